//! Property-based invariant tests for the approver.
//!
//! The model: several logical schedulers, each planning from its own stale copy of the view
//! (taken as a `ClusterView` clone, a `ViewSnapshot` or by applying deltas, refreshed only now
//! and then), propose gangs in random interleavings with submits, releases, cancels and server
//! failures. Proposals are built only with the shared fit function (`fit::member_request`,
//! `fit::plan_member`); some are deliberately malformed. Every command goes through
//! `ClusterView::apply` and is logged.
//!
//! After every command: the independent invariant checker is clean; the decision equals the one
//! an independent oracle (written here from the approver's documented rules) predicts, including
//! the exact rejection and the set of servers whose fresh records come back; rejections and
//! retries change nothing; accepted gangs are placed whole; releases and failures free exactly
//! what was held. At the end: replaying the log (also after a JSON round trip) on a fresh view
//! gives the same outcomes and state hashes; a snapshot rebuilds the same state; deltas bring
//! old copies up to date.
//!
//! A failing case prints its `Params` (a valid struct literal): `world::run_scenario(&Params { .. })`
//! in a `#[test]` replays it exactly. `APPROVER_CASES=N` runs N cases instead of 256.
//!
//! | file | what |
//! |---|---|
//! | `main.rs` | scenario parameters, the static layout, the oracle, the logical schedulers' proposals |
//! | `world.rs` | the world (view, schedulers, log, checks), its operations, the property test and its coverage test |
//! | `plain.rs` | targeted scenarios |
//! | `dependencies.rs` | job dependencies and arrays: what submissions name, the admission oracle, the properties |
//! | `migration_moves.rs` | migration: atomic moves through the approver |

use anyhow::{Context, Result, bail, ensure};
use proptest::prelude::*;
use rand::rngs::SmallRng;
use rand::seq::{IndexedRandom, SliceRandom};
use rand::{Rng, SeedableRng};
use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use tessera_view::cluster_spec::RackGroup;
use tessera_view::fit::{self, FitMode};
use tessera_view::invariants;
use tessera_view::mask::CoreMask;
use tessera_view::preemption::VictimProblem;
use tessera_view::view::{DEFAULT_CHANGE_LOG, DEFAULT_ENDED_JOBS_KEPT};
use tessera_view::{
    ClusterSpec, ClusterView, Command, ConfigSet, Cordon, CpuDemand, Decision, Health, Job, JobId, JobSpec, JobState,
    JobTrace, LocalityLevel, MemberPlacement, Outcome, Predictor, Preemption, Proposal, ProposalId, Rejection,
    RequestId, ServerId, ServerRecord, TaskEvent, TaskState, Topology, Usage, ViewError, ViewSnapshot, ViewVersion,
};

const PRESETS: [&str; 4] = ["seed-8gpu", "dgx1-v100", "dgx-h100", "pcie-4gpu"];
const TENANTS: [&str; 3] = ["default", "vision", "speech"];
/// The tenant that gets a quota when a scenario has one.
const QUOTA_TENANT: &str = "vision";
const INTRA: [LocalityLevel; 3] = [LocalityLevel::PcieSwitch, LocalityLevel::Socket, LocalityLevel::Server];

// ---------------------------------------------------------------------------------------------
// Scenario parameters
// ---------------------------------------------------------------------------------------------

/// Everything that determines one scenario. `Debug` prints a valid struct literal.
#[derive(Clone, Debug)]
struct Params {
    seed: u64,
    /// Index into `PRESETS`.
    preset: usize,
    /// A second topology sharing the racks (a mixed cluster), if any (ignored when equal to `preset`).
    second: Option<usize>,
    servers: u32,
    servers_per_rack: u32,
    racks_per_ib: u32,
    /// GPU quota of `QUOTA_TENANT`.
    quota: Option<u32>,
    schedulers: usize,
    ops: usize,
    /// Change-log bound (`None`: the default).
    log_cap: Option<usize>,
    /// Ended jobs kept (`None`: the default).
    ended_kept: Option<usize>,
}

