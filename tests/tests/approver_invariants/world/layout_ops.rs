//! Layout changes in the world: an operator adds configuration sets and servers and removes
//! them, among the stale schedulers. The oracle is written from the documented rules
//! (`tessera_view::layout`), not from its code: what is refused, what a change does to the
//! records, and that nothing else (no job, no other server) moves.

use super::*;
use tessera_view::layout::LayoutChange;
use tessera_view::{ConfigSetId, Topology};

/// Why the documented rules refuse `cmd` on `view`, or `None` when they accept it.
fn refusal(view: &ClusterView, cmd: &Command) -> Option<&'static str> {
    let good_name = |n: &str| {
        (1..=64).contains(&n.chars().count())
            && n.starts_with(|c: char| c.is_ascii_alphanumeric())
            && n.chars().all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    };
    let live_set = |cs: ConfigSetId| view.config_sets().get(cs.index()).filter(|c| !c.removed);
    match cmd {
        Command::AddServers { config_set, names, .. } => {
            if live_set(*config_set).is_none() {
                return Some("unknown set");
            }
            // Names the cluster has (a removed server's) are taken as they are.
            let known = |n: &String| view.server_id(n).is_some();
            if names.is_empty() || names.len() > 1024 || !names.iter().all(|n| known(n) || good_name(n)) {
                return Some("names");
            }
            let distinct: BTreeSet<&String> = names.iter().collect();
            if distinct.len() != names.len() {
                return Some("repeated");
            }
            let taken = |n: &String| {
                view.servers().iter().enumerate().any(|(i, r)| {
                    r.health != Health::Removed && view.server_name(ServerId(i as u32)) == Some(n.as_str())
                })
            };
            names.iter().any(taken).then_some("taken")
        }
        Command::AddConfigSet { rack, ib_domain, topology } => {
            let rack_ok = view.racks().contains(rack) || good_name(rack);
            let ib_ok = view.ib_domains().contains(ib_domain) || good_name(ib_domain);
            if !rack_ok || !ib_ok || topology.validate().is_err() {
                return Some("names");
            }
            if view.topologies().iter().any(|t| t.name == topology.name && *t != **topology) {
                return Some("topology name");
            }
            let live = view.config_sets().iter().filter(|c| !c.removed);
            for cs in live {
                let same_rack = view.racks()[cs.rack as usize] == *rack;
                if same_rack && view.ib_domains()[cs.ib_domain as usize] != *ib_domain {
                    return Some("rack domain");
                }
                if cs.name == format!("{rack}/{}", topology.name) {
                    return Some("set exists");
                }
            }
            None
        }
        Command::RemoveServer { server, .. } => match view.server(*server) {
            None => Some("unknown"),
            Some(r) if r.health == Health::Removed => Some("removed"),
            Some(_) if view.hosts_gangs(*server) => Some("busy"),
            Some(_) => None,
        },
        Command::RemoveConfigSet { config_set } => {
            if live_set(*config_set).is_none() {
                return Some("unknown set");
            }
            let left = view.servers().iter().any(|r| r.config_set == *config_set && r.health != Health::Removed);
            left.then_some("servers left")
        }
        _ => Some("not a layout command"),
    }
}

