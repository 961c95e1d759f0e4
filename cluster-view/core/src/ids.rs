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

/// Most bytes in a [`RequestId`].
pub const MAX_REQUEST_ID_BYTES: usize = 96;

/// A client's id for one job submission, chosen by the client and sent again with every retry
/// of it: the view admits a job at most once per request id (while the job is remembered), so a
/// submission retried after an unknown outcome (a dropped connection, a leader change) cannot
/// admit the job twice. 1 to [`MAX_REQUEST_ID_BYTES`] printable ASCII characters.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct RequestId(String);

impl TryFrom<String> for RequestId {
    type Error = crate::ViewError;
    fn try_from(s: String) -> Result<RequestId, crate::ViewError> {
        RequestId::new(s)
    }
}

impl From<RequestId> for String {
    fn from(r: RequestId) -> String {
        r.0
    }
}

impl RequestId {
    /// Checks and wraps a client's id.
    pub fn new(id: impl Into<String>) -> Result<RequestId, crate::ViewError> {
        let id = id.into();
        let bad = |why: String| Err(crate::ViewError::BadRequestId(why));
        if id.is_empty() || id.len() > MAX_REQUEST_ID_BYTES {
            return bad(format!("{} bytes; 1 to {MAX_REQUEST_ID_BYTES} allowed", id.len()));
        }
        if let Some(c) = id.chars().find(|c| !c.is_ascii_graphic()) {
            return bad(format!("has {c:?}; only printable ASCII without spaces is allowed"));
        }
        Ok(RequestId(id))
    }

    /// The id of the `index`-th job of a request that submits several under one id.
    pub fn item(&self, index: usize) -> Result<RequestId, crate::ViewError> {
        RequestId::new(format!("{}/{index}", self.0))
    }

    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for RequestId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}
