//! Configuration sets: groups of homogeneous servers at one network position.

use crate::ids::ConfigSetId;
use crate::locality::LocalityLevel;
use serde::{Deserialize, Serialize};

/// A group of servers with the same topology in the same rack and InfiniBand domain.
///
/// Few exist and they change only by an operator's layout commands ([`crate::layout`]), so they are kept as read-only metadata beside the server
/// records, which refer to them by [`ConfigSetId`].
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConfigSet {
    /// Its id (index in the view).
    pub id: ConfigSetId,
    /// Display name, `<rack>/<topology>`.
    pub name: String,
    /// Index of its topology in the view's topology table.
    pub topology: u16,
    /// Index of its rack in the view's rack table.
    pub rack: u32,
    /// Index of its InfiniBand domain in the view's domain table.
    pub ib_domain: u32,
    /// Removed by an operator (see [`crate::layout`]): it takes no new servers, its name may
    /// be used again, its id is never reused.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub removed: bool,
}

impl ConfigSet {
    /// The domain its servers are in at `level`, the key by which a gang of that level groups
    /// servers: its rack up to `rack` (a server is inside its rack), its InfiniBand domain at
    /// `ib-domain`, the one cluster-wide domain (0) at `any`. Admission, drains, migration plans,
    /// the schedulers' wait estimates and `optimus` group servers by this; the placement search
    /// and the simulator's free-GPU counts walk the view's rack and domain tables instead.
    pub fn domain(&self, level: LocalityLevel) -> u32 {
        match level {
            LocalityLevel::IbDomain => self.ib_domain,
            LocalityLevel::Any => 0,
            _ => self.rack,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn servers_share_a_domain_by_rack_up_to_rack_by_ib_domain_then_all_at_any() {
        let cs = ConfigSet {
            id: ConfigSetId(0),
            name: "r7/seed-8gpu".into(),
            topology: 0,
            rack: 7,
            ib_domain: 3,
            removed: false,
        };
        for (level, domain) in [
            (LocalityLevel::Socket, 7),
            (LocalityLevel::Server, 7),
            (LocalityLevel::Rack, 7),
            (LocalityLevel::IbDomain, 3),
            (LocalityLevel::Any, 0),
        ] {
            assert_eq!(cs.domain(level), domain, "{level}");
        }
    }
}
