//! [`ViewServerError`]: the one error type of the view service, for its requests and for its
//! start, and the one place where an error becomes a gRPC status ([`ViewServerError::code`] and
//! `From<ViewServerError> for Status`). The HTTP API's answers are made from it in one place
//! too, [`crate::http::ApiError`].
//!
//! A variant that wraps a cause keeps it as its [`std::error::Error::source`] and does not
//! repeat it in its message: the CLI prints the chain (`{e:#}`), and a status carries
//! [`chain`].

use std::path::PathBuf;
use tessera_replica::ReplicaError;
use tessera_view::{SpecError, ViewError};
use thiserror::Error;
use tonic::{Code, Status};

/// Metadata key of a follower's answer to a write: the leader's address.
pub use tessera_proto::LEADER_KEY;

/// Why a request to the replica failed (the first group: each says what the caller does), or
/// why the replica could not start or stopped (the second: each names what to fix).
#[derive(Debug, Error)]
pub enum ViewServerError {
    // Requests.
    /// Writes go to the leader: send this one there (its address is in the status's
    /// [`LEADER_KEY`] metadata when known).
    #[error("not the leader; {}", leader_text(.leader, .addr))]
    NotLeader {
        /// The leader's id, 0 if unknown.
        leader: u64,
        /// Its address, if known.
        addr: Option<String>,
    },
    /// Too many requests queued or in flight: retry after a backoff.
    #[error("busy: {0}; retry after a backoff")]
    Busy(String),
    /// No answer within the request timeout; the outcome of a write is unknown: read the state,
    /// or retry a write whose id makes it idempotent.
    #[error("timed out after {after_ms} ms; the outcome is unknown")]
    Timeout {
        /// How long the request waited.
        after_ms: u64,
    },
    /// A write met a leader change or an unexpected answer: its outcome is unknown; retry it
    /// with the same request or proposal id, or read the state.
    #[error("outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// The request names something that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed: fix it; retrying it unchanged fails again.
    #[error("{0}")]
    Invalid(String),
    /// The request does not apply to the current state.
    #[error("{0}")]
    Precondition(String),
    /// A heartbeat from a server the view has marked down: it must register again.
    #[error("server {server} is down (its lease expired); register again")]
    ServerDown {
        /// The server.
        server: tessera_view::ServerId,
    },
    /// The view refused the command (unknown job, wrong state, a spec that never fits, …).
    #[error(transparent)]
    View(#[from] ViewError),
    /// The replica is shutting down, or its driver dropped the request: try another replica.
    #[error("replica stopped: {0}")]
    Stopped(String),
    /// The replica's storage or raft failed: at start (the data directory is not this
    /// replica's, RocksDB cannot open), or under a request (try another replica).
    #[error(transparent)]
    Replica(Box<ReplicaError>),
    /// The caller is not authenticated (no certificate and no token, or a bad token).
    #[error("{0}")]
    Unauthenticated(String),
    /// The caller is authenticated but may not do this.
    #[error("{0}")]
    PermissionDenied(String),
    /// A fault of this server (an answer of the wrong kind): a bug.
    #[error("internal error: {0}")]
    Internal(String),

    // Starting and running the replica.
    /// A configuration value is wrong: fix it in the file or the flags.
    #[error("config {file}: {message}")]
    Config {
        /// The file, the field (`peers`, `raft_peers`) or `config`.
        file: String,
        /// What is wrong.
        message: String,
    },
    /// The configuration file cannot be read.
    #[error("config {}: cannot read", file.display())]
    ReadConfig {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The configuration file is not valid TOML, or a field has the wrong type.
    #[error("config {}: not a replica configuration", file.display())]
    ParseConfig {
        /// The file.
        file: PathBuf,
        /// The parser's error (it gives the line and column).
        source: Box<toml::de::Error>,
    },
    /// The configuration cannot be written as TOML (a bug: every value has a TOML form).
    #[error("config {}: cannot encode", file.display())]
    EncodeConfig {
        /// The file.
        file: PathBuf,
        /// The encoder's error.
        source: toml::ser::Error,
    },
    /// The configuration file cannot be written.
    #[error("config {}: cannot write", file.display())]
    WriteConfig {
        /// The file.
        file: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The cluster spec the configuration names is unreadable or invalid (the source names the
    /// file, the field and the line).
    #[error("cannot load the cluster spec")]
    ClusterSpec(#[source] Box<SpecError>),
    /// The data directory cannot be created.
    #[error("cannot create the data directory {}", dir.display())]
    DataDir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The sockets passed by the process that started this one are unusable or do not match
    /// the configuration.
    #[error("sockets passed by the parent process (LISTEN_FDS): {0}")]
    Inherited(String),
    /// A socket passed by the parent process cannot be taken over.
    #[error("sockets passed by the parent process (LISTEN_FDS): descriptor {fd} (`{name}`): {what}")]
    InheritedSocket {
        /// The descriptor.
        fd: i32,
        /// Its name in `LISTEN_FDNAMES`.
        name: String,
        /// What failed, e.g. `cannot set close-on-exec`.
        what: &'static str,
        /// Why.
        source: std::io::Error,
    },
    /// A listen address cannot be bound or used: free the port or pick another address.
    #[error("cannot listen on {addr}")]
    Listen {
        /// The address (or which listener).
        addr: String,
        /// Why.
        source: std::io::Error,
    },
    /// The replica's driver thread cannot be started.
    #[error("cannot start the driver thread of replica {replica}")]
    DriverThread {
        /// The replica.
        replica: u64,
        /// Why.
        source: std::io::Error,
    },
    /// The driver thread panicked: a bug; the log above says where.
    #[error("the driver thread of replica {replica} panicked (see the log above)")]
    DriverPanicked {
        /// The replica.
        replica: u64,
    },
    /// The replica failed while serving (storage, raft): restart it; it recovers from what is
    /// durable.
    #[error("replica {replica} failed")]
    ReplicaFailed {
        /// The replica.
        replica: u64,
        /// Why.
        source: Box<ReplicaError>,
    },
    /// A gRPC server stopped with an error.
    #[error("gRPC server on {addr} failed")]
    Serve {
        /// Its listen address.
        addr: String,
        /// Why.
        source: tonic::transport::Error,
    },
    /// The TLS directory is missing, malformed, or TLS was neither configured nor refused
    /// explicitly.
    #[error("TLS")]
    Tls(#[source] Box<tessera_proto::tls::TlsError>),
    /// The HTTP API cannot make its client of the view.
    #[error("HTTP API on {addr}: cannot make a view client")]
    HttpClient {
        /// The HTTP listen address.
        addr: String,
        /// Why.
        source: Box<tessera_proto::client::ClientError>,
    },
}

// Every request's answer carries a `Result<_, ViewServerError>` through the driver's channels:
// the rare, large causes (the start's, the replica's) are boxed to keep it within this budget.
const _: () = assert!(std::mem::size_of::<ViewServerError>() <= 64);

impl From<tessera_proto::tls::TlsError> for ViewServerError {
    fn from(e: tessera_proto::tls::TlsError) -> Self {
        ViewServerError::Tls(Box::new(e))
    }
}

impl From<ReplicaError> for ViewServerError {
    fn from(e: ReplicaError) -> Self {
        ViewServerError::Replica(Box::new(e))
    }
}

fn leader_text(leader: &u64, addr: &Option<String>) -> String {
    match (leader, addr) {
        (0, _) => "no leader is known yet (election in progress?)".to_string(),
        (l, Some(a)) => format!("the leader is replica {l} at {a}"),
        (l, None) => format!("the leader is replica {l} (address unknown)"),
    }
}

impl ViewServerError {
    /// The gRPC code the error answers with; `From<ViewServerError> for Status` uses it, and the
    /// HTTP API maps it on with [`crate::http::http_of_grpc`]. Errors of the start never answer
    /// a request: they are `Internal`, or `Unavailable` when another replica may serve.
    pub fn code(&self) -> Code {
        use ViewServerError as E;
        match self {
            E::NotLeader { .. } | E::Stopped(_) | E::OutcomeUnknown(_) | E::Replica(_) => Code::Unavailable,
            E::ReplicaFailed { .. } | E::DriverPanicked { .. } => Code::Unavailable,
            E::Busy(_) => Code::ResourceExhausted,
            E::Timeout { .. } => Code::DeadlineExceeded,
            E::NotFound(_) => Code::NotFound,
            E::Unauthenticated(_) => Code::Unauthenticated,
            E::PermissionDenied(_) => Code::PermissionDenied,
            E::Invalid(_) => Code::InvalidArgument,
            E::Precondition(_) | E::ServerDown { .. } => Code::FailedPrecondition,
            E::View(ViewError::UnknownJob(_) | ViewError::UnknownServer(_)) => Code::NotFound,
            E::View(ViewError::InvalidSpec(_) | ViewError::NeverFits(_) | ViewError::BadRequestId(_)) => {
                Code::InvalidArgument
            }
            E::View(_) => Code::FailedPrecondition,
            E::Internal(_)
            | E::Config { .. }
            | E::ReadConfig { .. }
            | E::ParseConfig { .. }
            | E::EncodeConfig { .. }
            | E::WriteConfig { .. }
            | E::ClusterSpec(_)
            | E::DataDir { .. }
            | E::Inherited(_)
            | E::InheritedSocket { .. }
            | E::Listen { .. }
            | E::DriverThread { .. }
            | E::Serve { .. }
            | E::Tls(_)
            | E::HttpClient { .. } => Code::Internal,
        }
    }
}

impl From<ViewServerError> for Status {
    fn from(e: ViewServerError) -> Status {
        let mut s = Status::new(e.code(), chain(&e));
        if let ViewServerError::NotLeader { addr: Some(a), .. } = &e
            && let Ok(v) = a.parse()
        {
            s.metadata_mut().insert(LEADER_KEY, v);
        }
        s
    }
}

pub use tessera_proto::error::chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_carry_the_code_the_cause_and_the_leader() {
        let e = ViewServerError::NotLeader { leader: 2, addr: Some("10.0.0.2:7000".into()) };
        let s = Status::from(e);
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(s.metadata().get(LEADER_KEY).and_then(|v| v.to_str().ok()), Some("10.0.0.2:7000"));
        let source = std::io::Error::new(std::io::ErrorKind::AddrInUse, "address in use");
        let e = ViewServerError::Listen { addr: "0.0.0.0:7000".into(), source };
        assert_eq!(e.to_string(), "cannot listen on 0.0.0.0:7000");
        let s = Status::from(e);
        assert_eq!((s.code(), s.message()), (Code::Internal, "cannot listen on 0.0.0.0:7000: address in use"));
        let s = Status::from(ViewServerError::from(ViewError::UnknownJob(tessera_view::JobId(7))));
        assert_eq!(s.code(), Code::NotFound);
    }
}
