//! Why a pending job waits: the answer an operator or a user wants from the queue ("why is my
//! job not running?"), computed from the view alone, so that every replica gives the same one.
//!
//! [`Explainer`] checks, in order, the reasons a placement cannot be approved now:
//!
//! 0. it waits for other jobs to end (its `after` / `after_any`), or out a restart's backoff;
//! 1. the job could never fit this cluster, even empty ([`ClusterView::never_fits`]);
//! 2. its tenant's quota has no room for its GPUs;
//! 3. healthy, uncordoned servers of its GPU type have fewer free member slots than it has
//!    members (a slot: room for one member's GPUs, cores and memory, by the approver's own fit
//!    code, [`crate::fit::plan_member`]);
//! 4. there is room, but not within the level it accepts now (its `prefer`, loosened by
//!    `relax_after_s` since submission up to `tolerate`): it waits for a tighter placement until
//!    its next relaxation step, or (room only beyond `tolerate`) for free GPUs to gather;
//! 5. none of these: it fits now, and waits for its scheduler host, behind the jobs ahead of it.
//!
//! The search here is coarser than a scheduler's (per-domain member slots and, for a gang inside
//! one server, one group holding all its GPUs), so "fits now" means the room exists, not that a
//! particular placement was found. Work is bounded: each distinct job shape costs one pass over
//! the servers (kept for the next job of that shape), and a queue is explained a page at a time.

use crate::fit::{self, FitMode, MemberRequest};
use crate::ids::{JobId, ServerId};
use crate::job::{Job, JobSpec, JobState};
use crate::locality::LocalityLevel;
use crate::view::ClusterView;
use std::collections::HashMap;
use std::fmt;

/// Why a pending job waits.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Waiting {
    /// It could never be placed on this cluster as it is (even empty).
    NeverFits {
        /// Why, as the submission check words it.
        why: String,
    },
    /// Its tenant's quota, or its quota at the job's class or a class below, has no room for it.
    Quota {
        /// The tenant.
        tenant: String,
        /// The class whose quota it is (it bounds that class and above), if a class quota.
        class: Option<String>,
        /// GPUs the tenant holds now (at that class and above, for a class quota).
        held: u32,
        /// The tenant's quota, GPUs.
        quota: u32,
        /// GPUs the job needs.
        needs: u32,
    },
    /// Not enough free room anywhere: free member slots on healthy, uncordoned servers of its
    /// type, whatever their locality.
    Capacity {
        /// Members the gang has.
        members: u32,
        /// Free member slots in the cluster (counted up to `members`).
        slots: u32,
    },
    /// Room exists, but not within the level the job accepts now.
    Locality {
        /// The loosest level it accepts now.
        allowed: LocalityLevel,
        /// The loosest level it will ever accept.
        tolerate: LocalityLevel,
        /// The tightest level with room now, if within `tolerate`; `None`: the free room is
        /// scattered beyond `tolerate` (it waits for free GPUs to gather in one domain).
        fits_at: Option<LocalityLevel>,
        /// When its accepted level loosens next (view clock, Unix ms); `None`: no timer (it
        /// declares a slowdown and its host weighs the looser levels' cost), or none left.
        relax_at_ms: Option<u64>,
    },
    /// It waits for other jobs to end first (its spec's `after` / `after_any`).
    Dependency {
        /// The first job it still waits for.
        first: JobId,
        /// Whether that job must finish (`after`) rather than merely end (`after_any`).
        must_finish: bool,
        /// How many jobs it still waits for.
        count: u32,
    },
    /// A member failed and its restart policy re-queued it: it is not placed before its
    /// backoff ends.
    Restarting {
        /// Restarts so far (this one included).
        restarts: u32,
        /// Restarts its policy allows.
        max: u32,
        /// When it may be placed again (view clock, Unix ms).
        until_ms: u64,
    },
    /// It fits now, at `level`: its scheduler host has not placed it yet.
    Ready {
        /// The tightest level with room that it accepts now.
        level: LocalityLevel,
    },
}

