//! Targeted tests of the replica's checks: the leader pre-check against gangs in flight (one
//! fit function), and snapshots from the leader checked before they replace anything. The
//! replicas run on the in-memory backend (`MemBackend`), which is real storage code.

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Message, MessageType, Snapshot, SnapshotMetadata};
use tessera_replica::codec::{self, SnapshotData};
use tessera_replica::{Answer, MemBackend, Replica, ReplicaConfig, ReplicaError};
use tessera_view::placement::Rejection;
use tessera_view::{
    ClusterSpec, ClusterView, Command, CoreMask, Decision, JobId, JobSpec, MemberPlacement, Outcome, Proposal,
    ProposalId, ServerId, Topology,
};

fn topo() -> Topology {
    Topology::preset("seed-8gpu").expect("preset")
}

fn initial() -> ClusterView {
    ClusterView::from_spec(&ClusterSpec::uniform(topo(), 6, 3, 1))
}

/// Runs `on_ready` until `ticket` is answered (bounded).
fn answer(r: &mut Replica<MemBackend>, ticket: u64) -> Answer {
    for _ in 0..20 {
        r.on_ready().expect("ready");
        if let Some((_, a)) = r.take_outcomes().into_iter().find(|(t, _)| *t == ticket) {
            return a;
        }
    }
    panic!("ticket {ticket} never answered");
}

/// A single-voter replica that leads, on a fresh simulated disk.
fn leader() -> Replica<MemBackend> {
    let mut r =
        Replica::with_backend(ReplicaConfig::new(1, vec![1], "checks"), MemBackend::new(), initial).expect("open");
    r.campaign().expect("campaign");
    for _ in 0..10 {
        r.on_ready().expect("ready");
        if r.is_leader() {
            return r;
        }
    }
    panic!("a single voter did not lead");
}

fn submit(r: &mut Replica<MemBackend>, spec: JobSpec) -> JobId {
    let t = r.propose(Command::submit(spec)).expect("propose");
    match answer(r, t) {
        Answer::Applied(Outcome::Submitted(Ok(job))) => job,
        other => panic!("submit answered {other:?}"),
    }
}

fn member(server: u32, gpu: u32, first_core: u32, memory_mib: u32) -> MemberPlacement {
    MemberPlacement { server: ServerId(server), gpus: 1 << gpu, cores: CoreMask::range(first_core, 4), memory_mib }
}

/// The immediate answer to gang proposal `id` of `job`, if the pre-check decided it.
fn immediate(r: &mut Replica<MemBackend>, id: u64, job: JobId, members: Vec<MemberPlacement>) -> Option<Decision> {
    let p = Proposal { id: ProposalId(id), job, members, based_on: r.view().version() };
    let t = r.propose_gang(p).expect("propose_gang");
    r.take_outcomes().into_iter().find(|(x, _)| *x == t).map(|(_, a)| match a {
        Answer::Immediate(d) => d,
        other => panic!("expected an immediate decision, got {other:?}"),
    })
}

#[test]
fn the_pre_check_refuses_what_gangs_in_flight_hold_with_records_net_of_them() {
    let mut r = leader();
    let mem = topo().memory_mib;
    let half = mem / 2;
    let mut big = JobSpec::simple("big-memory", 1, 1);
    big.memory_mib_per_gpu = Some(half);
    let a = submit(&mut r, big.clone());
    let mut pair = JobSpec::simple("pair", 2, 1);
    pair.memory_mib_per_gpu = Some(half);
    let b = submit(&mut r, pair);
    let c = submit(&mut r, JobSpec::simple("small", 1, 1));
    let d = submit(&mut r, big);
    let rec0 = *r.view().server(ServerId(0)).expect("server 0");

    // A takes GPU 0, cores 0..4 and half the memory of server 0; it stays in flight (no
    // on_ready yet).
    assert_eq!(immediate(&mut r, 1, a, vec![member(0, 0, 0, half)]), None);
    assert_eq!(r.in_flight(), 1);
    let mut net = rec0;
    net.free_gpus &= !1;
    net.free_cores = net.free_cores.without(CoreMask::range(0, 4));
    net.free_memory_mib -= half;

    // C asks for GPU 0 too: refused at once, with server 0's record net of A.
    match immediate(&mut r, 2, c, vec![member(0, 0, 4, mem / 8)]) {
        Some(Decision::Rejected { reason, fresh, .. }) => {
            assert_eq!(reason, Rejection::DevicesBusy { server: ServerId(0), mask: 1 });
            assert_eq!(fresh, vec![(ServerId(0), net)]);
        }
        other => panic!("expected a rejection, got {other:?}"),
    }
    // C on cores A holds: refused for the cores.
    match immediate(&mut r, 3, c, vec![member(0, 1, 2, mem / 8)]) {
        Some(Decision::Rejected { reason: Rejection::CoresBusy { server, mask }, .. }) => {
            assert_eq!((server, mask), (ServerId(0), CoreMask::range(2, 2)));
        }
        other => panic!("expected a cores rejection, got {other:?}"),
    }
    // B's two members on server 0 each fit what A left (half the memory), not together: the
    // gang's memory on one server adds up, as the approver counts it.
    match immediate(&mut r, 4, b, vec![member(0, 1, 8, half), member(0, 2, 12, half)]) {
        Some(Decision::Rejected { reason, fresh, .. }) => {
            assert_eq!(reason, Rejection::MemoryShort { server: ServerId(0), free: mem - half, asked: 2 * half });
            assert_eq!(fresh, vec![(ServerId(0), net)]);
        }
        other => panic!("expected a memory rejection, got {other:?}"),
    }
    // D alone fits beside A on server 0 (the other half of the memory): accepted into flight.
    assert_eq!(immediate(&mut r, 5, d, vec![member(0, 3, 16, half)]), None);
    // Elsewhere B fits.
    assert_eq!(immediate(&mut r, 6, b, vec![member(1, 0, 0, half), member(1, 1, 4, half)]), None);
    assert_eq!(r.in_flight(), 3);
    // Applied, the three placements hold and nothing is in flight any more.
    for _ in 0..5 {
        r.on_ready().expect("ready");
    }
    assert_eq!(r.in_flight(), 0);
    for job in [a, b, d] {
        assert!(r.view().job(job).is_some_and(|j| j.placement.is_some()), "{job} placed");
    }
    assert!(tessera_view::invariants::check(r.view()).is_clean());
}

