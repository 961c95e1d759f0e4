//! Preemption: a pending job takes the resources of lower-priority gangs, in one atomic command.
//!
//! A [`Preemption`] is the preemptor's gang proposal plus the jobs it displaces. The approver
//! ([`ClusterView::preempt`]) applies it whole or not at all: every victim's gang is released
//! whole and the victim goes back to pending (it is never left partly running), and the
//! preemptor is placed on the freed resources, in one step. It checks:
//!
//! - the proposal id, as for any proposal: a resend of an applied preemption is
//!   `AlreadyApplied`, a spent or reused id is refused;
//! - the preemptor: known and pending;
//! - the victims ([`VictimProblem`]): 1 to [`MAX_VICTIMS`], each known, distinct, not the
//!   preemptor, holding resources, ranked below the preemptor ([`Job::outranks`]: a lower
//!   priority, or the same priority and a higher attained-service queue), preempted fewer than the cluster's
//!   [`crate::Priorities::max_preemptions`] times (a starvation bound), and each *needed*: one of
//!   its members shares a device or a core with a member of the preemptor's gang, or holds
//!   memory on a server where the gang's members need more than is free there with every other
//!   victim released (a preemption never displaces a job it does not need);
//! - the gang, exactly as a proposal's (shape, locality, health, quota, free resources), against
//!   the records with every victim's resources given back.
//!
//! Which victims to choose is the scheduler's (`tessera_scheduler::preemption`); the approver
//! only refuses a bad choice.

use crate::ids::{JobId, ServerId};
use crate::job::{Job, JobState};
use crate::locality::LocalityLevel;
use crate::placement::{Decision, MemberPlacement, Proposal, Rejection};
use crate::view::ClusterView;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use thiserror::Error;

/// The most victims one preemption may name.
pub const MAX_VICTIMS: usize = 256;
/// The most characters of a preemption's reason kept in each victim's error.
pub const MAX_REASON_CHARS: usize = 256;

/// A pending job's gang, placed on resources that lower-priority jobs hold now.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Preemption {
    /// The preemptor's gang; its id is the preemption's (idempotency).
    pub proposal: Proposal,
    /// The jobs whose gangs are released whole and re-queued.
    pub victims: Vec<JobId>,
    /// Why, for the victims' error and the logs.
    pub reason: String,
}

/// Why a job named as a victim may not be preempted.
#[derive(Clone, Debug, PartialEq, Eq, Error, Serialize, Deserialize)]
pub enum VictimProblem {
    /// The view does not know it.
    #[error("unknown job")]
    Unknown,
    /// It is the preemptor itself.
    #[error("it is the preemptor")]
    IsPreemptor,
    /// It is named twice.
    #[error("named twice")]
    Duplicate,
    /// It holds no resources.
    #[error("it is {state} and holds nothing")]
    HoldsNothing {
        /// Its state.
        state: String,
    },
    /// It does not rank below the preemptor (see [`Job::outranks`]).
    #[error(
        "it does not rank below the preemptor: priority {} in service queue {}, against {} in queue {}",
        .victim.0, .victim.1, .preemptor.0, .preemptor.1
    )]
    NotLower {
        /// The victim's priority and service queue.
        victim: (i32, u8),
        /// The preemptor's priority and service queue.
        preemptor: (i32, u8),
    },
    /// It was preempted as often as the cluster allows.
    #[error("it was preempted {times} times, the cluster's bound is {max}")]
    Exhausted {
        /// Times preempted.
        times: u32,
        /// The bound.
        max: u32,
    },
    /// None of its members shares a device or a core with the preemptor's gang, and the gang
    /// needs none of its memory.
    #[error("the preemptor's gang uses none of its devices, cores or memory")]
    NotNeeded,
}

/// Whether the gang `gang` uses a device or a core that `held` holds: the approver's test of
/// whether a victim is needed, and the victim choice's.
pub fn shares_resources(held: &[MemberPlacement], gang: &[MemberPlacement]) -> bool {
    held.iter()
        .any(|h| gang.iter().any(|m| m.server == h.server && (m.gpus & h.gpus != 0 || m.cores.intersects(h.cores))))
}

