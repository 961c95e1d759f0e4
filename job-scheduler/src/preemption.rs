//! Victim choice for preemption: which lower-ranked gangs a waiting job should displace.
//!
//! Pure: it reads a [`LocalView`] and the candidates the host offers, and returns the victims
//! and the preemptor's gang for a [`tessera_view::Preemption`]. The approver re-checks
//! everything (rank, the starvation bound, that each victim is needed); this only chooses well.
//!
//! The order of preference, as the issue states it: the fewest gangs, then the lowest rank
//! (priority, then the highest attained-service queue), then the least work lost: first the
//! fewest GPUs stopped that the preemptor does not take (they idle until a waiting job fits
//! them, and the victims, re-queued, each need all they held), then the least time since the
//! victims' last checkpoint. Victims are always whole gangs: releasing one frees every member
//! it holds, and the search sees all of them free.
//!
//! Two searches:
//! - **per server**, for a gang that one server can hold: on each server with candidates, free
//!   each candidate alone, and where none alone makes room, its candidates one by one in
//!   preference order until the gang fits on that server (the search's own one-server planner,
//!   [`plan_on_server`], on the server's record with those victims' resources given back); the
//!   best set wins. A one-server gang needs victims on its server only, so this finds it
//!   whenever freeing every candidate there would;
//! - **global**, for a gang larger than any server, and for a gang of several members that may
//!   span servers when no one server has room: free candidates across the cluster in
//!   preference order until [`find_placement`] finds the gang on a copy of the view.
//!
//! Either way, a victim the found gang does not need (no shared device or core, none of its
//! memory: [`needed_victims`]) is dropped before returning: the approver refuses unneeded
//! victims.

use crate::local_view::{LocalView, Overlay};
use crate::scheduler::Attempt;
use crate::search::{find_placement, plan_on_server};
use std::borrow::Borrow;
use std::collections::{BTreeMap, BTreeSet};
use tessera_view::fit::FitMode;
use tessera_view::preemption::needed_victims;
use tessera_view::{Job, JobId, JobSpec, LocalityLevel, MemberPlacement, ServerId};

/// Servers the per-server search visits at most (those with the most candidate GPUs first).
const SERVERS_TRIED: usize = 64;

/// A job the host offers as a possible victim: one the preemptor outranks and that is under the
/// cluster's preemption bound.
#[derive(Clone, Debug, PartialEq)]
pub struct Candidate {
    /// The job.
    pub job: JobId,
    /// Its placement's members.
    pub members: Vec<MemberPlacement>,
    /// Its priority.
    pub priority: i32,
    /// Its attained-service queue.
    pub service_queue: u8,
    /// When its current run began (Unix ms on the view's clock): the later of its placement's
    /// approval and its members' start. A stop checkpoints it, so what it loses is the
    /// restart and the work since its last checkpoint, which the host does not know: the
    /// shorter the run so far, the less, so a later start is preferred.
    pub since_ms: u64,
}

impl Candidate {
    /// `job` as a candidate, if it holds a placement.
    pub fn of(job: &Job) -> Option<Candidate> {
        let p = job.placement.as_ref().filter(|_| job.state.holds_resources())?;
        Some(Candidate {
            job: job.id,
            members: p.members.clone(),
            priority: job.spec.priority,
            service_queue: job.service_queue,
            since_ms: job.times.placed_ms.max(job.times.started_ms),
        })
    }
}

/// Victims and the gang they make room for.
#[derive(Clone, Debug, PartialEq)]
pub struct Choice {
    /// The victims, in preference order.
    pub victims: Vec<JobId>,
    /// The preemptor's members, in rank order.
    pub members: Vec<MemberPlacement>,
}

/// Chooses victims among `candidates` (owned, or references into a host's pool) so that `spec`
/// fits within `allowed`, or `None` when even all of them would not make room, or when the gang
/// found needs none of them.
pub fn choose_victims<C: Borrow<Candidate>>(
    view: &LocalView,
    spec: &JobSpec,
    allowed: LocalityLevel,
    mode: FitMode,
    salt: u64,
    candidates: &[C],
) -> Option<Choice> {
    let candidates: Vec<&Candidate> = candidates.iter().map(Borrow::borrow).collect();
    choose_among(view, spec, allowed, mode, salt, &candidates)
}