prop_compose! {
    fn params()(
        seed in any::<u64>(),
        preset in 0..PRESETS.len(),
        second in prop::option::weighted(0.25, 0..PRESETS.len()),
        servers in 2..=12u32,
        servers_per_rack in 1..=6u32,
        racks_per_ib in 1..=3u32,
        quota in prop::option::weighted(0.35, 4..=32u32),
        schedulers in 2..=8usize,
        ops in 50..=150usize,
        log_cap in prop::option::weighted(0.25, 4..=64usize),
        ended_kept in prop::option::weighted(0.25, 0..=6usize),
    ) -> Params {
        Params { seed, preset, second, servers, servers_per_rack, racks_per_ib, quota, schedulers, ops, log_cap, ended_kept }
    }
}

fn build_spec(p: &Params) -> ClusterSpec {
    let topo = Topology::preset(PRESETS[p.preset]).expect("preset");
    let mut spec = ClusterSpec::uniform(topo, p.servers, p.servers_per_rack, p.racks_per_ib);
    if let Some(q) = p.quota {
        spec.quotas.insert(QUOTA_TENANT.to_string(), q);
    }
    // A low starvation bound, so that scenarios reach it.
    spec.priorities.max_preemptions = 1 + (p.seed % 2) as u32;
    // Attained-service queues in a third of the scenarios (from the seed, so the scenario's
    // draws stay as they were): thresholds a job crosses within a few clock steps.
    if p.seed.is_multiple_of(3) {
        spec.priorities.attained_service_gpu_s = vec![300, 3_600, 36_000];
    }
    if let Some(second) = p.second.filter(|s| *s != p.preset) {
        // Every other rack also holds one server of a second topology (a mixed cluster).
        spec.topologies.push(Topology::preset(PRESETS[second]).expect("preset"));
        let racks: Vec<RackGroup> = spec.groups.iter().step_by(2).cloned().collect();
        for g in racks {
            spec.groups.push(RackGroup { rack: g.rack, ib_domain: g.ib_domain, topology: 1, servers: 1 });
        }
    }
    spec
}

fn limits(p: &Params) -> (usize, usize) {
    (p.log_cap.unwrap_or(DEFAULT_CHANGE_LOG), p.ended_kept.unwrap_or(DEFAULT_ENDED_JOBS_KEPT))
}

fn fresh_view(p: &Params, spec: &ClusterSpec) -> ClusterView {
    let (cap, kept) = limits(p);
    ClusterView::from_spec(spec).with_limits(cap, kept)
}

// ---------------------------------------------------------------------------------------------
// Layout and small helpers
// ---------------------------------------------------------------------------------------------

/// The view's layout as the world last saw it (refreshed after every layout change).
#[derive(Clone, Debug)]
struct Layout {
    topologies: Vec<Topology>,
    config_sets: Vec<ConfigSet>,
}

impl Layout {
    fn of(view: &ClusterView) -> Layout {
        Layout { topologies: view.topologies().to_vec(), config_sets: view.config_sets().to_vec() }
    }
    fn cs(&self, rec: &ServerRecord) -> &ConfigSet {
        &self.config_sets[rec.config_set.index()]
    }
    fn topo(&self, rec: &ServerRecord) -> &Topology {
        &self.topologies[self.cs(rec).topology as usize]
    }
}

fn all_devices(t: &Topology) -> u64 {
    if t.devices >= 64 { u64::MAX } else { (1u64 << t.devices) - 1 }
}

/// The tightest intra-server level holding every device of `mask` (written independently of
/// `Topology::level_of`).
fn intra_level(t: &Topology, mask: u64) -> LocalityLevel {
    let within = |g: &u64| mask & !*g == 0;
    if t.pcie_switches.iter().any(within) || t.nvlink_groups.iter().any(within) {
        LocalityLevel::PcieSwitch
    } else if t.sockets.iter().any(within) {
        LocalityLevel::Socket
    } else {
        LocalityLevel::Server
    }
}

