//! What goes into log entries and snapshots.
//!
//! Commands and snapshots are JSON (serde): stable, inspectable with standard tools, and fast
//! enough at this size; the raft messages themselves stay raft-rs's protobuf. An entry's
//! `context` names the proposing replica and its client tickets, so only that replica reports
//! the outcomes of its own proposals.

use crate::error::ReplicaError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use tessera_view::{Command, ViewSnapshot};

/// The payload of a raft snapshot: the view at an applied index.
#[derive(Debug, Serialize, Deserialize)]
pub struct SnapshotData {
    /// Raft index the view reflects.
    pub applied: u64,
    /// The view.
    pub view: ViewSnapshot,
    /// Replica addresses announced by applied membership changes.
    #[serde(default)]
    pub addrs: BTreeMap<u64, String>,
}

/// Encodes the commands of one log entry.
pub fn encode_commands(c: &[Command]) -> Vec<u8> {
    serde_json::to_vec(c).unwrap_or_default()
}

/// Decodes a log entry's commands.
pub fn decode_commands(b: &[u8]) -> Result<Vec<Command>, ReplicaError> {
    serde_json::from_slice(b).map_err(|e| ReplicaError::Decode { what: "commands", why: e.to_string() })
}

/// Encodes snapshot data.
pub fn encode_snapshot(s: &SnapshotData) -> Vec<u8> {
    serde_json::to_vec(s).unwrap_or_default()
}

/// Decodes snapshot data.
pub fn decode_snapshot(b: &[u8]) -> Result<SnapshotData, ReplicaError> {
    serde_json::from_slice(b).map_err(|e| ReplicaError::Decode { what: "snapshot", why: e.to_string() })
}

/// An entry context: the proposing replica, its incarnation, and its tickets in order.
pub fn encode_context(replica: u64, boot: u64, tickets: &[u64]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 * (2 + tickets.len()));
    out.extend_from_slice(&replica.to_be_bytes());
    out.extend_from_slice(&boot.to_be_bytes());
    for t in tickets {
        out.extend_from_slice(&t.to_be_bytes());
    }
    out
}

/// Decodes an entry context into (replica, incarnation, tickets); `None` for an empty or
/// malformed one.
pub fn decode_context(b: &[u8]) -> Option<(u64, u64, Vec<u64>)> {
    if b.len() < 16 || !b.len().is_multiple_of(8) {
        return None;
    }
    let word = |i: usize| u64::from_be_bytes(b[i * 8..i * 8 + 8].try_into().unwrap_or([0; 8]));
    Some((word(0), word(1), (2..b.len() / 8).map(word).collect()))
}
