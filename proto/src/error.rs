//! [`WireError`]: why a wire message could not become a core value.

use thiserror::Error;

/// Why a decoded wire message was refused by a `TryFrom` conversion to a core type.
///
/// Each variant names the protobuf message and the field; errors found inside an element of a
/// repeated or nested field are wrapped in [`WireError::At`], whose `path` locates the element
/// (e.g. `jobs[3].placement.members[0]`). [`WireError::root`] returns the innermost error.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum WireError {
    /// A required field is absent: an unset sub-message or oneof, or an enum left `UNSPECIFIED`
    /// (proto3 cannot tell an enum set to 0 from an unset one).
    #[error("{message}.{field}: missing")]
    Missing {
        /// The protobuf message.
        message: &'static str,
        /// The field.
        field: &'static str,
    },
    /// An enum field holds a value this build does not know.
    #[error("{message}.{field}: unknown enum value {value}")]
    UnknownEnum {
        /// The protobuf message.
        message: &'static str,
        /// The field.
        field: &'static str,
        /// The raw value received.
        value: i32,
    },
    /// A number or mask outside what the field allows.
    #[error("{message}.{field}: {value} is out of range: {why}")]
    OutOfRange {
        /// The protobuf message.
        message: &'static str,
        /// The field.
        field: &'static str,
        /// The value received (a mask is given as its integer value).
        value: u64,
        /// What the field allows.
        why: String,
    },
    /// A value that is malformed or contradicts another value (an empty name, overlapping
    /// masks, a free mask that disagrees with what the jobs hold, ...).
    #[error("{message}.{field}: {why}")]
    Invalid {
        /// The protobuf message.
        message: &'static str,
        /// The field.
        field: &'static str,
        /// What is wrong.
        why: String,
    },
    /// A rule of the core type broken (see `Topology::validate` and `JobSpec::validate` in
    /// `tessera-view`) at a field path of the core type that names no field of the message.
    /// Rules broken at a path that does name one are reported as [`WireError::OutOfRange`] or
    /// [`WireError::Invalid`] of that field, with the path at the start of `why`.
    #[error("{message}: field `{path}`: {why}")]
    Rule {
        /// The protobuf message.
        message: &'static str,
        /// The core type's field path, e.g. `sockets[1].pcie_switches[0]`.
        path: String,
        /// What is wrong.
        why: String,
    },
    /// An error inside an element of a repeated or nested field.
    #[error("{path}: {inner}")]
    At {
        /// Where, as a dotted path with indices, e.g. `jobs[3].spec`.
        path: String,
        /// The error found there.
        inner: Box<WireError>,
    },
}

impl WireError {
    /// The innermost error, without the [`WireError::At`] wrappers.
    pub fn root(&self) -> &WireError {
        match self {
            WireError::At { inner, .. } => inner.root(),
            e => e,
        }
    }

    /// Prefixes the error's location with `path` (outermost first).
    pub fn at(self, path: impl Into<String>) -> WireError {
        let path = path.into();
        match self {
            WireError::At { path: inner_path, inner } => WireError::At { path: format!("{path}.{inner_path}"), inner },
            e => WireError::At { path, inner: Box::new(e) },
        }
    }

    pub(crate) fn missing(message: &'static str, field: &'static str) -> WireError {
        WireError::Missing { message, field }
    }

    pub(crate) fn invalid(message: &'static str, field: &'static str, why: impl Into<String>) -> WireError {
        WireError::Invalid { message, field, why: why.into() }
    }

    pub(crate) fn out_of_range(
        message: &'static str,
        field: &'static str,
        value: u64,
        why: impl Into<String>,
    ) -> WireError {
        WireError::OutOfRange { message, field, value, why: why.into() }
    }
}

/// An error with its causes, `a: b: c`, for log fields and for messages whose reader sees no
/// `source()` (gRPC statuses, HTTP answers, task exits). A cause whose text the message already
/// ends with is not repeated. The one copy every crate uses.
pub fn chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        let text = c.to_string();
        if !out.ends_with(&text) {
            out.push_str(": ");
            out.push_str(&text);
        }
        cause = c.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_nest_outermost_first() {
        let e = WireError::missing("Job", "spec").at("jobs[3]").at("snapshot");
        assert_eq!(e.to_string(), "snapshot.jobs[3]: Job.spec: missing");
        assert_eq!(e.root(), &WireError::missing("Job", "spec"));
    }
}
