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
//! A failing case prints its `Params` (a valid struct literal): `run_scenario(&Params { .. })`
//! in a `#[test]` replays it exactly. `APPROVER_CASES=N` runs N cases instead of 256.

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
    ClusterSpec, ClusterView, Command, ConfigSet, CpuDemand, Decision, Health, Job, JobId, JobSpec, JobState,
    LocalityLevel, MemberPlacement, Outcome, Predictor, Preemption, Proposal, ProposalId, Rejection, RequestId,
    ServerId, ServerRecord, TaskEvent, TaskState, Topology, ViewError, ViewSnapshot, ViewVersion,
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
// Static layout and small helpers
// ---------------------------------------------------------------------------------------------

/// The static part of the view (topologies and configuration sets never change).
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
    view.jobs()
        .into_iter()
        .filter(|j| j.placement.is_some() && j.spec.tenant == tenant)
        .map(|j| j.spec.total_gpus())
        .sum()
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
            first =
                Some(Rejection::QuotaExceeded { tenant: spec.tenant.clone(), quota, used, asked: spec.total_gpus() });
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

// ---------------------------------------------------------------------------------------------
// The world: the view, the schedulers, the command log, and the checks
// ---------------------------------------------------------------------------------------------

/// What the scenarios exercised, summed over runs (for the coverage test).
#[derive(Clone, Debug, Default)]
struct Stats {
    submitted: u64,
    never_fits: u64,
    accepted: u64,
    accepted_after_retry: u64,
    conflicts: u64,
    conflict_fresh_servers: u64,
    /// Conflicts by reason code.
    conflict_kinds: BTreeMap<String, u64>,
    quota_rejections: u64,
    not_pending: u64,
    too_loose: u64,
    already_applied: u64,
    bad: BTreeMap<String, u64>,
    batches: u64,
    releases: u64,
    cancels: u64,
    requeued: u64,
    refresh_by_delta: u64,
    refresh_delta_none: u64,
    delta_checks: u64,
    replica_steps: u64,
    reaccepted_ids: u64,
    /// Submissions retried under a remembered request id (answered with the same job).
    resubmitted: u64,
    /// A request id reused with another spec (refused).
    request_reused: u64,
    /// A retried request id whose job was forgotten (admitted afresh).
    resubmit_forgotten: u64,
    /// Preemptions applied, and victims they re-queued.
    preempted: u64,
    preempted_victims: u64,
    /// Preemptions refused, by reason code (and victim problem).
    preempt_refused: BTreeMap<String, u64>,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        self.submitted += o.submitted;
        self.never_fits += o.never_fits;
        self.accepted += o.accepted;
        self.accepted_after_retry += o.accepted_after_retry;
        self.conflicts += o.conflicts;
        self.conflict_fresh_servers += o.conflict_fresh_servers;
        for (k, v) in &o.conflict_kinds {
            *self.conflict_kinds.entry(k.clone()).or_default() += v;
        }
        self.quota_rejections += o.quota_rejections;
        self.not_pending += o.not_pending;
        self.too_loose += o.too_loose;
        self.already_applied += o.already_applied;
        for (k, v) in &o.bad {
            *self.bad.entry(k.clone()).or_default() += v;
        }
        self.batches += o.batches;
        self.releases += o.releases;
        self.cancels += o.cancels;
        self.requeued += o.requeued;
        self.refresh_by_delta += o.refresh_by_delta;
        self.refresh_delta_none += o.refresh_delta_none;
        self.delta_checks += o.delta_checks;
        self.replica_steps += o.replica_steps;
        self.reaccepted_ids += o.reaccepted_ids;
        self.resubmitted += o.resubmitted;
        self.request_reused += o.request_reused;
        self.resubmit_forgotten += o.resubmit_forgotten;
        self.preempted += o.preempted;
        self.preempted_victims += o.preempted_victims;
        for (k, v) in &o.preempt_refused {
            *self.preempt_refused.entry(k.clone()).or_default() += v;
        }
    }
}

struct Checkpoint {
    version: ViewVersion,
    servers: Vec<ServerRecord>,
    jobs: BTreeMap<JobId, Job>,
}

struct World {
    p: Params,
    spec: ClusterSpec,
    view: ClusterView,
    layout: Layout,
    /// The fully free records of the initial view.
    pristine: Vec<ServerRecord>,
    scheds: Vec<Sched>,
    log: Vec<(Command, Outcome, u64)>,
    next_proposal: u64,
    next_name: u64,
    /// Every accepted proposal, in order.
    accepted: Vec<Proposal>,
    times_accepted: HashMap<ProposalId, u32>,
    checkpoints: Vec<Checkpoint>,
    /// Submissions made under a request id: the id, the job it admitted and its spec.
    requests: Vec<(RequestId, JobId, JobSpec)>,
    /// A view rebuilt from a (JSON round-tripped) snapshot mid-run, fed the same commands.
    replica: Option<ClusterView>,
    stats: Stats,
}

impl World {
    fn new(p: &Params) -> World {
        let spec = build_spec(p);
        let view = fresh_view(p, &spec);
        let layout = Layout::of(&view);
        let pristine = view.servers().to_vec();
        let scheds = (0..p.schedulers).map(|_| Sched::from_clone(&view)).collect();
        World {
            p: p.clone(),
            spec,
            view,
            layout,
            pristine,
            scheds,
            log: Vec::new(),
            next_proposal: p.seed % 1000 * 1000 + 1,
            next_name: 0,
            accepted: Vec::new(),
            times_accepted: HashMap::new(),
            checkpoints: Vec::new(),
            requests: Vec::new(),
            replica: None,
            stats: Stats::default(),
        }
    }

    fn proposal_id(&mut self) -> ProposalId {
        self.next_proposal += 1;
        ProposalId(self.next_proposal)
    }

    /// Applies one command through `ClusterView::apply`, logs it and checks what must hold after
    /// any command.
    fn exec(&mut self, cmd: Command) -> Result<Outcome> {
        let (v0, h0) = (self.view.version(), self.view.state_hash());
        // A submission retried under a remembered request id changes nothing (op_resubmit
        // checks the answer against the model's own record of request ids).
        let retry = match &cmd {
            Command::Submit { request: Some(r), .. } => self.view.job_of_request(r).is_some(),
            _ => false,
        };
        let out = self.view.apply(&cmd);
        let (v1, h1) = (self.view.version(), self.view.state_hash());
        // A command bumps the version once when it changes state; a batch once per accepted gang
        // (`op_health` checks that a health change bumps it and a no-op does not).
        let bumps = match &out {
            Outcome::Decided(ds) => ds.iter().filter(|d| matches!(d, Decision::Accepted { .. })).count() as u64,
            Outcome::Submitted(r) => (r.is_ok() && !retry) as u64,
            Outcome::Ended(r) => r.is_ok() as u64,
            Outcome::HealthSet(r) => (r.is_ok() && v1 != v0) as u64,
            Outcome::TaskReported(r) => (r.is_ok() && v1 != v0) as u64,
            Outcome::DevicesSet(r) => (r.is_ok() && v1 != v0) as u64,
        };
        ensure!(v1.0 == v0.0 + bumps, "version went {v0} -> {v1} on {cmd:?} -> {out:?}");
        if v1 == v0 {
            ensure!(h1 == h0, "state hash changed without a version bump on {cmd:?} -> {out:?}");
        } else {
            ensure!(h1 != h0, "version bumped but state hash unchanged on {cmd:?}");
        }
        self.check_global().with_context(|| format!("after {cmd:?} -> {out:?}"))?;
        if let Some(r) = &mut self.replica {
            // Decisions agree, except which servers beyond the conflicting ones a rejection
            // refreshes: that may depend on how far back each view's change log reaches.
            let o2 = r.apply(&cmd);
            ensure!(
                without_fresh(&o2) == without_fresh(&out),
                "replica from snapshot decided {o2:?}, the view {out:?}, on {cmd:?}"
            );
            ensure!(r.state_hash() == h1, "replica from snapshot diverged (state hash) after {cmd:?}");
            self.stats.replica_steps += 1;
        }
        self.log.push((cmd, out.clone(), h1));
        Ok(out)
    }

    /// What must hold after every command.
    fn check_global(&self) -> Result<()> {
        let rep = invariants::check(&self.view);
        ensure!(rep.is_clean(), "invariant violations: {:#?}", rep.violations);
        for t in TENANTS {
            let held = tenant_held(&self.view, t);
            ensure!(
                self.view.tenant_used(t) == held,
                "tenant {t}: tenant_used {} != {held} held",
                self.view.tenant_used(t)
            );
            if let Some(&q) = self.view.quotas().get(t) {
                ensure!(held <= q, "tenant {t} holds {held} GPUs over its quota {q}");
            }
        }
        let servers = self.view.servers();
        for j in self.view.jobs() {
            let Some(pl) = &j.placement else { continue };
            ensure!(j.state.holds_resources(), "{} is {} with a placement", j.id, j.state);
            ensure!(pl.members.len() == j.spec.members as usize, "{} placed with {} members", j.id, pl.members.len());
            let level = gang_level(&self.layout, servers, &pl.members);
            ensure!(pl.level == level, "{}: recorded level {} but members span {level}", j.id, pl.level);
            ensure!(level <= j.spec.tolerate, "{} placed at {level}, tolerates {}", j.id, j.spec.tolerate);
            for m in &pl.members {
                ensure!(
                    servers[m.server.index()].health != Health::Down,
                    "{} holds a member on down {}",
                    j.id,
                    m.server
                );
            }
        }
        Ok(())
    }

    /// Proposes `p` alone, checks the decision against the oracle and what changed, and returns it.
    fn propose(&mut self, p: Proposal, must: Option<&Rejection>) -> Result<Decision> {
        let before = self.view.clone();
        let expect = predict(&before, &self.layout, &p);
        if let Some(r) = must {
            ensure!(
                expect == Expect::Rejected(r.clone(), BTreeSet::new()),
                "oracle says {expect:?}, breaking said {r:?}"
            );
        }
        let out = self.exec(Command::Propose(vec![p.clone()]))?;
        let Outcome::Decided(ds) = out else { bail!("propose answered {out:?}") };
        ensure!(ds.len() == 1, "one proposal, {} decisions", ds.len());
        let d = ds.into_iter().next().expect("one");
        self.check_decision(&before, &p, &expect, &d).with_context(|| format!("proposal {p:?}"))?;
        Ok(d)
    }