impl Waiting {
    /// A short, stable name of the reason (API and metrics label).
    pub fn code(&self) -> &'static str {
        match self {
            Waiting::NeverFits { .. } => "never_fits",
            Waiting::Quota { .. } => "quota",
            Waiting::Capacity { .. } => "capacity",
            Waiting::Locality { .. } => "locality",
            Waiting::Restarting { .. } => "restarting",
            Waiting::Dependency { .. } => "dependency",
            Waiting::Ready { .. } => "ready",
        }
    }
}

impl fmt::Display for Waiting {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Waiting::NeverFits { why } => write!(f, "never fits this cluster: {why}"),
            Waiting::Quota { tenant, class: None, held, quota, needs } => write!(
                f,
                "quota: tenant `{tenant}` holds {held} of its {quota} GPUs and this job needs {needs}; it waits for the tenant's jobs to end"
            ),
            Waiting::Quota { tenant, class: Some(class), held, quota, needs } => write!(
                f,
                "quota: tenant `{tenant}` holds {held} of its {quota} GPUs at class `{class}` and above, and this job needs {needs}; it waits for those jobs to end"
            ),
            Waiting::Capacity { members, slots } => write!(
                f,
                "no fit anywhere: {members} member(s) need room and healthy servers of its type have {slots} free slot(s); it waits for jobs to end"
            ),
            Waiting::Locality { allowed, tolerate, fits_at: Some(level), relax_at_ms } => {
                write!(f, "waiting for a better level: room at {level} only, and it accepts up to {allowed} now")?;
                match relax_at_ms {
                    Some(at) => write!(f, " (it accepts a looser level at {at} Unix ms, up to {tolerate})"),
                    None if allowed < tolerate => {
                        write!(f, " (its host weighs the looser levels' slowdown against waiting)")
                    }
                    None => Ok(()),
                }
            }
            Waiting::Locality { tolerate, fits_at: None, .. } => write!(
                f,
                "no fit at its allowed level: enough GPUs are free, but not within one {tolerate}; it waits for free GPUs to gather"
            ),
            Waiting::Dependency { first, must_finish, count } => {
                let how = if *must_finish { "finish" } else { "end" };
                write!(f, "waits for {first} to {how}")?;
                match count.saturating_sub(1) {
                    0 => Ok(()),
                    more => write!(f, " and {more} more job(s) to end"),
                }
            }
            Waiting::Restarting { restarts, max, until_ms } => write!(
                f,
                "restart {restarts} of {max} after a member failed: placed again from {until_ms} Unix ms (its restart backoff)"
            ),
            Waiting::Ready { level } => write!(f, "fits now at {level}: waiting for its scheduler host to place it"),
        }
    }
}

/// A pending job's explanation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WaitExplanation {
    /// The job.
    pub job: JobId,
    /// Why it waits.
    pub waiting: Waiting,
    /// Its place in the queue (0: first), in the view's queue order
    /// ([`ClusterView::queue_key`]): pending jobs of a higher priority, then of a lower
    /// attained-service queue, then (on a cluster with queues) of less GPU time attained, then
    /// submitted earlier, come first.
    pub position: u32,
    /// How long it has waited, ms (view clock since submission).
    pub waited_ms: u64,
}

/// Room for one job shape on the servers as they are now.
#[derive(Clone, Debug)]
struct Room {
    /// Free member slots summed over the cluster (each server's capped at `members`).
    total: u64,
    /// The tightest level with room, per level cap: `tightest[l]` is the tightest level ≤
    /// `LocalityLevel::ALL[l]` with room, if any.
    fits: [bool; LocalityLevel::ALL.len()],
}

impl Room {
    fn tightest(&self, max: LocalityLevel) -> Option<LocalityLevel> {
        LocalityLevel::ALL.into_iter().filter(|l| *l <= max).find(|l| self.fits[l.rank()])
    }
}

/// Explains pending jobs of one view; keeps the room of each job shape it has seen.
#[derive(Debug)]
pub struct Explainer<'a> {
    view: &'a ClusterView,
    rooms: HashMap<String, Room>,
}

