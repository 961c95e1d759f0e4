//! The scheduler host (`tessera scheduler run`): one scheduler task per pending job it holds.
//!
//! The host shares one [`ViewCache`] among its tasks. Every third of a lease it calls
//! `AdoptJobs` on the leader with the jobs it still schedules and how many more it will take;
//! the leader renews those and hands out pending jobs nobody holds. Each adopted job gets a
//! task running [`place_job`] with the scheduler the job names (or the host's default). A job
//! the leader says is no longer this host's (it was placed, cancelled, or another host took it
//! after this one missed its lease) has its task stopped.
//!
//! A migration task ([`crate::migration_task`]) moves small running jobs out of the way of held jobs
//! that fragmentation blocks.
//!
//! Several hosts may run at once: each job has one host at a time, and when two hosts' jobs
//! want the same GPUs the approver decides, atomically. If a host dies, its jobs go to the
//! others one lease later.

use crate::SchedulerError;
use crate::cache::ViewCache;
use crate::metrics::HostMetrics;
use crate::migration_task::MigrationConfig;
use crate::runtime::{Placed, RuntimeOptions, place_job};
use crate::scheduler::{BUILTIN, Scheduler, builtin, canonical_name};
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tessera_proto::backoff::{Backoff, seeded_rng};
use tessera_proto::client::ViewClient;
use tessera_view::JobId;
use tokio::task::JoinHandle;

/// Schedulers by name, and the one used for jobs that name none.
#[derive(Debug, Clone)]
pub struct Registry {
    schedulers: BTreeMap<String, Arc<dyn Scheduler>>,
    default: String,
}

impl Default for Registry {
    /// The built-in schedulers, `locality-tolerant` for jobs that name none.
    fn default() -> Self {
        let mut r = Registry { schedulers: BTreeMap::new(), default: "locality-tolerant".into() };
        for name in BUILTIN {
            if let Some(s) = builtin(name) {
                r.schedulers.insert(name.to_string(), Arc::from(s));
            }
        }
        r
    }
}

impl Registry {
    /// Adds (or replaces) a scheduler under its [`Scheduler::name`].
    pub fn register(mut self, s: impl Scheduler + 'static) -> Registry {
        self.schedulers.insert(s.name().to_string(), Arc::new(s));
        self
    }

    /// Uses `name` (or what an old alias now names) for jobs that name no scheduler; an error
    /// if it is not registered.
    pub fn with_default(mut self, name: &str) -> Result<Registry, SchedulerError> {
        let Some(found) = self.resolve(name) else {
            return Err(SchedulerError::UnknownName {
                what: "scheduler",
                name: name.to_string(),
                expected: self.names(),
            });
        };
        self.default = found.to_string();
        Ok(self)
    }

    /// The registered name `name` stands for: itself when registered, else the scheduler an
    /// old alias ([`crate::scheduler::ALIASES`]) now names, when that one is registered.
    fn resolve<'a>(&self, name: &'a str) -> Option<&'a str> {
        [name, canonical_name(name)].into_iter().find(|n| self.schedulers.contains_key(*n))
    }

    /// Registered names, comma-separated.
    pub fn names(&self) -> String {
        self.schedulers.keys().cloned().collect::<Vec<_>>().join(", ")
    }

    /// The scheduler for a job that asks for `name` (none: the default; an old alias: the
    /// scheduler it now names, unless one is registered under the old name itself).
    pub fn get(&self, name: Option<&str>) -> Option<Arc<dyn Scheduler>> {
        let name = self.resolve(name.unwrap_or(&self.default))?;
        self.schedulers.get(name).cloned()
    }
}

/// How a host runs.
#[derive(Debug, Clone)]
pub struct HostConfig {
    /// View replica addresses.
    pub view: Vec<String>,
    /// Mutual TLS with a scheduler certificate named as this host, or plaintext.
    pub security: tessera_proto::tls::Security,
    /// The host's name, unique among hosts.
    pub name: String,
    /// Most jobs scheduled at once.
    pub max_jobs: usize,
    /// Retry settings of every task.
    pub runtime: RuntimeOptions,
    /// Live migration for the held jobs fragmentation blocks.
    pub migration: MigrationConfig,
    /// The recorder the host counts into ([`crate::metrics`]), labelled with its name; the
    /// caller serves it (several hosts may share one).
    pub metrics: Arc<tessera_proto::prom::Metrics>,
}

/// What a host has done so far (for logs and tests).
#[derive(Debug, Default, Clone)]
pub struct HostStats {
    /// Jobs adopted.
    pub adopted: u64,
    /// Jobs this host placed.
    pub placed: u64,
    /// Jobs given up.
    pub gave_up: u64,
}