    fn check_decision(&mut self, before: &ClusterView, p: &Proposal, expect: &Expect, d: &Decision) -> Result<()> {
        let view = &self.view;
        match (expect, d) {
            (Expect::Accepted(level), Decision::Accepted { job, proposal, level: got, version }) => {
                ensure!(*job == p.job && *proposal == p.id, "decision names {job}/{proposal}");
                ensure!(got == level, "accepted at {got}, oracle says {level}");
                ensure!(version.0 == before.version().0 + 1 && *version == view.version(), "accepted at {version}");
                let j = view.job(p.job).context("accepted job vanished")?;
                ensure!(j.state == JobState::Placed, "accepted job is {}", j.state);
                let pl = j.placement.as_ref().context("accepted job has no placement")?;
                ensure!(pl.members.len() == j.spec.members as usize, "accepted gang is not whole");
                ensure!(pl.members == p.members && pl.proposal == p.id, "placement differs from the proposal");
                ensure!(pl.level == *level && pl.placed_at == *version, "placement level/version");
                let mut want = before.servers().to_vec();
                adjust(&mut want, &p.members, true);
                ensure!(view.servers() == want.as_slice(), "servers after accept differ from before minus the gang");
                let t = &j.spec.tenant;
                ensure!(view.tenant_used(t) == before.tenant_used(t) + j.spec.total_gpus(), "tenant_used after accept");
                *self.times_accepted.entry(p.id).or_default() += 1;
                if self.times_accepted[&p.id] > 1 {
                    self.stats.reaccepted_ids += 1;
                }
                self.accepted.push(p.clone());
                self.stats.accepted += 1;
            }
            (Expect::AlreadyApplied, Decision::AlreadyApplied { job, proposal, version }) => {
                ensure!(*job == p.job && *proposal == p.id && *version == view.version(), "already-applied fields");
                ensure!(view.version() == before.version(), "already-applied changed the version");
                ensure!(view.state_hash() == before.state_hash(), "already-applied changed the state");
                self.stats.already_applied += 1;
            }
            (Expect::Rejected(reason, stale), Decision::Rejected { job, proposal, reason: got, fresh, version }) => {
                ensure!(*job == p.job && *proposal == p.id, "rejection names {job}/{proposal}");
                ensure!(got == reason, "rejected with {got:?}, oracle says {reason:?}");
                ensure!(*version == view.version() && view.version() == before.version(), "rejection changed version");
                ensure!(view.state_hash() == before.state_hash(), "rejection changed the state");
                check_fresh(view, p, fresh, stale)?;
                if !got.is_conflict() {
                    ensure!(fresh.is_empty(), "a non-conflict rejection carries fresh records");
                }
                match got {
                    Rejection::QuotaExceeded { .. } => self.stats.quota_rejections += 1,
                    Rejection::JobNotPending { .. } => self.stats.not_pending += 1,
                    Rejection::LocalityTooLoose { .. } => self.stats.too_loose += 1,
                    r if r.is_conflict() => {
                        self.stats.conflicts += 1;
                        self.stats.conflict_fresh_servers += fresh.len() as u64;
                        *self.stats.conflict_kinds.entry(r.code().to_string()).or_default() += 1;
                    }
                    _ => {}
                }
            }
            _ => bail!("decided {d:?}, oracle expected {expect:?}"),
        }
        Ok(())
    }

    fn pending_jobs(&self) -> Vec<JobId> {
        self.view.jobs().into_iter().filter(|j| j.state == JobState::Pending).map(|j| j.id).collect()
    }

    // ---- operations ----

    fn op_submit(&mut self, rng: &mut SmallRng) -> Result<()> {
        if !self.requests.is_empty() && rng.random_ratio(1, 4) {
            return self.op_resubmit(rng);
        }
        self.next_name += 1;
        let spec = random_job(rng, &self.layout, self.view.servers().len(), self.next_name);
        let request = rng.random_bool(0.5).then(|| RequestId::new(format!("req-{}", self.next_name))).transpose()?;
        self.submit_checked(rng, spec, request)
    }

    /// A client retries a submission under a request id it used before: with the same spec it
    /// gets the same job and nothing changes; with another spec it is refused; once the job is
    /// forgotten (ended and past the kept ones), the id admits afresh.
    fn op_resubmit(&mut self, rng: &mut SmallRng) -> Result<()> {
        let i = rng.random_range(0..self.requests.len());
        let (request, job, spec) = self.requests[i].clone();
        let other = rng.random_ratio(1, 3);
        let sent = if other {
            self.next_name += 1;
            random_job(rng, &self.layout, self.view.servers().len(), self.next_name)
        } else {
            spec.clone()
        };
        let remembered = self.view.job(job).is_some();
        ensure!(
            self.view.job_of_request(&request) == remembered.then_some(job),
            "request index disagrees with the jobs kept for `{request}`"
        );
        if !remembered {
            self.stats.resubmit_forgotten += 1;
            self.requests.swap_remove(i);
            return self.submit_checked(rng, sent, Some(request));
        }
        let before = self.view.clone();
        let out = self.exec(Command::Submit { spec: sent.clone(), request: Some(request.clone()) })?;
        ensure!(self.view.state_hash() == before.state_hash(), "a retried submission changed the state");
        ensure!(self.view.version() == before.version(), "a retried submission changed the version");
        match out {
            Outcome::Submitted(Ok(id)) if sent == spec => {
                ensure!(id == job, "retry of `{request}` answered {id}, first admitted {job}");
                self.stats.resubmitted += 1;
            }
            Outcome::Submitted(Err(ViewError::RequestReused { request: r, job: j })) if sent != spec => {
                ensure!(r == request.as_str() && j == job, "reuse refusal names {r}/{j}");
                self.stats.request_reused += 1;
            }
            other => bail!("retry of `{request}` (same spec: {}) answered {other:?}", sent == spec),
        }
        Ok(())
    }

    fn submit_checked(&mut self, rng: &mut SmallRng, spec: JobSpec, request: Option<RequestId>) -> Result<()> {
        let before = self.view.clone();
        let never = before.never_fits(&spec);
        let out = self.exec(Command::Submit { spec: spec.clone(), request: request.clone() })?;
        match out {
            Outcome::Submitted(Ok(id)) => {
                ensure!(never.is_none(), "admitted {id} though never_fits says {never:?}");
                let j = self.view.job(id).context("submitted job missing")?;
                ensure!(j.state == JobState::Pending && j.placement.is_none() && j.spec == spec, "submitted job");
                ensure!(j.request == request, "job keeps request {:?}, sent {request:?}", j.request);
                ensure!(self.view.servers() == before.servers(), "submit changed servers");
                if let Some(r) = request {
                    self.requests.push((r, id, spec.clone()));
                }
                self.stats.submitted += 1;
            }
            Outcome::Submitted(Err(ViewError::NeverFits(why))) => {
                ensure!(never.as_ref() == Some(&why), "refusal differs from never_fits");
                ensure!(self.view.state_hash() == before.state_hash(), "refused submit changed state");
                // No false refusals: a gang the shared fit function can build on the empty
                // cluster within the job's tolerance and quota does fit.
                let within_quota = self.view.quotas().get(&spec.tenant).is_none_or(|q| spec.total_gpus() <= *q);
                for _ in 0..4 {
                    if let Some(ms) = plan_gang(&self.layout, &self.pristine, &spec, rng, true) {
                        let level = gang_level(&self.layout, &self.pristine, &ms);
                        ensure!(
                            !within_quota || level > spec.tolerate,
                            "refused as never fitting ({why}), yet {ms:?} fits the empty cluster at {level}: {spec:?}"
                        );
                    }
                }
                self.stats.never_fits += 1;
            }
            other => bail!("submit answered {other:?}"),
        }
        Ok(())
    }

    /// A scheduler plans a pending job (as it sees it) from its stale copy and proposes; on a
    /// conflict it may apply the fresh records and retry.
    fn op_propose(&mut self, rng: &mut SmallRng, respect_locality: bool) -> Result<()> {
        let k = rng.random_range(0..self.scheds.len());
        let job = if !respect_locality {
            // Only jobs with a tolerance to break.
            let tight: Vec<JobId> = self
                .view
                .jobs()
                .into_iter()
                .filter(|j| j.state == JobState::Pending && j.spec.tolerate < LocalityLevel::Any)
                .map(|j| j.id)
                .collect();
            tight.choose(rng).copied()
        } else if rng.random_bool(0.75) {
            let mine: Vec<JobId> =
                self.scheds[k].jobs.values().filter(|j| j.state == JobState::Pending).map(|j| j.id).collect();
            mine.choose(rng).copied()
        } else {
            self.pending_jobs().choose(rng).copied()
        };
        let Some(job) = job else { return Ok(()) };
        let spec = match self.scheds[k].jobs.get(&job).or(self.view.job(job)) {
            Some(j) => j.spec.clone(),
            None => return Ok(()),
        };
        let mut refreshed: BTreeSet<ServerId> = BTreeSet::new();
        for attempt in 0..3 {
            let Some(members) = plan_gang(&self.layout, &self.scheds[k].servers, &spec, rng, respect_locality) else {
                return Ok(());
            };
            let id = self.proposal_id();
            let p = Proposal { id, job, members, based_on: self.scheds[k].version };
            let d = self.propose(p.clone(), None)?;
            match d {
                Decision::Accepted { .. } => {
                    if attempt > 0 {
                        self.stats.accepted_after_retry += 1;
                    }
                    return Ok(());
                }
                Decision::Rejected { reason, fresh, .. } if reason.is_conflict() && rng.random_bool(0.7) => {
                    // Fresh records are current: a retry never conflicts again on those servers.
                    // (The rejection changed nothing, so the oracle still names the conflicts.)
                    if let Expect::Rejected(_, conflicting) = predict(&self.view, &self.layout, &p) {
                        for s in &conflicting {
                            ensure!(!refreshed.contains(s), "retry conflicted again on refreshed {s}");
                        }
                    }
                    for (s, rec) in fresh {
                        self.scheds[k].servers[s.index()] = rec;
                        refreshed.insert(s);
                    }
                    if matches!(reason, Rejection::QuotaExceeded { .. }) {
                        return Ok(());
                    }
                }
                _ => return Ok(()),
            }
        }
        Ok(())
    }

