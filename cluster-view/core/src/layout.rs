//! The cluster's layout on a running view: configuration sets and servers added and removed by
//! an operator, as replicated commands ([`crate::Command::AddConfigSet`],
//! [`crate::Command::AddServers`], [`crate::Command::RemoveServer`],
//! [`crate::Command::RemoveConfigSet`]).
//!
//! Ids are indices and are never reused, so every placement, cordon and history entry that names
//! a server keeps meaning the same machine. A removed server stays in the tables as a tombstone:
//! its record is [`Health::Removed`] and offers nothing (no free devices, cores or memory), so
//! the one fit function refuses it like any server that is not up. A removed configuration set
//! keeps its id and its place in the table, takes no new servers, and frees its name. The
//! topology, rack and InfiniBand domain tables only grow.
//!
//! A server is removed only once no gang has a member on it: an operator drains it first
//! (`tessera servers drain`), which re-queues what is still there at the deadline. New servers
//! start down; each comes up when its agent registers with a matching topology.
//!
//! Deltas carry server records and jobs, not the layout, so a layout change resets the change
//! log: every reader behind it takes a snapshot, which holds the new tables. Layout changes are
//! rare operator actions; a snapshot per watcher is their price.

use crate::cluster_spec::{MAX_CONFIG_SETS, MAX_SERVERS};
use crate::config_set::ConfigSet;
use crate::error::ViewError;
use crate::ids::{ConfigSetId, ServerId};
use crate::mask::CoreMask;
use crate::server::{Health, ServerRecord};
use crate::topology::Topology;
use crate::view::ClusterView;
use serde::{Deserialize, Serialize};

/// Most servers one [`crate::Command::AddServers`] adds.
pub const MAX_SERVERS_PER_ADD: usize = 1024;
/// Most characters of a server, rack or InfiniBand domain name given at run time.
pub const MAX_NAME_CHARS: usize = 64;

/// What a layout command created.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayoutChange {
    /// The configuration set added, if one was.
    pub config_set: Option<ConfigSetId>,
    /// The servers added, in the order named.
    pub servers: Vec<ServerId>,
    /// Their names, in the same order.
    pub names: Vec<String>,
}

/// Checks a name new to the cluster, given at run time: 1 to [`MAX_NAME_CHARS`] characters,
/// ASCII letters, digits, `-`, `_` and `.`, starting with a letter or digit (it appears in
/// paths, labels and URLs). Names the cluster already has (a spec's rack, a removed server's
/// name given again) are taken as they are.
pub fn check_name(what: &str, name: &str) -> Result<(), ViewError> {
    let bad = |why: &str| Err(ViewError::Layout(format!("{what} name `{}`: {why}", name.escape_debug())));
    if name.is_empty() || name.chars().count() > MAX_NAME_CHARS {
        return bad(&format!("1 to {MAX_NAME_CHARS} characters"));
    }
    if !name.chars().next().is_some_and(|c| c.is_ascii_alphanumeric()) {
        return bad("must start with a letter or digit");
    }
    if !name.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.')) {
        return bad("only ASCII letters, digits, `-`, `_` and `.`");
    }
    Ok(())
}

/// `count` names `<rack>-sNN` with the smallest numbers for which `taken` is false (the names
/// a cluster spec gives its servers, continued).
pub fn free_names(rack: &str, taken: impl Fn(&str) -> bool, count: usize) -> Vec<String> {
    let mut out = Vec::with_capacity(count);
    let mut n = 0u64;
    while out.len() < count {
        let name = format!("{rack}-s{n:02}");
        if !taken(&name) {
            out.push(name);
        }
        n += 1;
    }
    out
}