impl World {
    /// An operator changes the layout: mostly servers added to a live set or removed (busy
    /// ones refused), sometimes a configuration set added or removed, sometimes with a bad or
    /// taken name. Checks the answer against the rules, the records against what the change
    /// does, that no job moved, and that readers behind the change go to snapshots.
    pub(super) fn op_layout(&mut self, rng: &mut SmallRng) -> Result<()> {
        let before = self.view.clone();
        let n = before.servers().len() as u32;
        let sets = before.config_sets().len() as u16;
        let name = |rng: &mut SmallRng, k: u64| match rng.random_range(0..12) {
            0 => "-bad".to_string(),
            1 => before.server_name(ServerId(rng.random_range(0..n))).unwrap_or("x").to_string(),
            _ => format!("added-{k}"),
        };
        let cmd = match rng.random_range(0..10) {
            0..=3 => {
                let beyond = u16::from(rng.random_ratio(1, 10));
                let config_set = ConfigSetId(rng.random_range(0..sets + beyond));
                let names = (0..rng.random_range(1..=3))
                    .map(|i| {
                        self.next_name += 1;
                        if i > 0 && rng.random_ratio(1, 15) {
                            "added-dup".to_string()
                        } else {
                            name(rng, self.next_name)
                        }
                    })
                    .collect();
                Command::AddServers { config_set, names, at_ms: self.view.now_ms() }
            }
            4 | 5 => {
                let racks = before.racks();
                let (rack, ib_domain) = match rng.random_range(0..4) {
                    // An existing rack, in its own domain or (refused) another.
                    0 => {
                        let cs = &before.config_sets()[rng.random_range(0..sets) as usize];
                        let ib = if rng.random_bool(0.5) { cs.ib_domain as usize } else { 0 };
                        (before.racks()[cs.rack as usize].clone(), before.ib_domains()[ib].clone())
                    }
                    1 => (racks[0].clone(), "ib-elsewhere".to_string()),
                    _ => (format!("rack-new-{}", rng.random_range(0..3)), "ib-new".to_string()),
                };
                let mut topology = match rng.random_range(0..3) {
                    0 => self.layout.topologies[0].clone(),
                    _ => Topology::preset("pcie-4gpu").expect("a preset"),
                };
                if rng.random_ratio(1, 8) {
                    // Another topology under a name the cluster has: refused.
                    topology.memory_mib /= 2;
                    topology.name = self.layout.topologies[0].name.clone();
                }
                Command::AddConfigSet { rack, ib_domain, topology: Box::new(topology) }
            }
            6..=8 => {
                // Idle servers mostly, busy ones sometimes (refused), unknown ids rarely.
                let idle: Vec<u32> = (0..n)
                    .filter(|&s| {
                        before.server(ServerId(s)).is_some_and(|r| r.health != Health::Removed)
                            && !before.hosts_gangs(ServerId(s))
                    })
                    .collect();
                let server = match (rng.random_range(0..10), idle.choose(rng)) {
                    (0, _) => ServerId(n + rng.random_range(0..3)),
                    (1..=6, Some(&s)) => ServerId(s),
                    _ => ServerId(rng.random_range(0..n)),
                };
                Command::RemoveServer { server, at_ms: self.view.now_ms() }
            }
            _ => Command::RemoveConfigSet { config_set: ConfigSetId(rng.random_range(0..=sets)) },
        };
        let expect = refusal(&before, &cmd);
        let out = self.exec(cmd.clone())?;
        let Outcome::Layout(res) = out else { bail!("{cmd:?} answered {out:?}") };
        let change = match (expect, res) {
            (Some(why), Err(e)) => {
                ensure!(self.view.state_hash() == before.state_hash(), "a refused {cmd:?} ({e}) changed the state");
                ensure!(self.view.version() == before.version(), "a refused layout change bumped the version");
                *self.stats.layout_refused.entry(why.to_string()).or_default() += 1;
                return Ok(());
            }
            (None, Ok(change)) => change,
            (expect, res) => bail!("{cmd:?}: the rules say {expect:?}, the view answered {res:?}"),
        };
        self.check_layout_change(&before, &cmd, &change)?;
        self.layout = Layout::of(&self.view);
        self.last_layout = self.view.version();
        Ok(())
    }

    fn check_layout_change(&mut self, before: &ClusterView, cmd: &Command, change: &LayoutChange) -> Result<()> {
        let view = &self.view;
        ensure!(view.version().0 == before.version().0 + 1, "a layout change is one version");
        for j in before.jobs() {
            ensure!(view.job(j.id) == Some(j), "{} changed on {cmd:?}", j.id);
        }
        ensure!(view.delta_since(before.version()).is_none(), "a reader before {cmd:?} was offered a delta");
        let mut want = before.servers().to_vec();
        match cmd {
            Command::AddServers { config_set, names, .. } => {
                let t = self.layout.topologies[self.layout.config_sets[config_set.index()].topology as usize].clone();
                let first = want.len() as u32;
                let ids: Vec<ServerId> = (0..names.len() as u32).map(|i| ServerId(first + i)).collect();
                ensure!(change.servers == ids && change.names == *names, "added {change:?}, asked for {names:?}");
                for (id, name) in ids.iter().zip(names) {
                    ensure!(view.server_id(name) == Some(*id), "`{name}` does not find {id}");
                    let full = ServerRecord {
                        free_gpus: all_devices(&t),
                        free_cores: t.all_cores(),
                        free_memory_mib: t.memory_mib,
                        config_set: *config_set,
                        health: Health::Up,
                    };
                    want.push(ServerRecord { health: Health::Down, ..full });
                    self.pristine.push(full);
                }
                self.stats.layout_added_servers += names.len() as u64;
                self.stats.layout_readded_names +=
                    names.iter().filter(|n| before.server_id(n).is_some()).count() as u64;
            }
            Command::RemoveServer { server, .. } => {
                let tomb = ServerRecord {
                    free_gpus: 0,
                    free_cores: CoreMask::EMPTY,
                    free_memory_mib: 0,
                    health: Health::Removed,
                    ..want[server.index()]
                };
                want[server.index()] = tomb;
                self.pristine[server.index()] = tomb;
                ensure!(
                    view.cordon_of(*server).is_none() && view.unhealthy_devices(*server) == 0,
                    "{server} kept its cordon or sick devices"
                );
                self.stats.layout_removed_servers += 1;
            }
            Command::AddConfigSet { rack, topology, .. } => {
                let id = ConfigSetId(before.config_sets().len() as u16);
                ensure!(change.config_set == Some(id), "added {change:?}, expected set {id:?}");
                let cs = &view.config_sets()[id.index()];
                ensure!(
                    view.topologies()[cs.topology as usize] == **topology && view.racks()[cs.rack as usize] == *rack,
                    "set {cs:?}"
                );
                self.stats.layout_added_sets += 1;
            }
            Command::RemoveConfigSet { config_set } => {
                ensure!(view.config_sets()[config_set.index()].removed, "{config_set:?} not marked removed");
                self.stats.layout_removed_sets += 1;
            }
            other => bail!("not a layout command: {other:?}"),
        }
        ensure!(view.servers() == want.as_slice(), "{cmd:?}: the records are not as the change says");
        Ok(())
    }
}
