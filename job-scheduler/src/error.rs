//! [`SchedulerError`]: what goes wrong in this crate outside the live loops and the trace files:
//! a name or setting given on the command line, a step of the placement benchmark or of the
//! hosts' migration task, the local view's index self-check. [`TraceError`]: a trace, node list or model file that cannot be
//! read (the Philly sampler's and the simulator's loaders). The live loops' errors
//! ([`crate::runtime::RuntimeError`], [`crate::host::HostError`], [`crate::cache::CacheError`]),
//! the search's ([`crate::SearchError`]) and the simulator's runs ([`crate::sim::engine::SimError`],
//! [`crate::sim::experiment::ExperimentError`]) sit beside their modules.

use tessera_view::{ConfigSetId, Health, JobId, ServerId, SpecError, ViewError};
use thiserror::Error;

/// Why a parse, a benchmark or a self-check failed.
#[derive(Debug, Error)]
pub enum SchedulerError {
    /// A name (a placement policy, a simulated policy) that is none of the known ones.
    #[error("unknown {what} `{name}` (expected {expected})")]
    UnknownName {
        /// What kind of name, e.g. `policy`.
        what: &'static str,
        /// The name given.
        name: String,
        /// The names accepted, for people.
        expected: String,
    },
    /// A setting out of range; names the setting (its flag) and what it must be.
    #[error("{setting} must be {expected}, got {got}")]
    BadSetting {
        /// The setting, as its flag (`--servers`).
        setting: &'static str,
        /// What it must be (`at least 1`).
        expected: String,
        /// The value given.
        got: String,
    },
    /// A compiled-in topology preset is missing (a build without it).
    #[error("the compiled-in topology preset `{0}` is missing")]
    MissingPreset(&'static str),
    /// A topology built in code is invalid.
    #[error(transparent)]
    Topology(#[from] SpecError),
    /// The view refused a step of the benchmark (`submit`, `release`, `cancel`).
    #[error("{action}{}: {source}", job.map(|j| format!(" {j}")).unwrap_or_default())]
    View {
        /// What was asked.
        action: &'static str,
        /// The job it was asked for, when there is one.
        job: Option<JobId>,
        /// The refusal.
        source: ViewError,
    },
    /// A call to the view failed (the migration task's `Snapshot` or `Migrate`).
    #[error("{call}: {source}")]
    Call {
        /// The call.
        call: &'static str,
        /// Why.
        source: tessera_proto::client::ClientError,
    },
    /// The view answered a snapshot request with no snapshot.
    #[error("no snapshot in the answer")]
    NoSnapshot,
    /// The view answered with a snapshot that does not decode.
    #[error("malformed snapshot: {0}")]
    MalformedSnapshot(#[source] tessera_proto::WireError),
    /// A job the view just admitted is not in it.
    #[error("submitted job {0} vanished")]
    JobVanished(JobId),
    /// Index self-check: a server that is not up is indexed as free capacity.
    #[error("{server} is {health} but indexed")]
    IndexedNotUp {
        /// The server.
        server: ServerId,
        /// Its health.
        health: Health,
    },
    /// Index self-check: a server sits in a bucket, or at a position, its record does not imply.
    #[error("{0} is in the wrong bucket or position")]
    MisIndexed(ServerId),
    /// Index self-check: a server is in the index twice.
    #[error("{0} is indexed twice")]
    IndexedTwice(ServerId),
    /// Index self-check: an up server is missing from the index.
    #[error("{0} is up but not indexed")]
    NotIndexed(ServerId),
    /// Index self-check: a configuration set's free-GPU histogram disagrees with its records.
    #[error("histogram of {0} is off")]
    HistogramOff(ConfigSetId),
}

/// A malformed trace file.
#[derive(Debug, Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("{file}: cannot read: {source}")]
    Io {
        /// The file.
        file: String,
        /// The error.
        source: std::io::Error,
    },
    /// A required column is missing from the header.
    #[error("{file}: missing column `{column}` in the header")]
    MissingColumn {
        /// The file.
        file: String,
        /// The column.
        column: &'static str,
    },
    /// A value could not be used.
    #[error("{file}: row {row}, column `{column}`: {message}")]
    BadValue {
        /// The file.
        file: String,
        /// 1-based data row number (the header is row 0).
        row: u64,
        /// The column.
        column: &'static str,
        /// What is wrong.
        message: String,
    },
    /// A file is wrong as a whole (a model or cluster file, a trace that yields nothing).
    #[error("{file}: {message}")]
    Invalid {
        /// The file.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// The file has no rows.
    #[error("{file}: no data rows")]
    Empty {
        /// The file.
        file: String,
    },
}