/// Which of `victims` (each one's members) the gang `gang` needs: those it shares a device or a
/// core with ([`shares_resources`]), and those holding memory on a server where the gang's
/// members need more than `free_mib(server)` (what is free there before any victim is released)
/// plus what the other victims hold there. The approver's test, and the victim choice's.
pub fn needed_victims(
    free_mib: impl Fn(ServerId) -> u32,
    victims: &[&[MemberPlacement]],
    gang: &[MemberPlacement],
) -> Vec<bool> {
    let mut need: BTreeMap<ServerId, u64> = BTreeMap::new();
    for m in gang {
        *need.entry(m.server).or_default() += u64::from(m.memory_mib);
    }
    let mut released: BTreeMap<ServerId, u64> = BTreeMap::new();
    for h in victims.iter().flat_map(|v| v.iter()).filter(|h| need.contains_key(&h.server)) {
        *released.entry(h.server).or_default() += u64::from(h.memory_mib);
    }
    victims
        .iter()
        .map(|held| {
            shares_resources(held, gang)
                || need.iter().any(|(&s, &asked)| {
                    let mine: u64 = held.iter().filter(|h| h.server == s).map(|h| u64::from(h.memory_mib)).sum();
                    mine > 0 && asked > u64::from(free_mib(s)) + released.get(&s).copied().unwrap_or(0) - mine
                })
        })
        .collect()
}

impl ClusterView {
    /// Applies a preemption atomically (see the [module docs](crate::preemption)): on success
    /// every victim is pending again, with its `preemptions` count raised and the reason as its
    /// error, and the preemptor is placed. Idempotent on the proposal id.
    pub fn preempt(&mut self, pre: &Preemption) -> Decision {
        match self.precheck_preempt(pre) {
            Ok(level) => {
                self.bump();
                let p = &pre.proposal;
                let reason: String = pre.reason.chars().take(MAX_REASON_CHARS).collect();
                for &v in &pre.victims {
                    self.requeue(v, format!("preempted by {}: {reason}", p.job));
                    if let Some(j) = self.jobs.get_mut(&v) {
                        j.preemptions = j.preemptions.saturating_add(1);
                    }
                }
                self.take(p, level, JobState::Placed);
                Decision::Accepted { job: p.job, proposal: p.id, level, version: self.version }
            }
            Err(decision) => decision,
        }
    }

    /// Everything [`ClusterView::preempt`] decides, without applying.
    pub fn precheck_preempt(&self, pre: &Preemption) -> Result<LocalityLevel, Decision> {
        let p = &pre.proposal;
        if let Some(d) = self.idempotency(p) {
            return Err(d);
        }
        let reject = |r: Rejection| Err(self.reject(p, r, &[]));
        let Some(job) = self.jobs.get(&p.job) else {
            return reject(Rejection::UnknownJob);
        };
        if let Err(r) = crate::approver::placeable(job) {
            return reject(r);
        }
        if pre.victims.is_empty() || pre.victims.len() > MAX_VICTIMS {
            return reject(Rejection::VictimCount { got: pre.victims.len() as u32, max: MAX_VICTIMS as u32 });
        }
        let victims = match self.victims(pre, job) {
            Ok(v) => v,
            Err((victim, problem)) => return reject(Rejection::Victim { victim, problem }),
        };
        let level =
            self.validate_members(p, job, &victims).map_err(|(reason, stale)| self.reject(p, reason, &stale))?;
        // Checked after the gang's shape, so that "needed" compares well-formed members.
        let held: Vec<&[MemberPlacement]> =
            victims.iter().map(|v| v.placement.as_ref().map_or(&[][..], |g| &g.members[..])).collect();
        let free_mib = |s: ServerId| self.servers[s.index()].free_memory_mib;
        if let Some((v, _)) = victims.iter().zip(needed_victims(free_mib, &held, &p.members)).find(|(_, n)| !n) {
            return reject(Rejection::Victim { victim: v.id, problem: VictimProblem::NotNeeded });
        }
        Ok(level)
    }

