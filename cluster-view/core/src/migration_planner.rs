//! The migration planner: frees a group for a job blocked by fragmentation.
//!
//! When a pending job cannot be placed at its locality level although enough GPUs are free in
//! the cluster, the free GPUs are scattered. [`plan`] finds the fewest moves of small running
//! jobs that free a group of the needed size at that level, and a new home for each moved job
//! that keeps its locality (a move never makes the moved job slower, only pauses it). Each move
//! is then applied through the approver as one atomic transaction ([`ClusterView::migrate`],
//! `Command::Migrate`), and the blocked job proposes the planned target like any gang.
//!
//! The planner is pure, like the rest of this crate: it reads no clock, so the caller passes
//! remaining-time estimates (a job near its end is never moved) and the rules in
//! [`MigrationParams`]. Jobs without an estimate count as far from their end.
//!
//! Search: for every server and every group of the level (PCIe switch, socket or the whole
//! server), the movable jobs that occupy the group are taken largest first until enough GPUs are
//! free — for disjoint occupants this is the fewest moves — and more jobs of the server are
//! added while cores or memory are still short. A multi-server gang takes the cheapest servers
//! of one rack, IB domain or the cluster, as its level allows. Destinations are planned on the
//! current records with the target's resources withheld and the moved jobs' old resources still
//! held, so a moved job can land neither on the freed group nor where it was. A moved job lands
//! where it keeps the cores it holds if it can, then on the fullest server. One that fits
//! nowhere may have a home made for it by one more move (a chain, [`MigrationParams::chained_moves`]):
//! a smaller movable job on another server moves to a free home of its own, and the two moves
//! count against the plan's bound like any others. Moves are applied in the plan's order, so the
//! job making room moves first.

use crate::fit::{self, FitMode};
use crate::ids::{JobId, ServerId};
use crate::job::{Job, JobSpec, JobState};
use crate::locality::LocalityLevel;
use crate::placement::MemberPlacement;
use crate::server::{Health, ServerRecord};
use crate::view::ClusterView;
use std::collections::BTreeMap;

mod homes;
use homes::{ChainMemo, Shape, chained, destination};

/// Candidate targets (servers, or domains for multi-server gangs) tried for destinations
/// before the planner gives up; bounds the work of one call.
const CANDIDATES_TRIED: usize = 16;

/// The rules a plan follows.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct MigrationParams {
    /// Most moves in one plan per member of the blocked job ([`MigrationParams::moves_for`]).
    pub max_moves: usize,
    /// A job with less remaining time than this is never moved.
    pub min_remaining_s: f64,
    /// Largest job (total GPUs) that may be moved; only single-member jobs move.
    pub small_job_max_gpus: u32,
    /// Checkpoint-restart time of one move: the moved job makes no progress for this long.
    pub checkpoint_restart_s: f64,
    /// Whether a moved job that fits nowhere as things are may get a home by first moving one
    /// other movable job out of its way (a chain of two moves, both within
    /// [`MigrationParams::moves_for`]). Without it, a plan needs a free home for every moved job.
    pub chained_moves: bool,
}

impl Default for MigrationParams {
    fn default() -> Self {
        MigrationParams {
            max_moves: 4,
            min_remaining_s: 1800.0,
            small_job_max_gpus: 4,
            checkpoint_restart_s: 60.0,
            chained_moves: true,
        }
    }
}

impl MigrationParams {
    /// Most moves in one plan for a job of `members` members: [`MigrationParams::max_moves`]
    /// for each. A gang of `k` members needs `k` servers freed, one member's worth each, and
    /// every second it waits idles `k` times the GPUs a one-member job's wait does, so the same
    /// bound per member keeps what its moves may cost in proportion to what they gain.
    pub fn moves_for(&self, members: u32) -> usize {
        self.max_moves.saturating_mul(members.max(1) as usize)
    }
}

/// One planned move: a running job's whole placement to new members.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Move {
    /// The job moved.
    pub job: JobId,
    /// Its current members.
    pub from: Vec<MemberPlacement>,
    /// Its new members.
    pub to: Vec<MemberPlacement>,
}

/// A plan: the moves, then the blocked job's placement they make possible.
#[derive(Clone, Debug, PartialEq)]
pub struct MigrationPlan {
    /// The blocked job.
    pub job: JobId,
    /// Its placement once the moves are applied (propose it after them).
    pub target: Vec<MemberPlacement>,
    /// The level the target achieves.
    pub level: LocalityLevel,
    /// The moves, in the order to apply them.
    pub moves: Vec<Move>,
    /// GPU-seconds lost to checkpoint-restart: moved GPUs × [`MigrationParams::checkpoint_restart_s`].
    pub cost_gpu_s: f64,
}

/// A running job's member on one server, as the planner sees it.
#[derive(Clone, Copy, Debug)]
struct Holder<'a> {
    /// The job, as the view has it.
    of: &'a Job,
    member: MemberPlacement,
    movable: bool,
    /// A movable job's [`Shape`], as an index into [`Holders::shapes`].
    shape: Option<usize>,
}

/// What freeing a target on one server takes.
#[derive(Clone, Debug)]
struct Freeing {
    server: ServerId,
    movers: Vec<usize>,
    target: Vec<MemberPlacement>,
    moved_gpus: u32,
}

impl Freeing {
    /// Cheapest first: fewest moves, then fewest GPUs moved, then the lowest server
    /// (deterministic).
    fn rank(&self) -> (usize, u32, ServerId) {
        (self.movers.len(), self.moved_gpus, self.server)
    }
}