/// Runs a scheduler host until `shutdown` resolves.
pub async fn run_host(
    cfg: HostConfig,
    registry: Registry,
    shutdown: impl Future<Output = ()>,
) -> Result<HostStats, SchedulerError> {
    let client = ViewClient::new(cfg.view.clone())
        .map_err(SchedulerError::call("connect"))?
        .with_deadline(Duration::from_secs(5))
        .with_security(cfg.security.clone());
    tokio::pin!(shutdown);
    // The view may not be up yet (hosts start with the cluster): keep trying, bounded backoff.
    let mut backoff = Backoff::new(Duration::from_millis(200), Duration::from_secs(5));
    let mut rng = seeded_rng(fnv(&cfg.name));
    let cache = loop {
        let e = match ViewCache::connect(client.clone()).await {
            Ok(c) => break c,
            Err(e) => e,
        };
        let delay = backoff.next_delay(&mut rng);
        tracing::warn!(host = %cfg.name, error = %chain(&e), retry_in_ms = delay.as_millis() as u64, "cannot read the view");
        tokio::select! {
            _ = &mut shutdown => return Ok(HostStats::default()),
            _ = tokio::time::sleep(delay) => {}
        }
    };
    // The copy keeps a reservation only for a host that makes them (it costs a pass over the
    // waiting jobs per change).
    cache.set_reserving(cfg.runtime.reserve);
    tracing::info!(host = %cfg.name, schedulers = %registry.names(), "scheduler host started");
    let metrics = HostMetrics::new(cfg.metrics.clone(), &cfg.name);
    let mut tasks: HashMap<JobId, JoinHandle<Option<Placed>>> = HashMap::new();
    // When each held job was adopted, published for the migration task (it stops once the
    // sender is dropped, when this function returns).
    let mut adopted_at: HashMap<JobId, Instant> = HashMap::new();
    let (held_tx, held_rx) = tokio::sync::watch::channel(Vec::new());
    let migration = tokio::spawn(crate::migration_task::run(
        cfg.migration.clone(),
        cfg.name.clone(),
        client.clone(),
        cache.clone(),
        held_rx,
        metrics.clone(),
        cfg.runtime.reserve,
    ));
    let mut stats = HostStats::default();
    let mut every = Duration::from_millis(300);
    let mut adopt_client = client.clone();
    loop {
        // Reap finished tasks first, so their jobs are not renewed.
        let done: Vec<JobId> = tasks.iter().filter(|(_, t)| t.is_finished()).map(|(j, _)| *j).collect();
        for j in done {
            if let Some(t) = tasks.remove(&j) {
                match t.await {
                    Ok(Some(Placed::Placed { level, .. })) => {
                        stats.placed += 1;
                        metrics.placed(level);
                        metrics.done("placed");
                    }
                    Ok(Some(Placed::GaveUp(_))) => {
                        stats.gave_up += 1;
                        metrics.done("gave_up");
                    }
                    Ok(Some(Placed::NotPending(_))) => metrics.done("not_pending"),
                    Ok(None) | Err(_) => metrics.done("stopped"),
                }
            }
        }
        let held: Vec<u64> = tasks.keys().map(|j| j.0).collect();
        let want = cfg.max_jobs.saturating_sub(tasks.len()) as u32;
        match adopt_client.adopt_jobs(&cfg.name, held, want).await {
            Ok(r) => {
                metrics.adopt_call("ok");
                metrics.adopted(r.adopted.len());
                if r.lease_ms > 0 {
                    every = Duration::from_millis((r.lease_ms / 3).max(50));
                }
                for j in r.dropped {
                    if let Some(t) = tasks.remove(&JobId(j)) {
                        metrics.dropped(1);
                        tracing::debug!(host = %cfg.name, job_id = j, "job no longer ours; its task stops");
                        t.abort();
                    }
                }
                for j in r.adopted {
                    let job = JobId(j);
                    stats.adopted += 1;
                    adopted_at.insert(job, Instant::now());
                    tasks.insert(job, spawn_job(&cfg, &registry, &client, &cache, job, &metrics));
                }
            }
            Err(e) => {
                metrics.adopt_call("failed");
                tracing::warn!(host = %cfg.name, error = %e, "AdoptJobs failed");
            }
        }
        metrics.held(tasks.len());
        if cfg.runtime.reserve {
            let (reserved, servers) =
                cache.read(|s| (s.reservations.stats(), s.reservations.current().map_or(0, |r| r.servers.len())));
            metrics.reservations(reserved, servers);
        }
        adopted_at.retain(|j, _| tasks.contains_key(j));
        held_tx.send_replace(adopted_at.iter().map(|(j, t)| (*j, *t)).collect());
        tokio::select! {
            _ = &mut shutdown => break,
            _ = tokio::time::sleep(every) => {}
        }
    }
    for (_, t) in tasks {
        t.abort();
    }
    migration.abort();
    Ok(stats)
}