impl<'a> Explainer<'a> {
    /// An explainer over `view`.
    pub fn new(view: &'a ClusterView) -> Explainer<'a> {
        Explainer { view, rooms: HashMap::new() }
    }

    /// The pending jobs in the view's queue order ([`ClusterView::queue_key`]): a higher
    /// priority first, then a lower attained-service queue, then (on a cluster with queues)
    /// less GPU time attained, then submitted earlier.
    pub fn queue(&self) -> Vec<&'a Job> {
        let mut q: Vec<&Job> = self.view.jobs().into_iter().filter(|j| j.state == JobState::Pending).collect();
        // The key sums a job's earlier runs on a cluster with queues: computed once per job.
        q.sort_by_cached_key(|j| self.view.queue_key(j));
        q
    }

    /// Why pending job `id` waits; `None` if the view has no such pending job. Its queue
    /// position costs a pass over the pending jobs.
    pub fn explain(&mut self, id: JobId) -> Option<WaitExplanation> {
        let job = self.view.job(id).filter(|j| j.state == JobState::Pending)?;
        let key = self.view.queue_key(job);
        let position = self
            .view
            .jobs()
            .into_iter()
            .filter(|j| j.state == JobState::Pending && self.view.queue_key(j) < key)
            .count() as u32;
        Some(self.explain_at(job, position))
    }

    /// Why `job` (pending, at `position` in the queue) waits.
    pub fn explain_at(&mut self, job: &Job, position: u32) -> WaitExplanation {
        let now = self.view.now_ms();
        let waited_ms = now.saturating_sub(job.waiting_from_ms());
        let waiting = match job.spec.run.restart {
            // Other jobs first: neither fit nor backoff matters before they end.
            _ if !job.waiting_for.is_empty() => {
                let (first, must_finish) = job.waiting_for[0];
                Waiting::Dependency { first, must_finish, count: job.waiting_for.len() as u32 }
            }
            // Its backoff first: nothing else matters before it ends.
            Some(policy) if job.not_before_ms > now && self.view.never_fits(&job.spec).is_none() => {
                Waiting::Restarting { restarts: job.restarts, max: policy.max, until_ms: job.not_before_ms }
            }
            _ => self.reason(&job.spec, waited_ms, job.waiting_from_ms()),
        };
        WaitExplanation { job: job.id, waiting, position, waited_ms }
    }

    fn reason(&mut self, spec: &JobSpec, waited_ms: u64, submitted_ms: u64) -> Waiting {
        if let Some(why) = self.view.never_fits(spec) {
            return Waiting::NeverFits { why };
        }
        let needs = spec.total_gpus();
        if let Some(&quota) = self.view.quotas().get(&spec.tenant) {
            let held = self.view.tenant_used(&spec.tenant);
            if held.saturating_add(needs) > quota {
                return Waiting::Quota { tenant: spec.tenant.clone(), class: None, held, quota, needs };
            }
        }
        for (class, floor, quota) in self.view.class_limits(&spec.tenant, spec.priority) {
            let held = self.view.held_at_or_above(&spec.tenant, floor);
            if held.saturating_add(needs) > quota {
                return Waiting::Quota {
                    tenant: spec.tenant.clone(),
                    class: Some(class.to_string()),
                    held,
                    quota,
                    needs,
                };
            }
        }
        let room = self.room(spec);
        if room.total < u64::from(spec.members) {
            return Waiting::Capacity { members: spec.members, slots: room.total as u32 };
        }
        let allowed = spec.allowed_level(waited_ms / 1000);
        if let Some(level) = room.tightest(allowed) {
            return Waiting::Ready { level };
        }
        let relax_at_ms = match spec.relax_after_s {
            Some(step) if step > 0 && allowed < spec.tolerate => {
                let steps = waited_ms / 1000 / step + 1;
                Some(submitted_ms.saturating_add(steps.saturating_mul(step).saturating_mul(1000)))
            }
            _ => None,
        };
        Waiting::Locality { allowed, tolerate: spec.tolerate, fits_at: room.tightest(spec.tolerate), relax_at_ms }
    }

