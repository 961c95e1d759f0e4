//! [`ViewCache`]: a scheduler's live copy of the cluster view.
//!
//! The cache starts from a linearizable snapshot, then follows the view's `Watch` stream in a
//! task of its own: each delta updates the server records (through [`LocalView::apply_delta`],
//! which refuses anything that would roll the copy back) and the jobs it names. When the stream
//! breaks (the replica died, the leader moved) the task subscribes again from the version it
//! holds (after a jittered [`Backoff`], 50 ms doubling to 2 s, reset by every event), through
//! the leader-following [`ViewClient`]; a replica that no longer holds that far
//! back answers with a snapshot, and the copy is rebuilt from it. Readers never wait for the
//! network: they read whatever the copy holds, and [`ViewCache::changed`] tells them when that
//! moved on.

use crate::LocalView;
use crate::SchedulerError;
use crate::scheduler::RunningIndex;
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tessera_proto::backoff::{Backoff, seeded_rng};
use tessera_proto::client::ViewClient;
use tessera_proto::v1;
use tessera_view::{Job, JobId, JobState, ServerId, ServerRecord, ViewDelta, ViewSnapshot, ViewVersion};
use tokio::sync::watch;

/// How long one watch stream is followed before subscribing again (a replica that went quiet
/// without closing the stream cannot hold the copy back for longer).
const WATCH_REFRESH: Duration = Duration::from_secs(30);

/// The copy: server records with the search index, and every job the view still holds.
#[derive(Debug)]
pub struct CacheState {
    /// Server records, indexed for the search.
    pub view: LocalView,
    /// Jobs by id (ended ones until the view forgets them).
    pub jobs: HashMap<JobId, Job>,
    /// Server names, by id.
    pub server_names: Vec<String>,
    /// Unhealthy devices per server (bit i = device i), by id.
    pub unhealthy: Vec<u64>,
    /// The jobs holding GPUs, per server (for schedulers' [`crate::scheduler::Context`]).
    pub running: RunningIndex,
}

impl CacheState {
    fn from_snapshot(s: &ViewSnapshot) -> CacheState {
        CacheState {
            view: LocalView::from_snapshot(s),
            jobs: s.jobs.iter().map(|j| (j.id, j.clone())).collect(),
            running: RunningIndex::from_jobs(&s.jobs).with_preemption_bound(s.priorities.max_preemptions),
            server_names: s.server_names.clone(),
            unhealthy: s.unhealthy.clone(),
        }
    }

    /// Applies a delta; false (nothing changed) when it does not continue this copy.
    fn apply(&mut self, d: &ViewDelta) -> bool {
        if !self.view.apply_delta(d) {
            return false;
        }
        for j in &d.jobs {
            self.running.update(j);
            self.jobs.insert(j.id, j.clone());
        }
        true
    }

    /// Pending jobs, highest priority first, then oldest.
    pub fn pending(&self) -> Vec<&Job> {
        let mut v: Vec<&Job> = self.jobs.values().filter(|j| j.state == JobState::Pending).collect();
        v.sort_by(|a, b| b.spec.priority.cmp(&a.spec.priority).then(a.id.cmp(&b.id)));
        v
    }

    /// A server's name, or its id in words.
    pub fn server_name(&self, s: ServerId) -> String {
        self.server_names.get(s.index()).cloned().unwrap_or_else(|| s.to_string())
    }
}

/// A live copy of the cluster view, shared by every scheduler task of a process.
#[derive(Clone, Debug)]
pub struct ViewCache {
    state: Arc<RwLock<CacheState>>,
    version: watch::Receiver<u64>,
    follower: Arc<tokio::task::AbortHandle>,
}

impl Drop for ViewCache {
    fn drop(&mut self) {
        // The last clone stops the follower task.
        if Arc::strong_count(&self.follower) == 1 {
            self.follower.abort();
        }
    }
}

impl ViewCache {
    /// Reads a linearizable snapshot through `client` and starts following the view.
    pub async fn connect(mut client: ViewClient) -> Result<ViewCache, SchedulerError> {
        let snap = read_snapshot(&mut client).await?;
        let version = snap.version.0;
        let state = Arc::new(RwLock::new(CacheState::from_snapshot(&snap)));
        let (tx, rx) = watch::channel(version);
        let task = tokio::spawn(follow(client, state.clone(), tx));
        Ok(ViewCache { state, version: rx, follower: Arc::new(task.abort_handle()) })
    }

    /// Runs `f` on the copy as it is now.
    pub fn read<R>(&self, f: impl FnOnce(&CacheState) -> R) -> R {
        match self.state.read() {
            Ok(s) => f(&s),
            Err(poisoned) => f(&poisoned.into_inner()),
        }
    }

