//! Properties of the placement search, against brute force and the approver.
//!
//! - Soundness: every placement found is accepted by the approver's `validate` on the same view,
//!   at the level the search reports, within the level allowed.
//! - Tightness: no server could host the gang at a tighter intra-server level than the one found
//!   (brute force over every server with the shared fit helpers).
//! - Completeness: when the search finds nothing for a one-member job, no server can host it.
//! - The index stays consistent with the records through arbitrary updates.

use proptest::prelude::*;
use tessera_scheduler::search::plan_on_server;
use tessera_scheduler::{LocalView, Overlay, find_placement};
use tessera_view::fit::{self, FitMode};
use tessera_view::{
    ClusterSpec, ClusterView, Health, JobSpec, LocalityLevel, Proposal, ProposalId, ServerId, Topology,
};

const PRESETS: [&str; 4] = ["seed-8gpu", "dgx1-v100", "dgx-h100", "pcie-4gpu"];

/// A view with random existing load, placed through the approver (so it is consistent).
fn loaded_view(preset: usize, servers: u32, fill: &[(u8, u8)], down: Option<u32>) -> ClusterView {
    let topo = Topology::preset(PRESETS[preset]).expect("preset");
    let mut view = ClusterView::from_spec(&ClusterSpec::uniform(topo.clone(), servers, 3, 2));
    for (i, &(server, gpus)) in fill.iter().enumerate() {
        let s = ServerId(server as u32 % servers);
        let rec = *view.server(s).expect("server");
        let want = (gpus as u32 % topo.devices) + 1;
        let Some(g) = tessera_view::mask::lowest_set_bits(rec.free_gpus, want) else { continue };
        let job = view.submit(JobSpec::simple("fill", 1, want)).expect("fits");
        let req = fit::member_request(&view.job(job).expect("job").spec, &topo);
        let Some(cores) = fit::pick_cores(&topo, rec.free_cores, g, &req, 0) else { continue };
        let p = Proposal {
            id: ProposalId(10_000 + i as u64),
            job,
            members: vec![tessera_view::MemberPlacement { server: s, gpus: g, cores, memory_mib: req.memory_mib }],
            based_on: view.version(),
        };
        assert!(view.propose(&p).is_placed());
    }
    if let Some(d) = down {
        view.set_health(ServerId(d % servers), Health::Down).expect("server exists");
    }
    view
}

fn level(i: u8) -> LocalityLevel {
    LocalityLevel::ALL[i as usize % 6]
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 400, ..ProptestConfig::default() })]

    #[test]
    fn found_placements_are_approved_tight_and_complete(
        preset in 0usize..4,
        servers in 1u32..10,
        fill in proptest::collection::vec((any::<u8>(), any::<u8>()), 0..30),
        down in proptest::option::of(any::<u32>()),
        members in 1u32..4,
        gpus in 1u32..9,
        allowed in 0u8..6,
        spread in any::<bool>(),
        salt in any::<u64>(),
    ) {
        let mut view = loaded_view(preset, servers, &fill, down);
        let topo = Topology::preset(PRESETS[preset]).expect("preset");
        let gpus = gpus.min(topo.devices);
        let mut spec = JobSpec::simple("probe", members, gpus);
        spec.tolerate = level(allowed);
        spec.prefer = LocalityLevel::PcieSwitch;
        let Ok(job) = view.submit(spec.clone()) else { return Ok(()) };
        let local = LocalView::of_view(&view);
        local.check_index().map_err(|e| TestCaseError::fail(e.to_string()))?;
        let mode = if spread { FitMode::Spread } else { FitMode::Pack };
        let found = find_placement(&local, &Overlay::default(), &spec, spec.tolerate, mode, salt);
        // Brute force: the tightest intra-server level any server offers for the whole gang.
        let req = fit::member_request(&spec, &topo);
        let mut brute: Option<LocalityLevel> = None;
        for l in [LocalityLevel::PcieSwitch, LocalityLevel::Socket, LocalityLevel::Server] {
            if l > spec.tolerate { break; }
            let any = (0..servers).any(|s| {
                let s = ServerId(s);
                plan_on_server(&topo, view.server(s).expect("server"), s, &req, members, l, FitMode::Pack)
                    .is_some_and(|m| view.gang_level(&m) <= l)
            });
            if any { brute = Some(l); break; }
        }
        match found {
            Ok(f) => {
                prop_assert!(f.level <= spec.tolerate, "level {} beyond {}", f.level, spec.tolerate);
                let p = Proposal { id: ProposalId(1), job, members: f.members.clone(), based_on: view.version() };
                let v = view.validate(&p);
                prop_assert_eq!(v.clone().map_err(|e| e.0), Ok(f.level), "approver disagrees: {:?}", v);
                if let Some(b) = brute {
                    prop_assert!(f.level <= b, "found {} but a server offers {}", f.level, b);
                }
            }
            Err(e) => {
                prop_assert!(brute.is_none(), "search found nothing ({e}) but a server offers {:?}", brute);
                if members == 1 {
                    // A one-member job needs a single server; none can host it at all.
                    let any = (0..servers).any(|s| {
                        let s = ServerId(s);
                        fit::plan_member(&topo, view.server(s).expect("server"), s, &req, LocalityLevel::Server, FitMode::Pack).is_some()
                    });
                    prop_assert!(!any || spec.tolerate < LocalityLevel::Server, "a server could host the job");
                }
            }
        }
    }

    #[test]
    fn index_tracks_arbitrary_updates(
        preset in 0usize..4,
        updates in proptest::collection::vec((0u32..12, any::<u64>(), 0u8..3), 0..200),
    ) {
        let topo = Topology::preset(PRESETS[preset]).expect("preset");
        let view = ClusterView::from_spec(&ClusterSpec::uniform(topo.clone(), 12, 4, 2));
        let mut local = LocalView::of_view(&view);
        for (s, free, h) in updates {
            let mut rec = *view.server(ServerId(s)).expect("server");
            rec.free_gpus = free & topo.all_devices();
            rec.health = [Health::Up, Health::Draining, Health::Down][h as usize];
            local.apply_server(ServerId(s), rec);
            local.check_index().map_err(|e| TestCaseError::fail(e.to_string()))?;
        }
    }
}

