//! The crate's error types. Each one tells the caller what went wrong and where.

use crate::ids::{JobId, ServerId};
use thiserror::Error;

/// A problem in a user-written file (topology, cluster spec or job spec).
///
/// Every variant names the file (or `<inline>` for text given directly); `Invalid` also names
/// the field as a dotted path (e.g. `sockets[1].pcie_switches[0]`).
#[derive(Debug, Error)]
pub enum SpecError {
    /// The file could not be read.
    #[error("{file}: cannot read")]
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

    /// Names the line of an `Invalid` field in `text` (the file's contents) as `file:line`,
    /// when the field is written there (a missing field has no line). TOML syntax errors carry
    /// their line already.
    pub fn with_line(self, text: &str) -> SpecError {
        match self {
            SpecError::Invalid { file, field, message } => match field_line(text, &field) {
                Some(line) if !file.ends_with(&format!(":{line}")) => {
                    SpecError::Invalid { file: format!("{file}:{line}"), field, message }
                }
                _ => SpecError::Invalid { file, field, message },
            },
            other => other,
        }
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

/// A rule broken by an already-built value: what [`crate::Topology::validate`],
/// [`crate::JobSpec::validate`], [`crate::CpuDemand::validate`] and
/// [`crate::Predictor::validate`] return.
///
/// The spec parsers turn it into [`SpecError::Invalid`] (see [`FieldError::in_file`]); the wire
/// conversions of `tessera-proto` into their own error.
#[derive(Clone, Debug, Error, PartialEq, Eq)]
#[error("field `{field}`: {message}")]
pub struct FieldError {
    /// Dotted path of the field, as the spec files name it (e.g. `sockets[1].pcie_switches[0]`,
    /// `locality.tolerate`, `cpu.predictor.theta`).
    pub field: String,
    /// What is wrong with it.
    pub message: String,
}

impl FieldError {
    /// A field error.
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> FieldError {
        FieldError { field: field.into(), message: message.into() }
    }

    /// The same error seen from the value that contains this one: `within("cpu")` turns field
    /// `cores_per_gpu` into `cpu.cores_per_gpu`.
    pub fn within(self, parent: &str) -> FieldError {
        FieldError { field: format!("{parent}.{}", self.field), message: self.message }
    }

    /// As a [`SpecError::Invalid`] of `file`.
    pub fn in_file(self, file: &str) -> SpecError {
        SpecError::Invalid { file: file.to_string(), field: self.field, message: self.message }
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
    /// The job spec is malformed (specs built in code rather than parsed from a file).
    #[error("invalid job spec: {0}")]
    InvalidSpec(FieldError),
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
    /// A layout command was refused (see [`crate::layout`]); the message says why.
    #[error("layout change refused: {0}")]
    Layout(String),
    /// A quota or priority-class change was refused (see [`crate::policy`]).
    #[error("policy change refused: {0}")]
    Policy(String),
    /// A submission's request id is malformed.
    #[error("bad request id: {0}")]
    BadRequestId(String),
    /// A submission's request id names a remembered job whose spec differs: the client reused
    /// an id for another job. Choose a fresh id per job.
    #[error("request id `{request}` was used for {job} with another spec; use a fresh request id")]
    RequestReused {
        /// The request id.
        request: String,
        /// The job it admitted.
        job: JobId,
    },
    /// A task report that does not match the job's current placement (the placement it was
    /// started for was released, re-queued or replaced): the reporter should stop that task.
    #[error("stale task report for {job}: {why}")]
    StaleTask {
        /// The job.
        job: JobId,
        /// What does not match.
        why: String,
    },
}

/// The 1-based line of TOML `text` that sets the dotted `field` (`locality.tolerate`), or,
/// failing that, the line that sets its nearest enclosing key (an inline table, an array).
/// Tracks `[table]` headers; good enough to point a person at a line, not a TOML parser.
pub fn field_line(text: &str, field: &str) -> Option<usize> {
    let unquote =
        |k: &str| k.split('.').map(|p| p.trim().trim_matches('"').trim_matches('\'')).collect::<Vec<_>>().join(".");
    let mut table = String::new();
    let mut best: Option<(usize, usize)> = None; // (matched prefix length, line)
    for (i, line) in text.lines().enumerate() {
        let l = line.trim();
        if l.starts_with('#') || l.is_empty() {
            continue;
        }
        if let Some(h) = l.strip_prefix('[') {
            let h = h.trim_start_matches('[');
            if let Some(end) = h.find(']') {
                table = unquote(&h[..end]);
                if table == field {
                    return Some(i + 1);
                }
            }
            continue;
        }
        let Some((key, _)) = l.split_once('=') else { continue };
        let key = unquote(key);
        let full = if table.is_empty() { key } else { format!("{table}.{key}") };
        if full == field {
            return Some(i + 1);
        }
        if field.starts_with(&format!("{full}.")) && best.is_none_or(|(n, _)| full.len() > n) {
            best = Some((full.len(), i + 1));
        }
    }
    best.map(|(_, line)| line)
}

#[cfg(test)]
mod line_tests {
    use super::field_line;

    #[test]
    fn finds_keys_in_tables_dotted_keys_and_inline_tables() {
        let t = "name = 'x'\ngpus = 4\n\n[locality]\nprefer = 'rack'\ntolerate = 'socket'\nslowdown = { rack = 2.0 }\n";
        assert_eq!(field_line(t, "gpus"), Some(2));
        assert_eq!(field_line(t, "locality.tolerate"), Some(6));
        assert_eq!(field_line(t, "locality.slowdown.rack"), Some(7));
        assert_eq!(field_line("cpu.cores_per_gpu = 0\n", "cpu.cores_per_gpu"), Some(1));
        assert_eq!(field_line(t, "memory_mib_per_gpu"), None);
    }
}