/// The locality level a gang achieves (independent of `ClusterView::gang_level`).
fn gang_level(layout: &Layout, servers: &[ServerRecord], members: &[MemberPlacement]) -> LocalityLevel {
    let Some(first) = members.first() else { return LocalityLevel::PcieSwitch };
    if members.iter().all(|m| m.server == first.server) {
        let all = members.iter().fold(0u64, |a, m| a | m.gpus);
        return intra_level(layout.topo(&servers[first.server.index()]), all);
    }
    let cs = |m: &MemberPlacement| layout.cs(&servers[m.server.index()]);
    let c0 = cs(first);
    if members.iter().all(|m| cs(m).rack == c0.rack) {
        LocalityLevel::Rack
    } else if members.iter().all(|m| cs(m).ib_domain == c0.ib_domain) {
        LocalityLevel::IbDomain
    } else {
        LocalityLevel::Any
    }
}

/// Takes a member's resources from a copy of its server's record.
fn take(rec: &mut ServerRecord, m: &MemberPlacement) {
    rec.free_gpus &= !m.gpus;
    rec.free_cores = rec.free_cores.without(m.cores);
    rec.free_memory_mib = rec.free_memory_mib.saturating_sub(m.memory_mib);
}

/// Takes (`take`) or gives back members' resources on a copy of the records.
fn adjust(recs: &mut [ServerRecord], ms: &[MemberPlacement], take: bool) {
    adjust_healthy(recs, ms, take, &[]);
}

/// [`adjust`], where giving back leaves the `unhealthy` devices (by server) out of the free mask.
fn adjust_healthy(recs: &mut [ServerRecord], ms: &[MemberPlacement], take: bool, unhealthy: &[u64]) {
    for m in ms {
        let sick = unhealthy.get(m.server.index()).copied().unwrap_or(0);
        let r = &mut recs[m.server.index()];
        if take {
            r.free_gpus &= !m.gpus;
            r.free_cores = r.free_cores.without(m.cores);
            r.free_memory_mib = r.free_memory_mib.saturating_sub(m.memory_mib);
        } else {
            r.free_gpus |= m.gpus & !sick;
            r.free_cores = r.free_cores.or(m.cores);
            r.free_memory_mib += m.memory_mib;
        }
    }
}

/// Unhealthy devices of every server, by id.
fn unhealthy(view: &ClusterView) -> Vec<u64> {
    (0..view.servers().len() as u32).map(|s| view.unhealthy_devices(ServerId(s))).collect()
}

/// Proposal ids held by placed gangs, from the jobs alone.
fn held_proposals(view: &ClusterView) -> HashMap<ProposalId, JobId> {
    view.jobs().into_iter().filter_map(|j| j.placement.as_ref().map(|p| (p.proposal, j.id))).collect()
}

/// GPUs a tenant holds, from the jobs alone.
fn tenant_held(view: &ClusterView, tenant: &str) -> u32 {
    held_at_or_above(view, tenant, i32::MIN)
}

/// GPUs a tenant holds at priority `floor` and above, from the jobs alone.
fn held_at_or_above(view: &ClusterView, tenant: &str, floor: i32) -> u32 {
    view.jobs()
        .into_iter()
        .filter(|j| j.placement.is_some() && j.spec.tenant == tenant && j.spec.priority >= floor)
        .map(|j| j.spec.total_gpus())
        .sum()
}

/// The class quotas that bind a job of `tenant` at `priority`, in class-name order, as
/// (class, the class's priority, GPUs): those of its class and the classes below it.
fn class_limits(view: &ClusterView, tenant: &str, priority: i32) -> Vec<(String, i32, u32)> {
    let mut out = Vec::new();
    for (class, &q) in view.class_quotas().get(tenant).into_iter().flatten() {
        if let Some(&floor) = view.priorities().classes.get(class)
            && priority >= floor
        {
            out.push((class.clone(), floor, q));
        }
    }
    out
}

fn jobs_map(view: &ClusterView) -> BTreeMap<JobId, Job> {
    view.jobs().into_iter().map(|j| (j.id, j.clone())).collect()
}