    /// A scheduler whose copy is current except for one resource, so that its gang conflicts on
    /// that resource alone: either memory looks entirely free on the servers where it is short,
    /// or the planned cores of one member are swapped for one core that another job holds.
    fn op_propose_skewed(&mut self, rng: &mut SmallRng) -> Result<()> {
        let Some(job) = self.pending_jobs().choose(rng).copied() else { return Ok(()) };
        let spec = self.view.job(job).context("pending job")?.spec.clone();
        let mut recs = self.view.servers().to_vec();
        let memory = rng.random_bool(0.5);
        for (r, full) in recs.iter_mut().zip(&self.pristine) {
            // Hidden from the planner: servers where the resource is not an issue.
            let req = fit::member_request(&spec, self.layout.topo(r));
            if memory && r.free_memory_mib >= req.memory_mib || !memory && r.free_cores == full.free_cores {
                r.health = Health::Down;
            }
            if memory {
                r.free_memory_mib = full.free_memory_mib;
            }
        }
        let Some(mut members) = plan_gang(&self.layout, &recs, &spec, rng, true) else { return Ok(()) };
        if !memory {
            let servers = self.view.servers();
            let k = rng.random_range(0..members.len());
            let m = &mut members[k];
            let all = self.pristine[m.server.index()].free_cores;
            let taken = all.without(servers[m.server.index()].free_cores);
            let (Some(c), Some(drop)) = (taken.lowest(1), m.cores.lowest(1)) else { return Ok(()) };
            m.cores = m.cores.without(drop).or(c);
        }
        let id = self.proposal_id();
        self.propose(Proposal { id, job, members, based_on: self.view.version() }, None)?;
        Ok(())
    }

    /// A deliberately malformed proposal for a job pending in the view.
    fn op_bad(&mut self, rng: &mut SmallRng) -> Result<()> {
        let Some(job) = self.pending_jobs().choose(rng).copied() else { return Ok(()) };
        let spec = self.view.job(job).context("pending job")?.spec.clone();
        let k = rng.random_range(0..self.scheds.len());
        let members = match plan_gang(&self.layout, &self.scheds[k].servers, &spec, rng, true) {
            Some(m) => m,
            None => match plan_gang(&self.layout, &self.pristine, &spec, rng, true) {
                Some(m) => m,
                None => return Ok(()),
            },
        };
        let id = self.proposal_id();
        let mut p = Proposal { id, job, members, based_on: self.scheds[k].version };
        let kind = *BAD_KINDS.choose(rng).expect("kinds");
        let Some(reason) = break_proposal(kind, &mut p, &spec, &self.view, &self.layout, rng) else { return Ok(()) };
        ensure!(!reason.is_conflict(), "{kind:?} made a conflict rejection {reason:?}");
        let d = self.propose(p, Some(&reason)).with_context(|| format!("bad proposal {kind:?}"))?;
        ensure!(matches!(&d, Decision::Rejected { reason: r, .. } if *r == reason), "{kind:?} decided {d:?}");
        *self.stats.bad.entry(format!("{kind:?}")).or_default() += 1;
        Ok(())
    }

    /// Several schedulers' proposals in one command: each decided on its own, as if sent alone.
    fn op_batch(&mut self, rng: &mut SmallRng) -> Result<()> {
        let pending = self.pending_jobs();
        let mut batch = Vec::new();
        for _ in 0..rng.random_range(2..=4) {
            let Some(&job) = pending.choose(rng) else { break };
            let spec = self.view.job(job).context("pending job")?.spec.clone();
            let k = rng.random_range(0..self.scheds.len());
            if let Some(members) = plan_gang(&self.layout, &self.scheds[k].servers, &spec, rng, true) {
                let id = self.proposal_id();
                batch.push(Proposal { id, job, members, based_on: self.scheds[k].version });
            }
        }
        if batch.len() > 1 && rng.random_bool(0.3) {
            batch.push(batch[0].clone()); // a duplicate within the batch
        }
        if batch.is_empty() {
            return Ok(());
        }
        // The same proposals one by one on a copy, each checked against the oracle.
        let mut alone = self.view.clone();
        let mut want = Vec::new();
        for p in &batch {
            let expect = predict(&alone, &self.layout, p);
            let d = alone.propose(p);
            let ok = match (&expect, &d) {
                (Expect::Accepted(l), Decision::Accepted { level, .. }) => l == level,
                (Expect::AlreadyApplied, Decision::AlreadyApplied { .. }) => true,
                (Expect::Rejected(r, _), Decision::Rejected { reason, .. }) => r == reason,
                _ => false,
            };
            ensure!(ok, "in a batch, {p:?} decided {d:?}, oracle expected {expect:?}");
            want.push(d);
        }
        let out = self.exec(Command::Propose(batch.clone()))?;
        ensure!(out == Outcome::Decided(want), "batch decided {out:?} unlike one by one");
        ensure!(self.view.state_hash() == alone.state_hash(), "batch state differs from one-by-one state");
        let Outcome::Decided(ds) = &out else { bail!("batch answered {out:?}") };
        for (p, d) in batch.iter().zip(ds) {
            if let Decision::Accepted { .. } = d {
                *self.times_accepted.entry(p.id).or_default() += 1;
                self.accepted.push(p.clone());
                self.stats.accepted += 1;
            }
        }
        self.stats.batches += 1;
        Ok(())
    }

    /// Re-sends an earlier accepted proposal (a retry after a lost answer).
    /// A pending job preempts up to three gangs: mostly ones it outranks and that are under the
    /// bound, now and then ones at the bound or any holder (which the approver must refuse). Its gang is planned on the
    /// current records with the victims' resources given back. The oracle: a victim that may not
    /// be preempted is refused first; then the proposal checks, predicted on a copy of the view
    /// where the victims were released; then every victim must be needed. Accepted: each victim
    /// is pending, holds nothing and counts one more preemption, and the servers equal that copy
    /// with the gang taken. Refused: nothing changed (`exec` checks the hash).
    fn op_preempt(&mut self, rng: &mut SmallRng) -> Result<()> {
        let Some(job) = self.pending_jobs().choose(rng).copied() else { return Ok(()) };
        let me = self.view.job(job).context("pending job")?.clone();
        let max = self.view.priorities().max_preemptions;
        let holders: Vec<Job> = self.view.jobs().into_iter().filter(|j| j.state.holds_resources()).cloned().collect();
        let lawful: Vec<&Job> = holders.iter().filter(|v| me.outranks(v) && v.preemptions < max).collect();
        let spent: Vec<&Job> = holders.iter().filter(|v| me.outranks(v) && v.preemptions >= max).collect();
        let pool: Vec<&Job> = match rng.random_range(0..20) {
            0..=13 if !lawful.is_empty() => lawful,
            14..=16 if !spent.is_empty() => spent,
            _ => holders.iter().collect(),
        };
        if pool.is_empty() {
            return Ok(());
        }
        let n = if rng.random_bool(0.6) { 1 } else { rng.random_range(1..=pool.len().min(3)) };
        let victims: Vec<Job> = pool.choose_multiple(rng, n).map(|v| (*v).clone()).collect();
        let mut released = self.view.clone();
        for v in &victims {
            released.release(v.id, false).context("a holder releases")?;
        }
        // Planned on the records with the victims released, or, half the time, on what the victims
        // hold alone (so that the gang needs them).
        let plan_on = if rng.random_bool(0.5) {
            released.servers().to_vec()
        } else {
            let mut only: Vec<ServerRecord> = released
                .servers()
                .iter()
                .map(|r| ServerRecord { free_gpus: 0, free_cores: CoreMask::EMPTY, free_memory_mib: 0, ..*r })
                .collect();
            for v in &victims {
                let ms = v.placement.as_ref().map_or(&[][..], |p| &p.members[..]);
                adjust_healthy(&mut only, ms, false, &unhealthy(&self.view));
            }
            only
        };
        let Some(members) = plan_gang(&self.layout, &plan_on, &me.spec, rng, true) else { return Ok(()) };
        let id = self.proposal_id();
        let p = Proposal { id, job, members, based_on: self.view.version() };
        let pre =
            Preemption { proposal: p.clone(), victims: victims.iter().map(|v| v.id).collect(), reason: "test".into() };
        let uses = |v: &Job| {
            v.placement.as_ref().is_some_and(|pl| {
                pl.members.iter().any(|h| {
                    p.members
                        .iter()
                        .any(|m| m.server == h.server && (m.gpus & h.gpus != 0 || m.cores.intersects(h.cores)))
                })
            })
        };
        let expect = if let Some(v) = victims.iter().find(|v| !(me.outranks(v) && v.preemptions < max)) {
            let problem = if me.outranks(v) {
                VictimProblem::Exhausted { times: v.preemptions, max }
            } else {
                VictimProblem::NotLower {
                    victim: (v.spec.priority, v.service_queue),
                    preemptor: (me.spec.priority, me.service_queue),
                }
            };
            Some(Rejection::Victim { victim: v.id, problem })
        } else {
            match predict(&released, &self.layout, &p) {
                Expect::Rejected(r, _) => Some(r),
                Expect::AlreadyApplied => bail!("a fresh id predicted as applied"),
                Expect::Accepted(_) => victims
                    .iter()
                    .find(|v| !uses(v))
                    .map(|v| Rejection::Victim { victim: v.id, problem: VictimProblem::NotNeeded }),
            }
        };
        let out = self.exec(Command::Preempt(pre))?;
        let Outcome::Decided(ds) = out else { bail!("preempt answered {out:?}") };
        let [d] = ds.as_slice() else { bail!("one preemption, {} decisions", ds.len()) };
        match (expect, d) {
            (None, Decision::Accepted { .. }) => {
                for v in &victims {
                    let now = self.view.job(v.id).context("victim vanished")?;
                    ensure!(
                        now.state == JobState::Pending && now.placement.is_none() && now.tasks.is_empty(),
                        "victim {} is {} after the preemption",
                        v.id,
                        now.state
                    );
                    ensure!(now.preemptions == v.preemptions + 1, "victim {} preemptions not counted", v.id);
                }
                let placed = self.view.job(job).context("preemptor vanished")?;
                ensure!(placed.state == JobState::Placed, "preemptor is {}", placed.state);
                let mut want = released.servers().to_vec();
                adjust(&mut want, &p.members, true);
                ensure!(self.view.servers() == want.as_slice(), "servers differ from victims released + gang taken");
                self.accepted.push(p);
                self.stats.preempted += 1;
                self.stats.preempted_victims += victims.len() as u64;
            }
            (Some(r), Decision::Rejected { reason, .. }) => {
                ensure!(*reason == r, "preemption refused with {reason:?}, oracle says {r:?}");
                let code = match reason {
                    Rejection::Victim { problem, .. } => format!("victim:{}", problem_code(problem)),
                    other => other.code().to_string(),
                };
                *self.stats.preempt_refused.entry(code).or_default() += 1;
            }
            (e, d) => bail!("preemption decided {d:?}, oracle expected {e:?}"),
        }
        Ok(())
    }

