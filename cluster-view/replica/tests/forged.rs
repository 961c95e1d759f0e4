//! Raft messages a replica never gets from a correct peer — forged, or corrupted in a way the
//! decoder accepts — are dropped, not stepped: raft-rs ends the process on some of them (a
//! heartbeat committing past the log, entries that contradict committed ones, an
//! acknowledgement of entries the leader never wrote). The replica keeps working after each.

use raft::eraftpb::{Entry, Message, MessageType};
use tessera_replica::{MemBackend, Replica, ReplicaConfig};
use tessera_view::{ClusterSpec, ClusterView, Topology};

fn initial() -> ClusterView {
    ClusterView::from_spec(&ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 2, 2, 1))
}

/// Replica `id` of a 3-replica cluster, fresh (its log holds the bootstrap entry only).
fn replica(id: u64) -> Replica<MemBackend> {
    let cfg = ReplicaConfig { sync: false, ..ReplicaConfig::new(id, vec![1, 2, 3], "forged") };
    Replica::with_backend(cfg, MemBackend::new(), initial).expect("open")
}

fn msg(kind: MessageType, from: u64, to: u64, term: u64) -> Message {
    let mut m = Message::default();
    m.set_msg_type(kind);
    (m.from, m.to, m.term) = (from, to, term);
    m
}

fn entry(index: u64, term: u64) -> Entry {
    let mut e = Entry::default();
    (e.index, e.term) = (index, term);
    e
}

/// The replica still elects itself and commits after the forged message (a single step of each
/// kind of work: it campaigns, and its state machine answers).
fn still_works(r: &mut Replica<MemBackend>) {
    let applied = r.applied_index();
    r.campaign().expect("campaign");
    r.tick();
    assert!(r.term() > 0);
    assert!(r.applied_index() >= applied);
}

#[test]
fn a_heartbeat_that_commits_past_the_log_is_dropped() {
    let mut r = replica(1);
    let mut m = msg(MessageType::MsgHeartbeat, 2, 1, 2);
    m.commit = 1_000;
    r.step(m);
    still_works(&mut r);
}

#[test]
fn entries_that_contradict_committed_ones_are_dropped() {
    let mut r = replica(1);
    let mut m = msg(MessageType::MsgAppend, 2, 1, 2);
    (m.index, m.log_term, m.commit) = (1, 1, 1);
    // Not the entries after `index`: one that rewrites the committed entry 1.
    m.entries = vec![entry(1, 2), entry(2, 2)].into();
    r.step(m);
    still_works(&mut r);
}

#[test]
fn an_acknowledgement_of_entries_the_leader_never_wrote_is_dropped() {
    let mut r = replica(1);
    let before = r.applied_index();
    r.campaign().expect("campaign");
    r.on_ready().expect("ready");
    // Replica 2 grants its pre-vote (at the term it would campaign at), then its vote, so it
    // leads and appends its first entry of the term.
    if r.role() == "pre-candidate" {
        r.step(msg(MessageType::MsgRequestPreVoteResponse, 2, 1, r.term() + 1));
        r.on_ready().expect("ready");
    }
    let term = r.term();
    r.step(msg(MessageType::MsgRequestVoteResponse, 2, 1, term));
    assert!(r.is_leader(), "{}", r.role());
    r.on_ready().expect("ready");
    // Replica 3 "acknowledges" index 1,000. Taken, it would make {1, 3} a quorum holding the
    // new entry, which only replica 1 holds: committed without a real majority.
    let mut ack = msg(MessageType::MsgAppendResponse, 3, 1, term);
    ack.index = 1_000;
    r.step(ack);
    for _ in 0..3 {
        r.on_ready().expect("ready");
    }
    assert_eq!(r.applied_index(), before, "nothing commits until a real majority holds it");
    // The real acknowledgement from replica 2 commits it.
    let mut real = msg(MessageType::MsgAppendResponse, 2, 1, term);
    // The log: the bootstrap snapshot at `before` (1), the leader's first entry after it.
    real.index = before + 1;
    r.step(real);
    for _ in 0..3 {
        r.on_ready().expect("ready");
    }
    assert!(r.applied_index() > before, "a majority commits");
    still_works(&mut r);
}