// ---------------------------------------------------------------------------------------------
// The oracle: what the approver must decide, from its documented rules
// ---------------------------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
enum Expect {
    Accepted(LocalityLevel),
    AlreadyApplied,
    /// The first reason, and the servers whose fresh records must come back.
    Rejected(Rejection, BTreeSet<ServerId>),
}

fn predict(view: &ClusterView, layout: &Layout, p: &Proposal) -> Expect {
    let rej = |r: Rejection| Expect::Rejected(r, BTreeSet::new());
    if let Some(&owner) = held_proposals(view).get(&p.id) {
        return if owner == p.job { Expect::AlreadyApplied } else { rej(Rejection::ProposalIdReused { other: owner }) };
    }
    // An id applied before whose placement has ended is spent: never applied again.
    if let Some(owner) = view.jobs().into_iter().find(|j| j.proposals.contains(&p.id)) {
        return if owner.id == p.job {
            rej(Rejection::ProposalSpent)
        } else {
            rej(Rejection::ProposalIdReused { other: owner.id })
        };
    }
    let Some(job) = view.job(p.job) else { return rej(Rejection::UnknownJob) };
    if job.state != JobState::Pending {
        return rej(Rejection::JobNotPending { state: job.state.as_str().to_string() });
    }
    if let Some(&(first, _)) = job.waiting_for.first() {
        return rej(Rejection::DependencyPending { first, count: job.waiting_for.len() as u32 });
    }
    let spec = &job.spec;
    if p.members.len() != spec.members as usize {
        return rej(Rejection::WrongMemberCount { expected: spec.members, got: p.members.len() as u32 });
    }
    let servers = view.servers();
    // Per-server union of the gang's claims, in first-appearance order.
    let mut merged: Vec<MemberPlacement> = Vec::new();
    for (i, m) in p.members.iter().enumerate() {
        let member = i as u32;
        let Some(rec) = servers.get(m.server.index()) else {
            return rej(Rejection::UnknownServer { member, server: m.server });
        };
        let topo = layout.topo(rec);
        if let Some(want) = &spec.gpu_type
            && *want != topo.device_type
        {
            return rej(Rejection::WrongGpuType {
                member,
                server: m.server,
                expected: want.clone(),
                got: topo.device_type.clone(),
            });
        }
        let req = fit::member_request(spec, topo);
        let outside = m.gpus & !all_devices(topo);
        if outside != 0 {
            return rej(Rejection::DevicesOutOfRange { member, server: m.server, mask: outside });
        }
        let outside = m.cores.without(CoreMask::range(0, topo.cores()));
        if !outside.is_empty() {
            return rej(Rejection::CoresOutOfRange { member, server: m.server, mask: outside });
        }
        if m.gpus.count_ones() != req.gpus {
            return rej(Rejection::WrongGpuCount { member, expected: req.gpus, got: m.gpus.count_ones() });
        }
        let cores = m.cores.count();
        if cores < req.min_cores || cores > req.want_cores {
            return rej(Rejection::WrongCoreCount { member, min: req.min_cores, max: req.want_cores, got: cores });
        }
        if m.memory_mib != req.memory_mib {
            return rej(Rejection::WrongMemory { member, expected: req.memory_mib, got: m.memory_mib });
        }
        match merged.iter_mut().find(|x| x.server == m.server) {
            Some(x) => {
                if x.gpus & m.gpus != 0 || x.cores.intersects(m.cores) {
                    return rej(Rejection::OverlapWithinGang { server: m.server });
                }
                x.gpus |= m.gpus;
                x.cores = x.cores.or(m.cores);
                x.memory_mib += m.memory_mib;
            }
            None => merged.push(*m),
        }
    }
    let level = gang_level(layout, servers, &p.members);
    if level > spec.tolerate {
        return rej(Rejection::LocalityTooLoose { achieved: level, tolerate: spec.tolerate });
    }
    let mut first = None;
    if let Some(&quota) = view.quotas().get(&spec.tenant) {
        let used = tenant_held(view, &spec.tenant);
        if used + spec.total_gpus() > quota {
            first = Some(Rejection::QuotaExceeded {
                tenant: spec.tenant.clone(),
                class: None,
                quota,
                used,
                asked: spec.total_gpus(),
            });
        }
    }
    for (class, floor, quota) in class_limits(view, &spec.tenant, spec.priority) {
        let used = held_at_or_above(view, &spec.tenant, floor);
        if first.is_none() && used + spec.total_gpus() > quota {
            first = Some(Rejection::QuotaExceeded {
                tenant: spec.tenant.clone(),
                class: Some(class),
                quota,
                used,
                asked: spec.total_gpus(),
            });
        }
    }
    let mut stale = BTreeSet::new();
    for m in &merged {
        let rec = &servers[m.server.index()];
        let busy_gpus = m.gpus & !rec.free_gpus;
        let busy_cores = m.cores.without(rec.free_cores);
        let why = if rec.health != Health::Up {
            Some(Rejection::ServerNotUp { server: m.server, health: rec.health })
        } else if busy_gpus != 0 {
            Some(Rejection::DevicesBusy { server: m.server, mask: busy_gpus })
        } else if !busy_cores.is_empty() {
            Some(Rejection::CoresBusy { server: m.server, mask: busy_cores })
        } else if m.memory_mib > rec.free_memory_mib {
            Some(Rejection::MemoryShort { server: m.server, free: rec.free_memory_mib, asked: m.memory_mib })
        } else {
            None
        };
        if let Some(r) = why {
            first.get_or_insert(r);
            stale.insert(m.server);
        }
    }
    match first {
        None => Expect::Accepted(level),
        Some(r) => Expect::Rejected(r, stale),
    }
}