/// Plans the fewest moves that let pending `job` be placed at `level` (or tighter), or `None`
/// when no plan within the rules exists. `remaining_s` holds remaining-time estimates by job.
pub fn plan(
    view: &ClusterView,
    job: JobId,
    level: LocalityLevel,
    remaining_s: &BTreeMap<JobId, f64>,
    params: &MigrationParams,
) -> Option<MigrationPlan> {
    let blocked = view.job(job).filter(|j| j.state == JobState::Pending)?;
    let spec = &blocked.spec;
    let level = level.min(spec.tolerate);
    let holders = holders(view, job, spec.total_gpus(), remaining_s, params);
    let member_level = if spec.members == 1 { level.min(LocalityLevel::Server) } else { LocalityLevel::Server };
    let max_moves = params.moves_for(spec.members);
    let candidates: Vec<Vec<Freeing>> = if spec.members == 1 {
        cheapest_servers(view, spec, member_level, &holders, params).into_iter().map(|f| vec![f]).collect()
    } else {
        let mut options: Vec<Freeing> = (0..view.servers().len())
            .filter_map(|s| freeing(view, ServerId(s as u32), spec, member_level, &holders, params.max_moves))
            .collect();
        options.sort_by_key(Freeing::rank);
        gang_candidates(view, options, spec.members as usize, level, max_moves)
    };
    let mut memo = ChainMemo::default();
    for chosen in candidates {
        if let Some(p) = with_destinations(view, job, &chosen, &holders, max_moves, params, &mut memo) {
            return Some(p);
        }
    }
    None
}

/// [`plan`], for a caller that plans for the same blocked jobs again and again (the live
/// migration task every interval, the simulator after passes): a job and level it found no plan
/// for on the same cluster, as the planner reads it ([`FailedPlans`]), get `None` again without
/// the search. The answer is always [`plan`]'s.
pub fn plan_remembering(
    view: &ClusterView,
    job: JobId,
    level: LocalityLevel,
    remaining_s: &BTreeMap<JobId, f64>,
    params: &MigrationParams,
    failed: &mut FailedPlans,
) -> Option<MigrationPlan> {
    // Only a pending job's failure is kept: another has no plan for a reason of its own.
    view.job(job).filter(|j| j.state == JobState::Pending)?;
    if failed.basis.refresh(view, remaining_s, params) {
        failed.jobs.clear();
    } else if failed.jobs.contains(&(job, level)) {
        failed.remembered += 1;
        return None;
    }
    let found = plan(view, job, level, remaining_s, params);
    if found.is_none() {
        failed.jobs.insert((job, level));
    }
    found
}

/// The plans [`plan_remembering`] found none for, and what it found none on: every server's
/// record and unhealthy devices, every placed job's members, level and whether the rules let it
/// move (its remaining time included), and the rules. A plan reads nothing else that changes:
/// a job's spec is fixed once admitted, and a configuration set's topology and domains once
/// registered. When any of it changes, the failures are forgotten.
///
/// Planning fails far more often than it succeeds on a busy cluster (24,967 failed plans to 809
/// moves in the Philly speed run of docs/BENCHMARKS.md), and from one round to the next most
/// find the cluster as it was: a job that arrives and waits changes nothing here. Memory: one
/// copy of what the planner reads, and a (job, level) per failure on it.
#[derive(Debug, Default)]
pub struct FailedPlans {
    basis: Basis,
    jobs: std::collections::BTreeSet<(JobId, LocalityLevel)>,
    remembered: u64,
}

impl FailedPlans {
    /// Plans answered `None` from memory, without a search.
    pub fn remembered(&self) -> u64 {
        self.remembered
    }
}

/// What a plan reads of a cluster ([`FailedPlans`]).
#[derive(Debug, Default, PartialEq)]
struct Basis {
    records: Vec<ServerRecord>,
    unhealthy: Vec<u64>,
    /// Per placed job in the view's order: (id, may move by the rules but for the blocked job's
    /// size, level), and its members in `members`. Its size follows from its id.
    placed: Vec<(JobId, bool, LocalityLevel)>,
    members: Vec<MemberPlacement>,
    params: Option<MigrationParams>,
}

impl Basis {
    /// Reads `view`: true if anything differs from what was read before.
    fn refresh(&mut self, view: &ClusterView, remaining_s: &BTreeMap<JobId, f64>, params: &MigrationParams) -> bool {
        let mut now = Basis {
            records: view.servers().to_vec(),
            unhealthy: (0..view.servers().len()).map(|s| view.unhealthy_devices(ServerId(s as u32))).collect(),
            placed: Vec::with_capacity(self.placed.len()),
            members: Vec::with_capacity(self.members.len()),
            params: Some(*params),
        };
        for j in view.placed_jobs() {
            let Some(p) = &j.placement else { continue };
            now.placed.push((j.id, may_move(j, j.spec.total_gpus(), remaining_s, params), p.level));
            now.members.extend(p.members.iter().copied());
        }
        let changed = now != *self;
        if changed {
            *self = now;
        }
        changed
    }
}

/// Whether the rules let placed job `j` (of `total` GPUs) move, but for the blocked job's size.
fn may_move(j: &Job, total: u32, remaining_s: &BTreeMap<JobId, f64>, params: &MigrationParams) -> bool {
    matches!(j.state, JobState::Placed | JobState::Running)
        && j.spec.members == 1
        && total <= params.small_job_max_gpus
        && remaining_s.get(&j.id).is_none_or(|r| *r >= params.min_remaining_s)
}

/// Every running member, by server: one list, sorted by server, and where each server's part
/// starts (one allocation per plan instead of one per server).
struct Holders<'a> {
    all: Vec<Holder<'a>>,
    /// The movable jobs' shapes, each once.
    shapes: Vec<Shape<'a>>,
    start: Vec<usize>,
}