impl ClusterView {
    /// Adds a configuration set of `topology` in `rack` and `ib_domain` (each added to its
    /// table if new), with no servers yet. Refused: a malformed topology or name; a rack already
    /// in another InfiniBand domain; a topology whose name is taken by a different one; a live
    /// set of the same name (`rack/topology`: add servers to it instead); the table full.
    pub fn add_config_set(
        &mut self,
        rack: &str,
        ib_domain: &str,
        topology: &Topology,
    ) -> Result<ConfigSetId, ViewError> {
        // Names new to the cluster follow the rules; those it has (from a spec, which allows
        // more) are taken as they are.
        if !self.racks.iter().any(|r| r == rack) {
            check_name("rack", rack)?;
        }
        if !self.ib_domains.iter().any(|d| d == ib_domain) {
            check_name("InfiniBand domain", ib_domain)?;
        }
        topology
            .validate()
            .map_err(|e| ViewError::Layout(format!("topology `{}`: {}: {}", topology.name, e.field, e.message)))?;
        if self.config_sets.len() >= MAX_CONFIG_SETS {
            return Err(ViewError::Layout(format!("the cluster already has {MAX_CONFIG_SETS} configuration sets")));
        }
        let rack_ix = self.racks.iter().position(|r| r == rack);
        let ib_ix = self.ib_domains.iter().position(|d| d == ib_domain);
        if let Some(r) = rack_ix
            && let Some(other) = self.config_sets.iter().find(|cs| !cs.removed && cs.rack as usize == r)
            && Some(other.ib_domain as usize) != ib_ix
        {
            return Err(ViewError::Layout(format!(
                "rack `{rack}` is in InfiniBand domain `{}`, not `{ib_domain}`",
                self.ib_domains[other.ib_domain as usize]
            )));
        }
        let topo_ix = match self.topologies.iter().position(|t| t.name == topology.name) {
            Some(i) if self.topologies[i] != *topology => {
                return Err(ViewError::Layout(format!(
                    "topology `{}` differs from the one of that name the cluster has; give it another name",
                    topology.name
                )));
            }
            Some(i) => i,
            None if self.topologies.len() >= u16::MAX as usize => {
                return Err(ViewError::Layout("too many distinct topologies".into()));
            }
            None => self.topologies.len(),
        };
        let name = format!("{rack}/{}", topology.name);
        if let Some(cs) = self.config_sets.iter().find(|cs| !cs.removed && cs.name == name) {
            return Err(ViewError::Layout(format!(
                "configuration set `{name}` already exists (id {}): add servers to it",
                cs.id.0
            )));
        }
        self.bump();
        if topo_ix == self.topologies.len() {
            self.topologies.push(topology.clone());
        }
        let rack = rack_ix.unwrap_or_else(|| {
            self.racks.push(rack.to_string());
            self.racks.len() - 1
        });
        let ib = ib_ix.unwrap_or_else(|| {
            self.ib_domains.push(ib_domain.to_string());
            self.ib_domains.len() - 1
        });
        let id = ConfigSetId(self.config_sets.len() as u16);
        self.config_sets.push(ConfigSet {
            id,
            name,
            topology: topo_ix as u16,
            rack: rack as u32,
            ib_domain: ib as u32,
            removed: false,
        });
        self.layout_changed();
        Ok(id)
    }

    /// Adds servers named `names` to configuration set `cs`, all free and [`Health::Down`]
    /// until their agents register. Refused whole: an unknown or removed set; no name, more
    /// than [`MAX_SERVERS_PER_ADD`], a malformed or repeated name, or one a server that is not
    /// removed already has; the view full ([`MAX_SERVERS`]). A removed server's name may be
    /// given again: the name then means the new server.
    pub fn add_servers(&mut self, cs: ConfigSetId, names: &[String], at_ms: u64) -> Result<LayoutChange, ViewError> {
        let set = self
            .config_sets
            .get(cs.index())
            .ok_or_else(|| ViewError::Layout(format!("no configuration set with id {}", cs.0)))?;
        if set.removed {
            return Err(ViewError::Layout(format!("configuration set `{}` was removed", set.name)));
        }
        if names.is_empty() || names.len() > MAX_SERVERS_PER_ADD {
            return Err(ViewError::Layout(format!("{} server names; give 1 to {MAX_SERVERS_PER_ADD}", names.len())));
        }
        if self.servers.len() + names.len() > MAX_SERVERS as usize {
            return Err(ViewError::Layout(format!("the cluster would exceed {MAX_SERVERS} servers")));
        }
        let mut seen = std::collections::HashSet::new();
        for n in names {
            if self.server_id(n).is_none() {
                check_name("server", n)?;
            }
            if !seen.insert(n.as_str()) {
                return Err(ViewError::Layout(format!("server `{n}` is named twice")));
            }
            if let Some(s) = self.server_id(n)
                && self.servers[s.index()].health != Health::Removed
            {
                return Err(ViewError::Layout(format!("server `{n}` already exists ({s})")));
            }
        }
        let topo = self.topology_of(cs).clone();
        let set_name = set.name.clone();
        self.bump();
        let mut added = Vec::with_capacity(names.len());
        for n in names {
            let id = ServerId(self.servers.len() as u32);
            self.servers.push(ServerRecord {
                free_gpus: topo.all_devices(),
                free_cores: topo.all_cores(),
                free_memory_mib: topo.memory_mib,
                config_set: cs,
                health: Health::Down,
            });
            self.server_names.push(n.clone());
            self.server_versions.push(self.version);
            self.unhealthy.push(0);
            self.server_by_name.insert(n.clone(), id);
            self.remember(
                id,
                at_ms,
                format!("added to configuration set `{set_name}`: down until its agent registers"),
            );
            added.push(id);
        }
        self.layout_changed();
        Ok(LayoutChange { config_set: None, servers: added, names: names.to_vec() })
    }