    fn op_resend(&mut self, rng: &mut SmallRng) -> Result<()> {
        let Some(p) = self.accepted.choose(rng).cloned() else { return Ok(()) };
        let holds = self.view.job(p.job).and_then(|j| j.placement.as_ref()).is_some_and(|pl| pl.proposal == p.id);
        let d = self.propose(p.clone(), None)?;
        if holds {
            ensure!(matches!(d, Decision::AlreadyApplied { .. }), "re-sent live proposal {} decided {d:?}", p.id);
        }
        Ok(())
    }

    fn op_end(&mut self, rng: &mut SmallRng, cancel: bool) -> Result<()> {
        let jobs = self.view.jobs();
        let placed: Vec<JobId> = jobs.iter().filter(|j| j.state.holds_resources()).map(|j| j.id).collect();
        let any: Vec<JobId> = jobs.iter().map(|j| j.id).collect();
        let job = match rng.random_range(0..10) {
            0 => JobId(rng.random_range(0..self.view.jobs().len() as u64 + 20)),
            1..=2 => any.choose(rng).copied().unwrap_or(JobId(0)),
            _ => match placed.choose(rng).or(any.choose(rng)) {
                Some(j) => *j,
                None => return Ok(()),
            },
        };
        let before = self.view.clone();
        let failed = rng.random_bool(0.3);
        let cmd = if cancel { Command::Cancel { job, reason: None } } else { Command::Release { job, failed } };
        let out = self.exec(cmd)?;
        let Outcome::Ended(res) = out else { bail!("end answered {out:?}") };
        let old = before.job(job);
        let allowed = match old {
            None => false,
            Some(j) if cancel => !matches!(j.state, JobState::Finished | JobState::Failed),
            Some(j) => j.state.holds_resources(),
        };
        match (res, old) {
            (Ok(()), Some(j)) => {
                ensure!(allowed, "ended {job} in state {}", j.state);
                let mut want = before.servers().to_vec();
                if let Some(pl) = &j.placement {
                    adjust_healthy(&mut want, &pl.members, false, &unhealthy(&before));
                }
                ensure!(self.view.servers() == want.as_slice(), "ending {job} did not free exactly its resources");
                let state = if cancel || failed { JobState::Failed } else { JobState::Finished };
                if let Some(now) = self.view.job(job) {
                    ensure!(now.state == state && now.placement.is_none(), "{job} is {} after ending", now.state);
                }
                if cancel { self.stats.cancels += 1 } else { self.stats.releases += 1 }
            }
            (Err(e), _) => {
                ensure!(!allowed, "ending {job} refused: {e}");
                let ok = match (&e, old) {
                    (ViewError::UnknownJob(j), None) => *j == job,
                    (ViewError::BadJobState { job: j, .. }, Some(_)) => *j == job,
                    _ => false,
                };
                ensure!(ok, "ending {job} refused with the wrong error {e:?}");
                ensure!(self.view.state_hash() == before.state_hash(), "refused end changed state");
            }
            (Ok(()), None) => bail!("ended unknown {job}"),
        }
        Ok(())
    }

    fn op_health(&mut self, rng: &mut SmallRng, down: bool) -> Result<()> {
        let n = self.view.servers().len() as u32;
        let server = if rng.random_range(0..30) == 0 {
            ServerId(n + rng.random_range(0..3))
        } else if down {
            ServerId(rng.random_range(0..n))
        } else {
            let sick: Vec<u32> = (0..n).filter(|&s| self.view.servers()[s as usize].health != Health::Up).collect();
            match sick.choose(rng) {
                Some(&s) => ServerId(s),
                None => ServerId(rng.random_range(0..n)),
            }
        };
        let health = if down {
            Health::Down
        } else if rng.random_range(0..5) == 0 {
            Health::Draining
        } else {
            Health::Up
        };
        let before = self.view.clone();
        let out = self.exec(Command::SetHealth { server, health })?;
        let Outcome::HealthSet(res) = out else { bail!("set health answered {out:?}") };
        let Some(old) = before.server(server) else {
            ensure!(matches!(res, Err(ViewError::UnknownServer(_))), "unknown {server}: {res:?}");
            ensure!(self.view.state_hash() == before.state_hash(), "unknown server changed state");
            return Ok(());
        };
        let requeued = res.map_err(|e| anyhow::anyhow!("set health of {server}: {e}"))?;
        if old.health == health {
            ensure!(requeued.is_empty() && self.view.state_hash() == before.state_hash(), "no-op health change");
            return Ok(());
        }
        ensure!(self.view.server(server).map(|r| r.health) == Some(health), "health not set");
        ensure!(self.view.version().0 == before.version().0 + 1, "a health change did not bump the version");
        let hit: Vec<&Job> = before
            .jobs()
            .into_iter()
            .filter(|j| {
                health == Health::Down
                    && j.placement.as_ref().is_some_and(|p| p.members.iter().any(|m| m.server == server))
            })
            .collect();
        let want_ids: Vec<JobId> = hit.iter().map(|j| j.id).collect();
        ensure!(requeued == want_ids, "{server} {health}: requeued {requeued:?}, its gangs are {want_ids:?}");
        // Every member of every hit gang, on every server, is freed; nothing else changes.
        let mut want = before.servers().to_vec();
        for j in &hit {
            adjust_healthy(&mut want, &j.placement.as_ref().expect("placed").members, false, &unhealthy(&before));
        }
        want[server.index()].health = health;
        ensure!(self.view.servers() == want.as_slice(), "{server} {health}: servers not freed exactly");
        for j in before.jobs() {
            let now = self.view.job(j.id).context("job vanished on health change")?;
            if want_ids.contains(&j.id) {
                ensure!(now.state == JobState::Pending && now.placement.is_none(), "{} not re-queued whole", j.id);
                ensure!(now.spec == j.spec && now.submitted_at == j.submitted_at, "{} re-queued changed", j.id);
            } else {
                ensure!(now == j, "{} changed though it had no member on {server}", j.id);
            }
        }
        self.stats.requeued += want_ids.len() as u64;
        Ok(())
    }

    /// A node agent reports a task: mostly of a live placement, sometimes stale (another
    /// proposal, member or server). Checks the member and job states and what is freed.
    fn op_task(&mut self, rng: &mut SmallRng) -> Result<()> {
        let placed: Vec<Job> = self.view.jobs().into_iter().filter(|j| j.placement.is_some()).cloned().collect();
        let Some(j) = placed.choose(rng).cloned() else { return Ok(()) };
        let pl = j.placement.clone().context("placed")?;
        let mut member = rng.random_range(0..pl.members.len() as u32);
        let mut proposal = pl.proposal;
        let mut server = pl.members[member as usize].server;
        let stale = rng.random_range(0..8) == 0;
        if stale {
            match rng.random_range(0..3) {
                0 => proposal = ProposalId(proposal.0 ^ 1 << 40),
                1 => member = pl.members.len() as u32 + rng.random_range(0..3),
                _ => server = ServerId(server.0 + 1 + rng.random_range(0..3)),
            }
        }
        let event = match rng.random_range(0..10) {
            0..=4 => TaskEvent::Started,
            5..=8 => TaskEvent::Exited { code: 0, message: String::new() },
            _ => TaskEvent::Exited { code: rng.random_range(1..130), message: "boom".into() },
        };
        let before = self.view.clone();
        let out = self.exec(Command::Task { job: j.id, proposal, member, server, event: event.clone() })?;
        let Outcome::TaskReported(res) = out else { bail!("task report answered {out:?}") };
        let wrong_server = pl.members.get(member as usize).is_some_and(|m| m.server != server);
        if stale && (proposal != pl.proposal || member as usize >= pl.members.len() || wrong_server) {
            ensure!(matches!(res, Err(ViewError::StaleTask { .. })), "stale report answered {res:?}");
            ensure!(self.view.state_hash() == before.state_hash(), "a stale report changed state");
            return Ok(());
        }
        let state = res.map_err(|e| anyhow::anyhow!("report on {}: {e}", j.id))?;
        let mut tasks = j.tasks.clone();
        let k = member as usize;
        let ends = match &event {
            TaskEvent::Started => {
                if tasks[k] == TaskState::Starting {
                    tasks[k] = TaskState::Running;
                }
                None
            }
            TaskEvent::Exited { code: 0, .. } => {
                tasks[k] = TaskState::Succeeded;
                tasks.iter().all(|t| *t == TaskState::Succeeded).then_some(JobState::Finished)
            }
            TaskEvent::Exited { .. } => Some(JobState::Failed),
        };
        // An ended job may be forgotten at once (`ended_kept` = 0).
        let now = self.view.job(j.id);
        ensure!(now.is_some() || ends.is_some(), "{} vanished on a report that does not end it", j.id);
        if let Some(now) = now {
            ensure!(now.state == state, "report answered {state} but the job is {}", now.state);
        }
        match ends {
            Some(end) => {
                ensure!(state == end, "{} is {state}, want {end}", j.id);
                if let Some(now) = now {
                    ensure!(now.placement.is_none() && now.tasks.is_empty(), "{} ended holding a placement", j.id);
                    let error_ok = match end {
                        JobState::Failed => {
                            now.error.as_ref().is_some_and(|e| e.contains(&format!("member {member} ")))
                        }
                        _ => now.error == j.error,
                    };
                    ensure!(error_ok, "{} ended {end} with error {:?}", j.id, now.error);
                }
                let mut want = before.servers().to_vec();
                adjust_healthy(&mut want, &pl.members, false, &unhealthy(&before));
                ensure!(self.view.servers() == want.as_slice(), "ending {} by a report did not free it exactly", j.id);
            }
            None => {
                let now = now.context("checked above")?;
                ensure!(now.tasks == tasks, "{}: tasks {:?}, want {tasks:?}", j.id, now.tasks);
                let all_up = tasks.iter().all(|t| *t != TaskState::Starting);
                let want = if j.state == JobState::Placed && all_up { JobState::Running } else { j.state };
                ensure!(state == want, "{} is {state}, want {want}", j.id);
                ensure!(self.view.servers() == before.servers(), "a task report moved resources");
            }
        }
        Ok(())
    }