/// Replica 1 of three, a follower that has applied its bootstrap (index 1), on `disk`.
fn follower(disk: &MemBackend) -> Replica<MemBackend> {
    Replica::with_backend(ReplicaConfig::new(1, vec![1, 2, 3], "checks"), disk.clone(), initial).expect("open")
}

/// A snapshot message from replica 2 (term 2) at index 5 carrying `data`.
fn snapshot_message(data: Vec<u8>) -> Message {
    let mut meta = SnapshotMetadata { index: 5, term: 2, ..Default::default() };
    meta.set_conf_state(ConfState { voters: vec![1, 2, 3], ..Default::default() });
    let mut snap = Snapshot::default();
    snap.set_metadata(meta);
    snap.set_data(data.into());
    let mut m = Message::default();
    m.set_msg_type(MessageType::MsgSnapshot);
    m.from = 2;
    m.to = 1;
    m.term = 2;
    m.set_snapshot(snap);
    m
}

/// A view at index 5 with one job placed, as a leader would send it.
fn good_view() -> SnapshotData {
    let mut v = initial();
    let job = match v.apply(&Command::submit(JobSpec::simple("j", 1, 1))) {
        Outcome::Submitted(Ok(job)) => job,
        other => panic!("submit: {other:?}"),
    };
    let mem = topo().memory_mib / 8;
    let p = Proposal { id: ProposalId(1), job, members: vec![member(0, 0, 0, mem)], based_on: v.version() };
    assert!(matches!(v.propose(&p), Decision::Accepted { .. }));
    SnapshotData { applied: 5, view: v.snapshot(), addrs: Default::default() }
}

#[test]
fn a_snapshot_from_the_leader_is_checked_before_it_replaces_anything() {
    let encode = |d: &SnapshotData| codec::encode_snapshot(d).expect("encode");
    // The job's GPU shown free as well: a double allocation waiting to happen.
    let mut double = good_view();
    double.view.servers[0].free_gpus |= 1;
    // A snapshot whose view says another index than the snapshot's.
    let mut elsewhere = good_view();
    elsewhere.applied = 4;
    // A server without a name.
    let mut unnamed = good_view();
    unnamed.view.server_names.pop();
    let bad: [(&str, Vec<u8>); 4] = [
        ("double allocation", encode(&double)),
        ("wrong index", encode(&elsewhere)),
        ("server without a name", encode(&unnamed)),
        ("not a snapshot", b"{\"applied\": 5}".to_vec()),
    ];
    for (what, data) in bad {
        let disk = MemBackend::new();
        let mut r = follower(&disk);
        r.on_ready().expect("ready");
        let before = (r.applied_index(), r.view().state_hash());
        r.step(snapshot_message(data));
        match r.on_ready() {
            Err(ReplicaError::BadSnapshot { index: 5, why }) => eprintln!("{what}: refused: {why}"),
            // Undecodable data never reaches raft-rs: the message is dropped as forged
            // (`Replica::step`) and the replica goes on.
            Ok(_) if what == "not a snapshot" => eprintln!("{what}: dropped"),
            other => panic!("{what}: expected a refusal, got {other:?}"),
        }
        assert_eq!((r.applied_index(), r.view().state_hash()), before, "{what}: the state was replaced");
        // Nothing was written: reopened, the replica is where it was.
        drop(r);
        let r = follower(&disk);
        assert_eq!((r.applied_index(), r.view().state_hash()), before, "{what}: the storage was replaced");
    }
    // The same message with a sound view is installed: the checks above can fail only on the
    // data.
    let disk = MemBackend::new();
    let mut r = follower(&disk);
    r.on_ready().expect("ready");
    let good = good_view();
    let hash = ClusterView::from_snapshot(good.view.clone()).state_hash();
    r.step(snapshot_message(encode(&good)));
    r.on_ready().expect("a sound snapshot is installed");
    assert_eq!((r.applied_index(), r.view().state_hash()), (5, hash));
    drop(r);
    assert_eq!(follower(&disk).applied_index(), 5);
    // (The message's bytes, as a transport would send them, encode without loss.)
    let m = snapshot_message(encode(&good));
    assert_eq!(Message::parse_from_bytes(&codec::encode_message(&m).expect("encode")).expect("decode"), m);
}