/// An outcome with every rejection's `fresh` records dropped.
fn without_fresh(out: &Outcome) -> Outcome {
    let mut out = out.clone();
    if let Outcome::Decided(ds) = &mut out {
        for d in ds {
            if let Decision::Rejected { fresh, .. } = d {
                fresh.clear();
            }
        }
    }
    out
}

/// A rejection's `fresh` records: first every conflicting server (and no other), then possibly
/// servers that changed after the version the proposal was planned on; each once, each with its
/// current record.
fn check_fresh(
    view: &ClusterView,
    p: &Proposal,
    fresh: &[(ServerId, ServerRecord)],
    conflicting: &BTreeSet<ServerId>,
) -> Result<()> {
    let ids: BTreeSet<ServerId> = fresh.iter().map(|(s, _)| *s).collect();
    ensure!(ids.len() == fresh.len(), "fresh lists a server twice: {fresh:?}");
    ensure!(fresh.len() >= conflicting.len(), "fresh {fresh:?} misses conflicting servers {conflicting:?}");
    let (first, rest) = fresh.split_at(conflicting.len());
    let first: BTreeSet<ServerId> = first.iter().map(|(s, _)| *s).collect();
    ensure!(&first == conflicting, "fresh starts with {first:?}, the conflicting servers are {conflicting:?}");
    for (s, _) in rest {
        let changed = view.server_version(*s).is_some_and(|v| v > p.based_on);
        ensure!(changed, "fresh lists {s}, which neither conflicts nor changed after {}", p.based_on);
    }
    for (s, rec) in fresh {
        ensure!(view.server(*s) == Some(rec), "fresh record of {s} is not its current record");
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Logical schedulers and their proposals
// ---------------------------------------------------------------------------------------------

/// One logical scheduler's stale copy of the view.
#[derive(Clone, Debug)]
struct Sched {
    version: ViewVersion,
    servers: Vec<ServerRecord>,
    jobs: BTreeMap<JobId, Job>,
}

impl Sched {
    fn from_clone(view: &ClusterView) -> Sched {
        let c = view.clone();
        Sched { version: c.version(), servers: c.servers().to_vec(), jobs: jobs_map(&c) }
    }
    fn from_snapshot(s: ViewSnapshot) -> Sched {
        Sched { version: s.version, servers: s.servers, jobs: s.jobs.into_iter().map(|j| (j.id, j)).collect() }
    }
}

fn random_mode(rng: &mut SmallRng) -> FitMode {
    if rng.random_bool(0.5) { FitMode::Pack } else { FitMode::Spread }
}

fn server_order(rng: &mut SmallRng, recs: &[ServerRecord]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..recs.len()).collect();
    match rng.random_range(0..4) {
        0 => {}
        1 => order.sort_by_key(|&i| std::cmp::Reverse(recs[i].free_gpus.count_ones())),
        2 => order.reverse(),
        _ => order.shuffle(rng),
    }
    order
}

/// Plans a whole gang on `stale` records with the shared fit function, greedily, tracking what
/// earlier members took on a local copy. With `respect_locality` the gang stays within the job's
/// tolerance; without, it may spread anywhere (the approver must then refuse a too-loose gang).
fn plan_gang(
    layout: &Layout,
    stale: &[ServerRecord],
    spec: &JobSpec,
    rng: &mut SmallRng,
    respect_locality: bool,
) -> Option<Vec<MemberPlacement>> {
    let mut recs = stale.to_vec();
    let mode = random_mode(rng);
    let mut order = server_order(rng, &recs);
    let typed = |rec: &ServerRecord| spec.gpu_type.as_ref().is_none_or(|t| *t == layout.topo(rec).device_type);
    if respect_locality && spec.tolerate.is_intra_server() {
        // The whole gang on one server, its devices' union within the tolerance.
        let levels: Vec<LocalityLevel> = INTRA.into_iter().filter(|l| *l <= spec.tolerate).collect();
        for &s in &order {
            let mut local = recs[s];
            if !typed(&local) {
                continue;
            }
            let topo = layout.topo(&local);
            let req = fit::member_request(spec, topo);
            let mut members = Vec::new();
            for _ in 0..spec.members {
                let max = *levels.choose(rng).expect("levels");
                let Some((m, _)) = fit::plan_member(topo, &local, ServerId(s as u32), &req, max, mode) else { break };
                take(&mut local, &m);
                members.push(m);
            }
            if members.len() == spec.members as usize && gang_level(layout, stale, &members) <= spec.tolerate {
                return Some(members);
            }
        }
        return None;
    }
    let bound = if respect_locality { spec.tolerate } else { LocalityLevel::Any };
    let stick = rng.random_bool(0.5);
    let mut anchor: Option<(u32, u32)> = None;
    let mut members = Vec::new();
    for _ in 0..spec.members {
        let max = *INTRA.choose(rng).expect("levels");
        let mut placed = None;
        for (pos, &s) in order.iter().enumerate() {
            let rec = recs[s];
            if !typed(&rec) {
                continue;
            }
            let cs = layout.cs(&rec);
            if let Some((rack, ib)) = anchor
                && ((bound == LocalityLevel::Rack && cs.rack != rack)
                    || (bound == LocalityLevel::IbDomain && cs.ib_domain != ib))
            {
                continue;
            }
            let topo = layout.topo(&rec);
            let req = fit::member_request(spec, topo);
            if let Some((m, _)) = fit::plan_member(topo, &rec, ServerId(s as u32), &req, max, mode) {
                placed = Some((pos, s, m));
                break;
            }
        }
        let (pos, s, m) = placed?;
        adjust(&mut recs, &[m], true);
        let cs = layout.cs(&recs[s]);
        anchor.get_or_insert((cs.rack, cs.ib_domain));
        members.push(m);
        if !stick {
            // Spread: the next member looks at other servers first.
            let s = order.remove(pos);
            order.push(s);
        }
    }
    Some(members)
}

/// The kinds of malformed proposal a scheduler may send.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Bad {
    MemberCount,
    UnknownServer,
    DevicesOutOfRange,
    CoresOutOfRange,
    GpuCount,
    CoreCount,
    Memory,
    Overlap,
    ReusedId,
    UnknownJob,
    GpuType,
}