    /// A node agent reports unhealthy devices (sometimes ones that do not exist, or an unknown
    /// server): free devices that turn unhealthy leave the free mask, held ones stay held.
    fn op_devices(&mut self, rng: &mut SmallRng) -> Result<()> {
        let n = self.view.servers().len() as u32;
        let server = if rng.random_range(0..20) == 0 { ServerId(n) } else { ServerId(rng.random_range(0..n)) };
        let all = self.view.server(server).map_or(0xff, |r| self.view.topology_of(r.config_set).all_devices());
        let devices = match rng.random_range(0..10) {
            0..=3 => 0,
            4 => (all << 1 | 1) & !all,
            _ => rng.random::<u64>() & rng.random::<u64>() & rng.random::<u64>() & all,
        };
        let before = self.view.clone();
        let out = self.exec(Command::SetUnhealthyDevices { server, devices })?;
        let Outcome::DevicesSet(res) = out else { bail!("device health answered {out:?}") };
        if server.0 >= n || devices & !all != 0 {
            ensure!(res.is_err(), "bad device report accepted: {server} {devices:#x}");
            ensure!(self.view.state_hash() == before.state_hash(), "a refused device report changed state");
            return Ok(());
        }
        res.map_err(|e| anyhow::anyhow!("device report on {server}: {e}"))?;
        ensure!(self.view.unhealthy_devices(server) == devices, "unhealthy devices not recorded");
        let mut want = before.servers().to_vec();
        let held: u64 = before
            .jobs()
            .iter()
            .filter_map(|j| j.placement.as_ref())
            .flat_map(|p| p.members.iter())
            .filter(|m| m.server == server)
            .fold(0, |a, m| a | m.gpus);
        want[server.index()].free_gpus = all & !held & !devices;
        ensure!(self.view.servers() == want.as_slice(), "device report on {server} changed other state");
        for j in before.jobs() {
            ensure!(self.view.job(j.id) == Some(j), "{} changed on a device report", j.id);
        }
        Ok(())
    }

    /// A scheduler catches up: by a clone, a snapshot, or by applying a delta to its copy.
    fn op_refresh(&mut self, rng: &mut SmallRng) -> Result<()> {
        let k = rng.random_range(0..self.scheds.len());
        match rng.random_range(0..3) {
            0 => self.scheds[k] = Sched::from_clone(&self.view),
            1 => self.scheds[k] = Sched::from_snapshot(self.view.snapshot()),
            _ => {
                let since = self.scheds[k].version;
                match self.view.delta_since(since) {
                    Some(d) => {
                        ensure!(d.from == since && d.to == self.view.version(), "delta {}..{}", d.from, d.to);
                        let s = &mut self.scheds[k];
                        for (id, rec) in d.servers {
                            s.servers[id.index()] = rec;
                        }
                        for j in d.jobs {
                            s.jobs.insert(j.id, j);
                        }
                        s.version = d.to;
                        ensure!(s.servers == self.view.servers(), "servers after a delta from {since} are stale");
                        for j in self.view.jobs() {
                            ensure!(s.jobs.get(&j.id) == Some(j), "{} after a delta from {since} is stale", j.id);
                        }
                        self.stats.refresh_by_delta += 1;
                    }
                    None => {
                        ensure!(self.p.log_cap.is_some(), "delta from {since} refused with an unbounded change log");
                        self.stats.refresh_delta_none += 1;
                        self.scheds[k] = Sched::from_snapshot(self.view.snapshot());
                    }
                }
            }
        }
        Ok(())
    }

    fn op_checkpoint(&mut self) {
        self.checkpoints.push(Checkpoint {
            version: self.view.version(),
            servers: self.view.servers().to_vec(),
            jobs: jobs_map(&self.view),
        });
    }

    fn start_replica(&mut self) -> Result<()> {
        let json = serde_json::to_string(&self.view.snapshot())?;
        let snap: ViewSnapshot = serde_json::from_str(&json)?;
        ensure!(snap == self.view.snapshot(), "snapshot changed through JSON");
        let (cap, kept) = limits(&self.p);
        let r = ClusterView::from_snapshot(snap).with_limits(cap, kept);
        ensure!(r.state_hash() == self.view.state_hash(), "replica from snapshot has another state hash");
        self.replica = Some(r);
        Ok(())
    }

    fn step(&mut self, rng: &mut SmallRng) -> Result<()> {
        match rng.random_range(0..100) {
            0..=13 => self.op_submit(rng),
            14..=39 => self.op_propose(rng, true),
            40..=43 => self.op_propose_skewed(rng),
            44..=46 => self.op_propose(rng, false),
            47..=56 => self.op_bad(rng),
            57..=60 => self.op_batch(rng),
            61..=66 => self.op_resend(rng),
            67..=74 => self.op_end(rng, false),
            75..=78 => self.op_end(rng, true),
            79..=80 => self.op_health(rng, true),
            81..=82 => self.op_health(rng, false),
            83..=86 => self.op_task(rng),
            87 => self.op_devices(rng),
            88..=93 => self.op_refresh(rng),
            94..=97 => self.op_preempt(rng),
            _ => {
                self.op_checkpoint();
                Ok(())
            }
        }
    }

    /// The end-of-run properties: replay, snapshot, deltas.
    fn finish(&mut self) -> Result<()> {
        let h = self.view.state_hash();
        // Replaying the log on a fresh view, from the commands as logged and after JSON.
        let cmds: Vec<Command> = self.log.iter().map(|(c, _, _)| c.clone()).collect();
        let json = serde_json::to_string(&cmds)?;
        let back: Vec<Command> = serde_json::from_str(&json)?;
        ensure!(back == cmds, "commands changed through JSON");
        for cmds in [&cmds, &back] {
            let mut r = fresh_view(&self.p, &self.spec);
            for (i, (c, (_, out, hash))) in cmds.iter().zip(&self.log).enumerate() {
                let o = r.apply(c);
                ensure!(&o == out, "replay step {i}: {c:?} decided {o:?}, originally {out:?}");
                ensure!(r.state_hash() == *hash, "replay step {i}: state hash differs after {c:?}");
            }
            ensure!(r.state_hash() == h && r.version() == self.view.version(), "replay ends elsewhere");
        }
        // A snapshot rebuilds the same state.
        let again = ClusterView::from_snapshot(self.view.snapshot());
        ensure!(again.state_hash() == h, "from_snapshot(snapshot) has another state hash");
        ensure!(again.snapshot() == self.view.snapshot(), "snapshot of the rebuilt view differs");
        ensure!(invariants::check(&again).is_clean(), "rebuilt view breaks invariants");
        // Deltas bring old copies up to date.
        let current_jobs = jobs_map(&self.view);
        for cp in &self.checkpoints {
            let mut visited = HashSet::new();
            let reachable = self.view.for_each_changed_server(cp.version, |s, rec| {
                visited.insert((s, *rec));
            });
            match self.view.delta_since(cp.version) {
                Some(d) => {
                    ensure!(reachable, "for_each_changed_server refuses what delta_since serves");
                    ensure!(d.from == cp.version && d.to == self.view.version(), "delta bounds");
                    let listed: HashSet<(ServerId, ServerRecord)> = d.servers.iter().copied().collect();
                    let listed_ids: BTreeSet<ServerId> = listed.iter().map(|(s, _)| *s).collect();
                    ensure!(listed_ids.len() == d.servers.len(), "delta lists a server twice");
                    ensure!(visited == listed, "for_each_changed_server visits other servers than the delta");
                    let mut servers = cp.servers.clone();
                    for (s, rec) in &d.servers {
                        servers[s.index()] = *rec;
                    }
                    ensure!(
                        servers == self.view.servers(),
                        "delta from {} does not reach the current servers",
                        cp.version
                    );
                    let mut jobs = cp.jobs.clone();
                    for j in d.jobs {
                        jobs.insert(j.id, j);
                    }
                    for (id, j) in &current_jobs {
                        ensure!(jobs.get(id) == Some(j), "delta from {}: {id} is stale", cp.version);
                    }
                    self.stats.delta_checks += 1;
                }
                None => {
                    ensure!(!reachable, "delta_since refuses what for_each_changed_server serves");
                    ensure!(self.p.log_cap.is_some(), "delta from {} refused with an unbounded log", cp.version);
                }
            }
        }
        Ok(())
    }
}

fn run_scenario(p: &Params) -> Result<Stats> {
    let mut rng = SmallRng::seed_from_u64(p.seed);
    let mut w = World::new(p);
    for _ in 0..3 {
        w.op_submit(&mut rng)?;
    }
    w.op_checkpoint();
    let replica_at = rng.random_range(0..p.ops);
    for i in 0..p.ops {
        if i == replica_at {
            w.start_replica()?;
        }
        w.step(&mut rng).with_context(|| format!("op #{i}"))?;
    }
    w.finish().context("end of run")?;
    Ok(w.stats)
}

