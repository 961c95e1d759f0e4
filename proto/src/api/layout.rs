//! The JSON of layout changes: `GET /v1/config-sets`, `POST /v1/config-sets`,
//! `DELETE /v1/config-sets/{id}`, `POST /v1/servers`, `DELETE /v1/servers/{name}`, and what
//! `tessera config-sets` and `tessera servers add|remove` print with `--json`.

use serde::{Deserialize, Serialize};
use tessera_view::{Health, ViewSnapshot};
use utoipa::ToSchema;

/// One configuration set: servers of one topology in one rack and InfiniBand domain.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ConfigSetInfo {
    /// Its id (never reused).
    pub id: u32,
    /// Its name, `<rack>/<topology>`.
    pub name: String,
    /// Its rack.
    pub rack: String,
    /// Its InfiniBand domain.
    pub ib_domain: String,
    /// Its servers' topology.
    pub topology: String,
    /// Its servers' GPU type.
    pub device_type: String,
    /// GPUs per server.
    pub gpus_per_server: u32,
    /// Its servers that are not removed.
    pub servers: u64,
    /// Removed by an operator: it takes no new servers.
    pub removed: bool,
}

/// Every configuration set of the view, by id, removed ones included.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct ConfigSetList {
    /// The view version read.
    pub version: u64,
    /// The configuration sets.
    pub config_sets: Vec<ConfigSetInfo>,
}

impl ConfigSetList {
    /// The configuration sets of a view.
    pub fn of(s: &ViewSnapshot) -> ConfigSetList {
        let mut live = vec![0u64; s.config_sets.len()];
        for r in s.servers.iter().filter(|r| r.health != Health::Removed) {
            if let Some(n) = live.get_mut(r.config_set.index()) {
                *n += 1;
            }
        }
        let config_sets = s
            .config_sets
            .iter()
            .map(|cs| {
                let t = s.topologies.get(cs.topology as usize);
                ConfigSetInfo {
                    id: cs.id.0.into(),
                    name: cs.name.clone(),
                    rack: s.racks.get(cs.rack as usize).cloned().unwrap_or_default(),
                    ib_domain: s.ib_domains.get(cs.ib_domain as usize).cloned().unwrap_or_default(),
                    topology: t.map(|t| t.name.clone()).unwrap_or_default(),
                    device_type: t.map(|t| t.device_type.clone()).unwrap_or_default(),
                    gpus_per_server: t.map_or(0, |t| t.devices),
                    servers: live.get(cs.id.index()).copied().unwrap_or(0),
                    removed: cs.removed,
                }
            })
            .collect();
        ConfigSetList { version: s.version.0, config_sets }
    }

    /// The live configuration set a person names: by id, or by `<rack>/<topology>`.
    pub fn find(&self, what: &str) -> Result<&ConfigSetInfo, String> {
        let found = match what.parse::<u32>() {
            Ok(id) => self.config_sets.iter().find(|c| c.id == id),
            Err(_) => self.config_sets.iter().find(|c| !c.removed && c.name == what),
        };
        found.ok_or_else(|| {
            let known: Vec<String> =
                self.config_sets.iter().filter(|c| !c.removed).map(|c| format!("{} ({})", c.id, c.name)).collect();
            format!("no configuration set `{what}` (known: {})", known.join(", "))
        })
    }
}

/// `count` names for new servers of configuration set `cs` of a view, `<rack>-sNN` with the
/// smallest numbers no server has (`tessera servers add --count`, `POST /v1/servers`), or
/// `None` for an unknown set.
pub fn free_server_names(s: &ViewSnapshot, cs: u32, count: usize) -> Option<Vec<String>> {
    let set = s.config_sets.get(cs as usize)?;
    let rack = s.racks.get(set.rack as usize).map_or("", String::as_str);
    let taken: std::collections::HashSet<&str> = s.server_names.iter().map(String::as_str).collect();
    Some(tessera_view::layout::free_names(rack, |n| taken.contains(n), count))
}

/// The body of `POST /v1/config-sets`: a configuration set to add, with no servers yet.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddConfigSetBody {
    /// Its rack: 1 to 64 ASCII letters, digits, `-`, `_`, `.`; a known rack keeps its domain.
    pub rack: String,
    /// Its InfiniBand domain, named as the rack is.
    pub ib_domain: String,
    /// A compiled-in topology preset (`seed-8gpu`, `dgx1-v100`, `dgx-h100`, `pcie-4gpu`); or
    /// give `topology_toml`.
    #[serde(default)]
    pub topology: Option<String>,
    /// A topology file's text (TOML), as `tessera` reads topology files.
    #[serde(default)]
    pub topology_toml: Option<String>,
}

/// The body of `POST /v1/servers`: servers to add to one configuration set, down until their
/// agents register.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
#[serde(deny_unknown_fields)]
pub struct AddServersBody {
    /// The configuration set's id.
    #[schema(maximum = 65535)]
    pub config_set: u32,
    /// Their names (1 to 64 ASCII letters, digits, `-`, `_`, `.` each), at most 1,024; or give
    /// `count`.
    #[serde(default)]
    #[schema(max_items = 1024)]
    pub names: Vec<String>,
    /// How many to add, named `<rack>-sNN` with the smallest numbers free, when no names are
    /// given (1 to 1,024).
    #[serde(default)]
    #[schema(maximum = 1024)]
    pub count: u32,
}

/// What a layout change did.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, ToSchema)]
pub struct LayoutChanged {
    /// What was done: `add-config-set`, `add-servers`, `remove-server`, `remove-config-set`.
    pub action: String,
    /// The view version after it.
    pub version: u64,
    /// The configuration set added or removed, if one was.
    pub config_set: Option<u32>,
    /// The servers added or removed, by name.
    pub servers: Vec<String>,
}
