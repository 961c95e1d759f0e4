//! What goes into log entries and snapshots.
//!
//! Commands and snapshots are JSON (serde): stable, inspectable with standard tools, and fast
//! enough at this size; the raft messages themselves stay raft-rs's protobuf. An entry's
//! `context` names the proposing replica and its client tickets, so only that replica reports
//! the outcomes of its own proposals.
//!
//! Encoding returns [`ReplicaError::Encode`] instead of empty bytes: a log entry or snapshot
//! is never written empty. No value of these types fails to encode today; if one ever does
//! (a bug), the replica's `on_ready` fails and the process stops, to recover from its log.

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

/// JSON of `value`, or [`ReplicaError::Encode`] naming `what` (fail point `replica::encode`).
pub fn encode_json<T: Serialize + ?Sized>(what: &'static str, value: &T) -> Result<Vec<u8>, ReplicaError> {
    crate::fail_point!("replica::encode", |_| Err(ReplicaError::Encode { what, why: "fail point encode".into() }));
    serde_json::to_vec(value).map_err(|e| ReplicaError::Encode { what, why: e.to_string() })
}

/// The bytes of a raft protobuf message (entry, hard state, message), or
/// [`ReplicaError::Encode`] naming `what`.
pub fn encode_proto(what: &'static str, m: &impl protobuf::Message) -> Result<Vec<u8>, ReplicaError> {
    m.write_to_bytes().map_err(|e| ReplicaError::Encode { what, why: e.to_string() })
}

/// The bytes of a raft message for the transport.
pub fn encode_message(m: &raft::eraftpb::Message) -> Result<Vec<u8>, ReplicaError> {
    encode_proto("raft message", m)
}

/// Encodes the commands of one log entry.
pub fn encode_commands(c: &[Command]) -> Result<Vec<u8>, ReplicaError> {
    encode_json("commands", c)
}

/// Decodes a log entry's commands.
pub fn decode_commands(b: &[u8]) -> Result<Vec<Command>, ReplicaError> {
    serde_json::from_slice(b).map_err(|e| ReplicaError::Decode { what: "commands", why: e.to_string() })
}

/// Encodes snapshot data.
pub fn encode_snapshot(s: &SnapshotData) -> Result<Vec<u8>, ReplicaError> {
    encode_json("snapshot", s)
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
    let (words, rest) = b.as_chunks::<8>();
    match words {
        [replica, boot, tickets @ ..] if rest.is_empty() => Some((
            u64::from_be_bytes(*replica),
            u64::from_be_bytes(*boot),
            tickets.iter().map(|t| u64::from_be_bytes(*t)).collect(),
        )),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contexts_round_trip_and_malformed_ones_are_none() {
        let b = encode_context(3, 7, &[1, 2, u64::MAX]);
        assert_eq!(decode_context(&b), Some((3, 7, vec![1, 2, u64::MAX])));
        assert_eq!(decode_context(&encode_context(3, 7, &[])), Some((3, 7, vec![])));
        assert_eq!(decode_context(&b[..b.len() - 1]), None);
        assert_eq!(decode_context(&b[..8]), None);
        assert_eq!(decode_context(&[]), None);
    }

    #[test]
    fn an_unencodable_value_is_an_error_not_empty_bytes() {
        // JSON object keys must be strings: serde_json refuses a map keyed by pairs.
        let bad: BTreeMap<(u8, u8), u8> = [((1, 2), 3)].into_iter().collect();
        match encode_json("test value", &bad) {
            Err(ReplicaError::Encode { what: "test value", why }) => assert!(why.contains("key"), "{why}"),
            other => panic!("expected an encode error, got {other:?}"),
        }
        assert!(encode_json("ok", &[1u8, 2]).is_ok_and(|b| b == b"[1,2]"));
    }

    /// Found by the `spec_files` fuzz target: serde_json's default float parser read back
    /// 4.4444444444444444e52, as its own writer had written it, one ulp off, so a
    /// job spec changed in the log (and would differ between a replica that applied the entry
    /// and one restored from a snapshot written from it).
    #[test]
    fn floats_come_back_exactly_through_the_log() {
        for v in [4.4444444444444444e52, 4.444444444444445e52, 0.1 + 0.2, f64::MAX, f64::MIN_POSITIVE, 1e-300] {
            let back: Vec<f64> = serde_json::from_slice(&encode_json("floats", &[v]).expect("encode")).expect("decode");
            assert_eq!(back[0].to_bits(), v.to_bits(), "{v:e} came back as {:e}", back[0]);
        }
    }
}