/// 256 cases, or `APPROVER_CASES` for a longer hunt. No regression files: a failure prints its
/// `Params`, which reproduce it exactly.
fn config() -> ProptestConfig {
    let cases = std::env::var("APPROVER_CASES").ok().and_then(|c| c.parse().ok()).unwrap_or(256);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

proptest! {
    #![proptest_config(config())]

    /// Many stale schedulers, random interleavings, releases and failures: every invariant holds
    /// after every command, and the log replays to the same state.
    #[test]
    fn stale_schedulers_never_break_the_view(p in params()) {
        if let Err(e) = run_scenario(&p) {
            prop_assert!(false, "{:?}\n{:#}", p, e);
        }
    }
}

/// The generator is not vacuous: a fixed set of scenarios reaches every path the properties
/// talk about.
#[test]
fn scenarios_exercise_every_path() {
    let mut total = Stats::default();
    let mut rng = SmallRng::seed_from_u64(7);
    for i in 0..48u64 {
        let p = Params {
            seed: rng.random(),
            preset: (i % 4) as usize,
            second: (i % 3 == 0).then_some(((i / 4) % 4) as usize),
            servers: rng.random_range(2..=12),
            servers_per_rack: rng.random_range(1..=6),
            racks_per_ib: rng.random_range(1..=3),
            quota: (i % 2 == 0).then(|| rng.random_range(4..=32)),
            schedulers: rng.random_range(2..=8),
            ops: 150,
            log_cap: (i % 4 == 1).then(|| rng.random_range(4..=64)),
            ended_kept: (i % 4 == 2).then(|| rng.random_range(0..=6)),
        };
        let stats = run_scenario(&p).unwrap_or_else(|e| panic!("{p:?}\n{e:#}"));
        total.add(&stats);
    }
    eprintln!("{total:#?}");
    let t = &total;
    for (what, n) in [
        ("submitted", t.submitted),
        ("never_fits", t.never_fits),
        ("accepted", t.accepted),
        ("accepted_after_retry", t.accepted_after_retry),
        ("conflicts", t.conflicts),
        ("quota_rejections", t.quota_rejections),
        ("not_pending", t.not_pending),
        ("too_loose", t.too_loose),
        ("already_applied", t.already_applied),
        ("batches", t.batches),
        ("releases", t.releases),
        ("cancels", t.cancels),
        ("requeued", t.requeued),
        ("refresh_by_delta", t.refresh_by_delta),
        ("refresh_delta_none", t.refresh_delta_none),
        ("delta_checks", t.delta_checks),
        ("replica_steps", t.replica_steps),
        ("resubmitted", t.resubmitted),
        ("request_reused", t.request_reused),
        ("resubmit_forgotten", t.resubmit_forgotten),
    ] {
        assert!(n > 0, "no scenario reached `{what}`: {total:#?}");
    }
    assert!(t.conflict_fresh_servers >= t.conflicts, "conflicts without fresh records");
    for code in ["server_not_up", "devices_busy", "cores_busy", "memory_short"] {
        assert!(t.conflict_kinds.get(code).copied().unwrap_or(0) > 0, "no `{code}` conflict: {total:#?}");
    }
    for kind in BAD_KINDS {
        assert!(t.bad.get(&format!("{kind:?}")).copied().unwrap_or(0) > 0, "no `{kind:?}` proposal was sent");
    }
    assert!(t.preempted > 0 && t.preempted_victims >= t.preempted, "no preemption applied: {total:#?}");
    for code in ["victim:not_lower", "victim:exhausted", "victim:not_needed"] {
        assert!(t.preempt_refused.get(code).copied().unwrap_or(0) > 0, "no preemption refused as `{code}`: {total:#?}");
    }
}

/// A short name of a victim problem, for the coverage counters.
fn problem_code(p: &VictimProblem) -> &'static str {
    match p {
        VictimProblem::Unknown => "unknown",
        VictimProblem::IsPreemptor => "is_preemptor",
        VictimProblem::Duplicate => "duplicate",
        VictimProblem::HoldsNothing { .. } => "holds_nothing",
        VictimProblem::NotLower { .. } => "not_lower",
        VictimProblem::Exhausted { .. } => "exhausted",
        VictimProblem::NotNeeded => "not_needed",
    }
}

// ---------------------------------------------------------------------------------------------
// Plain tests
// ---------------------------------------------------------------------------------------------

/// `servers` seed-8gpu servers, `per_rack` to a rack, two racks to an InfiniBand domain.
fn seed_view(servers: u32, per_rack: u32) -> ClusterView {
    ClusterView::from_spec(&ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), servers, per_rack, 2))
}

fn submit(view: &mut ClusterView, spec: JobSpec) -> JobId {
    match view.apply(&Command::submit(spec)) {
        Outcome::Submitted(Ok(id)) => id,
        other => panic!("submit: {other:?}"),
    }
}

fn decide(view: &mut ClusterView, p: &Proposal) -> Decision {
    match view.apply(&Command::Propose(vec![p.clone()])) {
        Outcome::Decided(mut ds) if ds.len() == 1 => ds.remove(0),
        other => panic!("propose: {other:?}"),
    }
}

/// Plans member `i` of `spec` on `on[i]`, with the shared fit function, on a copy of `servers`.
fn plan_on(view: &ClusterView, servers: &[ServerRecord], spec: &JobSpec, on: &[u32]) -> Vec<MemberPlacement> {
    let layout = Layout::of(view);
    let mut recs = servers.to_vec();
    on.iter()
        .map(|&s| {
            let rec = recs[s as usize];
            let topo = layout.topo(&rec);
            let req = fit::member_request(spec, topo);
            let (m, _) = fit::plan_member(topo, &rec, ServerId(s), &req, LocalityLevel::Server, FitMode::Pack)
                .unwrap_or_else(|| panic!("member does not fit on server#{s}"));
            take(&mut recs[s as usize], &m);
            m
        })
        .collect()
}

fn clean(view: &ClusterView) {
    let rep = invariants::check(view);
    assert!(rep.is_clean(), "{:#?}", rep.violations);
}

/// `fresh` starts with the current records of exactly the `conflicting` servers, in member order
/// (anything after them changed since the proposal's version; see `check_fresh`).
fn assert_fresh(view: &ClusterView, p: &Proposal, fresh: &[(ServerId, ServerRecord)], conflicting: &[u32]) {
    let want: Vec<(ServerId, ServerRecord)> =
        conflicting.iter().map(|&s| (ServerId(s), *view.server(ServerId(s)).expect("server"))).collect();
    assert!(fresh.len() >= want.len() && fresh[..want.len()] == want[..], "fresh {fresh:?}, want first {want:?}");
    let set = want.iter().map(|(s, _)| *s).collect();
    check_fresh(view, p, fresh, &set).unwrap_or_else(|e| panic!("{e:#}"));
}

