use super::*;
use crate::cluster_spec::ClusterSpec;
use crate::ids::{JobId, ProposalId};
use crate::invariants;
use crate::job::{JobSpec, RunSettings};
use crate::placement::Proposal;
use crate::server::Cordon;
use crate::topology::Topology;
use crate::view::{Command, Outcome};

const T0: u64 = 1_800_000_000_000;

/// Four seed-8gpu servers, two to a rack (rack-0: 0 and 1; rack-1: 2 and 3).
fn view() -> ClusterView {
    let topo = Topology::preset("seed-8gpu").expect("preset");
    let mut v = ClusterView::from_spec(&ClusterSpec::uniform(topo, 4, 2, 1));
    v.advance_clock(T0);
    v
}

fn spec(members: u32, gpus: u32, tolerate: LocalityLevel) -> JobSpec {
    JobSpec { memory_mib_per_gpu: Some(1024), tolerate, ..JobSpec::simple("j", members, gpus) }
}

/// Admits `spec` and places one member on each of `servers` (planned by the fit function).
fn place(v: &mut ClusterView, spec: JobSpec, servers: &[u32], id: u64) -> JobId {
    let job = v.submit(spec.clone()).expect("admitted");
    let mut recs = v.servers().to_vec();
    let members: Vec<MemberPlacement> = servers
        .iter()
        .map(|&s| {
            let rec = recs[s as usize];
            let topo = v.topology_of(rec.config_set);
            let req = fit::member_request(&spec, topo);
            let (m, _) = fit::plan_member(topo, &rec, ServerId(s), &req, LocalityLevel::Server, FitMode::Pack)
                .expect("the member fits");
            take(&mut recs[s as usize], &m);
            m
        })
        .collect();
    let p = Proposal { id: ProposalId(id), job, members, based_on: v.version() };
    assert!(v.propose(&p).is_placed(), "{job} placed on {servers:?}");
    job
}

fn drain(v: &mut ClusterView, s: u32, in_ms: u64) {
    let c = Cordon { reason: "maintenance".into(), since_ms: T0, drain_by_ms: Some(T0 + in_ms) };
    v.cordon(ServerId(s), c).expect("drained");
}

/// Applies the moves as the leader does (one `Migrate`), each accepted.
fn apply(v: &mut ClusterView, moves: &[Move], first_id: u64) {
    let ps: Vec<Proposal> = moves
        .iter()
        .enumerate()
        .map(|(i, m)| Proposal {
            id: ProposalId(first_id + i as u64),
            job: m.job,
            members: m.to.clone(),
            based_on: v.version(),
        })
        .collect();
    match v.apply(&Command::Migrate(ps)) {
        Outcome::Decided(ds) => assert!(ds.iter().all(|d| d.is_placed()), "{ds:?}"),
        o => panic!("unexpected outcome {o:?}"),
    }
    let rep = invariants::check(v);
    assert!(rep.is_clean(), "{:?}", rep.violations);
}

#[test]
fn a_gang_on_a_drained_server_moves_to_the_fullest_server_that_takes_it() {
    let mut v = view();
    let a = place(&mut v, spec(1, 2, LocalityLevel::Server), &[0], 1);
    // Server 3 is the fullest with room for two GPUs: the best fit.
    place(&mut v, spec(1, 4, LocalityLevel::Server), &[3], 2);
    drain(&mut v, 0, 60_000);
    let moves = drain_moves(&v, ServerId(0), MAX_DRAIN_MOVES);
    assert_eq!(moves.len(), 1, "{moves:?}");
    assert_eq!((moves[0].job, moves[0].to[0].server), (a, ServerId(3)));
    apply(&mut v, &moves, 10);
    assert!(!v.hosts_gangs(ServerId(0)), "the drained server is empty before its deadline");
    assert_eq!(v.job(a).map(|j| j.state), Some(JobState::Migrating));
    assert!(drain_moves(&v, ServerId(0), MAX_DRAIN_MOVES).is_empty(), "nothing left to move");
}