/// [`choose_victims`] over references to the candidates.
fn choose_among(
    view: &LocalView,
    spec: &JobSpec,
    allowed: LocalityLevel,
    mode: FitMode,
    salt: u64,
    candidates: &[&Candidate],
) -> Option<Choice> {
    if candidates.is_empty() {
        return None;
    }
    let mut order: Vec<usize> = (0..candidates.len()).collect();
    order.sort_by(|&a, &b| {
        let (x, y) = (&candidates[a], &candidates[b]);
        (x.priority, std::cmp::Reverse(x.service_queue))
            .cmp(&(y.priority, std::cmp::Reverse(y.service_queue)))
            .then(y.since_ms.cmp(&x.since_ms))
            .then(x.job.cmp(&y.job))
    });
    let mut best: Option<(Score, Choice)> = None;
    let mut consider = |set: Vec<usize>, found: Vec<MemberPlacement>| {
        let set = needed_only(view, set, candidates, &found);
        if set.is_empty() {
            // It fits without displacing anyone: not a preemption (the approver refuses one
            // with no victims), but GPUs its scheduler left alone, such as those a host
            // withholds for a starved gang (`crate::reservation`).
            return;
        }
        let score = Score::of(&set, candidates, &found);
        if best.as_ref().is_none_or(|(s, _)| score < *s) {
            let victims = set.iter().map(|&k| candidates[k].job).collect();
            best = Some((score, Choice { victims, members: found }));
        }
    };
    let fits_one_server = view.topologies().iter().any(|t| t.devices >= spec.total_gpus());
    if fits_one_server {
        let mut room = false;
        let levels: Vec<LocalityLevel> =
            LocalityLevel::ALL.into_iter().filter(|l| l.is_intra_server() && *l <= allowed).collect();
        // GPUs the candidates hold per server (one map entry per server: a list searched per
        // member cost candidates × servers on a full cluster), most first.
        let mut per_server: BTreeMap<ServerId, u32> = BTreeMap::new();
        for m in candidates.iter().flat_map(|c| &c.members) {
            *per_server.entry(m.server).or_default() += m.gpus.count_ones();
        }
        let mut gpus_on: Vec<(u32, ServerId)> = per_server.into_iter().map(|(s, n)| (n, s)).collect();
        gpus_on.sort_by(|a, b| b.0.cmp(&a.0).then(a.1.cmp(&b.1)));
        for &(_, s) in gpus_on.iter().take(SERVERS_TRIED) {
            let Some(&base) = view.servers().get(s.index()) else { continue };
            let topo = view.topology_of(base.config_set);
            if spec.gpu_type.as_ref().is_some_and(|t| *t != topo.device_type) {
                continue;
            }
            let req = tessera_view::fit::member_request(spec, topo);
            let here: Vec<usize> =
                order.iter().copied().filter(|&k| candidates[k].members.iter().any(|m| m.server == s)).collect();
            let with_freed = |set: &[usize]| {
                let mut rec = base;
                for m in set.iter().flat_map(|&k| &candidates[k].members).filter(|m| m.server == s) {
                    rec.give_back(m, view.unhealthy_devices(s));
                }
                levels.iter().find_map(|&l| plan_on_server(topo, &rec, s, &req, spec.members, l, mode))
            };
            // One gang alone first, each of them: the fewest gangs come before the lowest rank.
            let mut single = false;
            for &k in &here {
                if let Some(found) = with_freed(&[k]) {
                    consider(vec![k], found);
                    single = true;
                }
            }
            room |= single;
            if single {
                continue;
            }
            // Else the candidates one by one in preference order until the gang fits.
            for n in 2..=here.len() {
                if let Some(found) = with_freed(&here[..n]) {
                    consider(here[..n].to_vec(), found);
                    room = true;
                    break;
                }
            }
        }
        // A gang that may span servers and found no room on one: the global search below.
        if room || allowed.is_intra_server() || spec.members < 2 {
            return best.map(|(_, c)| c);
        }
    }
    let mut scratch = Scratch { base: view, copy: view.clone(), touched: BTreeSet::new() };
    let mut set = Vec::new();
    for &k in &order {
        set.push(k);
        if let Some(found) = scratch.try_with(&set, candidates, spec, allowed, mode, salt) {
            consider(set, found);
            break;
        }
    }
    best.map(|(_, c)| c)
}