fn rejected(d: Decision) -> (Rejection, Vec<(ServerId, ServerRecord)>) {
    match d {
        Decision::Rejected { reason, fresh, .. } => (reason, fresh),
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn conflict_rejection_carries_fresh_record_of_every_conflicting_server() {
    let mut view = seed_view(4, 4);
    let a = submit(&mut view, JobSpec::simple("a", 2, 4));
    let b = submit(&mut view, JobSpec::simple("b", 2, 4));
    let c = submit(&mut view, JobSpec::simple("c", 2, 4));
    // Two schedulers plan on the same snapshot and pick the same devices.
    let snap = view.snapshot();
    let pa = Proposal {
        id: ProposalId(1),
        job: a,
        members: plan_on(&view, &snap.servers, &view.job(a).expect("a").spec, &[0, 1]),
        based_on: snap.version,
    };
    let pb = Proposal {
        id: ProposalId(2),
        job: b,
        members: plan_on(&view, &snap.servers, &view.job(b).expect("b").spec, &[0, 1]),
        based_on: snap.version,
    };
    let devices = |p: &Proposal| p.members.iter().map(|m| (m.server, m.gpus)).collect::<Vec<_>>();
    assert_eq!(devices(&pa), devices(&pb), "both planned the same devices");
    assert!(matches!(decide(&mut view, &pa), Decision::Accepted { .. }));
    let (h, v) = (view.state_hash(), view.version());
    let mut fresh_all = Vec::new();
    let (reason, fresh) = rejected(decide(&mut view, &pb));
    assert!(reason.is_conflict(), "{reason:?}");
    assert_eq!(reason, Rejection::DevicesBusy { server: ServerId(0), mask: pa.members[0].gpus });
    assert_fresh(&view, &pb, &fresh, &[0, 1]);
    assert_eq!((view.state_hash(), view.version()), (h, v), "a rejection changes nothing");
    fresh_all.extend(fresh);

    // The conflicting server comes back first: b on a busy server and a free one.
    let pb2 = Proposal {
        id: ProposalId(3),
        members: plan_on(&view, &snap.servers, &view.job(b).expect("b").spec, &[1, 2]),
        ..pb.clone()
    };
    let (reason, fresh) = rejected(decide(&mut view, &pb2));
    assert!(matches!(reason, Rejection::DevicesBusy { server: ServerId(1), .. }), "{reason:?}");
    assert_fresh(&view, &pb2, &fresh, &[1]);
    fresh_all.extend(fresh);

    // A down server is a conflict too, and its record comes back with the busy one.
    assert_eq!(
        view.apply(&Command::SetHealth { server: ServerId(3), health: Health::Down }),
        Outcome::HealthSet(Ok(vec![]))
    );
    let pc = Proposal {
        id: ProposalId(4),
        job: c,
        members: plan_on(&view, &snap.servers, &view.job(c).expect("c").spec, &[0, 3]),
        based_on: snap.version,
    };
    let (reason, fresh) = rejected(decide(&mut view, &pc));
    assert!(matches!(reason, Rejection::DevicesBusy { server: ServerId(0), .. }), "{reason:?}");
    assert_fresh(&view, &pc, &fresh, &[0, 3]);
    assert_eq!(fresh[1].1.health, Health::Down);
    fresh_all.extend(fresh);

    // A scheduler that applies every fresh record it got to its stale copy plans a gang that is
    // accepted: it avoids the down server and the devices now taken.
    let mut stale = snap.servers.clone();
    for (s, rec) in fresh_all {
        stale[s.index()] = rec;
    }
    let spec = view.job(c).expect("c").spec.clone();
    let mut members = Vec::new();
    for _ in 0..spec.members {
        let (s, m) = (0..stale.len())
            .find_map(|s| {
                let topo = Topology::preset("seed-8gpu").expect("preset");
                let req = fit::member_request(&spec, &topo);
                fit::plan_member(&topo, &stale[s], ServerId(s as u32), &req, LocalityLevel::Server, FitMode::Pack)
                    .map(|(m, _)| (s, m))
            })
            .expect("a member fits on the refreshed copy");
        take(&mut stale[s], &m);
        members.push(m);
    }
    assert!(members.iter().all(|m| m.server != ServerId(3)), "{members:?}");
    let retry = Proposal { id: ProposalId(5), members, ..pc };
    assert!(matches!(decide(&mut view, &retry), Decision::Accepted { .. }));
    clean(&view);
}

#[test]
fn down_server_requeues_a_multi_member_gang_whole_and_frees_every_member() {
    let mut view = seed_view(4, 2);
    let empty = view.servers().to_vec();
    let mut gang = JobSpec::simple("gang", 3, 4);
    gang.cpu = CpuDemand::Fixed { cores_per_gpu: 2 };
    gang.tenant = "vision".into();
    let g = submit(&mut view, gang.clone());
    let solo = submit(&mut view, JobSpec::simple("solo", 1, 8));
    let side = submit(&mut view, JobSpec::simple("side", 1, 2));
    let pg = Proposal {
        id: ProposalId(10),
        job: g,
        members: plan_on(&view, view.servers(), &gang, &[0, 1, 2]),
        based_on: view.version(),
    };
    assert!(matches!(decide(&mut view, &pg), Decision::Accepted { level: LocalityLevel::IbDomain, .. }));
    let ps = Proposal {
        id: ProposalId(11),
        job: solo,
        members: plan_on(&view, view.servers(), &view.job(solo).expect("solo").spec, &[3]),
        based_on: view.version(),
    };
    assert!(matches!(decide(&mut view, &ps), Decision::Accepted { .. }));
    let pside = Proposal {
        id: ProposalId(12),
        job: side,
        members: plan_on(&view, view.servers(), &view.job(side).expect("side").spec, &[0]),
        based_on: view.version(),
    };
    assert!(matches!(decide(&mut view, &pside), Decision::Accepted { .. }));
    assert_eq!(view.tenant_used("vision"), 12);
    let before = view.clone();

    let out = view.apply(&Command::SetHealth { server: ServerId(1), health: Health::Down });
    assert_eq!(out, Outcome::HealthSet(Ok(vec![g])));
    let j = view.job(g).expect("gang");
    assert_eq!((j.state, j.placement.is_none()), (JobState::Pending, true), "re-queued whole");
    assert_eq!(view.tenant_used("vision"), 0);
    // Every member's resources are back, on every server: server 0 holds only `side`, 1 and 2 nothing.
    let mut want = empty.clone();
    adjust(&mut want, &pside.members, true);
    adjust(&mut want, &ps.members, true);
    want[1].health = Health::Down;
    assert_eq!(view.servers(), want.as_slice());
    assert_eq!(view.job(solo), before.job(solo), "a gang without a member there is untouched");
    assert_eq!(view.job(side), before.job(side));
    clean(&view);

    // The job is placed again elsewhere; a gang naming the down server is refused as a conflict.
    let resent = Proposal { id: ProposalId(13), ..pg.clone() };
    let (reason, fresh) = rejected(decide(&mut view, &resent));
    assert_eq!(reason, Rejection::ServerNotUp { server: ServerId(1), health: Health::Down });
    assert_fresh(&view, &resent, &fresh, &[1]);
    let again = Proposal {
        id: ProposalId(14),
        job: g,
        members: plan_on(&view, view.servers(), &gang, &[0, 2, 2]),
        based_on: view.version(),
    };
    assert!(matches!(decide(&mut view, &again), Decision::Accepted { .. }));
    assert_eq!(view.job(g).and_then(|j| j.placement.as_ref()).map(|p| p.members.len()), Some(3));
    clean(&view);
}

#[test]
fn quota_is_enforced_at_submit_and_at_approval() {
    let mut spec = ClusterSpec::uniform(Topology::preset("pcie-4gpu").expect("preset"), 4, 2, 1);
    spec.quotas.insert("vision".into(), 8);
    let mut view = ClusterView::from_spec(&spec);
    let job = |name: &str, members: u32, gpus: u32| {
        let mut s = JobSpec::simple(name, members, gpus);
        s.tenant = "vision".into();
        s
    };
    // More than the quota can never run.
    let (h, v) = (view.state_hash(), view.version());
    let out = view.apply(&Command::submit(job("huge", 3, 4)));
    assert!(matches!(&out, Outcome::Submitted(Err(ViewError::NeverFits(m))) if m.contains("quota")), "{out:?}");
    assert_eq!((view.state_hash(), view.version()), (h, v));
    let a = submit(&mut view, job("a", 2, 4));
    let b = submit(&mut view, job("b", 1, 2));
    let other = submit(&mut view, JobSpec::simple("other", 1, 4));
    let pa = Proposal {
        id: ProposalId(1),
        job: a,
        members: plan_on(&view, view.servers(), &job("a", 2, 4), &[0, 1]),
        based_on: view.version(),
    };
    assert!(matches!(decide(&mut view, &pa), Decision::Accepted { .. }));
    assert_eq!(view.tenant_used("vision"), 8);
    let pb = Proposal {
        id: ProposalId(2),
        job: b,
        members: plan_on(&view, view.servers(), &job("b", 1, 2), &[2]),
        based_on: view.version(),
    };
    let (h, v) = (view.state_hash(), view.version());
    let (reason, fresh) = rejected(decide(&mut view, &pb));
    assert_eq!(reason, Rejection::QuotaExceeded { tenant: "vision".into(), quota: 8, used: 8, asked: 2 });
    assert!(reason.is_conflict() && fresh.is_empty(), "quota is a retryable conflict with no stale server");
    assert_eq!((view.state_hash(), view.version()), (h, v));
    // Other tenants are not limited.
    let po = Proposal {
        id: ProposalId(3),
        job: other,
        members: plan_on(&view, view.servers(), &JobSpec::simple("o", 1, 4), &[3]),
        based_on: view.version(),
    };
    assert!(matches!(decide(&mut view, &po), Decision::Accepted { .. }));
    // Once the tenant releases, the same placement is accepted under a new id.
    assert_eq!(view.apply(&Command::Release { job: a, failed: false }), Outcome::Ended(Ok(())));
    assert!(matches!(decide(&mut view, &Proposal { id: ProposalId(4), ..pb }), Decision::Accepted { .. }));
    assert_eq!(view.tenant_used("vision"), 2);
    clean(&view);
}

#[test]
fn jobs_that_can_never_fit_are_refused_at_submit() {
    let mut view = seed_view(4, 2);
    let (h, v) = (view.state_hash(), view.version());
    let refused = |view: &mut ClusterView, spec: JobSpec| match view.apply(&Command::submit(spec)) {
        Outcome::Submitted(Err(ViewError::NeverFits(why))) => why,
        other => panic!("expected a never-fits refusal, got {other:?}"),
    };
    // Larger than the whole cluster (4 servers x 8 GPUs).
    let why = refused(&mut view, JobSpec::simple("big", 5, 8));
    assert!(why.contains("5 members"), "{why}");
    // More GPUs per member than any server has.
    refused(&mut view, JobSpec::simple("wide", 1, 9));
    // An unknown device type.
    let mut typed = JobSpec::simple("typed", 1, 1);
    typed.gpu_type = Some("nvidia-bogus-1g".into());
    let why = refused(&mut view, typed);
    assert!(why.contains("nvidia-bogus-1g"), "{why}");
    // One server cannot hold two whole-server members.
    let mut tight = JobSpec::simple("tight", 2, 8);
    tight.tolerate = LocalityLevel::Server;
    refused(&mut view, tight);
    // One rack holds two servers: three whole-server members cannot share a rack.
    let mut rack = JobSpec::simple("rack", 3, 8);
    rack.tolerate = LocalityLevel::Rack;
    refused(&mut view, rack);
    assert_eq!((view.state_hash(), view.version()), (h, v), "refusals change nothing");
    assert!(view.jobs().is_empty());
    // The largest job that does fit is admitted.
    let ok = submit(&mut view, JobSpec::simple("fits", 4, 8));
    assert_eq!(view.job(ok).map(|j| j.state), Some(JobState::Pending));
}

#[test]
fn large_gangs_are_checked_for_overlap_too() {
    // More than 16 members switches the approver's overlap detection to a map.
    let spec = ClusterSpec::uniform(Topology::preset("pcie-4gpu").expect("preset"), 6, 6, 1);
    let mut view = ClusterView::from_spec(&spec);
    let gang = JobSpec::simple("many", 20, 1);
    let j = submit(&mut view, gang.clone());
    let on: Vec<u32> = (0..20).map(|i| i % 6).collect();
    let members = plan_on(&view, view.servers(), &gang, &on);
    let (h, v) = (view.state_hash(), view.version());
    for dup in [6usize, 17, 19] {
        // Member `dup` repeats member `dup - 6`, which sits on the same server.
        let mut bad = members.clone();
        bad[dup] = bad[dup - 6];
        let p = Proposal { id: ProposalId(dup as u64), job: j, members: bad.clone(), based_on: v };
        let (reason, _) = rejected(decide(&mut view, &p));
        assert_eq!(reason, Rejection::OverlapWithinGang { server: bad[dup].server }, "duplicate at {dup}");
        assert_eq!((view.state_hash(), view.version()), (h, v));
    }
    let p = Proposal { id: ProposalId(100), job: j, members, based_on: v };
    assert!(matches!(decide(&mut view, &p), Decision::Accepted { .. }));
    clean(&view);
}

/// A replica rebuilt from a snapshot must stay identical to the view it was taken from when both
/// apply the same commands. Regression: `from_snapshot` once rebuilt the queue of ended jobs in
/// job-id order instead of the order the jobs ended, so once more than `ended_jobs_kept` jobs
/// had ended the two forgot different jobs and their state hashes diverged.
#[test]
fn replica_from_snapshot_forgets_the_same_ended_jobs() {
    let spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 2, 2, 1);
    let mut view = ClusterView::from_spec(&spec).with_limits(DEFAULT_CHANGE_LOG, 2);
    let a = submit(&mut view, JobSpec::simple("a", 1, 1));
    let b = submit(&mut view, JobSpec::simple("b", 1, 1));
    // b ends before a.
    assert_eq!(view.apply(&Command::Cancel { job: b, reason: None }), Outcome::Ended(Ok(())));
    assert_eq!(view.apply(&Command::Cancel { job: a, reason: None }), Outcome::Ended(Ok(())));
    let mut replica = ClusterView::from_snapshot(view.snapshot()).with_limits(DEFAULT_CHANGE_LOG, 2);
    assert_eq!(replica.state_hash(), view.state_hash());
    // A third job ends: the oldest ended job (b) should be forgotten on both.
    for v in [&mut view, &mut replica] {
        let c = submit(v, JobSpec::simple("c", 1, 1));
        assert_eq!(v.apply(&Command::Cancel { job: c, reason: None }), Outcome::Ended(Ok(())));
    }
    assert!(view.job(b).is_none() && view.job(a).is_some(), "the view forgets the first job to end");
    assert_eq!(replica.job(a).is_some(), view.job(a).is_some(), "the replica forgot another job");
    assert_eq!(replica.state_hash(), view.state_hash(), "replica diverged");
}

/// Regression: the approver applies a proposal id at most once. The view once forgot an id when
/// its gang was freed, so a late retry of an accepted proposal, arriving after its server went
/// down and came back, was applied a second time. Now it is refused as spent.
#[test]
fn a_proposal_id_is_applied_at_most_once() {
    let mut view = seed_view(2, 2);
    let spec = JobSpec::simple("j", 1, 8);
    let j = submit(&mut view, spec.clone());
    let p = Proposal {
        id: ProposalId(7),
        job: j,
        members: plan_on(&view, view.servers(), &spec, &[0]),
        based_on: view.version(),
    };
    assert!(matches!(decide(&mut view, &p), Decision::Accepted { .. }));
    assert!(matches!(decide(&mut view, &p), Decision::AlreadyApplied { .. }), "a retry while placed");
    assert_eq!(
        view.apply(&Command::SetHealth { server: ServerId(0), health: Health::Down }),
        Outcome::HealthSet(Ok(vec![j]))
    );
    assert_eq!(
        view.apply(&Command::SetHealth { server: ServerId(0), health: Health::Up }),
        Outcome::HealthSet(Ok(vec![]))
    );
    // The scheduler never saw the first answer and retries the same proposal.
    let (h, v) = (view.state_hash(), view.version());
    let d = decide(&mut view, &p);
    assert!(
        matches!(&d, Decision::Rejected { reason: Rejection::ProposalSpent, .. }),
        "proposal id applied twice: {d:?}"
    );
    assert_eq!((view.state_hash(), view.version()), (h, v));
}

/// Regression: `never_fits` once sized an intra-server tolerance by that level's groups alone.
/// A gang whose devices share an NVLink group is at `pcie-switch`, tighter than `socket`: on
/// `dgx-h100` (one 8-GPU NVLink group, 4-GPU sockets) a 6-GPU job tolerating `socket` fits at
/// `pcie-switch`, and must be admitted.
#[test]
fn never_fits_counts_nvlink_groups_within_a_socket_tolerance() {
    let spec = ClusterSpec::uniform(Topology::preset("dgx-h100").expect("preset"), 1, 1, 1);
    let mut view = ClusterView::from_spec(&spec);
    let mut job = JobSpec::simple("six", 1, 6);
    job.prefer = LocalityLevel::Socket;
    job.tolerate = LocalityLevel::Socket;
    // The shared fit function places it within the tolerance on the empty server.
    let topo = &view.topologies()[0];
    let req = fit::member_request(&job, topo);
    let rec = view.servers()[0];
    let (_, level) = fit::plan_member(topo, &rec, ServerId(0), &req, LocalityLevel::Socket, FitMode::Pack)
        .expect("fits at pcie-switch");
    assert_eq!(level, LocalityLevel::PcieSwitch);
    let out = view.apply(&Command::submit(job));
    assert!(matches!(out, Outcome::Submitted(Ok(_))), "refused a job that fits: {out:?}");
}

/// Regression: `never_fits` once checked one member's cores and memory, so gangs whose members
/// cannot share a server for cores or memory were admitted to wait forever.
#[test]
fn never_fits_counts_every_members_cores_and_memory() {
    // One seed-8gpu server (32 cores, 384 GiB) per rack.
    let spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 4, 1, 4);
    let mut view = ClusterView::from_spec(&spec);
    let mut mem = JobSpec::simple("mem", 2, 2);
    mem.memory_mib_per_gpu = Some(98_305); // 2 members x 2 GPUs x 98,305 MiB > 393,216 MiB
    mem.tolerate = LocalityLevel::Server;
    assert!(view.never_fits(&mem).is_some_and(|w| w.contains("cores and memory")), "{:?}", view.never_fits(&mem));
    mem.tolerate = LocalityLevel::Rack;
    assert!(view.never_fits(&mem).is_some(), "one server per rack cannot hold both members");
    mem.tolerate = LocalityLevel::Any;
    assert!(view.never_fits(&mem).is_none(), "two servers anywhere can");
    let mut cpu = JobSpec::simple("cpu", 2, 1);
    cpu.cpu = CpuDemand::Fixed { cores_per_gpu: 20 };
    cpu.tolerate = LocalityLevel::Rack;
    assert!(view.never_fits(&cpu).is_some(), "two 20-core members never share a 32-core server");
    cpu.tolerate = LocalityLevel::IbDomain;
    assert!(view.never_fits(&cpu).is_none());
    assert!(matches!(view.apply(&Command::submit(cpu)), Outcome::Submitted(Ok(_))));
}