impl<'a> std::ops::Index<usize> for Holders<'a> {
    type Output = [Holder<'a>];

    /// The members on server `s`, in job id order.
    fn index(&self, s: usize) -> &[Holder<'a>] {
        &self.all[self.start[s]..self.start[s + 1]]
    }
}

/// Every running member per server, with whether its job may be moved.
fn holders<'a>(
    view: &'a ClusterView,
    blocked: JobId,
    blocked_gpus: u32,
    remaining_s: &BTreeMap<JobId, f64>,
    params: &MigrationParams,
) -> Holders<'a> {
    let mut all: Vec<Holder> = Vec::new();
    let mut shapes: Vec<Shape> = Vec::new();
    // Placed jobs only (pending ones may be many), in id order: plans are deterministic.
    for j in view.placed_jobs() {
        let Some(p) = &j.placement else { continue };
        let total = j.spec.total_gpus();
        let movable = j.id != blocked && total < blocked_gpus && may_move(j, total, remaining_s, params);
        for m in &p.members {
            let shape = movable.then(|| {
                let shape = Shape::of(&j.spec, home_level(j), m.cores.count());
                shapes.iter().position(|s| *s == shape).unwrap_or_else(|| {
                    shapes.push(shape);
                    shapes.len() - 1
                })
            });
            all.push(Holder { of: j, member: *m, movable, shape });
        }
    }
    // Stable: each server's members stay in job id order.
    all.sort_by_key(|h| h.member.server);
    let servers = view.servers().len();
    let mut start = Vec::with_capacity(servers + 1);
    let mut at = 0;
    for s in 0..servers {
        start.push(at);
        at += all[at..].iter().take_while(|h| h.member.server.index() == s).count();
    }
    start.push(all.len());
    Holders { all, shapes, start }
}

/// The record of a server with some members' resources given back.
fn released(view: &ClusterView, rec: &ServerRecord, server: ServerId, freed: &[&MemberPlacement]) -> ServerRecord {
    let mut r = *rec;
    for m in freed {
        r.free_gpus |= m.gpus & !view.unhealthy_devices(server);
        r.free_cores = r.free_cores.or(m.cores);
        r.free_memory_mib += m.memory_mib;
    }
    r
}

/// The cheapest way to make one member of `spec` fit on `server` at `level` by moving at most
/// `max_movers` jobs off it (callers pass [`MigrationParams::max_moves`] or less), if any: of
/// the groups that need the fewest moves, the first.
fn freeing(
    view: &ClusterView,
    server: ServerId,
    spec: &JobSpec,
    level: LocalityLevel,
    holders: &Holders,
    max_movers: usize,
) -> Option<Freeing> {
    let rec = view.server(server)?;
    let topo = view.topology_of(rec.config_set);
    if rec.health != Health::Up
        || topo.devices < spec.gpus_per_member
        || spec.gpu_type.as_ref().is_some_and(|t| *t != topo.device_type)
    {
        return None;
    }
    let req = fit::member_request(spec, topo);
    let here = &holders[server.index()];
    // No group can reach more GPUs than the whole server: free ones plus the movable jobs'.
    let movable_gpus: u32 = here.iter().filter(|h| h.movable).map(|h| h.member.gpus.count_ones()).sum();
    if rec.free_gpus.count_ones() + movable_gpus < req.gpus {
        return None;
    }
    let mut best: Option<Freeing> = None;
    for group in topo.groups(level) {
        if group.count_ones() < req.gpus {
            continue;
        }
        let movable_in = |h: &Holder| h.movable && h.member.gpus & group != 0;
        let reachable = (rec.free_gpus & group).count_ones()
            + here.iter().filter(|h| movable_in(h)).map(|h| (h.member.gpus & group).count_ones()).sum::<u32>();
        if reachable < req.gpus {
            continue;
        }
        // Occupants of the group, largest share of it first; then the server's other movable
        // jobs, most cores first, in case cores or memory are what is short.
        let mut order: Vec<usize> = (0..here.len()).filter(|&i| movable_in(&here[i])).collect();
        order.sort_by_key(|&i| (std::cmp::Reverse((here[i].member.gpus & group).count_ones()), here[i].of.id));
        let mut rest: Vec<usize> = (0..here.len()).filter(|&i| here[i].movable && !order.contains(&i)).collect();
        rest.sort_by_key(|&i| (std::cmp::Reverse(here[i].member.cores.count()), here[i].of.id));
        order.extend(rest);
        let bound = best.as_ref().map_or(max_movers, |b| b.movers.len().saturating_sub(1));
        let mut movers: Vec<usize> = Vec::new();
        for k in 0..=order.len().min(bound) {
            if k > 0 {
                movers.push(order[k - 1]);
            }
            let freed: Vec<&MemberPlacement> = movers.iter().map(|&i| &here[i].member).collect();
            let mut r = released(view, rec, server, &freed);
            r.free_gpus &= group;
            if let Some((m, _)) = fit::plan_member(topo, &r, server, &req, level, FitMode::Pack) {
                let moved_gpus = movers.iter().map(|&i| here[i].member.gpus.count_ones()).sum();
                best = Some(Freeing { server, movers: movers.clone(), target: vec![m], moved_gpus });
                break;
            }
        }
    }
    best
}

/// For a one-member job: the [`CANDIDATES_TRIED`] cheapest servers to free, cheapest first (fewest
/// moves, then fewest GPUs moved, then the lowest server id), as sorting every server's
/// [`freeing`] would give them. Once that many are found, a server is searched only for as many
/// moves as the last of them needs: with more it could not rank above it. On a large busy
/// cluster most servers are then tried with one or two moves instead of the whole bound.
fn cheapest_servers(
    view: &ClusterView,
    spec: &JobSpec,
    level: LocalityLevel,
    holders: &Holders,
    params: &MigrationParams,
) -> Vec<Freeing> {
    let mut best: Vec<Freeing> = Vec::with_capacity(CANDIDATES_TRIED + 1);
    for s in 0..view.servers().len() {
        let cap = match best.get(CANDIDATES_TRIED - 1) {
            Some(last) => last.movers.len(),
            None => params.max_moves,
        };
        let Some(f) = freeing(view, ServerId(s as u32), spec, level, holders, cap) else { continue };
        let at = best.partition_point(|b| b.rank() < f.rank());
        if at < CANDIDATES_TRIED {
            best.insert(at, f);
            best.truncate(CANDIDATES_TRIED);
        }
    }
    best
}

