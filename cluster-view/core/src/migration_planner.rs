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
    /// Never more than [`MAX_MOVES`], what one `Migrate` request may carry.
    pub fn moves_for(&self, members: u32) -> usize {
        self.max_moves.saturating_mul(members.max(1) as usize).min(MAX_MOVES)
    }
}

/// Most moves in one plan: what one `Migrate` request may carry (the view server refuses a
/// request of more items). A plan for a gang of more than 256 members is held to it, so that
/// the live task never makes a plan the leader refuses whole.
pub const MAX_MOVES: usize = 1024;

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
        let chosen: Vec<Freeing> =
            chosen.into_iter().map(|f| needed_only(view, f, spec, member_level, &holders)).collect();
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

/// The rules of [`may_move`] the view itself can check, whatever a host's parameters: `j` is a
/// one-member job of fewer GPUs than the `blocked_gpus` of the job it is moved for. The leader
/// holds a host's moves to them too ([`crate::migration_check::moves_help`]), so that a host can
/// restart no larger gang, nor one of several members, to make room for its own job.
pub fn movable_for(j: &Job, blocked_gpus: u32) -> bool {
    j.spec.members == 1 && j.spec.total_gpus() < blocked_gpus
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
        let movable = j.id != blocked && movable_for(j, blocked_gpus) && may_move(j, total, remaining_s, params);
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
        r.give_back(m, view.unhealthy_devices(server));
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

/// `f` without the movers its target does not need, as the leader's check of a host's moves
/// ([`crate::migration_check::moves_help`]) judges a move: one holding none of the target's GPUs
/// or cores, on a server with the memory for the target without it, while the job still fits
/// without it (the fit redone on what the other movers free).
///
/// [`freeing`] moves a group's occupants one more at a time until the job fits, and the fit may
/// then take only GPUs the later ones freed. A socket of two PCIe switches is the case: its
/// first occupant moved frees a GPU on the other switch and too few cores, the next two free a
/// switch, and the fit packs the job there. Left in, the first move would cost its job a
/// restart for nothing, and the check refuses the whole plan. Found on a synthetic trace no rule
/// was measured on (docs/EVALUATION.md, "Stop 57"). The search's ranks and bounds are its own
/// (the moves counted before this), so it finds what it did; a plan only loses moves here.
fn needed_only(view: &ClusterView, mut f: Freeing, spec: &JobSpec, level: LocalityLevel, holders: &Holders) -> Freeing {
    let (Some(rec), [first]) = (view.server(f.server), f.target.as_slice()) else { return f };
    let topo = view.topology_of(rec.config_set);
    let Some(group) = topo.groups(level).into_iter().find(|g| first.gpus & !g == 0) else { return f };
    let req = fit::member_request(spec, topo);
    let here = &holders[f.server.index()];
    let mut target = *first;
    'drop: loop {
        let free_memory: u32 = rec.free_memory_mib + f.movers.iter().map(|&i| here[i].member.memory_mib).sum::<u32>();
        for k in 0..f.movers.len() {
            let h = &here[f.movers[k]].member;
            if h.gpus & target.gpus != 0
                || h.cores.intersects(target.cores)
                || target.memory_mib > free_memory - h.memory_mib
            {
                continue;
            }
            let rest: Vec<&MemberPlacement> =
                f.movers.iter().enumerate().filter(|&(n, _)| n != k).map(|(_, &i)| &here[i].member).collect();
            let mut r = released(view, rec, f.server, &rest);
            r.free_gpus &= group;
            if let Some((m, _)) = fit::plan_member(topo, &r, f.server, &req, level, FitMode::Pack) {
                f.movers.remove(k);
                target = m;
                continue 'drop;
            }
        }
        break;
    }
    f.moved_gpus = f.movers.iter().map(|&i| here[i].member.gpus.count_ones()).sum();
    f.target = vec![target];
    f
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
mod tests;
