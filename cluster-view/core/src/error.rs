//! The crate's error types. Each variant tells the caller what went wrong and where.

use crate::ids::{JobId, ServerId};
use thiserror::Error;

/// A problem in a user-written file (topology, cluster spec or job spec).
///
/// Every variant names the file (or `<inline>` for text given directly); `Invalid` also names
/// the field as a dotted path (e.g. `sockets[1].pcie_switches[0]`).
#[derive(Debug, Error)]
pub enum SpecError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Io {
        /// The file.
        file: String,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not valid TOML, or a field has the wrong type or an unknown name.
    #[error("{file}: {message}")]
    Syntax {
        /// The file.
        file: String,
        /// The parser's message (it gives the line and column).
        message: String,
    },
    /// A field has a value that is well-formed but wrong.
    #[error("{file}: field `{field}`: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// Dotted path of the field.
        field: String,
        /// What is wrong with it.
        message: String,
    },
}

impl SpecError {
    /// An `Invalid` error.
    pub fn invalid(file: &str, field: impl Into<String>, message: impl Into<String>) -> SpecError {
        SpecError::Invalid { file: file.to_string(), field: field.into(), message: message.into() }
    }

    /// A `Syntax` error from a TOML parse error.
    pub fn syntax(file: &str, err: &toml::de::Error) -> SpecError {
        SpecError::Syntax { file: file.to_string(), message: err.to_string().trim_end().to_string() }
    }

    /// Reads a whole file, mapping the error.
    pub fn read(path: &std::path::Path) -> Result<String, SpecError> {
        std::fs::read_to_string(path).map_err(|source| SpecError::Io { file: path.display().to_string(), source })
    }
}

/// Errors of view operations other than proposals (which answer with a [`crate::Decision`]).
#[derive(Clone, Debug, Error, PartialEq, Eq)]
pub enum ViewError {
    /// No job with this id exists.
    #[error("unknown job {0}")]
    UnknownJob(JobId),
    /// No server with this id or name exists.
    #[error("unknown server {0}")]
    UnknownServer(String),
    /// The job spec cannot be placed on this cluster at all; the message says why.
    #[error("job can never fit this cluster: {0}")]
    NeverFits(String),
    /// The operation does not apply to the job in its current state.
    #[error("job {job} is {state}, cannot {action}")]
    BadJobState {
        /// The job.
        job: JobId,
        /// Its state.
        state: &'static str,
        /// What was asked.
        action: &'static str,
    },
    /// A server would exceed the view's limits (devices, cores, count).
    #[error("server {0}: {1}")]
    BadServer(ServerId, String),
}
