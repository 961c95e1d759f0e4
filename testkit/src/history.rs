//! A checker of the view's whole history, as its change stream (`Watch`) tells it.
//!
//! [`follow`] subscribes from version 0 and feeds every event to a [`History`], re-subscribing
//! where it stopped when a replica dies. The history records who holds which GPUs and cores
//! after each step and flags a device or core held by two jobs at once. It also flags a *gap*:
//! a step it could not see, because the stream answered with a whole snapshot (its change log no
//! longer reached back) or a delta starting after the last version seen. A test that asserts
//! [`History::violations`] is empty has therefore seen every step, not a sample of them.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tessera_proto::v1;
use tessera_view::{Job, JobId, LocalityLevel, ViewDelta, ViewSnapshot};
use tessera_view_server::ViewClient;
use tokio::sync::watch;

/// Holdings at every step of the view's history: (server, gpu) and (server, core) → job.
#[derive(Debug, Default)]
pub struct History {
    /// Each job's members while it holds resources: (server, GPU mask, core mask words).
    pub held: HashMap<JobId, Vec<(u32, u64, [u64; 2])>>,
    /// What went wrong: double holdings and gaps, each with the version it was seen at.
    pub violations: Vec<String>,
    /// Every placement each job was seen with: (first member's server, level).
    pub placements: HashMap<JobId, Vec<(u32, LocalityLevel)>>,
    /// Every proposal id seen applied for a job (its placement's, and the job's record of
    /// every proposal applied for it, which a delta that skipped the placement still carries).
    pub proposals: std::collections::HashSet<u64>,
    /// Steps at which a gang was partly placed or partly running: a placement with fewer or
    /// more members than the job asked for, or a job running while a member has not started.
    pub partial_gangs: u64,
    /// Steps at which a device or core was held by two jobs.
    pub overlaps: u64,
    /// The last version seen.
    pub version: u64,
    /// Events applied (deltas and snapshots).
    pub events: u64,
}

impl History {
    /// Applies one event of the change stream.
    pub fn apply_event(&mut self, ev: v1::watch_event::Event) {
        match ev {
            v1::watch_event::Event::Delta(d) => match ViewDelta::try_from(d) {
                Ok(d) => self.apply_delta(&d),
                Err(e) => self.violations.push(format!("after version {}: undecodable delta: {e}", self.version)),
            },
            v1::watch_event::Event::Snapshot(s) => match ViewSnapshot::try_from(s) {
                Ok(s) => self.apply_snapshot(&s),
                Err(e) => self.violations.push(format!("after version {}: undecodable snapshot: {e}", self.version)),
            },
        }
    }

    /// A delta: a gap when it starts after the last version seen.
    pub fn apply_delta(&mut self, d: &ViewDelta) {
        if d.from.0 > self.version {
            self.violations.push(format!("gap: versions {}..{} were never seen", self.version, d.from.0));
        }
        self.apply(&d.jobs, d.to.0);
    }

    /// A whole snapshot: only the first state (version 0, before anything happened) may come
    /// this way; a later one means the steps between were skipped.
    pub fn apply_snapshot(&mut self, s: &ViewSnapshot) {
        let v = s.version.0;
        if v <= self.version {
            // Old news (a lagging replica): nothing unseen in it.
            return;
        }
        if self.version > 0 || self.events > 0 {
            self.violations.push(format!("gap: a snapshot at version {v} skipped versions {}..{v}", self.version));
        }
        // Jobs not in the snapshot hold nothing.
        let present: std::collections::HashSet<JobId> = s.jobs.iter().map(|j| j.id).collect();
        self.held.retain(|j, _| present.contains(j));
        self.apply(&s.jobs, v);
    }

    fn apply(&mut self, jobs: &[Job], version: u64) {
        self.events += 1;
        for j in jobs {
            self.proposals.extend(j.proposals.iter().map(|p| p.0));
            match &j.placement {
                Some(p) if j.state.holds_resources() => {
                    let all_started = j.tasks.len() == p.members.len()
                        && j.tasks.iter().all(|t| *t != tessera_view::TaskState::Starting);
                    if p.members.len() != j.spec.members as usize
                        || (j.state == tessera_view::JobState::Running && !all_started)
                    {
                        self.partial_gangs += 1;
                        self.violations.push(format!(
                            "version {version}: job {} is partly placed or running ({} of {} members, tasks {:?}, state {})",
                            j.id,
                            p.members.len(),
                            j.spec.members,
                            j.tasks,
                            j.state.as_str()
                        ));
                    }
                    let members: Vec<(u32, u64, [u64; 2])> =
                        p.members.iter().map(|m| (m.server.0, m.gpus, m.cores.0)).collect();
                    if self.held.get(&j.id) != Some(&members) {
                        self.placements.entry(j.id).or_default().push((p.members[0].server.0, p.level));
                    }
                    self.held.insert(j.id, members);
                }
                _ => {
                    self.held.remove(&j.id);
                }
            }
        }
        // No device or core held twice.
        let mut used: HashMap<u32, (u64, [u64; 2])> = HashMap::new();
        for (job, members) in &self.held {
            for (s, g, c) in members {
                let e = used.entry(*s).or_insert((0, [0, 0]));
                if e.0 & g != 0 || e.1[0] & c[0] != 0 || e.1[1] & c[1] != 0 {
                    self.overlaps += 1;
                    self.violations.push(format!("version {version}: job {job} overlaps on server {s}"));
                }
                e.0 |= g;
                e.1[0] |= c[0];
                e.1[1] |= c[1];
            }
        }
        self.version = self.version.max(version);
    }
}