/// The host's preemption step, live ([`crate::runtime::PlaceMachine`]) and wherever else an
/// [`Attempt`] is made: when the job's scheduler found nothing, the gang the job would get by
/// displacing running jobs it outranks ([`crate::scheduler::RunningIndex::preemptible_by`]),
/// within the level it accepts now; `None` when no such jobs exist or freeing all of them
/// would not make room.
pub fn displace(a: &Attempt<'_>) -> Option<Choice> {
    let candidates = a.ctx.running.preemptible_by(a.job.rank());
    if candidates.is_empty() {
        return None;
    }
    let free: u64 = a.view.servers().iter().map(|r| u64::from(r.free_gpus.count_ones())).sum();
    if !could_make_room(&candidates, free, a.job.spec.total_gpus()) {
        return None;
    }
    choose_victims(a.view, &a.job.spec, a.allowed, FitMode::Pack, a.salt, &candidates)
}

/// Whether `candidates`' GPUs and the `free` ones are at least the `need`ed: a bound checked
/// before the search, which then looks for a placement.
pub fn could_make_room<C: Borrow<Candidate>>(candidates: &[C], free: u64, need: u32) -> bool {
    let freeable: u64 =
        candidates.iter().flat_map(|c| &c.borrow().members).map(|m| u64::from(m.gpus.count_ones())).sum();
    freeable + free >= u64::from(need)
}

/// `set` less the victims the gang `found` does not need (the approver's own test,
/// [`needed_victims`]), the highest-ranked dropped first; one at a time, since a victim needed
/// for memory may be needed only once another that could have given it is dropped.
fn needed_only(
    view: &LocalView,
    mut set: Vec<usize>,
    candidates: &[&Candidate],
    found: &[MemberPlacement],
) -> Vec<usize> {
    let free_mib = |s: ServerId| view.servers().get(s.index()).map_or(0, |r| r.free_memory_mib);
    loop {
        let held: Vec<&[MemberPlacement]> = set.iter().map(|&k| &candidates[k].members[..]).collect();
        match needed_victims(free_mib, &held, found).iter().rposition(|n| !n) {
            Some(i) => {
                set.remove(i);
            }
            None => return set,
        }
    }
}

/// The preference order of a victim set: fewer gangs, then lower rank, then less work lost
/// (GPUs stopped for nothing, then the time since the victims' checkpoints).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Score {
    gangs: usize,
    /// The highest rank among the victims (priority, then the lowest queue): lower is better.
    rank: (i32, std::cmp::Reverse<u8>),
    /// The victims' GPUs the preemptor's gang does not use: they stop working and idle until a
    /// waiting job fits them, which at a load that preempts is seldom the victims themselves
    /// (each needs all it held). Fewer is better.
    idled_gpus: u32,
    /// The victims' run starts summed (later starts, less work lost): higher is better.
    since_ms: std::cmp::Reverse<u128>,
}

impl Score {
    fn of(set: &[usize], candidates: &[&Candidate], found: &[MemberPlacement]) -> Score {
        let rank = set
            .iter()
            .map(|&k| (candidates[k].priority, std::cmp::Reverse(candidates[k].service_queue)))
            .max()
            .unwrap_or((i32::MIN, std::cmp::Reverse(u8::MAX)));
        let held = set.iter().flat_map(|&k| &candidates[k].members);
        let idled_gpus = held
            .map(|v| {
                let taken: u64 = found.iter().filter(|m| m.server == v.server).fold(0, |a, m| a | m.gpus);
                (v.gpus & !taken).count_ones()
            })
            .sum();
        let since_ms = set.iter().map(|&k| u128::from(candidates[k].since_ms)).sum();
        Score { gangs: set.len(), rank, idled_gpus, since_ms: std::cmp::Reverse(since_ms) }
    }
}

/// A copy of the view on which victims' resources are freed for one search and restored after.
struct Scratch<'v> {
    base: &'v LocalView,
    copy: LocalView,
    touched: BTreeSet<ServerId>,
}

