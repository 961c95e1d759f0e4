//! Errors of the view service, and how they map to gRPC status codes.

use thiserror::Error;
use tonic::{Code, Status};

/// Metadata key of a follower's answer to a write: the leader's address.
pub use tessera_proto::LEADER_KEY;

/// Why a request to the replica's driver failed.
#[derive(Debug, Error)]
pub enum NodeError {
    /// Writes go to the leader.
    #[error("not the leader; {}", leader_text(.leader, .addr))]
    NotLeader {
        /// The leader's id, 0 if unknown.
        leader: u64,
        /// Its address, if known.
        addr: Option<String>,
    },
    /// Too many requests queued or in flight.
    #[error("busy: {0}; retry after a backoff")]
    Busy(String),
    /// No answer within the request timeout; the outcome of a write is unknown.
    #[error("timed out after {0} ms; the outcome is unknown")]
    Timeout(u64),
    /// The request names something that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// The request is malformed.
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
    /// The replica is shutting down or failed.
    #[error("replica stopped: {0}")]
    Stopped(String),
}

fn leader_text(leader: &u64, addr: &Option<String>) -> String {
    match (leader, addr) {
        (0, _) => "no leader is known yet (election in progress?)".to_string(),
        (l, Some(a)) => format!("the leader is replica {l} at {a}"),
        (l, None) => format!("the leader is replica {l} (address unknown)"),
    }
}

impl From<NodeError> for Status {
    fn from(e: NodeError) -> Status {
        let msg = e.to_string();
        match e {
            NodeError::NotLeader { addr, .. } => {
                let mut s = Status::new(Code::Unavailable, msg);
                if let Some(a) = addr
                    && let Ok(v) = a.parse()
                {
                    s.metadata_mut().insert(LEADER_KEY, v);
                }
                s
            }
            NodeError::Busy(_) => Status::new(Code::ResourceExhausted, msg),
            NodeError::Timeout(_) => Status::new(Code::DeadlineExceeded, msg),
            NodeError::NotFound(_) => Status::new(Code::NotFound, msg),
            NodeError::Invalid(_) => Status::new(Code::InvalidArgument, msg),
            NodeError::Precondition(_) | NodeError::ServerDown { .. } => Status::new(Code::FailedPrecondition, msg),
            NodeError::Stopped(_) => Status::new(Code::Unavailable, msg),
        }
    }
}

/// Why a replica could not start or stopped.
#[derive(Debug, Error)]
pub enum ServeError {
    /// The configuration is wrong.
    #[error("config {file}: {message}")]
    Config {
        /// The file (or "flags").
        file: String,
        /// What is wrong.
        message: String,
    },
    /// The replica's storage or raft failed.
    #[error(transparent)]
    Replica(#[from] tessera_replica::ReplicaError),
    /// The sockets passed by the process that started this one are unusable or do not match
    /// the configuration.
    #[error("sockets passed by the parent process (LISTEN_FDS): {0}")]
    Inherited(String),
    /// The gRPC server failed.
    #[error("gRPC server on {addr}: {why}")]
    Server {
        /// Listen address.
        addr: String,
        /// Why.
        why: String,
    },
}