#[test]
fn a_gang_across_servers_keeps_its_other_members_and_its_rack() {
    let mut v = view();
    // Two members in rack-0 (servers 0 and 1), tolerating a rack.
    let g = place(&mut v, spec(2, 4, LocalityLevel::Rack), &[0, 1], 1);
    let before = v.job(g).and_then(|j| j.placement.clone()).expect("placed");
    drain(&mut v, 0, 60_000);
    // Server 1 has 4 GPUs left: the moved member joins its sibling there, in the same rack.
    let moves = drain_moves(&v, ServerId(0), MAX_DRAIN_MOVES);
    assert_eq!(moves.len(), 1);
    assert_eq!(moves[0].to[1], before.members[1], "the member elsewhere stays exactly where it is");
    assert_eq!(moves[0].to[0].server, ServerId(1), "in the sibling's rack");
    apply(&mut v, &moves, 10);
    assert!(v.job(g).and_then(|j| j.placement.as_ref()).is_some_and(|p| p.level <= LocalityLevel::Rack));
}

#[test]
fn nothing_moves_to_a_looser_placement_or_out_of_its_rack() {
    let mut v = view();
    place(&mut v, spec(2, 4, LocalityLevel::Rack), &[0, 1], 1);
    // Fill server 1: the rack has no room left; servers 2 and 3 (rack-1) would loosen the gang.
    place(&mut v, spec(1, 4, LocalityLevel::Server), &[1], 2);
    drain(&mut v, 0, 60_000);
    assert!(drain_moves(&v, ServerId(0), MAX_DRAIN_MOVES).is_empty(), "waits for the deadline instead");
}

#[test]
fn gangs_that_end_first_stay_and_only_drains_before_their_deadline_move_anything() {
    let mut v = view();
    let mut short = spec(1, 1, LocalityLevel::Server);
    short.run = RunSettings { time_limit_s: Some(30), ..RunSettings::default() };
    place(&mut v, short, &[0], 1);
    let long = place(&mut v, spec(1, 1, LocalityLevel::Server), &[0], 2);
    // A cordon without a deadline moves nothing.
    let c = Cordon { reason: "x".into(), since_ms: T0, drain_by_ms: None };
    v.cordon(ServerId(0), c).expect("cordoned");
    assert!(drain_moves(&v, ServerId(0), MAX_DRAIN_MOVES).is_empty());
    drain(&mut v, 0, 60_000);
    let moves = drain_moves(&v, ServerId(0), MAX_DRAIN_MOVES);
    assert_eq!(moves.iter().map(|m| m.job).collect::<Vec<_>>(), vec![long], "the 30 s job ends before the deadline");
    assert!(drain_moves(&v, ServerId(0), 0).is_empty(), "the bound holds");
    // Past the deadline eviction takes over.
    v.advance_clock(T0 + 60_000);
    assert!(drain_moves(&v, ServerId(0), MAX_DRAIN_MOVES).is_empty());
}

#[test]
fn several_gangs_share_the_room_left_without_overlapping() {
    let mut v = view();
    for i in 0..4 {
        place(&mut v, spec(1, 2, LocalityLevel::Server), &[0], i + 1);
    }
    // Servers 1, 2 and 3 keep 2 GPUs free each: three of the four gangs find a home.
    for (s, id) in [(1, 11), (2, 12), (3, 13)] {
        place(&mut v, spec(1, 6, LocalityLevel::Server), &[s], id);
    }
    drain(&mut v, 0, 60_000);
    let moves = drain_moves(&v, ServerId(0), MAX_DRAIN_MOVES);
    assert_eq!(moves.len(), 3, "{moves:?}");
    apply(&mut v, &moves, 100);
    assert_eq!(
        v.jobs().iter().filter(|j| j.placement.as_ref().is_some_and(|p| p.members[0].server == ServerId(0))).count(),
        1
    );
}
