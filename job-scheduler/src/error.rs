//! [`SchedulerError`], the crate's one error type: a name or setting given on the command line,
//! a trace, node list or model file that cannot be used, a call the view refused for good, the
//! placement machine fed out of order, a job the simulator cannot admit, the local view's index
//! self-check. Each variant names what it is about (a file and row, a job, a server, a flag) and
//! says what to do where there is something to do.
//!
//! Outcomes that are not failures have their own value types: the search's
//! [`crate::NoPlacement`] (no gang fits now: wait or give up), the runtime's
//! [`crate::Placed`] and the view's `Rejection`.

use tessera_proto::client::ClientError;
use tessera_view::{ConfigSetId, Health, JobId, ServerId, SpecError, ViewError};
use thiserror::Error;

/// What went wrong in a scheduler host, the simulator, a trace loader or a benchmark.
#[derive(Debug, Error)]
pub enum SchedulerError {
    /// A name (a placement policy, a simulated policy, a scheduler) that is none of the known ones.
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
    /// A setting that does not apply to what else was asked (`--vc` with an Alibaba trace).
    #[error("{setting} {why}")]
    Unsupported {
        /// The setting, as its flag.
        setting: &'static str,
        /// Why it does not apply.
        why: &'static str,
    },
    /// A compiled-in topology preset is missing (a build without it).
    #[error("the compiled-in topology preset `{0}` is missing")]
    MissingPreset(&'static str),
    /// A cluster spec or topology (read from a file or built in code) is invalid.
    #[error(transparent)]
    Spec(#[from] SpecError),

    /// A file could not be read.
    #[error("{file}: cannot read")]
    Io {
        /// The file.
        file: String,
        /// The error.
        source: std::io::Error,
    },
    /// A CSV file could not be read or split into records.
    #[error("{file}: cannot read as CSV")]
    Csv {
        /// The file.
        file: String,
        /// The error.
        source: csv::Error,
    },
    /// A required column is missing from a trace's header.
    #[error("{file}: missing column `{column}` in the header")]
    MissingColumn {
        /// The file.
        file: String,
        /// The column.
        column: &'static str,
    },
    /// A value in a trace could not be used.
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
    BadFile {
        /// The file.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// A trace file has no rows.
    #[error("{file}: no data rows")]
    EmptyTrace {
        /// The file.
        file: String,
    },
    /// The Alibaba pods run on the real node list unless a cluster spec is given, and the node
    /// list could not be loaded.
    #[error("the Alibaba pods run on the real node list by default (or give a cluster spec)")]
    NodeList(#[source] Box<SchedulerError>),
    /// The simulator's thread pool could not start.
    #[error("cannot start the simulator's thread pool")]
    ThreadPool(#[from] rayon::ThreadPoolBuildError),

    /// A call to the view failed for good (after the client's own retries): the view is down,
    /// refused the caller, or answered something this client does not understand.
    #[error("{call}: the view refused")]
    Call {
        /// The call (`Snapshot`, `Propose`, `Migrate`, ...).
        call: &'static str,
        /// Why.
        source: ClientError,
    },
    /// The view refused a step of the benchmark (`submit`, `release`, `cancel`).
    #[error("{action}{}", job.map(|j| format!(" {j}")).unwrap_or_default())]
    View {
        /// What was asked.
        action: &'static str,
        /// The job it was asked for, when there is one.
        job: Option<JobId>,
        /// The refusal.
        source: ViewError,
    },
    /// The view answered a snapshot request with no snapshot.
    #[error("no snapshot in the view's answer")]
    NoSnapshot,
    /// The view answered with a snapshot that does not decode (a replica of another version?).
    #[error("the view sent a malformed snapshot")]
    MalformedSnapshot(#[source] tessera_proto::WireError),
    /// A job the view just admitted is not in it.
    #[error("submitted job {0} vanished")]
    JobVanished(JobId),
    /// The job a placement machine works for is not in the view (cancelled and forgotten).
    #[error("job {0} is not in the view")]
    UnknownJob(JobId),
    /// The shell fed a placement machine an event it was not waiting for (a bug in the shell).
    #[error("placement machine of job {job}: got {got} while waiting for {expected}")]
    OutOfOrder {
        /// The job.
        job: JobId,
        /// What the machine waited for.
        expected: &'static str,
        /// What it got.
        got: &'static str,
    },

    /// The simulator could not admit a trace's job even with the proportional CPU share (a trace
    /// no policy can run on this cluster).
    #[error("job {job} of the trace cannot be admitted")]
    Admission {
        /// The trace's job id.
        job: String,
        /// The refusal.
        source: ViewError,
    },

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

impl SchedulerError {
    /// A [`SchedulerError::Call`] of `call`, for `map_err`.
    pub fn call(call: &'static str) -> impl FnOnce(ClientError) -> SchedulerError {
        move |source| SchedulerError::Call { call, source }
    }

    /// A [`SchedulerError::Io`] of `file`, for `map_err`.
    pub fn io(file: &std::path::Path) -> impl Fn(std::io::Error) -> SchedulerError + '_ {
        move |source| SchedulerError::Io { file: file.display().to_string(), source }
    }

    /// A [`SchedulerError::Csv`] of `file`, for `map_err`.
    pub fn csv(file: &str) -> impl Fn(csv::Error) -> SchedulerError + '_ {
        move |source| SchedulerError::Csv { file: file.to_string(), source }
    }
}