/// A [`History`] built by [`follow`] on its own task, from version 0 until [`Followed::stop`].
#[derive(Debug)]
pub struct Followed {
    history: Arc<Mutex<History>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Followed {
    /// Starts following `c`'s view from version 0, on the current tokio runtime.
    pub fn start(c: ViewClient) -> Followed {
        let history = Arc::new(Mutex::new(History::default()));
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(follow(c, history.clone(), stopped));
        Followed { history, stop, task }
    }

    /// The history so far (it keeps growing until [`Followed::stop`]).
    pub fn history(&self) -> &Arc<Mutex<History>> {
        &self.history
    }

    /// Stops following, once the task has ended, and returns the history it built.
    pub async fn stop(self) -> History {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        std::mem::take(&mut *lock(&self.history))
    }
}

/// Follows the view from the history's version (0 for a new one) until `stop` turns true,
/// re-subscribing across replica deaths and leader changes.
pub async fn follow(mut c: ViewClient, h: Arc<Mutex<History>>, stop: watch::Receiver<bool>) {
    let mut retry = tessera_proto::backoff::Backoff::new(
        std::time::Duration::from_millis(10),
        std::time::Duration::from_millis(200),
    );
    let mut rng = tessera_proto::backoff::seeded_rng(0);
    while !*stop.borrow() {
        let from = lock(&h).version;
        let mut stream = match c.watch(from).await {
            Ok(s) => s,
            Err(_) => {
                let mut stop = stop.clone();
                tokio::select! {
                    () = tokio::time::sleep(retry.next_delay(&mut rng)) => continue,
                    _ = stop.wait_for(|s| *s) => return,
                }
            }
        };
        retry.reset();
        loop {
            let mut stop = stop.clone();
            let ev = tokio::select! {
                ev = stream.message() => ev,
                _ = stop.wait_for(|s| *s) => return,
            };
            let Ok(Some(ev)) = ev else { break };
            if let Some(ev) = ev.event {
                lock(&h).apply_event(ev);
            }
        }
    }
}

fn lock(h: &Mutex<History>) -> std::sync::MutexGuard<'_, History> {
    // A panic elsewhere while holding the lock leaves a usable history.
    h.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

#[cfg(test)]
mod tests {
    use super::*;
    use tessera_view::{ClusterSpec, ClusterView, Command, JobSpec, Outcome, Topology, ViewVersion};

    fn view() -> ClusterView {
        let spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 2, 2, 1);
        ClusterView::from_spec(&spec)
    }

    fn submit(v: &mut ClusterView, name: &str) {
        let out = v.apply(&Command::submit(JobSpec::simple(name, 1, 1)));
        assert!(matches!(out, Outcome::Submitted(Ok(_))), "{out:?}");
    }

    #[test]
    fn a_placement_that_began_and_ended_between_two_deltas_is_still_seen() {
        use tessera_view::{CoreMask, MemberPlacement, Proposal, ProposalId, ServerId};
        let mut v = view();
        let mut h = History::default();
        h.apply_snapshot(&v.snapshot());
        let v0 = v.version();
        let job = match v.apply(&Command::submit(JobSpec::simple("short", 1, 1))) {
            Outcome::Submitted(Ok(j)) => j,
            o => panic!("{o:?}"),
        };
        let m = MemberPlacement { server: ServerId(0), gpus: 1, cores: CoreMask::range(0, 4), memory_mib: 49_152 };
        let p = Proposal { id: ProposalId(77), job, members: vec![m], based_on: v.version() };
        let d = v.apply(&Command::Propose(vec![p]));
        assert!(matches!(&d, Outcome::Decided(d) if d[0].is_placed()), "{d:?}");
        v.release(job, false).expect("release");
        // One delta for all three steps: the job arrives finished, holding nothing.
        h.apply_delta(&v.delta_since(v0).expect("delta"));
        assert!(h.violations.is_empty(), "{:?}", h.violations);
        assert!(h.held.is_empty());
        assert!(h.proposals.contains(&77), "the job's record of applied proposals carries it");
    }

    #[test]
    fn a_gap_is_a_violation() {
        let mut v = view();
        let mut h = History::default();
        h.apply_snapshot(&v.snapshot());
        assert!(h.violations.is_empty(), "the first state may come as a snapshot");
        let v0 = v.version();
        submit(&mut v, "a");
        h.apply_delta(&v.delta_since(v0).expect("delta"));
        assert!(h.violations.is_empty(), "{:?}", h.violations);
        let v1 = v.version();
        submit(&mut v, "b");
        let v2 = v.version();
        submit(&mut v, "c");
        // A delta from v2 skips v1..v2; a snapshot later skips everything since.
        h.apply_delta(&v.delta_since(v2).expect("delta"));
        assert_eq!(h.violations.len(), 1, "{:?}", h.violations);
        assert!(h.violations[0].contains(&format!("{}..{}", v1.0, v2.0)), "{:?}", h.violations);
        submit(&mut v, "d");
        h.apply_snapshot(&v.snapshot());
        assert_eq!(h.violations.len(), 2, "{:?}", h.violations);
        // An old snapshot adds nothing.
        let mut old = v.snapshot();
        old.version = ViewVersion(1);
        h.apply_snapshot(&old);
        assert_eq!(h.violations.len(), 2);
    }
}