const BAD_KINDS: [Bad; 11] = [
    Bad::MemberCount,
    Bad::UnknownServer,
    Bad::DevicesOutOfRange,
    Bad::CoresOutOfRange,
    Bad::GpuCount,
    Bad::CoreCount,
    Bad::Memory,
    Bad::Overlap,
    Bad::ReusedId,
    Bad::UnknownJob,
    Bad::GpuType,
];

/// Breaks a well-formed proposal for a pending job in the way `kind` says and returns the
/// rejection it must get, or `None` when `kind` does not apply here.
fn break_proposal(
    kind: Bad,
    p: &mut Proposal,
    spec: &JobSpec,
    view: &ClusterView,
    layout: &Layout,
    rng: &mut SmallRng,
) -> Option<Rejection> {
    let servers = view.servers();
    let k = rng.random_range(0..p.members.len());
    let member = k as u32;
    let m = p.members[k];
    let topo = layout.topo(&servers[m.server.index()]).clone();
    let req = fit::member_request(spec, &topo);
    match kind {
        Bad::MemberCount => {
            if p.members.len() > 1 && rng.random_bool(0.5) {
                p.members.truncate(rng.random_range(0..p.members.len()));
            } else {
                p.members.push(m);
            }
            Some(Rejection::WrongMemberCount { expected: spec.members, got: p.members.len() as u32 })
        }
        Bad::UnknownServer => {
            let server = ServerId(servers.len() as u32 + rng.random_range(0..4u32));
            p.members[k].server = server;
            Some(Rejection::UnknownServer { member, server })
        }
        Bad::DevicesOutOfRange => {
            if topo.devices >= 64 {
                return None;
            }
            let mask = 1u64 << rng.random_range(topo.devices..64);
            p.members[k].gpus |= mask;
            Some(Rejection::DevicesOutOfRange { member, server: m.server, mask })
        }
        Bad::CoresOutOfRange => {
            if topo.cores() >= 128 {
                return None;
            }
            let mask = CoreMask::range(rng.random_range(topo.cores()..128), 1);
            p.members[k].cores = m.cores.or(mask);
            Some(Rejection::CoresOutOfRange { member, server: m.server, mask })
        }
        Bad::GpuCount => {
            let spare = all_devices(&topo) & !m.gpus;
            let gpus = if spare != 0 && rng.random_bool(0.5) {
                m.gpus | (spare & spare.wrapping_neg())
            } else {
                m.gpus & (m.gpus - 1)
            };
            p.members[k].gpus = gpus;
            Some(Rejection::WrongGpuCount { member, expected: req.gpus, got: gpus.count_ones() })
        }
        Bad::CoreCount => {
            let have = m.cores.count();
            let spare = CoreMask::range(0, topo.cores()).without(m.cores);
            let cores = if spare.count() + have > req.want_cores && (req.min_cores == 0 || rng.random_bool(0.5)) {
                m.cores.or(spare.lowest(req.want_cores + 1 - have)?)
            } else if req.min_cores > 0 {
                m.cores.lowest(req.min_cores - 1)?
            } else {
                return None;
            };
            p.members[k].cores = cores;
            Some(Rejection::WrongCoreCount { member, min: req.min_cores, max: req.want_cores, got: cores.count() })
        }
        Bad::Memory => {
            let got = if m.memory_mib > 0 && rng.random_bool(0.5) { m.memory_mib - 1 } else { m.memory_mib + 1 };
            p.members[k].memory_mib = got;
            Some(Rejection::WrongMemory { member, expected: req.memory_mib, got })
        }
        Bad::Overlap => {
            if p.members.len() < 2 {
                return None;
            }
            let j = rng.random_range(1..p.members.len());
            let i = rng.random_range(0..j);
            p.members[j] = p.members[i];
            Some(Rejection::OverlapWithinGang { server: p.members[i].server })
        }
        Bad::ReusedId => {
            let held = held_proposals(view);
            let mut others: Vec<(ProposalId, JobId)> = held.into_iter().filter(|(_, j)| *j != p.job).collect();
            others.sort();
            let &(id, other) = others.choose(rng)?;
            p.id = id;
            Some(Rejection::ProposalIdReused { other })
        }
        Bad::UnknownJob => {
            p.job = JobId(1_000_000 + rng.random_range(0..1000u64));
            Some(Rejection::UnknownJob)
        }
        Bad::GpuType => {
            let want = spec.gpu_type.as_ref()?;
            let others: Vec<usize> =
                (0..servers.len()).filter(|&s| layout.topo(&servers[s]).device_type != *want).collect();
            let &s = others.choose(rng)?;
            p.members[k].server = ServerId(s as u32);
            Some(Rejection::WrongGpuType {
                member,
                server: ServerId(s as u32),
                expected: want.clone(),
                got: layout.topo(&servers[s]).device_type.clone(),
            })
        }
    }
}