    /// The room for `spec`'s shape, computed once per shape.
    fn room(&mut self, spec: &JobSpec) -> &Room {
        let key = format!(
            "{:?}|{}|{}|{:?}|{:?}",
            spec.gpu_type, spec.members, spec.gpus_per_member, spec.cpu, spec.memory_mib_per_gpu
        );
        let view = self.view;
        self.rooms.entry(key).or_insert_with(|| room_of(view, spec))
    }
}

/// One pass over the servers: member slots per server, summed per rack, InfiniBand domain and
/// cluster; and whether one server holds the whole gang inside one group of each intra-server
/// level.
fn room_of(view: &ClusterView, spec: &JobSpec) -> Room {
    let members = u64::from(spec.members);
    let mut fits = [false; LocalityLevel::ALL.len()];
    let (mut by_rack, mut by_ib): (HashMap<u32, u64>, HashMap<u32, u64>) = (HashMap::new(), HashMap::new());
    let mut total = 0u64;
    let requests: Vec<Option<(MemberRequest, MemberRequest)>> = view
        .topologies()
        .iter()
        .map(|t| {
            if spec.gpu_type.as_ref().is_some_and(|want| *want != t.device_type) {
                return None;
            }
            let one = fit::member_request(spec, t);
            let m = spec.members;
            let gang = MemberRequest {
                gpus: one.gpus.saturating_mul(m),
                min_cores: one.min_cores.saturating_mul(m),
                want_cores: one.min_cores.saturating_mul(m),
                memory_mib: one.memory_mib.saturating_mul(m),
            };
            Some((MemberRequest { want_cores: one.min_cores, ..one }, gang))
        })
        .collect();
    for (i, rec) in view.servers().iter().enumerate() {
        let cs = &view.config_sets()[rec.config_set.index()];
        let Some((one, gang)) = &requests[cs.topology as usize] else { continue };
        let topo = &view.topologies()[cs.topology as usize];
        let server = ServerId(i as u32);
        // Member slots on this server: members planned one after another on a copy.
        let mut left = *rec;
        let mut slots = 0u64;
        while slots < members {
            let Some((m, _)) = fit::plan_member(topo, &left, server, one, LocalityLevel::Server, FitMode::Pack) else {
                break;
            };
            left.free_gpus &= !m.gpus;
            left.free_cores = left.free_cores.without(m.cores);
            left.free_memory_mib -= m.memory_mib;
            slots += 1;
        }
        if slots == 0 {
            continue;
        }
        total += slots;
        *by_rack.entry(cs.rack).or_default() += slots;
        *by_ib.entry(cs.ib_domain).or_default() += slots;
        if slots >= members {
            fits[LocalityLevel::Server.rank()] = true;
            for level in [LocalityLevel::PcieSwitch, LocalityLevel::Socket] {
                if !fits[level.rank()]
                    && fit::plan_member(topo, rec, server, gang, level, FitMode::Pack).is_some_and(|(_, l)| l <= level)
                {
                    fits[level.rank()] = true;
                }
            }
        }
    }
    fits[LocalityLevel::Rack.rank()] = by_rack.values().any(|s| *s >= members);
    fits[LocalityLevel::IbDomain.rank()] = by_ib.values().any(|s| *s >= members);
    fits[LocalityLevel::Any.rank()] = total >= members;
    // A gang that fits at a tight level fits at every looser one.
    for l in 1..fits.len() {
        fits[l] |= fits[l - 1];
    }
    Room { total: total.min(members), fits }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ProposalId;
    use crate::cluster_spec::ClusterSpec;
    use crate::placement::Proposal;

    /// Two racks of two 8-GPU servers each.
    fn view() -> ClusterView {
        let toml = r#"
            name = "w"
            [[racks]]
            name = "r0"
            ib_domain = "ib0"
            topology = "seed-8gpu"
            servers = 2
            [[racks]]
            name = "r1"
            ib_domain = "ib0"
            topology = "seed-8gpu"
            servers = 2
        "#;
        ClusterView::from_spec(&ClusterSpec::from_toml("w.toml", toml, None).expect("spec"))
    }

    fn spec(members: u32, g: u32, prefer: LocalityLevel, tolerate: LocalityLevel) -> JobSpec {
        let mut s = JobSpec::simple("j", members, g);
        s.tenant = "t".into();
        s.prefer = prefer;
        s.tolerate = tolerate;
        s
    }

    /// Takes `gpus` of server `s` for a 1-member job of that many GPUs.
    fn fill(v: &mut ClusterView, s: u32, gpus: u32) -> JobId {
        let id = v.submit(spec(1, gpus, LocalityLevel::Server, LocalityLevel::Server)).expect("submit");
        let topo = v.topology_of(v.servers()[s as usize].config_set).clone();
        let rec = v.servers()[s as usize];
        let req = fit::member_request(&v.job(id).expect("job").spec, &topo);
        let (m, _) =
            fit::plan_member(&topo, &rec, ServerId(s), &req, LocalityLevel::Server, FitMode::Pack).expect("room");
        let p = Proposal { id: ProposalId(id.0 * 7 + 1), job: id, members: vec![m], based_on: v.version() };
        let d = v.propose(&p);
        assert!(matches!(d, crate::Decision::Accepted { .. }), "{d:?}");
        id
    }

    #[test]
    fn a_job_that_fits_waits_for_its_host_and_its_position_follows_priority() {
        let mut v = view();
        let a = v.submit(spec(1, 4, LocalityLevel::Server, LocalityLevel::Server)).expect("a");
        let mut hi = spec(1, 4, LocalityLevel::Server, LocalityLevel::Server);
        hi.priority = 10;
        let b = v.submit(hi).expect("b");
        let mut e = Explainer::new(&v);
        let ea = e.explain(a).expect("pending");
        assert_eq!(ea.waiting, Waiting::Ready { level: LocalityLevel::Socket }, "4 GPUs fit in one socket");
        assert_eq!(ea.position, 1, "the higher-priority job is first");
        assert_eq!(e.explain(b).expect("pending").position, 0);
        assert_eq!(e.queue().iter().map(|j| j.id).collect::<Vec<_>>(), vec![b, a]);
    }

    #[test]
    fn a_restarted_job_waits_out_its_backoff_then_is_ready() {
        let mut v = view();
        let t0 = 1_800_000_000_000;
        let _ = v.apply(&crate::Command::Clock { at_ms: t0 });
        let mut s = spec(1, 1, LocalityLevel::Server, LocalityLevel::Any);
        s.command = vec!["train".into()];
        s.run.restart = Some(crate::job::RestartPolicy { max: 3, backoff_s: 30 });
        let j = v.submit(s).expect("submit");
        let topo = v.topology_of(v.servers()[0].config_set).clone();
        let req = fit::member_request(&v.job(j).expect("job").spec, &topo);
        let (m, _) = fit::plan_member(&topo, &v.servers()[0], ServerId(0), &req, LocalityLevel::Server, FitMode::Pack)
            .expect("room");
        let p = Proposal { id: ProposalId(5), job: j, members: vec![m], based_on: v.version() };
        assert!(matches!(v.propose(&p), crate::Decision::Accepted { .. }));
        let failed = crate::Command::Task {
            job: j,
            proposal: ProposalId(5),
            member: 0,
            server: ServerId(0),
            event: crate::TaskEvent::Exited { code: 1, message: String::new() },
        };
        let _ = v.apply(&failed);
        let mut e = Explainer::new(&v);
        let w = e.explain(j).expect("pending again").waiting;
        assert_eq!(w, Waiting::Restarting { restarts: 1, max: 3, until_ms: t0 + 30_000 });
        assert_eq!(w.code(), "restarting");
        // Once the view's clock passes the backoff, it is ready again.
        let _ = v.apply(&crate::Command::Clock { at_ms: t0 + 30_000 });
        let mut e = Explainer::new(&v);
        assert!(matches!(e.explain(j).expect("pending").waiting, Waiting::Ready { .. }));
    }

    #[test]
    fn a_full_cluster_is_capacity_and_a_quota_comes_first() {
        let mut v = view();
        for s in 0..4 {
            fill(&mut v, s, 8);
        }
        let j = v.submit(spec(1, 1, LocalityLevel::Server, LocalityLevel::Any)).expect("j");
        let mut e = Explainer::new(&v);
        assert_eq!(e.explain(j).expect("pending").waiting, Waiting::Capacity { members: 1, slots: 0 });

        let toml = "name = \"q\"\n[[racks]]\nname = \"r\"\ntopology = \"seed-8gpu\"\nib_domain = \"i\"\nservers = 2\n[quotas]\nt = 8\n";
        let mut v = ClusterView::from_spec(&ClusterSpec::from_toml("q.toml", toml, None).expect("spec"));
        fill(&mut v, 0, 6);
        let j = v.submit(spec(1, 4, LocalityLevel::Server, LocalityLevel::Any)).expect("j");
        let w = Explainer::new(&v).explain(j).expect("pending").waiting;
        assert_eq!(w, Waiting::Quota { tenant: "t".into(), class: None, held: 6, quota: 8, needs: 4 }, "{w}");
        assert!(w.to_string().contains("holds 6 of its 8 GPUs"), "{w}");
    }

    #[test]
    fn room_only_across_servers_waits_for_locality_until_its_relax_step() {
        let mut v = view();
        // Every server keeps 4 free GPUs: an 8-GPU single-server job does not fit, two 4-GPU
        // members in one rack do.
        for s in 0..4 {
            fill(&mut v, s, 4);
        }
        v.advance_clock(1_000_000);
        let mut sp = spec(2, 4, LocalityLevel::Server, LocalityLevel::Rack);
        sp.relax_after_s = Some(60);
        let j = v.submit(sp).expect("j");
        v.advance_clock(1_030_000);
        let w = Explainer::new(&v).explain(j).expect("pending");
        assert_eq!(w.waited_ms, 30_000);
        assert_eq!(
            w.waiting,
            Waiting::Locality {
                allowed: LocalityLevel::Server,
                tolerate: LocalityLevel::Rack,
                fits_at: Some(LocalityLevel::Rack),
                relax_at_ms: Some(1_060_000),
            }
        );
        // After one step it accepts a rack: ready.
        v.advance_clock(1_061_000);
        assert_eq!(
            Explainer::new(&v).explain(j).expect("pending").waiting,
            Waiting::Ready { level: LocalityLevel::Rack }
        );
    }

    #[test]
    fn free_gpus_scattered_beyond_tolerance_and_cordoned_servers_do_not_count() {
        let mut v = view();
        // Rack r0 keeps 4 + 0 free, rack r1 0 + 4: two 4-GPU members fit the cluster but no rack.
        fill(&mut v, 0, 4);
        fill(&mut v, 1, 8);
        fill(&mut v, 2, 8);
        fill(&mut v, 3, 4);
        let j = v.submit(spec(2, 4, LocalityLevel::Rack, LocalityLevel::Rack)).expect("j");
        let w = Explainer::new(&v).explain(j).expect("pending").waiting;
        assert!(matches!(w, Waiting::Locality { fits_at: None, .. }), "{w:?}");
        assert!(w.to_string().contains("not within one rack"), "{w}");

        // Cordon server 3: its free GPUs stop counting, and the cluster has one slot.
        let c = crate::Cordon { reason: "maintenance".into(), since_ms: 0, drain_by_ms: None };
        v.cordon(ServerId(3), c).expect("cordon");
        let w = Explainer::new(&v).explain(j).expect("pending").waiting;
        assert_eq!(w, Waiting::Capacity { members: 2, slots: 1 });
    }

    #[test]
    fn only_pending_jobs_are_explained() {
        let mut v = view();
        let placed = fill(&mut v, 0, 2);
        assert!(Explainer::new(&v).explain(placed).is_none());
        assert!(Explainer::new(&v).explain(JobId(999)).is_none());
    }
}
