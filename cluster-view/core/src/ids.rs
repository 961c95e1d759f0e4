//! Identifiers. Small integers so that records stay compact; names live in cold tables.

use serde::{Deserialize, Serialize};
use std::fmt;

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident($inner:ty), $prefix:literal) => {
        $(#[$doc])*
        #[derive(
            Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
        )]
        #[serde(transparent)]
        pub struct $name(pub $inner);

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "{}"), self.0)
            }
        }
    };
}

id_type!(
    /// Index of a server in the view (dense, assigned in registration order).
    ServerId(u32),
    "server#"
);
id_type!(
    /// Index of a configuration set in the view.
    ConfigSetId(u16),
    "config-set#"
);
id_type!(
    /// A job, assigned by the view at submission (dense, never reused).
    JobId(u64),
    "job-"
);
id_type!(
    /// A proposal's unique id, chosen by the proposing scheduler; apply is idempotent on it.
    ProposalId(u64),
    "proposal-"
);
id_type!(
    /// The view's version: the number of commands applied (the Raft applied index once replicated).
    ViewVersion(u64),
    "v"
);

impl ServerId {
    /// The id as a vector index.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}

impl ConfigSetId {
    /// The id as a vector index.
    #[inline]
    pub fn index(self) -> usize {
        self.0 as usize
    }
}