// ---------------------------------------------------------------------------------------------
// Migration: atomic moves through the approver
// ---------------------------------------------------------------------------------------------

/// Random fragmentation, then plans from `migration_planner::plan` applied as `Command::Migrate`, mixed
/// with corrupted moves (onto busy devices, of pending jobs) and retries. After every command
/// the invariant checker is clean and a refused move changes nothing; at the end, replaying the
/// log gives the same state hash, and so does a snapshot.
mod migration_moves {
    use super::*;
    use tessera_view::migration_planner::{self, MigrationParams};

    fn apply_checked(view: &mut ClusterView, log: &mut Vec<Command>, cmd: Command) -> Outcome {
        let before = view.state_hash();
        let out = view.apply(&cmd);
        if let Outcome::Decided(ds) = &out
            && ds.iter().all(|d| matches!(d, Decision::Rejected { .. } | Decision::AlreadyApplied { .. }))
        {
            assert_eq!(view.state_hash(), before, "refused or repeated moves change nothing: {ds:?}");
        }
        let r = invariants::check(view);
        assert!(r.is_clean(), "after {cmd:?}: {:?}", r.violations);
        log.push(cmd);
        out
    }

    fn scenario(seed: u64) {
        let mut rng = SmallRng::seed_from_u64(seed);
        let topo = Topology::preset(PRESETS[rng.random_range(0..PRESETS.len())]).expect("preset");
        let servers = rng.random_range(2..6u32);
        let spec = ClusterSpec::uniform(topo, servers, 2, 2);
        let mut view = ClusterView::from_spec(&spec);
        let mut log: Vec<Command> = Vec::new();
        let mut next_id = 1u64;
        let mut placed: Vec<JobId> = Vec::new();
        for _ in 0..rng.random_range(4..40) {
            let gpus = *[1u32, 1, 1, 2, 4].choose(&mut rng).expect("sizes");
            let mut s = JobSpec::simple("small", 1, gpus);
            s.cpu = CpuDemand::Fixed { cores_per_gpu: 1 };
            let Outcome::Submitted(Ok(job)) = apply_checked(&mut view, &mut log, Command::submit(s.clone())) else {
                continue;
            };
            let mode = if rng.random_bool(0.5) { FitMode::Spread } else { FitMode::Pack };
            let mut order: Vec<u32> = (0..servers).collect();
            order.shuffle(&mut rng);
            let member = order.iter().find_map(|&k| {
                let rec = view.servers()[k as usize];
                let t = view.topology_of(rec.config_set);
                let req = fit::member_request(&s, t);
                fit::plan_member(t, &rec, ServerId(k), &req, LocalityLevel::Server, mode).map(|(m, _)| m)
            });
            if let Some(m) = member {
                next_id += 1;
                let p = Proposal { id: ProposalId(next_id), job, members: vec![m], based_on: view.version() };
                if let Outcome::Decided(ds) = apply_checked(&mut view, &mut log, Command::Propose(vec![p]))
                    && ds[0].is_placed()
                {
                    placed.push(job);
                }
            }
            if !placed.is_empty() && rng.random_bool(0.3) {
                let j = placed.swap_remove(rng.random_range(0..placed.len()));
                apply_checked(&mut view, &mut log, Command::Release { job: j, failed: false });
            }
        }
        let big_gpus = view.topologies()[0].devices;
        let mut big = JobSpec::simple("big", 1, big_gpus);
        big.cpu = CpuDemand::Fixed { cores_per_gpu: 1 };
        let Outcome::Submitted(Ok(big)) = apply_checked(&mut view, &mut log, Command::submit(big)) else {
            panic!("a one-server job fits")
        };
        let remaining: BTreeMap<JobId, f64> =
            placed.iter().map(|&j| (j, if rng.random_bool(0.2) { 1.0 } else { 1e9 })).collect();
        let params = MigrationParams { max_moves: rng.random_range(0..6), ..MigrationParams::default() };
        let plan = migration_planner::plan(&view, big, LocalityLevel::Server, &remaining, &params);
        if let Some(plan) = plan {
            assert!(plan.moves.len() <= params.max_moves);
            for m in &plan.moves {
                assert!(remaining.get(&m.job).is_none_or(|r| *r >= params.min_remaining_s), "a job near its end moved");
            }
            // A corrupted move first: onto the target's devices when a job holds them, or a
            // move of the pending big job; either is refused whole.
            next_id += 1;
            let bad =
                Proposal { id: ProposalId(next_id), job: big, members: plan.target.clone(), based_on: view.version() };
            let out = apply_checked(&mut view, &mut log, Command::Migrate(vec![bad]));
            assert!(matches!(&out, Outcome::Decided(ds) if !ds[0].is_placed()), "{out:?}");
            let moves: Vec<Proposal> = plan
                .moves
                .iter()
                .map(|m| {
                    next_id += 1;
                    Proposal { id: ProposalId(next_id), job: m.job, members: m.to.clone(), based_on: view.version() }
                })
                .collect();
            let out = apply_checked(&mut view, &mut log, Command::Migrate(moves.clone()));
            assert!(matches!(&out, Outcome::Decided(ds) if ds.iter().all(Decision::is_placed)), "{out:?}");
            for m in &moves {
                assert_eq!(view.job(m.job).map(|j| j.state), Some(JobState::Migrating));
            }
            let out = apply_checked(&mut view, &mut log, Command::Migrate(moves.clone()));
            assert!(
                matches!(&out, Outcome::Decided(ds) if ds.iter().all(|d| matches!(d, Decision::AlreadyApplied { .. })))
            );
            next_id += 1;
            let target = Proposal { id: ProposalId(next_id), job: big, members: plan.target, based_on: view.version() };
            let out = apply_checked(&mut view, &mut log, Command::Propose(vec![target]));
            assert!(
                matches!(&out, Outcome::Decided(ds) if ds[0].is_placed()),
                "the plan's target is accepted: {out:?}"
            );
            for m in &moves {
                let mem = &m.members[0];
                let ev = Command::Task {
                    job: m.job,
                    proposal: m.id,
                    member: 0,
                    server: mem.server,
                    event: TaskEvent::Started,
                };
                assert_eq!(apply_checked(&mut view, &mut log, ev), Outcome::TaskReported(Ok(JobState::Running)));
            }
        }
        let mut replay = ClusterView::from_spec(&spec);
        for c in &log {
            replay.apply(c);
        }
        assert_eq!(replay.state_hash(), view.state_hash(), "replaying the log gives the same state");
        assert_eq!(ClusterView::from_snapshot(view.snapshot()).state_hash(), view.state_hash());
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 128, ..ProptestConfig::default() })]
        #[test]
        fn moves_are_atomic_idempotent_and_keep_every_invariant(seed in any::<u64>()) {
            scenario(seed);
        }
    }
}
