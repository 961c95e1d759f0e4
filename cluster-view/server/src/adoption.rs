//! Scheduler hosts' leases on pending jobs, kept by the leader in memory.
//!
//! A scheduler host (`tessera scheduler run`) runs one scheduler task per job it holds. It
//! calls `AdoptJobs` every third of a lease with the jobs it still schedules and how many more
//! it will take; the leader renews the held ones and hands out pending jobs nobody holds. A host
//! that stops calling loses its jobs to the next host that asks, one lease later.
//!
//! Nothing here is replicated, and nothing needs to be for safety: the approver places a job at
//! most once whoever proposes it, so two hosts scheduling one job (for a moment after a leader
//! change) waste work but never double-allocate. To keep that moment short, a new leader hands
//! out no job during its first lease, while the hosts renew what they held under the old one.
//!
//! The table is pure: time comes in as an argument (`now`), read once per request by the
//! driver (`node.rs`), so the unit tests drive it with explicit instants, lease boundaries
//! included, and never wait.

use std::collections::HashMap;
use std::time::{Duration, Instant};
use tessera_view::{ClusterView, JobId, JobState};

/// Most jobs in one request's `held` list, and most handed out per call.
pub const MAX_ADOPT: usize = 1024;

/// The leader's record of which host schedules which pending job.
#[derive(Debug)]
pub struct Adoptions {
    lease: Duration,
    owners: HashMap<JobId, (String, Instant)>,
    /// No job is handed out before this instant (one lease after taking office).
    grants_from: Instant,
}

/// Who may schedule one job now, as the leader sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Holder {
    /// The job is not pending (placed, running, ended or unknown): nobody holds it.
    NotPending,
    /// Pending, held by this host.
    Host(String),
    /// Pending, held by no host.
    Nobody,
}

/// What one `AdoptJobs` call gets.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Adopted {
    /// Held jobs renewed.
    pub kept: Vec<JobId>,
    /// Jobs newly handed to the host.
    pub adopted: Vec<JobId>,
    /// Held jobs the host must stop scheduling.
    pub dropped: Vec<JobId>,
}

impl Adoptions {
    /// An empty table; `lease` is how long a host holds a job without renewing.
    pub fn new(lease: Duration, now: Instant) -> Adoptions {
        Adoptions { lease, owners: HashMap::new(), grants_from: now }
    }

    /// The lease.
    pub fn lease(&self) -> Duration {
        self.lease
    }

    /// A new leader forgets the old table and waits one lease before handing out jobs.
    pub fn took_office(&mut self, now: Instant) {
        self.owners.clear();
        self.grants_from = now + self.lease;
    }

    /// Hosts holding at least one job now, with the jobs (sorted).
    pub fn hosts(&self, now: Instant) -> Vec<(String, Vec<JobId>)> {
        let mut held: HashMap<&str, Vec<JobId>> = HashMap::new();
        for (job, (host, until)) in &self.owners {
            if *until > now {
                held.entry(host).or_default().push(*job);
            }
        }
        let mut v: Vec<(String, Vec<JobId>)> = held
            .into_iter()
            .map(|(h, mut jobs)| {
                jobs.sort();
                (h.to_string(), jobs)
            })
            .collect();
        v.sort();
        v
    }

    /// The host holding `job` now, if any.
    pub fn owner(&self, job: JobId, now: Instant) -> Option<&str> {
        self.owners.get(&job).filter(|(_, until)| *until > now).map(|(h, _)| h.as_str())
    }

