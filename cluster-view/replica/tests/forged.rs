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