fn spawn_job(
    cfg: &HostConfig,
    registry: &Registry,
    client: &ViewClient,
    cache: &ViewCache,
    job: JobId,
    metrics: &HostMetrics,
) -> JoinHandle<Option<Placed>> {
    let (registry, mut client, cache) = (registry.clone(), client.clone(), cache.clone());
    let mut opts = cfg.runtime.clone();
    opts.salt ^= fnv(&cfg.name);
    opts.metrics = Some(metrics.clone());
    let host = cfg.name.clone();
    tokio::spawn(async move {
        let known = cache.job(job);
        let since = waiting_since(Instant::now(), wall_ms(), known.as_ref().map_or(0, |j| j.waiting_from_ms()));
        let asked = known.and_then(|j| j.spec.scheduler);
        let Some(s) = registry.get(asked.as_deref()) else {
            tracing::warn!(
                job_id = job.0,
                asked = asked.as_deref().unwrap_or_default(),
                runs = %registry.names(),
                "no such scheduler on this host; job cancelled"
            );
            let why = format!(
                "no scheduler `{}` on host `{host}` (it runs: {})",
                asked.unwrap_or_default(),
                registry.names()
            );
            let _ = client.cancel_because(job.0, &why).await;
            return Some(Placed::GaveUp(why));
        };
        match place_job(&mut client, &cache, s.as_ref(), job, since, &opts).await {
            Ok(p) => Some(p),
            Err(e) => {
                tracing::warn!(job_id = job.0, host = %host, error = %chain(&e), "scheduling stopped");
                None
            }
        }
    })
}

pub(crate) use tessera_proto::error::chain;

/// This machine's wall clock, Unix ms (0 before 1970).
pub(crate) fn wall_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// When a job started waiting, on this machine's monotonic clock: its submission time (the
/// view's clock, Unix ms, stamped by the leader) carried over through this machine's wall clock
/// `wall_ms` read at `now`. So `relax_after_s` steps and the cost rule count from submission:
/// a job adopted late, or again after its host failed, does not wait its steps again. No
/// submission time (a view from before times were kept), or one ahead of this clock (skew
/// between the leader and this machine), or a wait longer than this machine's monotonic clock
/// reaches back: `now`.
fn waiting_since(now: Instant, wall_ms: u64, submitted_ms: u64) -> Instant {
    if submitted_ms == 0 {
        return now;
    }
    now.checked_sub(Duration::from_millis(wall_ms.saturating_sub(submitted_ms))).unwrap_or(now)
}

/// FNV-1a of a name: a salt that tells hosts (and their rngs) apart.
pub(crate) fn fnv(s: &str) -> u64 {
    s.bytes().fold(0xcbf2_9ce4_8422_2325, |h, b| (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn waiting_counts_from_submission_on_the_wall_clock() {
        let now = Instant::now();
        let wall = 1_800_000_000_000;
        // Submitted 90 s ago: it has waited 90 s when adopted.
        assert_eq!(now.duration_since(waiting_since(now, wall, wall - 90_000)), Duration::from_secs(90));
        // No submission time, or one ahead of this clock: from now.
        assert_eq!(waiting_since(now, wall, 0), now);
        assert_eq!(waiting_since(now, wall, wall + 5_000), now);
    }
    use crate::scheduler::{Attempt, CpuAware, Verdict};

    /// A scheduler of one's own registered under the old alias's name.
    #[derive(Debug)]
    struct Custom;

    impl Scheduler for Custom {
        fn name(&self) -> &str {
            "default"
        }

        fn schedule(&self, _: &Attempt<'_>) -> Verdict {
            Verdict::Wait("custom".into())
        }
    }

    fn name_of(r: &Registry, asked: Option<&str>) -> Option<String> {
        r.get(asked).map(|s| s.name().to_string())
    }

    #[test]
    fn the_default_registry_holds_the_builtins_and_places_unnamed_jobs_locality_tolerant() {
        let r = Registry::default();
        assert_eq!(r.names(), "cpu-aware, fifo-firstfit, gandiva, hived, locality-tolerant, optimus");
        for name in BUILTIN {
            assert_eq!(name_of(&r, Some(name)).as_deref(), Some(name));
        }
        assert_eq!(name_of(&r, None).as_deref(), Some("locality-tolerant"));
        assert_eq!(name_of(&r, Some("no-such")), None);
    }

    #[test]
    fn the_old_name_default_still_names_locality_tolerant() {
        let r = Registry::default().with_default("cpu-aware").expect("registered");
        assert_eq!(name_of(&r, None).as_deref(), Some(CpuAware::default().name()));
        // A job file naming `default` gets the scheduler that name always meant, not the
        // host's default.
        assert_eq!(name_of(&r, Some("default")).as_deref(), Some("locality-tolerant"));
        // And `--default-scheduler default` keeps working.
        let r = r.with_default("default").expect("alias accepted");
        assert_eq!(name_of(&r, None).as_deref(), Some("locality-tolerant"));
        let e = Registry::default().with_default("no-such").expect_err("unknown");
        assert_eq!(
            e.to_string(),
            "unknown scheduler `no-such` (expected cpu-aware, fifo-firstfit, gandiva, hived, locality-tolerant, optimus)"
        );
    }

    #[test]
    fn a_scheduler_registered_under_an_alias_wins_over_the_alias() {
        let r = Registry::default().register(Custom);
        assert_eq!(name_of(&r, Some("default")).as_deref(), Some("default"));
        assert_eq!(name_of(&r, Some("locality-tolerant")).as_deref(), Some("locality-tolerant"));
        let r = r.with_default("default").expect("registered");
        assert_eq!(name_of(&r, None).as_deref(), Some("default"));
    }
}