    /// Who holds each of `jobs`, asked for by scheduler host `caller` before it schedules
    /// them. During a new leader's first lease, when no job is handed out and the hosts renew
    /// what they held under the old leader, a pending job nobody holds is `caller`'s from now
    /// on, as if `caller` had renewed it: a host's proposal can reach the new leader before its
    /// next `AdoptJobs` call does, and the first host to claim a job keeps it.
    pub fn holders(&mut self, view: &ClusterView, caller: &str, jobs: &[JobId], now: Instant) -> Vec<Holder> {
        jobs.iter()
            .map(|&j| {
                if !view.job(j).is_some_and(|j| j.state == JobState::Pending) {
                    return Holder::NotPending;
                }
                if let Some(h) = self.owner(j, now) {
                    return Holder::Host(h.to_string());
                }
                if now < self.grants_from {
                    self.owners.insert(j, (caller.to_string(), now + self.lease));
                    return Holder::Host(caller.to_string());
                }
                Holder::Nobody
            })
            .collect()
    }

    /// Renews `host`'s hold on `held` and hands it up to `want` more pending jobs that wait for
    /// no other job, in the view's queue order ([`ClusterView::queue_key`]: highest priority
    /// first, then the least attained-service queue, then the least GPU time attained on a
    /// cluster with queues, then oldest). Jobs that are no longer pending are dropped from the
    /// table.
    pub fn adopt(&mut self, view: &ClusterView, host: &str, held: &[JobId], want: usize, now: Instant) -> Adopted {
        let until = now + self.lease;
        // Forget jobs that are placed, running or over: nobody schedules them now.
        self.owners.retain(|j, _| view.job(*j).is_some_and(|j| j.state == JobState::Pending));
        let mut out = Adopted::default();
        for &j in held.iter().take(MAX_ADOPT) {
            let pending = view.job(j).is_some_and(|j| j.state == JobState::Pending);
            let other = self.owner(j, now).is_some_and(|h| h != host);
            if pending && !other {
                self.owners.insert(j, (host.to_string(), until));
                out.kept.push(j);
            } else {
                out.dropped.push(j);
            }
        }
        let want = want.min(MAX_ADOPT);
        if want == 0 || now < self.grants_from {
            return out;
        }
        let mut free: Vec<tessera_view::attained::QueueKey> = view
            .jobs()
            .into_iter()
            // A job still waiting for others is nobody's yet: it would hold a host's slot doing
            // nothing (and a large array waiting could starve the jobs it waits for).
            .filter(|j| j.state == JobState::Pending && j.waiting_for.is_empty() && self.owner(j.id, now).is_none())
            .map(|j| view.queue_key(j))
            .collect();
        free.sort();
        for (_, _, _, j) in free.into_iter().take(want) {
            self.owners.insert(j, (host.to_string(), until));
            out.adopted.push(j);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_view::{ClusterSpec, JobSpec};

    const MS: Duration = Duration::from_millis(1);
    const LEASE: Duration = Duration::from_secs(3);

    fn view_with_jobs(n: u32) -> (ClusterView, Vec<JobId>) {
        let spec = ClusterSpec::from_toml(
            "c.toml",
            "name='t'\n[[racks]]\nname='r0'\nib_domain='ib0'\ntopology='seed-8gpu'\nservers=2\n",
            None,
        )
        .expect("spec");
        let mut v = ClusterView::from_spec(&spec);
        let ids = (0..n).map(|i| v.submit(JobSpec::simple(&format!("j{i}"), 1, 1)).expect("admitted")).collect();
        (v, ids)
    }

    #[test]
    fn a_job_has_one_host_until_its_lease_lapses() {
        let t0 = Instant::now();
        let (v, ids) = view_with_jobs(3);
        let mut a = Adoptions::new(LEASE, t0);
        let got = a.adopt(&v, "h1", &[], 2, t0);
        assert_eq!(got.adopted, ids[..2].to_vec());
        // Another host gets only the job nobody holds.
        let got = a.adopt(&v, "h2", &[], 5, t0);
        assert_eq!(got.adopted, vec![ids[2]]);
        // h2 claiming h1's job is refused while h1's lease lasts.
        let got = a.adopt(&v, "h2", &[ids[0]], 0, t0 + Duration::from_secs(1));
        assert_eq!(got.dropped, vec![ids[0]]);
        // h1 renews one job and stops renewing the other; after the lease h2 takes it.
        let t1 = t0 + Duration::from_secs(2);
        assert_eq!(a.adopt(&v, "h1", &[ids[0]], 0, t1).kept, vec![ids[0]]);
        let t2 = t0 + Duration::from_secs(4);
        let got = a.adopt(&v, "h2", &[ids[2]], 5, t2);
        assert_eq!((got.kept, got.adopted), (vec![ids[2]], vec![ids[1]]));
        assert_eq!(a.owner(ids[0], t2), Some("h1"));
    }

    #[test]
    fn jobs_are_handed_out_by_priority_then_attained_service_queue_then_age() {
        let t0 = Instant::now();
        let (mut v, ids) = view_with_jobs(3);
        let urgent = v.submit(JobSpec { priority: 10, ..JobSpec::simple("u", 1, 1) }).expect("admitted");
        // The oldest job has run for a while before (a queue down): the others go first.
        v.set_service_queue(ids[0], 1).expect("queue");
        let mut a = Adoptions::new(LEASE, t0);
        assert_eq!(a.adopt(&v, "h1", &[], 4, t0).adopted, vec![urgent, ids[1], ids[2], ids[0]]);
    }

    #[test]
    fn a_job_waiting_for_another_is_handed_out_only_once_that_one_ended() {
        let t0 = Instant::now();
        let (mut v, ids) = view_with_jobs(1);
        // An array of a higher priority waiting for the first job takes no host slot from it.
        let waiting = JobSpec { after_any: vec![ids[0]], priority: 10, array: Some(3), ..JobSpec::simple("w", 1, 1) };
        let w = v.submit(waiting).expect("admitted");
        let mut a = Adoptions::new(LEASE, t0);
        assert_eq!(a.adopt(&v, "h1", &[], 1, t0).adopted, vec![ids[0]], "only the job waiting for nothing");
        assert!(a.adopt(&v, "h2", &[], 5, t0).adopted.is_empty(), "the array still waits");
        v.cancel(ids[0]).expect("cancelled");
        let array: Vec<JobId> = (0..3).map(|i| JobId(w.0 + i)).collect();
        assert_eq!(a.adopt(&v, "h2", &[], 5, t0).adopted, array, "any end of it will do");
    }

    #[test]
    fn a_lease_ends_exactly_one_lease_after_the_last_renewal() {
        let t0 = Instant::now();
        let (v, ids) = view_with_jobs(1);
        let mut a = Adoptions::new(LEASE, t0);
        assert_eq!(a.adopt(&v, "h1", &[], 1, t0).adopted, vec![ids[0]]);
        // Renewed at 2 s: held until 5 s, not 3 s.
        let renewed = t0 + Duration::from_secs(2);
        assert_eq!(a.adopt(&v, "h1", &[ids[0]], 0, renewed).kept, vec![ids[0]]);
        let end = renewed + LEASE;
        for (at, held) in [(end - MS, true), (end, false)] {
            assert_eq!(a.owner(ids[0], at).is_some(), held, "at {:?} after the renewal", at - renewed);
            assert_eq!(a.hosts(at).is_empty(), !held);
        }
        // At the end of the lease another host takes the job over, and the old holder's late
        // renewal is refused.
        assert_eq!(a.adopt(&v, "h2", &[], 1, end).adopted, vec![ids[0]]);
        assert_eq!(a.adopt(&v, "h1", &[ids[0]], 0, end + MS).dropped, vec![ids[0]]);
        assert_eq!(a.hosts(end + MS), vec![("h2".to_string(), vec![ids[0]])]);
    }

    #[test]
    fn a_new_leader_hands_out_jobs_from_exactly_one_lease_after_taking_office() {
        let t0 = Instant::now();
        let (v, ids) = view_with_jobs(1);
        let mut a = Adoptions::new(LEASE, t0);
        assert_eq!(a.adopt(&v, "h1", &[], 1, t0).adopted, vec![ids[0]], "a first leader grants at once");
        let office = t0 + Duration::from_secs(10);
        a.took_office(office);
        assert_eq!(a.owner(ids[0], office), None, "the old table is forgotten");
        assert!(a.adopt(&v, "h2", &[], 1, office + LEASE - MS).adopted.is_empty());
        assert_eq!(a.adopt(&v, "h2", &[], 1, office + LEASE).adopted, vec![ids[0]]);
    }

    #[test]
    fn requests_are_bounded() {
        let t0 = Instant::now();
        let (v, ids) = view_with_jobs(3);
        let mut a = Adoptions::new(LEASE, t0);
        // Held lists beyond MAX_ADOPT are cut (the service refuses them before this).
        let held: Vec<JobId> = ids.iter().copied().cycle().take(MAX_ADOPT + 5).collect();
        let got = a.adopt(&v, "h1", &held, usize::MAX, t0);
        assert_eq!(got.kept.len() + got.dropped.len(), MAX_ADOPT);
        assert!(got.adopted.is_empty(), "every pending job is held already");
    }

    #[test]
    fn jobs_no_longer_pending_are_dropped_and_a_new_leader_waits_a_lease() {
        let t0 = Instant::now();
        let (mut v, ids) = view_with_jobs(2);
        let mut a = Adoptions::new(LEASE, t0);
        a.took_office(t0);
        assert!(a.adopt(&v, "h1", &[], 5, t0).adopted.is_empty(), "no grants in the first lease");
        // Renewals are honoured at once, so hosts keep what they held under the old leader.
        assert_eq!(a.adopt(&v, "h1", &[ids[0]], 0, t0).kept, vec![ids[0]]);
        v.cancel(ids[0]).expect("cancel");
        let t1 = t0 + Duration::from_secs(3);
        let got = a.adopt(&v, "h1", &[ids[0]], 5, t1);
        assert_eq!((got.dropped, got.adopted), (vec![ids[0]], vec![ids[1]]));
        assert_eq!(a.hosts(t1), vec![("h1".to_string(), vec![ids[1]])]);
    }

    #[test]
    fn a_host_schedules_only_what_it_holds_and_claims_only_in_a_new_leaders_first_lease() {
        let t0 = Instant::now();
        let (mut v, ids) = view_with_jobs(3);
        let mut a = Adoptions::new(LEASE, t0);
        assert_eq!(a.adopt(&v, "h1", &[], 1, t0).adopted, vec![ids[0]]);
        v.cancel(ids[2]).expect("cancel");
        let unknown = JobId(999);
        assert_eq!(
            a.holders(&v, "h2", &[ids[0], ids[1], ids[2], unknown], t0),
            vec![Holder::Host("h1".into()), Holder::Nobody, Holder::NotPending, Holder::NotPending],
            "outside a first lease nobody claims anything by asking"
        );
        assert_eq!(a.owner(ids[1], t0), None);
        // A new leader: h2's proposal arrives before h1's renewal; h2 claims the job it asks
        // about, h1 then loses it on renewal, and the claim is an ordinary lease.
        let office = t0 + Duration::from_secs(10);
        a.took_office(office);
        assert_eq!(a.holders(&v, "h2", &[ids[0]], office), vec![Holder::Host("h2".into())]);
        assert_eq!(a.holders(&v, "h1", &[ids[0]], office + MS), vec![Holder::Host("h2".into())]);
        assert_eq!(a.adopt(&v, "h1", &[ids[0]], 0, office + MS).dropped, vec![ids[0]]);
        assert_eq!(a.owner(ids[0], office + LEASE - MS), Some("h2"));
        assert_eq!(a.owner(ids[0], office + LEASE), None, "an unrenewed claim lapses");
        // After the first lease asking claims nothing again.
        assert_eq!(a.holders(&v, "h1", &[ids[1]], office + LEASE), vec![Holder::Nobody]);
    }
}