#[test]
fn gang_larger_than_a_server_lands_in_one_rack_when_it_can() {
    let topo = Topology::preset("seed-8gpu").expect("preset");
    let mut view = ClusterView::from_spec(&ClusterSpec::uniform(topo, 8, 4, 1));
    let mut spec = JobSpec::simple("big", 2, 8);
    spec.tolerate = LocalityLevel::Rack;
    view.submit(spec.clone()).expect("fits");
    let local = LocalView::of_view(&view);
    let f = find_placement(&local, &Overlay::default(), &spec, spec.tolerate, FitMode::Pack, 0).expect("found");
    assert_eq!(f.level, LocalityLevel::Rack);
    assert_eq!(f.members.len(), 2);
    assert_ne!(f.members[0].server, f.members[1].server);
    // Tolerating only `server` it cannot fit: 16 GPUs never share one 8-GPU server.
    assert!(find_placement(&local, &Overlay::default(), &spec, LocalityLevel::Server, FitMode::Pack, 0).is_err());
}

#[test]
fn unknown_gpu_type_is_named() {
    let topo = Topology::preset("seed-8gpu").expect("preset");
    let view = ClusterView::from_spec(&ClusterSpec::uniform(topo, 2, 2, 1));
    let mut spec = JobSpec::simple("typed", 1, 1);
    spec.gpu_type = Some("nvidia-b200".into());
    let e =
        find_placement(&LocalView::of_view(&view), &Overlay::default(), &spec, LocalityLevel::Any, FitMode::Pack, 0)
            .expect_err("no such type");
    assert!(e.to_string().contains("nvidia-b200"), "{e}");
}

#[test]
fn spread_and_pack_choose_differently() {
    let topo = Topology::preset("seed-8gpu").expect("preset");
    let mut view = ClusterView::from_spec(&ClusterSpec::uniform(topo.clone(), 2, 2, 1));
    // Server 0 holds a 1-GPU job; server 1 is empty.
    let job = view.submit(JobSpec::simple("a", 1, 1)).expect("fits");
    let req = fit::member_request(&view.job(job).expect("job").spec, &topo);
    let (m, _) = fit::plan_member(
        &topo,
        view.server(ServerId(0)).expect("s"),
        ServerId(0),
        &req,
        LocalityLevel::Server,
        FitMode::Pack,
    )
    .expect("fits");
    assert!(view.propose(&Proposal { id: ProposalId(1), job, members: vec![m], based_on: view.version() }).is_placed());
    let local = LocalView::of_view(&view);
    let spec = JobSpec::simple("b", 1, 1);
    let pack = find_placement(&local, &Overlay::default(), &spec, LocalityLevel::Any, FitMode::Pack, 0).expect("pack");
    let spread =
        find_placement(&local, &Overlay::default(), &spec, LocalityLevel::Any, FitMode::Spread, 0).expect("spread");
    // Pack joins the used server, next to the running job under the same PCIe switch;
    // spread takes the empty server.
    assert_eq!(pack.members[0].server, ServerId(0));
    assert_eq!(pack.members[0].gpus, 0b10);
    assert_eq!(spread.members[0].server, ServerId(1));
}