/// Found by the `raft_messages` fuzz target: a follower forwards a peer's proposal to its
/// leader, and raft-rs panics sending one that carries a term (correct peers send term 0).
#[test]
fn a_forwarded_proposal_with_a_term_is_dropped() {
    let mut r = replica(1);
    // Follow replica 2 at term 2, then take a "forwarded" proposal with a term from 3.
    let mut hb = msg(MessageType::MsgHeartbeat, 2, 1, 2);
    hb.commit = 1;
    r.step(hb);
    r.on_ready().expect("ready");
    let mut m = msg(MessageType::MsgPropose, 3, 1, 2);
    m.entries = vec![entry(0, 0)].into();
    r.step(m);
    r.on_ready().expect("ready");
    // A proposal without entries and a vote request without a term, likewise.
    r.step(msg(MessageType::MsgPropose, 3, 1, 0));
    r.step(msg(MessageType::MsgRequestPreVote, 3, 1, 0));
    r.on_ready().expect("ready");
    still_works(&mut r);
}

/// A snapshot whose membership raft-rs cannot restore, or whose data is not a view, is dropped.
#[test]
fn a_snapshot_with_a_bad_membership_or_data_is_dropped() {
    let mut r = replica(1);
    for (voters, learners, data) in
        [(vec![], vec![], true), (vec![2, 3], vec![2], true), (vec![1, 2, 3], vec![], false)]
    {
        let mut m = msg(MessageType::MsgSnapshot, 2, 1, 5);
        let s = m.mut_snapshot();
        s.mut_metadata().index = 50;
        s.mut_metadata().term = 5;
        s.mut_metadata().mut_conf_state().voters = voters;
        s.mut_metadata().mut_conf_state().learners = learners;
        s.data = if data { Vec::new().into() } else { b"not a snapshot".to_vec().into() };
        r.step(m);
        r.on_ready().expect("ready");
    }
    assert_eq!(r.applied_index(), 1, "no snapshot installed");
    still_works(&mut r);
}

/// Found by the `raft_messages` fuzz target: raft-rs reads the term of an index past its log
/// as 0, so an append "after index 3 of term 0" matched a log of 1 entry and committed to 3.
#[test]
fn an_append_after_an_index_of_term_zero_is_dropped() {
    let mut r = replica(1);
    let mut m = msg(MessageType::MsgAppend, 2, 1, 2);
    (m.index, m.log_term, m.commit) = (3, 0, 3);
    r.step(m);
    r.on_ready().expect("ready");
    // Entries of term 0 past the log, likewise.
    let mut m = msg(MessageType::MsgAppend, 2, 1, 2);
    (m.index, m.log_term, m.commit) = (1, 1, 3);
    m.entries = vec![entry(2, 0), entry(3, 0)].into();
    r.step(m);
    r.on_ready().expect("ready");
    still_works(&mut r);
}

/// Found by the `raft_messages` fuzz target: a follower forwards a transfer request to its
/// leader with its own term set (raft-rs panics), and a leader indexes a read request's first
/// entry (panic without one). Neither reaches raft-rs.
#[test]
fn a_transfer_request_to_a_follower_and_a_read_without_context_are_dropped() {
    let mut r = replica(1);
    let mut hb = msg(MessageType::MsgHeartbeat, 2, 1, 2);
    hb.commit = 1;
    r.step(hb);
    r.on_ready().expect("ready");
    r.step(msg(MessageType::MsgTransferLeader, 3, 1, 2));
    r.on_ready().expect("ready");
    r.step(msg(MessageType::MsgReadIndex, 3, 1, 0));
    r.on_ready().expect("ready");
    still_works(&mut r);
    // Now the leader: a read-index request without its context entry.
    for _ in 0..3 {
        r.on_ready().expect("ready");
    }
    r.step(msg(MessageType::MsgReadIndex, 3, 1, 0));
    r.on_ready().expect("ready");
}
