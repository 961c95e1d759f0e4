//! Configuration sets: groups of homogeneous servers at one network position.

use crate::ids::ConfigSetId;
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