    /// The victims of `pre`, each checked against `preemptor`; the first bad one otherwise.
    fn victims<'v>(&'v self, pre: &Preemption, preemptor: &Job) -> Result<Vec<&'v Job>, (JobId, VictimProblem)> {
        let max = self.priorities.max_preemptions;
        let mut seen = BTreeSet::new();
        let mut out = Vec::with_capacity(pre.victims.len());
        for &v in &pre.victims {
            let problem = |p: VictimProblem| Err((v, p));
            if v == preemptor.id {
                return problem(VictimProblem::IsPreemptor);
            }
            if !seen.insert(v) {
                return problem(VictimProblem::Duplicate);
            }
            let Some(j) = self.jobs.get(&v) else { return problem(VictimProblem::Unknown) };
            if !j.state.holds_resources() || j.placement.is_none() {
                return problem(VictimProblem::HoldsNothing { state: j.state.as_str().to_string() });
            }
            if !preemptor.outranks(j) {
                return problem(VictimProblem::NotLower {
                    victim: (j.spec.priority, j.service_queue),
                    preemptor: (preemptor.spec.priority, preemptor.service_queue),
                });
            }
            if j.preemptions >= max {
                return problem(VictimProblem::Exhausted { times: j.preemptions, max });
            }
            out.push(j);
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::invariants;
    use crate::mask::CoreMask;
    use crate::{ClusterSpec, Command, JobSpec, Outcome, ProposalId, ServerId, Topology};

    fn view(servers: u32) -> ClusterView {
        let topo = Topology::preset("seed-8gpu").expect("preset");
        ClusterView::from_spec(&ClusterSpec::uniform(topo, servers, servers, 1))
    }

    /// A member on `server` with devices `gpus` (a mask) and one core, `core`.
    fn member(server: u32, gpus: u64, core: u32) -> MemberPlacement {
        MemberPlacement { server: ServerId(server), gpus, cores: CoreMask::range(core, 1), memory_mib: 1024 }
    }

    fn spec(name: &str, members: u32, gpus: u32, priority: i32) -> JobSpec {
        let mut s = JobSpec::simple(name, members, gpus);
        s.cpu = crate::CpuDemand::Fixed { cores_per_gpu: 1 };
        s.memory_mib_per_gpu = Some(1024 / gpus);
        s.priority = priority;
        s
    }

    fn place(v: &mut ClusterView, s: JobSpec, members: Vec<MemberPlacement>, id: u64) -> crate::JobId {
        let job = v.submit(s).expect("admitted");
        let p = Proposal { id: ProposalId(id), job, members, based_on: v.version() };
        assert!(matches!(v.propose(&p), Decision::Accepted { .. }));
        job
    }

    fn rejection(d: Decision) -> Rejection {
        match d {
            Decision::Rejected { reason, .. } => reason,
            other => panic!("expected a rejection, got {other:?}"),
        }
    }

    #[test]
    fn a_preemption_releases_every_victim_whole_and_places_the_preemptor_in_one_step() {
        let mut v = view(2);
        // A two-server low-priority gang: GPU 0 on each server.
        let low = place(&mut v, spec("low", 2, 1, 0), vec![member(0, 1, 0), member(1, 1, 0)], 1);
        let other = place(&mut v, spec("other", 1, 1, 0), vec![member(0, 2, 1)], 2);
        let high = v.submit(spec("high", 1, 1, 10)).expect("admitted");
        let proposal = Proposal { id: ProposalId(3), job: high, members: vec![member(0, 1, 0)], based_on: v.version() };
        let pre = Preemption { proposal, victims: vec![low], reason: "production job".into() };
        let before = v.clone();
        let out = v.apply(&Command::Preempt(pre.clone()));
        assert!(matches!(&out, Outcome::Decided(d) if matches!(d[..], [Decision::Accepted { .. }])), "{out:?}");
        let l = v.job(low).expect("victim");
        assert_eq!((l.state, l.placement.is_none(), l.preemptions), (JobState::Pending, true, 1));
        assert!(l.error.as_deref().is_some_and(|e| e.contains("preempted by") && e.contains("production job")));
        assert_eq!(v.job(other).expect("bystander").state, JobState::Placed, "a job not named is untouched");
        assert_eq!(v.job(high).expect("preemptor").state, JobState::Placed);
        // Both of the victim's members were released: server 1's GPU 0 is free again.
        assert_eq!(v.servers()[1].free_gpus & 1, 1);
        assert!(invariants::check(&v).is_clean(), "{:?}", invariants::check(&v));
        // A resend is answered as applied and changes nothing.
        let hash = v.state_hash();
        assert!(matches!(v.preempt(&pre), Decision::AlreadyApplied { .. }));
        assert_eq!(v.state_hash(), hash);
        // The log replays to the same state, and a snapshot rebuilds it.
        let mut replay = before;
        replay.apply(&Command::Preempt(pre));
        assert_eq!(replay.state_hash(), hash);
        assert_eq!(ClusterView::from_snapshot(v.snapshot()).state_hash(), hash);
    }

    #[test]
    fn a_bad_preemption_is_refused_whole_and_changes_nothing() {
        let mut v = view(2);
        let low = place(&mut v, spec("low", 1, 1, 0), vec![member(0, 1, 0)], 1);
        let low2 = place(&mut v, spec("low2", 1, 1, 0), vec![member(1, 1, 0)], 2);
        let peer = place(&mut v, spec("peer", 1, 1, 10), vec![member(0, 2, 1)], 3);
        let high = v.submit(spec("high", 1, 1, 10)).expect("admitted");
        let waiting = v.submit(spec("waiting", 1, 1, 0)).expect("admitted");
        let on = |members: Vec<MemberPlacement>, victims: Vec<crate::JobId>| Preemption {
            proposal: Proposal { id: ProposalId(9), job: high, members, based_on: v.version() },
            victims,
            reason: "r".into(),
        };
        let hash = v.state_hash();
        let cases = [
            (on(vec![member(0, 1, 0)], vec![]), "victim_count"),
            (on(vec![member(0, 1, 0)], vec![high]), "victim_not_preemptible"),
            (on(vec![member(0, 1, 0)], vec![low, low]), "victim_not_preemptible"),
            (on(vec![member(0, 1, 0)], vec![crate::JobId(99)]), "victim_not_preemptible"),
            (on(vec![member(0, 1, 0)], vec![waiting]), "victim_not_preemptible"),
            (on(vec![member(0, 2, 1)], vec![peer]), "victim_not_preemptible"),
            // low2 is lower but not needed: the gang is on server 0 only.
            (on(vec![member(0, 1, 0)], vec![low, low2]), "victim_not_preemptible"),
            // The gang still overlaps a job not named (peer's GPU 1): a conflict.
            (on(vec![member(0, 3, 0)], vec![low]), "wrong_gpu_count"),
            (on(vec![member(0, 2, 2)], vec![low]), "devices_busy"),
        ];
        for (pre, code) in cases {
            let r = rejection(v.preempt(&pre));
            assert_eq!(r.code(), code, "{pre:?}: {r}");
            assert_eq!(v.state_hash(), hash, "a refused preemption changed the view");
        }
        // The preemptor must be pending.
        let pre = Preemption {
            proposal: Proposal { id: ProposalId(10), job: peer, members: vec![member(0, 1, 0)], based_on: v.version() },
            victims: vec![low],
            reason: "r".into(),
        };
        assert_eq!(rejection(v.preempt(&pre)).code(), "job_not_pending");
        assert!(invariants::check(&v).is_clean());
    }

    #[test]
    fn a_victim_whose_memory_the_gang_needs_is_needed() {
        let mut v = view(1);
        let total = v.servers()[0].free_memory_mib;
        let with_memory = |name: &str, priority: i32, mib: u32| JobSpec {
            memory_mib_per_gpu: Some(mib),
            ..spec(name, 1, 1, priority)
        };
        let sized = |gpus: u64, core: u32, mib: u32| MemberPlacement { memory_mib: mib, ..member(0, gpus, core) };
        // A low-priority job on GPU 0 holds most of the memory; a small one on GPU 2 a little.
        let hog = place(&mut v, with_memory("hog", 0, total / 2 + 1024), vec![sized(1, 0, total / 2 + 1024)], 1);
        let small = place(&mut v, spec("small", 1, 1, 0), vec![member(0, 1 << 2, 2)], 2);
        // A high-priority job wants GPU 1 and half the memory: it fits only without the hog.
        let high = v.submit(with_memory("high", 10, total / 2)).expect("admitted");
        let version = v.version();
        let on = |id: u64, victims: Vec<crate::JobId>| Preemption {
            proposal: Proposal {
                id: ProposalId(id),
                job: high,
                members: vec![sized(2, 1, total / 2)],
                based_on: version,
            },
            victims,
            reason: "memory".into(),
        };
        let hash = v.state_hash();
        // Not the small job, which it needs for nothing: its 1 GiB does not make room.
        let r = rejection(v.preempt(&on(3, vec![hog, small])));
        assert_eq!(r, Rejection::Victim { victim: small, problem: VictimProblem::NotNeeded }, "{r}");
        assert_eq!(v.state_hash(), hash);
        // The hog, for its memory alone.
        assert!(matches!(v.preempt(&on(4, vec![hog])), Decision::Accepted { .. }));
        assert_eq!(v.job(hog).expect("victim").state, JobState::Pending);
        assert_eq!(v.job(small).expect("bystander").state, JobState::Placed);
        assert!(invariants::check(&v).is_clean(), "{:?}", invariants::check(&v));
    }

    #[test]
    fn a_class_resolves_at_admission_on_every_path_and_retries_stay_one_job() {
        let mut v = view(1);
        let batch = JobSpec { class: Some("batch".into()), ..spec("j", 1, 1, 0) };
        let a = v.submit(batch.clone()).expect("admitted");
        assert_eq!(v.job(a).expect("job").spec.priority, 50);
        let r = crate::RequestId::new("req-1".to_string()).expect("id");
        let b = v.submit_once(&batch, Some(&r)).expect("admitted");
        assert_eq!(v.job(b).expect("job").spec.priority, 50);
        assert_eq!(v.submit_once(&batch, Some(&r)), Ok(b), "a retry is the same job");
        let e = v.submit(JobSpec { class: Some("urgent".into()), ..spec("k", 1, 1, 0) }).expect_err("unknown");
        assert!(e.to_string().contains("unknown priority class `urgent`"), "{e}");
        let out = v.apply(&Command::Submit {
            spec: Box::new(JobSpec { class: Some("production".into()), ..batch }),
            request: None,
            user: None,
            trace: None,
        });
        let Outcome::Submitted(Ok(c)) = out else { panic!("{out:?}") };
        assert_eq!(v.job(c).expect("job").spec.priority, 100);
    }

    #[test]
    fn within_a_priority_a_job_preempts_only_jobs_of_a_higher_service_queue() {
        let mut v = view(1);
        let old = place(&mut v, spec("old", 1, 1, 0), vec![member(0, 1, 0)], 1);
        let new = v.submit(spec("new", 1, 1, 0)).expect("admitted");
        let pre = |id: u64, v: &ClusterView| Preemption {
            proposal: Proposal { id: ProposalId(id), job: new, members: vec![member(0, 1, 0)], based_on: v.version() },
            victims: vec![old],
            reason: "attained service".into(),
        };
        let r = rejection(v.preempt(&pre(2, &v)));
        assert!(matches!(r, Rejection::Victim { problem: VictimProblem::NotLower { .. }, .. }), "{r}");
        assert_eq!(v.apply(&Command::SetServiceQueue { job: old, queue: 1 }), Outcome::Ended(Ok(())));
        assert_eq!(v.job(old).expect("old").service_queue, 1);
        assert!(matches!(v.preempt(&pre(3, &v)), Decision::Accepted { .. }));
        // The queue survives the preemption and a snapshot, and an ended job keeps its own.
        assert_eq!(v.job(old).expect("old").service_queue, 1);
        let h = v.state_hash();
        assert_eq!(ClusterView::from_snapshot(v.snapshot()).state_hash(), h);
        v.release(new, false).expect("released");
        let e = v.set_service_queue(new, 2).expect_err("ended");
        assert!(matches!(e, crate::ViewError::BadJobState { .. }), "{e}");
    }

    #[test]
    fn a_job_preempted_as_often_as_the_bound_allows_is_not_preempted_again() {
        let mut topo_spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 1, 1, 1);
        topo_spec.priorities.max_preemptions = 2;
        let mut v = ClusterView::from_spec(&topo_spec);
        let low = place(&mut v, spec("low", 1, 1, 0), vec![member(0, 1, 0)], 1);
        for round in 0..3u64 {
            let high = v.submit(spec("high", 1, 1, 10)).expect("admitted");
            let pre = Preemption {
                proposal: Proposal {
                    id: ProposalId(100 + round),
                    job: high,
                    members: vec![member(0, 1, 0)],
                    based_on: v.version(),
                },
                victims: vec![low],
                reason: "r".into(),
            };
            let d = v.preempt(&pre);
            if round < 2 {
                assert!(matches!(d, Decision::Accepted { .. }), "round {round}: {d:?}");
                // The preemptor finishes; the victim runs again on the same GPU.
                v.release(high, false).expect("released");
                let again = Proposal {
                    id: ProposalId(200 + round),
                    job: low,
                    members: vec![member(0, 1, 0)],
                    based_on: v.version(),
                };
                assert!(matches!(v.propose(&again), Decision::Accepted { .. }));
            } else {
                let r = rejection(d);
                assert!(
                    matches!(r, Rejection::Victim { problem: VictimProblem::Exhausted { times: 2, max: 2 }, .. }),
                    "{r}"
                );
            }
        }
        assert_eq!(v.job(low).expect("low").preemptions, 2);
    }

    #[test]
    fn victims_free_their_tenants_quota_for_a_preemptor_of_the_same_tenant() {
        let mut s = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 1, 1, 1);
        s.quotas.insert("t".into(), 1);
        let mut v = ClusterView::from_spec(&s);
        let tenant = |mut j: JobSpec| {
            j.tenant = "t".into();
            j
        };
        let low = place(&mut v, tenant(spec("low", 1, 1, 0)), vec![member(0, 1, 0)], 1);
        let high = v.submit(tenant(spec("high", 1, 1, 10))).expect("admitted");
        let p = Proposal { id: ProposalId(2), job: high, members: vec![member(0, 2, 1)], based_on: v.version() };
        assert_eq!(rejection(v.propose(&p)).code(), "quota_exceeded", "no room in the quota without the victim");
        let pre = Preemption { proposal: Proposal { id: ProposalId(3), ..p }, victims: vec![low], reason: "r".into() };
        // GPU 1 is free, but the victim is needed only for its quota: refused as not needed.
        assert_eq!(rejection(v.preempt(&pre)).code(), "victim_not_preemptible");
        let pre = Preemption {
            proposal: Proposal { members: vec![member(0, 1, 0)], id: ProposalId(4), ..pre.proposal },
            ..pre
        };
        assert!(matches!(v.preempt(&pre), Decision::Accepted { .. }));
        assert_eq!(v.tenant_used("t"), 1);
    }
}
