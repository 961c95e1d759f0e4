//! Raft messages no correct peer sends, dropped before raft-rs sees them ([`forged`]): raft-rs
//! 0.7 panics on some, or moves its state backwards, instead of refusing them. Most were found
//! by the `raft_messages` fuzz target; each has a test in `tests/forged.rs`.

use crate::codec;
use raft::eraftpb::{Message, Snapshot};
use raft::{Raft, StateRole, Storage};

/// Why `m` cannot come from a correct peer, if it cannot. Checked before raft-rs sees it,
/// because raft-rs 0.7 panics on some such messages instead of refusing them:
/// - a heartbeat committing past this log's last index (`RaftLog::commit_to`): a leader
///   sends at most what this follower acknowledged;
/// - an append whose entries do not follow its `index` one by one: a leader sends exactly
///   those, and others can contradict committed entries (`RaftLog::maybe_append`);
/// - an acknowledgement of entries past this log's last index: a follower acknowledges only
///   what it was sent, and the leader would track progress it never made;
/// - a forwarded proposal or read-index request carrying a term, a proposal without
///   entries, a read-index request without its one context entry, or a leadership transfer request sent to a follower: raft-rs panics
///   forwarding or stepping such a one;
/// - an append whose previous entry has term 0 (past index 0), or whose entries' terms are
///   0, decrease, or exceed the message's term: raft-rs reads past its log as term 0 and
///   commits entries it does not have;
/// - any other message without a term: raft-rs takes it as a local one, skips its term
///   checks and panics (a vote answered with term 0) or moves its term back to 0;
/// - a vote for this replica once it is no longer a voter: raft-rs would make it a leader
///   that does not track itself (panic);
/// - a snapshot whose membership raft-rs cannot restore (panic) or whose data is not a view
///   snapshot (the replica would stop on it).
///
/// Found by the `raft_messages` fuzz target (`fuzz/`, `tessera_testkit::fuzz`).
pub(crate) fn forged<S: Storage>(raft: &Raft<S>, m: &Message) -> Option<String> {
    use raft::eraftpb::MessageType::{
        MsgAppend, MsgAppendResponse, MsgHeartbeat, MsgPropose, MsgReadIndex, MsgRequestPreVoteResponse,
        MsgRequestVoteResponse, MsgSnapshot, MsgTransferLeader,
    };
    let last = raft.raft_log.last_index();
    match m.get_msg_type() {
        MsgPropose | MsgReadIndex if m.term != 0 => {
            Some(format!("a forwarded {:?} carries term {}", m.get_msg_type(), m.term))
        }
        MsgPropose if m.entries.is_empty() => Some("a proposal without entries".into()),
        MsgReadIndex if m.entries.len() != 1 => {
            Some(format!("a read-index request with {} entries (its context is one)", m.entries.len()))
        }
        // Only a leader is sent a (forwarded) transfer request; a follower would forward it
        // again with its term set, and raft-rs panics sending that.
        MsgTransferLeader if raft.state != StateRole::Leader => {
            Some("a leadership transfer request sent to a follower".into())
        }
        // raft-rs takes a term-0 message as a local one and skips its term checks: a
        // candidate then follows the sender at term 0, or answers a vote with term 0 (panic).
        t if m.term == 0 && !matches!(t, MsgPropose | MsgReadIndex) => Some(format!("a {t:?} without a term")),
        MsgSnapshot => snapshot_forged(m.get_snapshot()),
        // A replica removed from the voters while campaigning (it applied its removal as a
        // candidate) must not win: raft-rs would make it a leader it cannot track (panic).
        MsgRequestVoteResponse | MsgRequestPreVoteResponse if !raft.promotable() => {
            Some("a vote for a replica that is not a voter".into())
        }
        MsgHeartbeat if m.commit > last => {
            Some(format!("a heartbeat commits to {} past the last index {last}", m.commit))
        }
        MsgAppend if m.entries.iter().enumerate().any(|(i, e)| Some(e.index) != m.index.checked_add(1 + i as u64)) => {
            let got: Vec<u64> = m.entries.iter().map(|e| e.index).collect();
            Some(format!("an append after index {} carries entries {got:?}", m.index))
        }
        // raft-rs reads the term of an index past the log as 0: such an append "matches"
        // and commits entries the log does not have (panic).
        MsgAppend if m.index > 0 && m.log_term == 0 => Some(format!("an append after index {} of term 0", m.index)),
        MsgAppend
            if m.entries.iter().enumerate().any(|(i, e)| {
                let prev = if i == 0 { m.log_term } else { m.entries[i - 1].term };
                e.term == 0 || e.term < prev || e.term > m.term
            }) =>
        {
            let got: Vec<u64> = m.entries.iter().map(|e| e.term).collect();
            Some(format!("an append at term {} after log term {} carries entry terms {got:?}", m.term, m.log_term))
        }
        MsgAppendResponse if !m.reject && m.index > last => {
            Some(format!("an acknowledgement of index {} past the last index {last}", m.index))
        }
        _ => None,
    }
}

/// Why a snapshot in a raft message cannot come from a correct leader, if it cannot: an empty
/// one, a membership that is not a plain set of voters and learners (this cluster never uses
/// joint consensus; raft-rs panics restoring some others), or data that is not a view snapshot.
fn snapshot_forged(s: &Snapshot) -> Option<String> {
    let meta = s.get_metadata();
    let cs = meta.get_conf_state();
    if meta.index == 0 {
        return Some("a snapshot at index 0".into());
    }
    if cs.voters.is_empty() || !cs.voters_outgoing.is_empty() || !cs.learners_next.is_empty() || cs.auto_leave {
        return Some(format!("a snapshot with membership {cs:?}"));
    }
    let mut ids: Vec<u64> = cs.voters.iter().chain(&cs.learners).copied().collect();
    let n = ids.len();
    ids.sort_unstable();
    ids.dedup();
    if ids.len() != n || ids.contains(&0) {
        return Some(format!("a snapshot whose members repeat or include 0: {cs:?}"));
    }
    codec::decode_snapshot(s.get_data()).err().map(|e| format!("a snapshot whose data does not decode: {e}"))
}