/// For a multi-server gang: per domain the level allows, the cheapest `members` servers;
/// domains cheapest first, within the move bound.
fn gang_candidates(
    view: &ClusterView,
    options: Vec<Freeing>,
    members: usize,
    level: LocalityLevel,
    max_moves: usize,
) -> Vec<Vec<Freeing>> {
    let domain = |s: ServerId| view.config_sets()[view.servers()[s.index()].config_set.index()].domain(level);
    if level <= LocalityLevel::Server {
        return Vec::new();
    }
    let mut by_domain: BTreeMap<u32, Vec<Freeing>> = BTreeMap::new();
    for f in options {
        let d = by_domain.entry(domain(f.server)).or_default();
        if d.len() < members {
            d.push(f); // options are sorted cheapest first
        }
    }
    let mut out: Vec<(usize, Vec<Freeing>)> = by_domain
        .into_values()
        .filter(|fs| fs.len() == members)
        .map(|fs| (fs.iter().map(|f| f.movers.len()).sum(), fs))
        .filter(|(cost, _)| *cost <= max_moves)
        .collect();
    out.sort_by_key(|(cost, fs)| (*cost, fs[0].server));
    out.into_iter().take(CANDIDATES_TRIED).map(|(_, fs)| fs).collect()
}

/// Completes a choice of freed servers with a destination for every moved job, or `None`; at
/// most `max_moves` moves ([`MigrationParams::moves_for`] the blocked job).
fn with_destinations<'a>(
    view: &'a ClusterView,
    job: JobId,
    chosen: &[Freeing],
    holders: &Holders<'a>,
    max_moves: usize,
    params: &MigrationParams,
    memo: &mut ChainMemo<'a>,
) -> Option<MigrationPlan> {
    let movers: Vec<&Holder> =
        chosen.iter().flat_map(|f| f.movers.iter().map(move |&i| &holders[f.server.index()][i])).collect();
    if movers.len() > max_moves {
        return None;
    }
    // Destinations see the current records minus what the target takes of what is free now
    // (the rest of the target comes from the moved jobs, whose old resources stay held here).
    let mut dest: Vec<ServerRecord> = view.servers().to_vec();
    for f in chosen {
        let r = &mut dest[f.server.index()];
        let freed_mem: u32 = f.movers.iter().map(|&i| holders[f.server.index()][i].member.memory_mib).sum();
        for t in &f.target {
            r.free_gpus &= !t.gpus;
            r.free_cores = r.free_cores.without(t.cores);
            let from_free = t.memory_mib.saturating_sub(freed_mem);
            r.free_memory_mib = r.free_memory_mib.saturating_sub(from_free);
        }
    }
    // A mover with no free home may have one made by moving one more job (a chain), while the
    // plan stays within its bound.
    let mut chains = 0;
    let mut moves = Vec::with_capacity(movers.len());
    for h in &movers {
        let j = h.of;
        let to = match destination(view, &dest, &j.spec, home_level(j), h.member.cores.count()) {
            Some(to) => to,
            None if params.chained_moves && movers.len() + chains < max_moves => {
                let skip: Vec<JobId> = std::iter::once(job)
                    .chain(movers.iter().map(|m| m.of.id))
                    .chain(moves.iter().map(|m: &Move| m.job))
                    .collect();
                let freed: Vec<ServerId> = chosen.iter().map(|f| f.server).collect();
                let (first, to) = chained(view, &dest, h, holders, &skip, &freed, memo)?;
                let y = first.from[0].server;
                dest[y.index()] = released(view, &dest[y.index()], y, &[&first.from[0]]);
                take(&mut dest[first.to[0].server.index()], &first.to[0]);
                moves.push(first);
                chains += 1;
                to
            }
            None => return None,
        };
        take(&mut dest[to.server.index()], &to);
        moves.push(Move { job: h.of.id, from: vec![h.member], to: vec![to] });
    }
    let target: Vec<MemberPlacement> = chosen.iter().flat_map(|f| f.target.iter().copied()).collect();
    let level = view.gang_level(&target);
    let moved_gpus: u32 = moves.iter().flat_map(|m| m.from.iter()).map(|m| m.gpus.count_ones()).sum();
    Some(MigrationPlan { job, target, level, moves, cost_gpu_s: f64::from(moved_gpus) * params.checkpoint_restart_s })
}

/// The level a moved job keeps: the one it runs at, or its server (a single-member job).
fn home_level(j: &Job) -> LocalityLevel {
    j.placement.as_ref().map_or(LocalityLevel::Server, |p| p.level).min(LocalityLevel::Server)
}