impl Scratch<'_> {
    /// The gang found with the resources of `set` freed, if any.
    fn try_with(
        &mut self,
        set: &[usize],
        candidates: &[&Candidate],
        spec: &JobSpec,
        allowed: LocalityLevel,
        mode: FitMode,
        salt: u64,
    ) -> Option<Vec<MemberPlacement>> {
        for &k in set {
            for m in &candidates[k].members {
                let mut rec = self.copy.servers()[m.server.index()];
                rec.give_back(m, self.copy.unhealthy_devices(m.server));
                if self.copy.apply_server(m.server, rec) {
                    self.touched.insert(m.server);
                }
            }
        }
        let found = find_placement(&self.copy, &Overlay::default(), spec, allowed, mode, salt).ok();
        for s in std::mem::take(&mut self.touched) {
            self.copy.apply_server(s, self.base.servers()[s.index()]);
        }
        found.map(|f| f.members)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_view::{ClusterSpec, ClusterView, Decision, Proposal, ProposalId, Topology};

    /// Two seed-8gpu servers; `jobs` are (GPUs, server, priority) placed in order.
    fn cluster(jobs: &[(u32, u32, i32)]) -> (ClusterView, Vec<Candidate>) {
        let topo = Topology::preset("seed-8gpu").expect("preset");
        let mut v = ClusterView::from_spec(&ClusterSpec::uniform(topo, 2, 2, 1));
        let mut out = Vec::new();
        for (i, &(gpus, server, priority)) in jobs.iter().enumerate() {
            let mut spec = JobSpec::simple("victim", 1, gpus);
            spec.priority = priority;
            let id = v.submit(spec.clone()).expect("admitted");
            // Place it on `server` with the shared search restricted by a one-server view.
            let mut local = LocalView::of_view(&v);
            for other in 0..2u32 {
                if other != server {
                    let mut rec = local.servers()[other as usize];
                    rec.free_gpus = 0;
                    local.apply_server(ServerId(other), rec);
                }
            }
            let found =
                find_placement(&local, &Overlay::default(), &spec, LocalityLevel::Any, FitMode::Pack, 0).expect("room");
            let p = Proposal {
                id: ProposalId(i as u64 + 1),
                job: id,
                members: found.members.clone(),
                based_on: v.version(),
            };
            assert!(matches!(v.propose(&p), Decision::Accepted { .. }));
            out.push(Candidate {
                job: id,
                members: found.members,
                priority,
                service_queue: 0,
                since_ms: 1_000 - i as u64,
            });
        }
        (v, out)
    }

    #[test]
    fn the_fewest_gangs_win_over_a_lower_rank() {
        // Server 0: four 2-GPU jobs of priority 0. Server 1: one 8-GPU job of priority 5.
        let (v, cands) = cluster(&[(2, 0, 0), (2, 0, 0), (2, 0, 0), (2, 0, 0), (8, 1, 5)]);
        let spec = JobSpec { priority: 10, ..JobSpec::simple("big", 1, 8) };
        let c = choose_victims(&LocalView::of_view(&v), &spec, LocalityLevel::Any, FitMode::Pack, 0, &cands)
            .expect("a choice");
        assert_eq!(c.victims, vec![cands[4].job], "one gang of priority 5 beats four of priority 0");
        assert!(c.members.iter().all(|m| m.server == ServerId(1)));
    }

    #[test]
    fn a_small_job_displaces_one_small_victim_with_the_least_work_lost() {
        let (v, cands) = cluster(&[(4, 0, 0), (4, 0, 0), (4, 1, 0), (4, 1, 0)]);
        let spec = JobSpec { priority: 1, ..JobSpec::simple("small", 1, 2) };
        let c = choose_victims(&LocalView::of_view(&v), &spec, LocalityLevel::Any, FitMode::Pack, 0, &cands)
            .expect("a choice");
        assert_eq!(c.victims, vec![cands[0].job], "one victim, the one that loses least (the latest start)");
        assert_eq!(needed_victims(|_| 0, &[&cands[0].members[..]], &c.members), vec![true]);
    }

    #[test]
    fn of_victims_of_one_rank_the_one_that_leaves_the_fewest_gpus_idle_is_taken() {
        // Server 0: an 8-GPU job, started last (the least work lost since a checkpoint). Server
        // 1: a 2-GPU job of the same rank beside 6 GPUs of a job the preemptor does not outrank.
        let (v, cands) = cluster(&[(8, 0, 0), (2, 1, 0), (6, 1, 9)]);
        let spec = JobSpec { priority: 1, ..JobSpec::simple("small", 1, 2) };
        let c = choose_victims(&LocalView::of_view(&v), &spec, LocalityLevel::Any, FitMode::Pack, 0, &cands[..2])
            .expect("a choice");
        // Displacing the 8-GPU job would stop 6 GPUs the preemptor leaves idle.
        assert_eq!(c.victims, vec![cands[1].job]);
        assert!(c.members.iter().all(|m| m.server == ServerId(1)));
    }

    #[test]
    fn no_choice_when_even_every_candidate_would_not_make_room() {
        // Server 1 is held by a job the preemptor does not outrank (not offered).
        let (v, cands) = cluster(&[(4, 0, 0), (4, 1, 9)]);
        let spec = JobSpec { priority: 1, ..JobSpec::simple("huge", 2, 8) };
        let local = LocalView::of_view(&v);
        assert_eq!(choose_victims(&local, &spec, LocalityLevel::Any, FitMode::Pack, 0, &cands[..1]), None);
        assert_eq!(choose_victims(&local, &spec, LocalityLevel::Any, FitMode::Pack, 0, &[] as &[Candidate]), None);
        // Offered both, the gang takes both servers whole.
        let c = choose_victims(&local, &spec, LocalityLevel::Any, FitMode::Pack, 0, &cands).expect("a choice");
        assert_eq!(c.victims.len(), 2);
    }

    #[test]
    fn one_gang_alone_beats_several_of_a_lower_rank_on_the_same_server() {
        // Server 0: four 1-GPU jobs of priority 0 and a 4-GPU job of priority 1; server 1 held
        // by a job the preemptor does not outrank (not offered).
        let (v, cands) = cluster(&[(1, 0, 0), (1, 0, 0), (1, 0, 0), (1, 0, 0), (4, 0, 1), (8, 1, 9)]);
        let spec = JobSpec { priority: 5, ..JobSpec::simple("four", 1, 4) };
        let c = choose_victims(&LocalView::of_view(&v), &spec, LocalityLevel::Any, FitMode::Pack, 0, &cands[..5])
            .expect("a choice");
        assert_eq!(c.victims, vec![cands[4].job], "one gang of priority 1 before four of priority 0");
    }

    #[test]
    fn a_gang_that_may_span_servers_takes_victims_on_two_when_no_one_server_has_room() {
        // Each server: 4 GPUs of a priority-0 job, 4 of a priority-9 one. A priority-5 gang of
        // two 4-GPU members fits on no one server, but on the two priority-0 jobs' GPUs.
        let (v, cands) = cluster(&[(4, 0, 0), (4, 0, 9), (4, 1, 0), (4, 1, 9)]);
        let spec = JobSpec { priority: 5, ..JobSpec::simple("pair", 2, 4) };
        let offered = [cands[0].clone(), cands[2].clone()];
        let local = LocalView::of_view(&v);
        let c = choose_victims(&local, &spec, LocalityLevel::Any, FitMode::Pack, 0, &offered).expect("both make room");
        let mut victims = c.victims.clone();
        victims.sort();
        assert_eq!(victims, vec![cands[0].job, cands[2].job]);
        // Held to one server, no choice.
        assert_eq!(choose_victims(&local, &spec, LocalityLevel::Server, FitMode::Pack, 0, &offered), None);
    }

    /// Whether the approver takes `choice` for a preemptor of `spec`, submitted to `v` now.
    fn approved(v: &mut ClusterView, spec: JobSpec, choice: &Choice) -> bool {
        let job = v.submit(spec).expect("admitted");
        let proposal = Proposal { id: ProposalId(99), job, members: choice.members.clone(), based_on: v.version() };
        let pre = tessera_view::Preemption { proposal, victims: choice.victims.clone(), reason: "test".into() };
        v.preempt(&pre).is_placed()
    }

    #[test]
    fn a_victims_unhealthy_device_is_not_counted_as_freed() {
        // Two full servers, one 8-GPU priority-0 job each; the one on server 0 started last (the
        // least work lost), but one of its devices went bad and stays taken when it ends.
        let (mut v, cands) = cluster(&[(8, 0, 0), (8, 1, 0)]);
        v.set_unhealthy_devices(ServerId(0), 0b1000).expect("set");
        let spec = JobSpec { priority: 1, ..JobSpec::simple("big", 1, 8) };
        let c = choose_victims(&LocalView::of_view(&v), &spec, LocalityLevel::Any, FitMode::Pack, 0, &cands)
            .expect("a choice");
        assert_eq!(c.victims, vec![cands[1].job], "only server 1's victim frees 8 healthy GPUs");
        assert!(approved(&mut v, spec, &c), "the approver takes the choice");
        // Across servers too: a 16-GPU gang needs all 16 devices, and one stays taken.
        let (mut v, cands) = cluster(&[(8, 0, 0), (8, 1, 0)]);
        let pair = JobSpec { priority: 1, ..JobSpec::simple("pair", 2, 8) };
        assert!(choose_victims(&LocalView::of_view(&v), &pair, LocalityLevel::Any, FitMode::Pack, 0, &cands).is_some());
        v.set_unhealthy_devices(ServerId(1), 0b1).expect("set");
        assert_eq!(choose_victims(&LocalView::of_view(&v), &pair, LocalityLevel::Any, FitMode::Pack, 0, &cands), None);
    }
}