/// Regression: records that decode fine but cannot belong to the server (devices beyond the
/// topology, an unknown configuration set) once panicked the local view, and a delta older than
/// the copy rolled it back.
#[test]
fn local_view_refuses_impossible_records_and_stale_deltas() {
    let topo = Topology::preset("seed-8gpu").expect("preset");
    let mut view = ClusterView::from_spec(&ClusterSpec::uniform(topo.clone(), 4, 2, 1));
    let mut local = LocalView::of_view(&view);
    let mut bad = *view.server(ServerId(0)).expect("server");
    bad.free_gpus = u64::MAX;
    assert!(!local.apply_server(ServerId(0), bad));
    bad.free_gpus = 0;
    bad.config_set = tessera_view::ConfigSetId(999);
    assert!(!local.apply_server(ServerId(0), bad));
    assert!(!local.apply_server(ServerId(77), *view.server(ServerId(0)).expect("server")));
    local.check_index().expect("index intact");
    // v0 -> v1 and v1 -> v2 deltas; replaying the first after the second must be refused.
    let place = |view: &mut ClusterView, id: u64| {
        let job = view.submit(JobSpec::simple("j", 1, 8)).expect("fits");
        let spec = view.job(job).expect("job").spec.clone();
        let f =
            find_placement(&LocalView::of_view(view), &Overlay::default(), &spec, LocalityLevel::Any, FitMode::Pack, 0)
                .expect("fits");
        assert!(
            view.propose(&Proposal { id: ProposalId(id), job, members: f.members, based_on: view.version() })
                .is_placed()
        );
    };
    let v0 = view.version();
    place(&mut view, 1);
    let old = view.delta_since(v0).expect("delta");
    place(&mut view, 2);
    assert!(local.apply_delta(&view.delta_since(v0).expect("delta")));
    assert!(!local.apply_delta(&old), "a delta ending before the copy's version must be refused");
    assert_eq!(local.servers(), view.servers());
}

/// A record shows which devices are free, not which held ones stay taken when their job ends:
/// the copy learns each server's unhealthy devices from snapshots, deltas and `catch_up`, and
/// refuses masks that cannot be (beyond the topology, or listing a free device).
#[test]
fn local_view_follows_unhealthy_devices_through_deltas() {
    let topo = Topology::preset("seed-8gpu").expect("preset");
    let mut view = ClusterView::from_spec(&ClusterSpec::uniform(topo, 2, 2, 1));
    let job = view.submit(JobSpec::simple("j", 1, 8)).expect("fits");
    let spec = view.job(job).expect("job").spec.clone();
    let f =
        find_placement(&LocalView::of_view(&view), &Overlay::default(), &spec, LocalityLevel::Any, FitMode::Pack, 0)
            .expect("fits");
    let s = f.members[0].server;
    assert!(
        view.propose(&Proposal { id: ProposalId(1), job, members: f.members, based_on: view.version() }).is_placed()
    );
    let mut local = LocalView::of_view(&view);
    let mut behind = LocalView::of_view(&view);
    let v0 = view.version();
    // A held device goes bad: the record does not change (the device was not free), the mask does.
    view.set_unhealthy_devices(s, 0b101).expect("set");
    let d = view.delta_since(v0).expect("delta");
    assert_eq!(d.unhealthy.len(), d.servers.len());
    assert!(local.apply_delta(&d));
    assert_eq!(local.unhealthy_devices(s), 0b101);
    assert_eq!(LocalView::of_view(&view).unhealthy_devices(s), 0b101);
    assert_eq!(LocalView::from_snapshot(&view.snapshot()).unhealthy_devices(s), 0b101);
    assert_eq!(behind.catch_up(&view), 1);
    assert_eq!(behind.unhealthy_devices(s), 0b101);
    // A delta that carries no masks leaves them; one that cannot be is refused whole.
    let v1 = view.version();
    view.set_unhealthy_devices(s, 0b1).expect("set");
    let mut bare = view.delta_since(v1).expect("delta");
    bare.unhealthy.clear();
    assert!(local.apply_delta(&bare));
    assert_eq!(local.unhealthy_devices(s), 0b101);
    let other = ServerId(1 - s.0);
    for bad in [1u64 << 40, view.server(other).expect("server").free_gpus & 1] {
        let mut d = view.delta_since(v1).expect("delta");
        d.servers.push((other, *view.server(other).expect("server")));
        d.unhealthy.push(bad);
        assert!(!local.apply_delta(&d), "mask {bad:#x} on {other:?} must be refused");
        assert_eq!(local.unhealthy_devices(s), 0b101, "a refused delta changes nothing");
    }
    // The job ends: a delta without masks shows devices 1-7 free, so they are healthy again.
    view.apply(&tessera_view::Command::Release { job, failed: false });
    let mut bare = view.delta_since(v1).expect("delta");
    bare.unhealthy.clear();
    assert!(local.apply_delta(&bare));
    assert_eq!(local.unhealthy_devices(s), 0b1, "device 2 is free, device 0 is not");
    // Healthy again.
    view.set_unhealthy_devices(s, 0).expect("set");
    assert!(local.apply_delta(&view.delta_since(v1).expect("delta")));
    assert_eq!(local.unhealthy_devices(s), 0);
    assert_eq!(local.servers(), view.servers());
}