fn random_job(rng: &mut SmallRng, layout: &Layout, servers: usize, n: u64) -> JobSpec {
    let topo = layout.topologies.choose(rng).expect("topologies");
    let mut s = JobSpec::simple(&format!("job{n}"), rng.random_range(1..=3), rng.random_range(1..=topo.devices));
    let tolerate = match rng.random_range(0..20) {
        0 => LocalityLevel::PcieSwitch,
        1..=2 => LocalityLevel::Socket,
        3..=5 => LocalityLevel::Server,
        6..=9 => LocalityLevel::Rack,
        10..=12 => LocalityLevel::IbDomain,
        _ => LocalityLevel::Any,
    };
    s.tolerate = tolerate;
    s.prefer = LocalityLevel::ALL[rng.random_range(0..=tolerate.rank())];
    if tolerate.is_intra_server() && rng.random_bool(0.8) {
        // Mostly a gang that one group of the tolerated level can hold.
        let group = topo.groups(tolerate).iter().map(|g| g.count_ones()).max().unwrap_or(1);
        s.gpus_per_member = rng.random_range(1..=(group / s.members).max(1));
    }
    s.cpu = match rng.random_range(0..3) {
        0 => CpuDemand::Proportional,
        1 => CpuDemand::Fixed { cores_per_gpu: rng.random_range(1..=4) },
        _ => {
            let theta = rng.random_range(1..=12u32);
            CpuDemand::Predicted {
                predictor: Predictor { p0: 1.0, p1: 0.25, p2: 2.5, theta: theta as f64 },
                min_cores_per_gpu: rng.random_range(1..=2u32.min(theta)),
            }
        }
    };
    let share = topo.memory_mib / topo.devices;
    s.memory_mib_per_gpu = match rng.random_range(0..8) {
        0 => Some(share / 2),
        1 => Some(share),
        2 => Some(rng.random_range(1..=share * 2)),
        // Memory-hungry: the server's memory runs out before its devices.
        3 => Some(share * rng.random_range(2..=(topo.devices / s.gpus_per_member).clamp(2, 4))),
        _ => None,
    };
    // Three priorities, so that preemptions find victims and refusals (from the job's number,
    // leaving the generator's random stream as it was).
    s.priority = (n % 3) as i32;
    // A time limit on every eighth job, one to three hours of the world's clock (from the
    // number too): some run out, most jobs end or are preempted first.
    if n.is_multiple_of(8) {
        s.run.time_limit_s = Some(3600 + n * 977 % 7200);
    }
    // The quota tenant often, so that its jobs compete for the quota.
    s.tenant = if rng.random_bool(0.4) { QUOTA_TENANT } else { TENANTS.choose(rng).expect("tenants") }.to_string();
    let types = layout.topologies.len() > 1;
    match rng.random_range(0..40) {
        0 => s.gpu_type = Some("nvidia-bogus-1g".to_string()),
        1 => {
            // Larger than the whole cluster.
            s.members = servers as u32 + 1;
            s.gpus_per_member = topo.devices;
            s.tolerate = LocalityLevel::Any;
        }
        n if n < 6 || (types && n < 20) => s.gpu_type = Some(topo.device_type.clone()),
        _ => {}
    }
    s
}

mod dependencies;
mod migration_moves;
mod plain;
mod world;