    /// The version the copy reflects.
    pub fn version(&self) -> ViewVersion {
        ViewVersion(*self.version.borrow())
    }

    /// One job as the copy holds it.
    pub fn job(&self, id: JobId) -> Option<Job> {
        self.read(|s| s.jobs.get(&id).cloned())
    }

    /// Replaces server records with fresher ones (from a rejection), when they still fit.
    pub fn learn(&self, fresh: &[(ServerId, ServerRecord)]) {
        if let Ok(mut s) = self.state.write() {
            for &(id, rec) in fresh {
                s.view.apply_server(id, rec);
            }
        }
    }

    /// Waits until the copy moves past `seen` (or `timeout` passes); returns the version then.
    pub async fn changed_since(&self, seen: ViewVersion, timeout: Duration) -> ViewVersion {
        let mut rx = self.version.clone();
        let _ = tokio::time::timeout(timeout, rx.wait_for(|v| *v > seen.0)).await;
        self.version()
    }

    /// Waits until `pred` holds for the copy (checked after every change), or `timeout`
    /// passes; returns whether it held.
    pub async fn wait_until(&self, timeout: Duration, mut pred: impl FnMut(&CacheState) -> bool) -> bool {
        let mut rx = self.version.clone();
        let deadline = tokio::time::Instant::now() + timeout;
        loop {
            if self.read(&mut pred) {
                return true;
            }
            match tokio::time::timeout_at(deadline, rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) | Err(_) => return self.read(&mut pred),
            }
        }
    }
}

async fn read_snapshot(client: &mut ViewClient) -> Result<ViewSnapshot, SchedulerError> {
    let r = client.snapshot(true).await.map_err(SchedulerError::call("Snapshot"))?;
    let wire = r.snapshot.ok_or(SchedulerError::NoSnapshot)?;
    ViewSnapshot::try_from(wire).map_err(SchedulerError::MalformedSnapshot)
}

/// Follows the watch stream for as long as the cache lives.
async fn follow(mut client: ViewClient, state: Arc<RwLock<CacheState>>, tx: watch::Sender<u64>) {
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(2));
    let mut rng = seeded_rng(crate::host::fnv(client.current()));
    loop {
        let from = *tx.borrow();
        let mut stream = match client.watch(from).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "watch failed, retrying");
                tokio::time::sleep(backoff.next_delay(&mut rng)).await;
                continue;
            }
        };
        let refresh = tokio::time::sleep(WATCH_REFRESH);
        tokio::pin!(refresh);
        loop {
            let ev = tokio::select! {
                ev = stream.message() => ev,
                _ = &mut refresh => break,
            };
            let ev = match ev {
                Ok(Some(ev)) => ev,
                Ok(None) => break,
                Err(e) => {
                    tracing::debug!(error = %e, "watch stream ended");
                    break;
                }
            };
            backoff.reset();
            let to = match ev.event {
                Some(v1::watch_event::Event::Delta(d)) => match ViewDelta::try_from(d) {
                    Ok(d) => {
                        let ok = state.write().map(|mut s| s.apply(&d)).unwrap_or(false);
                        if ok {
                            Some(d.to.0)
                        } else {
                            // A gap or a refused record: start over from a snapshot.
                            match read_snapshot(&mut client).await {
                                Ok(s) => replace(&state, &s),
                                Err(e) => {
                                    tracing::debug!(error = %e, "snapshot after a refused delta failed");
                                    None
                                }
                            }
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "malformed delta from the view, ignored");
                        None
                    }
                },
                Some(v1::watch_event::Event::Snapshot(s)) => match ViewSnapshot::try_from(s) {
                    Ok(s) => replace(&state, &s),
                    Err(e) => {
                        tracing::warn!(error = %e, "malformed snapshot from the view, ignored");
                        None
                    }
                },
                None => None,
            };
            if let Some(v) = to
                && v > *tx.borrow()
            {
                let _ = tx.send(v);
            }
        }
        // Resubscribing to a replica that keeps closing the stream at once backs off too.
        tokio::time::sleep(backoff.next_delay(&mut rng)).await;
    }
}

/// Rebuilds the copy from a snapshot unless that would take it back in time.
fn replace(state: &RwLock<CacheState>, s: &ViewSnapshot) -> Option<u64> {
    let mut st = state.write().ok()?;
    if s.version < st.view.version() {
        return None;
    }
    *st = CacheState::from_snapshot(s);
    Some(s.version.0)
}