    /// Removes a server: its record becomes a [`Health::Removed`] tombstone offering nothing,
    /// its cordon and unhealthy devices are dropped, its history says so. Refused while a gang
    /// has a member on it (drain it first), and for a server already removed.
    pub fn remove_server(&mut self, server: ServerId, at_ms: u64) -> Result<(), ViewError> {
        let rec = *self.servers.get(server.index()).ok_or_else(|| ViewError::UnknownServer(server.to_string()))?;
        let name = self.server_name(server).unwrap_or("?").to_string();
        if rec.health == Health::Removed {
            return Err(ViewError::BadServer(server, format!("`{name}` was already removed")));
        }
        let holders = self.gangs_on(server);
        if !holders.is_empty() {
            let shown: Vec<String> = holders.iter().take(8).map(|j| j.0.to_string()).collect();
            let more = if holders.len() > 8 { format!(" and {} more", holders.len() - 8) } else { String::new() };
            return Err(ViewError::BadServer(
                server,
                format!(
                    "`{name}` still hosts job(s) {}{more}; drain it first (tessera servers drain {name} --timeout-s N) and remove it once empty",
                    shown.join(", ")
                ),
            ));
        }
        self.bump();
        let r = &mut self.servers[server.index()];
        r.health = Health::Removed;
        r.free_gpus = 0;
        r.free_cores = CoreMask::EMPTY;
        r.free_memory_mib = 0;
        self.unhealthy[server.index()] = 0;
        self.cordons.remove(&server);
        self.touch_server(server);
        self.remember(server, at_ms, "removed from the cluster".to_string());
        self.layout_changed();
        Ok(())
    }

    /// Removes a configuration set that has no server left (every one removed): it takes no
    /// new servers and its name may be used again. Refused while a server of it is not removed.
    pub fn remove_config_set(&mut self, cs: ConfigSetId) -> Result<(), ViewError> {
        let set = self
            .config_sets
            .get(cs.index())
            .ok_or_else(|| ViewError::Layout(format!("no configuration set with id {}", cs.0)))?;
        if set.removed {
            return Err(ViewError::Layout(format!("configuration set `{}` was already removed", set.name)));
        }
        let live = self.servers.iter().filter(|r| r.config_set == cs && r.health != Health::Removed).count();
        if live > 0 {
            return Err(ViewError::Layout(format!(
                "configuration set `{}` still has {live} server(s); remove them first",
                set.name
            )));
        }
        self.bump();
        self.config_sets[cs.index()].removed = true;
        self.layout_changed();
        Ok(())
    }

    /// A server's record, or why it cannot be acted on: unknown, or removed.
    pub(crate) fn live_server(&self, server: ServerId) -> Result<ServerRecord, ViewError> {
        match self.servers.get(server.index()) {
            None => Err(ViewError::UnknownServer(server.to_string())),
            Some(r) if r.health == Health::Removed => {
                let name = self.server_name(server).unwrap_or("?");
                Err(ViewError::BadServer(server, format!("`{name}` was removed from the cluster")))
            }
            Some(r) => Ok(*r),
        }
    }

    /// The live configuration set named `name` (`rack/topology`), if any.
    pub fn config_set_id(&self, name: &str) -> Option<ConfigSetId> {
        self.config_sets.iter().find(|cs| !cs.removed && cs.name == name).map(|cs| cs.id)
    }

    /// `count` names for new servers of configuration set `cs`, `<rack>-sNN` with the smallest
    /// numbers no server of the view has, or `None` for an unknown set. The edges (`tessera
    /// servers add --count`, `POST /v1/servers`) name servers with it on the view they read and
    /// send the names: a retried add of named servers is refused, never applied twice.
    pub fn free_server_names(&self, cs: ConfigSetId, count: usize) -> Option<Vec<String>> {
        let set = self.config_sets.get(cs.index())?;
        Some(free_names(&self.racks[set.rack as usize], |n| self.server_id(n).is_some(), count))
    }

    /// After any layout change: derived tables recomputed, the never-fits memo dropped, and the
    /// change log reset so that every reader behind this version takes a snapshot.
    fn layout_changed(&mut self) {
        self.count_servers();
        self.readers_take_snapshots();
    }

    /// After a change deltas cannot carry (the layout, the policy): the never-fits memo dropped
    /// (it judged the old tables) and the change log reset, so every reader behind this version
    /// takes a snapshot.
    pub(crate) fn readers_take_snapshots(&mut self) {
        self.fit_memo.clear();
        self.log.clear();
        self.log_floor = self.version;
    }

    /// Recomputes the number of servers (not removed) per configuration set.
    pub(crate) fn count_servers(&mut self) {
        let mut counts = vec![0u64; self.config_sets.len()];
        for r in self.servers.iter().filter(|r| r.health != Health::Removed) {
            counts[r.config_set.index()] += 1;
        }
        self.cs_servers = counts;
    }
}

#[cfg(test)]
mod tests;