/// Takes a planned member's resources out of its server's record.
fn take(r: &mut ServerRecord, to: &MemberPlacement) {
    r.free_gpus &= !to.gpus;
    r.free_cores = r.free_cores.without(to.cores);
    r.free_memory_mib -= to.memory_mib;
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::job::{CpuDemand, TaskEvent};
    use crate::mask::CoreMask;
    use crate::placement::{Decision, Proposal, Rejection};
    use crate::view::{Command, Outcome};
    use crate::{ClusterSpec, ProposalId, Topology, invariants};
    use proptest::prelude::*;

    fn view(servers: u32) -> ClusterView {
        let topo = Topology::preset("seed-8gpu").expect("preset");
        ClusterView::from_spec(&ClusterSpec::uniform(topo, servers, servers, 1))
    }

    fn spec(gpus: u32) -> JobSpec {
        let mut s = JobSpec::simple("j", 1, gpus);
        s.cpu = CpuDemand::Fixed { cores_per_gpu: 1 };
        s.memory_mib_per_gpu = Some(1024);
        s
    }

    fn member(server: u32, gpus: u64, first_core: u32) -> MemberPlacement {
        let n = gpus.count_ones();
        MemberPlacement { server: ServerId(server), gpus, cores: CoreMask::range(first_core, n), memory_mib: 1024 * n }
    }

    fn decide(view: &mut ClusterView, cmd: Command) -> Vec<Decision> {
        match view.apply(&cmd) {
            Outcome::Decided(ds) => ds,
            o => panic!("unexpected outcome {o:?}"),
        }
    }

    /// A plan's moves as proposals, ids from 100 on, in the plan's order.
    fn proposals(view: &ClusterView, p: &MigrationPlan) -> Vec<Proposal> {
        let at = view.version();
        let to = |(i, m): (usize, &Move)| Proposal {
            id: ProposalId(100 + i as u64),
            job: m.job,
            members: m.to.clone(),
            based_on: at,
        };
        p.moves.iter().enumerate().map(to).collect()
    }

    /// Submits a job of `m`'s GPUs and places it as `m` under proposal id `id`.
    fn running(view: &mut ClusterView, m: MemberPlacement, id: u64) -> JobId {
        let job = view.submit(spec(m.gpus.count_ones())).expect("submit");
        let p = Proposal { id: ProposalId(id), job, members: vec![m], based_on: view.version() };
        assert!(decide(view, Command::Propose(vec![p]))[0].is_placed());
        job
    }

    /// Two 8-GPU servers, each with one small job on it: 14 GPUs free, no whole server.
    fn fragmented() -> (ClusterView, JobId, JobId, JobId) {
        let mut v = view(2);
        let a = running(&mut v, member(0, 0b1, 0), 1);
        let b = running(&mut v, member(1, 0b1000_0000, 31), 2);
        let big = v.submit(spec(8)).expect("submit");
        (v, a, b, big)
    }

    #[test]
    fn one_move_frees_a_server_for_a_blocked_gang() {
        let (mut v, a, b, big) = fragmented();
        let p = plan(&v, big, LocalityLevel::Server, &BTreeMap::new(), &MigrationParams::default()).expect("a plan");
        assert_eq!(p.moves.len(), 1, "{p:?}");
        let moved = p.moves[0].job;
        assert!(moved == a || moved == b);
        assert_eq!(p.target[0].gpus, 0xff);
        assert_ne!(p.moves[0].to[0].server, p.target[0].server, "the moved job leaves the freed server");
        assert_eq!(p.cost_gpu_s, 60.0);
        let moves = proposals(&v, &p);
        assert!(decide(&mut v, Command::Migrate(moves.clone())).iter().all(Decision::is_placed));
        assert!(invariants::check(&v).is_clean(), "{:?}", invariants::check(&v));
        assert_eq!(v.job(moved).map(|j| j.state), Some(JobState::Migrating));
        let target = Proposal { id: ProposalId(200), job: big, members: p.target.clone(), based_on: v.version() };
        assert!(decide(&mut v, Command::Propose(vec![target]))[0].is_placed());
        assert!(invariants::check(&v).is_clean());
        // The moved job runs again once its new member reports started.
        let to = moves[0].members[0].server;
        let r = v.apply(&Command::Task {
            job: moved,
            proposal: ProposalId(100),
            member: 0,
            server: to,
            event: TaskEvent::Started,
        });
        assert_eq!(r, Outcome::TaskReported(Ok(JobState::Running)));
        // A retried move is answered as applied and changes nothing.
        let h = v.state_hash();
        assert!(matches!(decide(&mut v, Command::Migrate(moves))[0], Decision::AlreadyApplied { .. }));
        assert_eq!(v.state_hash(), h);
    }

    #[test]
    fn a_failed_plan_is_remembered_until_what_the_planner_reads_changes() {
        let (mut v, a, b, big) = fragmented();
        let params = MigrationParams::default();
        let near_end = BTreeMap::from([(a, 60.0), (b, 60.0)]);
        let mut failed = FailedPlans::default();
        let remembering = |v: &ClusterView, remaining: &BTreeMap<JobId, f64>, failed: &mut FailedPlans| {
            let found = plan_remembering(v, big, LocalityLevel::Server, remaining, &params, failed);
            assert_eq!(found, plan(v, big, LocalityLevel::Server, remaining, &params), "the planner's answer");
            found
        };
        assert_eq!(remembering(&v, &near_end, &mut failed), None, "both jobs are near their end");
        assert_eq!(failed.remembered(), 0);
        assert_eq!(remembering(&v, &near_end, &mut failed), None);
        assert_eq!(failed.remembered(), 1, "nothing changed: no second search");
        // A job that arrives and waits changes nothing the planner reads.
        v.submit(spec(2)).expect("submit");
        assert_eq!(remembering(&v, &near_end, &mut failed), None);
        assert_eq!(failed.remembered(), 2);
        // Another level is another question.
        assert_eq!(plan_remembering(&v, big, LocalityLevel::Socket, &near_end, &params, &mut failed), None);
        assert_eq!(failed.remembered(), 2);
        // A remaining time is read: with `a` far from its end, moving it frees server 0.
        let a_far = BTreeMap::from([(b, 60.0)]);
        let p = remembering(&v, &a_far, &mut failed).expect("a plan once a may move");
        assert_eq!(p.moves.iter().map(|m| m.job).collect::<Vec<_>>(), vec![a]);
        assert_eq!(failed.remembered(), 2);
        // So are the rules, and the jobs placed: b's release frees server 1 without moves.
        assert_eq!(remembering(&v, &near_end, &mut failed), None);
        let stricter = MigrationParams { max_moves: 0, ..params };
        assert_eq!(plan_remembering(&v, big, LocalityLevel::Server, &a_far, &stricter, &mut failed), None);
        assert_eq!(failed.remembered(), 2, "other rules: searched again");
        assert_eq!(v.apply(&Command::Release { job: b, failed: false }), Outcome::Ended(Ok(())));
        let p = remembering(&v, &near_end, &mut failed).expect("server 1 is free");
        assert!(p.moves.is_empty(), "{p:?}");
        assert_eq!(failed.remembered(), 2);
    }

    #[test]
    fn a_moved_job_with_no_free_home_gets_one_made_by_a_chained_move() {
        // Server 0: a 2-GPU job on one PCIe switch. Server 1: five 1-GPU jobs, one GPU free
        // under three of its switches and none whole. Server 2: a 4-GPU and a 3-GPU job, GPU 7
        // free. Freeing server 0 for an 8-GPU job moves the pair, which fits nowhere on a switch
        // as things are; freeing server 1 takes 5 moves and server 2's jobs find no homes.
        let mut v = view(3);
        let pair = running(&mut v, member(0, 0b11, 0), 1);
        let mut ones = Vec::new();
        for (i, g) in [0u32, 2, 4, 6, 7].into_iter().enumerate() {
            ones.push(running(&mut v, member(1, 1 << g, 4 * g), 2 + i as u64));
        }
        running(&mut v, member(2, 0b1111, 0), 10);
        running(&mut v, member(2, 0b111_0000, 16), 11);
        let big = v.submit(spec(8)).expect("submit");
        let single = MigrationParams { chained_moves: false, ..MigrationParams::default() };
        assert!(plan(&v, big, LocalityLevel::Server, &BTreeMap::new(), &single).is_none(), "no plan of single moves");
        let p = plan(&v, big, LocalityLevel::Server, &BTreeMap::new(), &MigrationParams::default()).expect("a plan");
        // A 1-GPU job of server 1 makes room (to server 2's free GPU, the fullest home), then the
        // pair takes the switch it left, keeping its level.
        assert_eq!(p.moves.len(), 2, "{p:?}");
        assert!(ones.contains(&p.moves[0].job), "{p:?}");
        assert_eq!(p.moves[0].to[0].server, ServerId(2));
        assert_eq!(p.moves[1].job, pair);
        assert_eq!(p.moves[1].to[0].server, ServerId(1));
        assert_eq!(p.moves[1].to[0].gpus & p.moves[0].from[0].gpus, p.moves[0].from[0].gpus);
        assert_eq!(p.target[0].server, ServerId(0));
        assert_eq!(p.cost_gpu_s, 3.0 * 60.0);
        // The chain counts against the bound: one move is not enough.
        let one = MigrationParams { max_moves: 1, ..MigrationParams::default() };
        assert!(plan(&v, big, LocalityLevel::Server, &BTreeMap::new(), &one).is_none());
        // Applied in order through the approver, the moves and then the target are accepted.
        let moves = proposals(&v, &p);
        // The leader lets a host make them: the first move frees what the second takes.
        assert_eq!(crate::migration_check::moves_help(&v, big, &p.target, &moves), Ok(()));
        assert!(decide(&mut v, Command::Migrate(moves)).iter().all(Decision::is_placed));
        assert!(v.job(pair).and_then(|j| j.placement.as_ref()).is_some_and(|pl| pl.level == LocalityLevel::PcieSwitch));
        let target = Proposal { id: ProposalId(200), job: big, members: p.target.clone(), based_on: v.version() };
        assert!(decide(&mut v, Command::Propose(vec![target]))[0].is_placed());
        assert!(invariants::check(&v).is_clean(), "{:?}", invariants::check(&v));
    }

    #[test]
    fn a_moved_job_lands_where_it_keeps_its_cores_before_the_fullest_server() {
        // A 1-GPU job holding 8 cores on server 0. Server 1 has one GPU free beside the share of
        // 4 cores, server 2 two GPUs and cores to spare. Best fit alone picks server 1 and halves
        // the job's cores; it goes to server 2 with its 8.
        let mut v = view(3);
        let mut id = 0;
        let mut place = |v: &mut ClusterView, s: JobSpec, server: u32| {
            let job = v.submit(s.clone()).expect("submit");
            let rec = v.servers()[server as usize];
            let topo = v.topology_of(rec.config_set);
            let req = fit::member_request(&s, topo);
            let (m, _) = fit::plan_member(topo, &rec, ServerId(server), &req, LocalityLevel::Server, FitMode::Pack)
                .expect("fits");
            id += 1;
            let p = Proposal { id: ProposalId(id), job, members: vec![m], based_on: v.version() };
            assert!(decide(v, Command::Propose(vec![p]))[0].is_placed());
            (job, m)
        };
        let mut wide = spec(1);
        let predictor = crate::Predictor { p0: 1.0, p1: 0.0, p2: 2.0, theta: 8.0 };
        wide.cpu = CpuDemand::Predicted { predictor, min_cores_per_gpu: 1 };
        // Its 8 cores were spared while a 6-GPU job shared its server (the reserve keeps the
        // share beside each free GPU); that job has ended.
        let (first, _) = place(&mut v, spec(6), 0);
        let (mover, m) = place(&mut v, wide, 0);
        assert_eq!(m.cores.count(), 8);
        v.apply(&Command::Release { job: first, failed: false });
        let mut seven = spec(7);
        seven.cpu = CpuDemand::Fixed { cores_per_gpu: 4 };
        place(&mut v, seven, 1);
        place(&mut v, spec(6), 2);
        let blocked = v.submit(spec(8)).expect("submit");
        let p =
            plan(&v, blocked, LocalityLevel::Server, &BTreeMap::new(), &MigrationParams::default()).expect("a plan");
        assert_eq!(p.moves.len(), 1, "{p:?}");
        assert_eq!(p.moves[0].job, mover);
        assert_eq!(p.moves[0].to[0].server, ServerId(2), "{p:?}");
        assert_eq!(p.moves[0].to[0].cores.count(), 8);
        // Where no home grants its cores, the fullest is taken though it grants fewer.
        let mut hungry = spec(1);
        hungry.cpu = CpuDemand::Fixed { cores_per_gpu: 22 };
        place(&mut v, hungry, 2);
        let p =
            plan(&v, blocked, LocalityLevel::Server, &BTreeMap::new(), &MigrationParams::default()).expect("a plan");
        assert_eq!(p.moves[0].to[0].server, ServerId(1), "{p:?}");
        assert!(p.moves[0].to[0].cores.count() < 8);
    }

    #[test]
    fn jobs_near_their_end_and_the_move_bound_are_respected() {
        let (v, a, b, big) = fragmented();
        let ending: BTreeMap<JobId, f64> = [(a, 10.0), (b, 10.0)].into_iter().collect();
        assert!(plan(&v, big, LocalityLevel::Server, &ending, &MigrationParams::default()).is_none());
        let only_b: BTreeMap<JobId, f64> = [(a, 10.0)].into_iter().collect();
        let p = plan(&v, big, LocalityLevel::Server, &only_b, &MigrationParams::default()).expect("plan");
        assert_eq!(p.moves.iter().map(|m| m.job).collect::<Vec<_>>(), vec![b]);
        let none = MigrationParams { max_moves: 0, ..MigrationParams::default() };
        assert!(plan(&v, big, LocalityLevel::Server, &BTreeMap::new(), &none).is_none());
        // A 4-GPU job fits a free socket without moves: the plan is empty.
        let mut v = v;
        let four = v.submit(spec(4)).expect("submit");
        let p = plan(&v, four, LocalityLevel::Socket, &BTreeMap::new(), &MigrationParams::default()).expect("plan");
        assert!(p.moves.is_empty() && p.level <= LocalityLevel::Socket);
    }

    #[test]
    fn a_gang_may_move_the_bound_for_each_member_it_needs_a_server_freed_for() {
        // Four servers in one rack, three 1-GPU jobs on each: 20 GPUs free, no whole server.
        let mut v = view(4);
        for s in 0..4u32 {
            for g in 0..3u32 {
                running(&mut v, member(s, 1 << g, g), u64::from(s * 3 + g + 1));
            }
        }
        let mut gang = spec(8);
        gang.members = 2;
        let gang = v.submit(gang).expect("submit");
        // Two servers freed, three moves each: six, within 4 per member (8), beyond 4 in all.
        let p = plan(&v, gang, LocalityLevel::Rack, &BTreeMap::new(), &MigrationParams::default()).expect("a plan");
        assert_eq!(p.moves.len(), 6, "{p:?}");
        assert!(p.target.iter().all(|t| t.gpus == 0xff), "{:?}", p.target);
        let freed: Vec<ServerId> = p.target.iter().map(|t| t.server).collect();
        assert!(p.moves.iter().all(|m| !freed.contains(&m.to[0].server)), "moved jobs land on the other servers");
        assert_eq!(p.cost_gpu_s, 6.0 * 60.0);
        let three = MigrationParams { max_moves: 3, ..MigrationParams::default() };
        assert_eq!(three.moves_for(2), 6);
        assert!(plan(&v, gang, LocalityLevel::Rack, &BTreeMap::new(), &three).is_some(), "three per member suffice");
        let two = MigrationParams { max_moves: 2, ..MigrationParams::default() };
        assert!(
            plan(&v, gang, LocalityLevel::Rack, &BTreeMap::new(), &two).is_none(),
            "four moves free no two servers"
        );
        // A one-member job keeps the bound as it is.
        assert_eq!(MigrationParams::default().moves_for(1), 4);
    }

    #[test]
    fn a_gang_frees_the_servers_that_take_the_fewest_moves() {
        // Three servers in one rack: three 1-GPU jobs on server 0, one on each of 1 and 2.
        let mut v = view(3);
        let mut id = 1;
        for (s, jobs) in [(0u32, 3u32), (1, 1), (2, 1)] {
            for g in 0..jobs {
                running(&mut v, member(s, 1 << g, g), id);
                id += 1;
            }
        }
        let mut gang = spec(8);
        gang.members = 2;
        let gang = v.submit(gang).expect("submit");
        let p = plan(&v, gang, LocalityLevel::Rack, &BTreeMap::new(), &MigrationParams::default()).expect("a plan");
        let mut freed: Vec<ServerId> = p.target.iter().map(|t| t.server).collect();
        freed.sort();
        assert_eq!(freed, vec![ServerId(1), ServerId(2)], "{p:?}");
        assert_eq!(p.moves.len(), 2, "one move each, not three on server 0");
    }

    #[test]
    fn moves_are_validated_atomically() {
        let (mut v, a, b, big) = fragmented();
        let before = v.state_hash();
        let mv = |id: u64, job: JobId, m: MemberPlacement| Proposal {
            id: ProposalId(id),
            job,
            members: vec![m],
            based_on: crate::ViewVersion(0),
        };
        // Onto b's device: a conflict, nothing changes (a keeps its placement).
        let d = decide(&mut v, Command::Migrate(vec![mv(10, a, member(1, 0b1000_0000, 0))]));
        assert!(matches!(&d[0], Decision::Rejected { reason: Rejection::DevicesBusy { .. }, .. }), "{d:?}");
        // A pending job cannot be moved.
        let d = decide(&mut v, Command::Migrate(vec![mv(11, big, member(0, 0xff, 0))]));
        assert!(matches!(&d[0], Decision::Rejected { reason: Rejection::NotMovable { .. }, .. }), "{d:?}");
        assert_eq!(v.state_hash(), before, "refused moves change nothing");
        // A move may reuse the job's own device and core (device 0 plus device 1).
        let d = decide(&mut v, Command::Migrate(vec![mv(12, a, member(0, 0b10, 0))]));
        assert!(d[0].is_placed(), "{d:?}");
        assert!(invariants::check(&v).is_clean());
        // A migrating job is not moved again until it runs.
        let d = decide(&mut v, Command::Migrate(vec![mv(13, a, member(0, 0b100, 2))]));
        assert!(matches!(&d[0], Decision::Rejected { reason: Rejection::NotMovable { .. }, .. }), "{d:?}");
        // The old proposal id of `a` is spent.
        let d = decide(&mut v, Command::Migrate(vec![mv(1, a, member(0, 0b1, 0))]));
        assert!(matches!(&d[0], Decision::Rejected { reason: Rejection::ProposalSpent, .. }), "{d:?}");
        let _ = b;
    }

    #[test]
    fn the_index_of_placed_jobs_follows_placements_and_snapshots() {
        let (mut v, a, b, big) = fragmented();
        let ids = |v: &ClusterView| v.placed_jobs().map(|j| j.id).collect::<Vec<_>>();
        assert_eq!(ids(&v), vec![a, b], "placed jobs in id order; the pending one is not among them");
        v.release(a, false).expect("release");
        assert_eq!(ids(&v), vec![b]);
        assert!(invariants::check(&v).is_clean());
        let restored = ClusterView::from_snapshot(v.snapshot());
        assert_eq!(ids(&restored), vec![b], "rebuilt from the jobs on restore");
        // A stale index is a violation the checker names.
        v.placed.insert(big);
        let rep = invariants::check(&v);
        assert!(rep.violations.iter().any(|m| m.contains("index of placed jobs")), "{rep:?}");
    }

    /// A cluster of `layout.len()` servers, each holding one small job per chunk of
    /// `layout[s]`: `(gpus, gap, cores per GPU)`, GPUs from 0 up with a gap of `gap` GPUs after
    /// each, cores from 0 up; and a blocked one-member job of `blocked` GPUs wanting
    /// `blocked_cores` cores per GPU; built by commands applied in order.
    fn built(layout: &[Vec<(u32, u32, u32)>], blocked: u32, blocked_cores: u32) -> (ClusterView, JobId) {
        let mut v = view(layout.len() as u32);
        let mut id = 1;
        for (s, chunks) in layout.iter().enumerate() {
            let (mut at, mut core) = (0u32, 0u32);
            for &(gpus, gap, cores_per_gpu) in chunks {
                if at + gpus > 8 || core + gpus * cores_per_gpu > 32 {
                    break;
                }
                let mask = ((1u64 << gpus) - 1) << at;
                let m = MemberPlacement {
                    server: ServerId(s as u32),
                    gpus: mask,
                    cores: CoreMask::range(core, gpus * cores_per_gpu),
                    memory_mib: 1024 * gpus,
                };
                let mut sp = spec(gpus);
                sp.cpu = CpuDemand::Fixed { cores_per_gpu };
                let job = v.submit(sp).expect("submit");
                let p = Proposal { id: ProposalId(id), job, members: vec![m], based_on: v.version() };
                assert!(decide(&mut v, Command::Propose(vec![p]))[0].is_placed());
                id += 1;
                at += gpus + gap;
                core += gpus * cores_per_gpu;
            }
        }
        let mut sp = spec(blocked);
        sp.cpu = CpuDemand::Fixed { cores_per_gpu: blocked_cores };
        let job = v.submit(sp).expect("submit");
        (v, job)
    }

    fn summary(fs: &[Freeing], holders: &Holders) -> Vec<(ServerId, Vec<JobId>, u32)> {
        fs.iter()
            .map(|f| (f.server, f.movers.iter().map(|&i| holders[f.server.index()][i].of.id).collect(), f.moved_gpus))
            .collect()
    }

    proptest! {
        /// The pruned search for a one-member job finds the same cheapest servers, in the same
        /// order, as searching every server with the whole move bound and sorting; and a plan
        /// does not depend on the order the view's map yields its jobs in (a second view built
        /// by the same commands hashes them differently).
        #[test]
        fn the_pruned_search_finds_what_the_exhaustive_one_does(
            layout in prop::collection::vec(prop::collection::vec((1u32..=4, 0u32..=2, 1u32..=6), 0..5), 2..40),
            blocked in prop::sample::select(vec![2u32, 4, 8]),
            blocked_cores in 1u32..=4,
            level in prop::sample::select(vec![LocalityLevel::PcieSwitch, LocalityLevel::Socket, LocalityLevel::Server]),
        ) {
            let (v, job) = built(&layout, blocked, blocked_cores);
            let params = MigrationParams::default();
            let spec = &v.job(job).expect("job").spec;
            let held = holders(&v, job, blocked, &BTreeMap::new(), &params);
            let mut all: Vec<Freeing> = (0..v.servers().len())
                .filter_map(|s| freeing(&v, ServerId(s as u32), spec, level, &held, params.max_moves))
                .collect();
            all.sort_by_key(Freeing::rank);
            all.truncate(CANDIDATES_TRIED);
            let pruned = cheapest_servers(&v, spec, level, &held, &params);
            prop_assert_eq!(summary(&pruned, &held), summary(&all, &held));
            let (again, job2) = built(&layout, blocked, blocked_cores);
            prop_assert_eq!(job, job2);
            prop_assert_eq!(
                plan(&v, job, level, &BTreeMap::new(), &params),
                plan(&again, job2, level, &BTreeMap::new(), &params)
            );
        }
    }
}
