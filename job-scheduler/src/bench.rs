//! The placement benchmark (`tessera bench placement`).
//!
//! It measures the two steps on the scheduling path, placement search and approval, on one
//! core, at production-like contention:
//!
//! 1. A cluster of `servers` servers with `gpus_per_server` GPUs (2 sockets, PCIe switches of 2
//!    GPUs), 16 servers to a rack, 16 racks to an InfiniBand domain.
//! 2. Jobs with `(GPUs, duration)` drawn from the Philly trace arrive as a Poisson process whose
//!    rate offers `load` × the cluster's GPU capacity; each job runs for its duration in
//!    simulated time and is then released. Jobs larger than a server become gangs of
//!    server-sized members.
//! 3. `schedulers` logical schedulers take jobs in turn. They read a shared copy of the view
//!    that is brought up to date only every `lag` versions, as schedulers fed by a watch stream
//!    would be, so they plan on stale state and conflict as in production. A rejected
//!    scheduler learns the conflicting servers' fresh records (from the decision, into its
//!    private overlay) and retries, up to `max_retries` times.
//! 4. At the end, [`tessera_view::invariants::check`] recomputes every server's free state from
//!    the jobs' placements and counts double allocations independently of the bookkeeping.
//!
//! The wall time covers submission, search, approval, releases and view catch-up; building the
//! cluster and loading the trace are excluded.

use crate::error::SchedulerError;
use crate::local_view::{LocalView, Overlay};
use crate::philly_sampler::PhillySampler;
use crate::placement_policy::Policy;
use crate::search::find_placement;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::time::Instant;
use tessera_view::server::SERVER_RECORD_BYTES;
use tessera_view::{ClusterSpec, ClusterView, Decision, JobId, JobSpec, LocalityLevel, Proposal, ProposalId, Topology};

/// Benchmark parameters.
#[derive(Clone, Debug)]
pub struct PlacementBench {
    /// Servers in the cluster.
    pub servers: u32,
    /// GPUs per server (even, 2..=64).
    pub gpus_per_server: u32,
    /// Jobs to submit.
    pub jobs: u64,
    /// Logical schedulers proposing in turn.
    pub schedulers: u32,
    /// Versions the shared view may lag before it catches up.
    pub lag: u64,
    /// Offered load: arrival rate × mean GPU-seconds / GPU capacity.
    pub load: f64,
    /// Retries after a conflict.
    pub max_retries: u32,
    /// Placement policy.
    pub policy: Policy,
    /// Random seed.
    pub seed: u64,
}

impl Default for PlacementBench {
    fn default() -> Self {
        PlacementBench {
            servers: 16_000,
            gpus_per_server: 8,
            jobs: 100_000,
            schedulers: 64,
            lag: 64,
            load: 0.9,
            max_retries: 8,
            policy: Policy::default(),
            seed: 1,
        }
    }
}

/// Benchmark results (the JSON object `tessera bench placement --json` prints).
#[derive(Clone, Debug, Serialize)]
pub struct PlacementReport {
    /// Servers.
    pub servers: u64,
    /// GPUs.
    pub gpus: u64,
    /// Jobs submitted.
    pub jobs: u64,
    /// Jobs placed.
    pub placed: u64,
    /// Jobs that did not fit when they arrived (no queueing in this benchmark).
    pub no_fit: u64,
    /// Proposals rejected because the proposer's view was stale.
    pub conflicts: u64,
    /// Jobs dropped after `max_retries` conflicts.
    pub retries_exhausted: u64,
    /// Proposals rejected for any other reason (must be 0: the search and the approver agree).
    pub invalid_proposals: u64,
    /// Searches run (including retries and failed searches).
    pub searches: u64,
    /// Jobs released at the end of their duration.
    pub released: u64,
    /// Wall-clock seconds of the measured loop.
    pub wall_s: f64,
    /// Placed jobs per second of wall time.
    pub placements_per_s: f64,
    /// Median search time, microseconds.
    pub search_p50_us: f64,
    /// 99th-percentile search time, microseconds.
    pub search_p99_us: f64,
    /// Median approver time (validate + apply), microseconds.
    pub approve_p50_us: f64,
    /// 99th-percentile approver time, microseconds.
    pub approve_p99_us: f64,
    /// Hot state per server in the view (`size_of::<ServerRecord>()`).
    pub bytes_per_server: u64,
    /// A scheduler's copy per server: record plus index.
    pub scheduler_copy_bytes_per_server: u64,
    /// Device and core double allocations found by the independent check (must be 0).
    pub double_allocations: u64,
    /// All invariant violations found by the independent check (must be 0).
    pub invariant_violations: u64,
    /// GPU utilization when the last job was submitted.
    pub final_utilization: f64,
    /// Placed jobs per locality level achieved.
    pub placed_by_level: std::collections::BTreeMap<String, u64>,
    /// Share of placed jobs at or tighter than their preferred level.
    pub at_preferred_share: f64,
    /// Logical schedulers.
    pub schedulers: u32,
    /// Version lag of the shared view.
    pub lag: u64,
    /// Offered load.
    pub load: f64,
    /// Where job sizes and durations came from.
    pub trace: String,
    /// Seed.
    pub seed: u64,
}

/// A server model with `gpus` devices: 2 sockets (1 if `gpus` is 2 or less), PCIe switches of
/// two GPUs, 16 cores per socket, 384 GiB of memory.
pub fn bench_topology(gpus: u32) -> Result<Topology, SchedulerError> {
    if !(2..=64).contains(&gpus) || !gpus.is_multiple_of(2) {
        return Err(SchedulerError::BadSetting {
            setting: "--gpus-per-server",
            expected: "even and in 2..=64".into(),
            got: gpus.to_string(),
        });
    }
    if gpus == 8 {
        return Topology::preset("seed-8gpu").ok_or(SchedulerError::MissingPreset("seed-8gpu"));
    }
    let sockets = if gpus <= 2 { 1 } else { 2 };
    let per_socket = gpus / sockets;
    let mask = |from: u32, n: u32| ((1u64 << n) - 1) << from;
    let t = Topology {
        name: format!("bench-{gpus}gpu"),
        device_type: "bench-gpu".into(),
        devices: gpus,
        sockets: (0..sockets).map(|s| mask(s * per_socket, per_socket)).collect(),
        pcie_switches: (0..gpus / 2).map(|p| mask(2 * p, 2)).collect(),
        nvlink_groups: Vec::new(),
        cores_per_socket: 16,
        memory_mib: 393_216,
    };
    t.validate().map_err(|e| e.in_file("<bench topology>"))?;
    Ok(t)
}

/// The job spec the benchmark submits for a job of `gpus` GPUs.
fn job_spec(gpus: u32, gpus_per_server: u32, topo: &Topology) -> JobSpec {
    let (members, per) =
        if gpus <= gpus_per_server { (1, gpus) } else { (gpus.div_ceil(gpus_per_server), gpus_per_server) };
    let mut spec = JobSpec::simple("bench", members, per);
    let total = members * per;
    spec.prefer = [LocalityLevel::PcieSwitch, LocalityLevel::Socket, LocalityLevel::Server]
        .into_iter()
        .find(|&l| topo.max_group(l) >= total)
        .unwrap_or(LocalityLevel::Rack);
    spec.tolerate = LocalityLevel::Any;
    spec
}

fn percentile_us(sorted_ns: &[u32], p: f64) -> f64 {
    if sorted_ns.is_empty() {
        return 0.0;
    }
    let i = ((sorted_ns.len() - 1) as f64 * p).round() as usize;
    sorted_ns[i] as f64 / 1000.0
}

/// Runs the benchmark.
pub fn run(cfg: &PlacementBench, sampler: &PhillySampler) -> Result<PlacementReport, SchedulerError> {
    // (setting, value, least, most)
    let limits: [(&'static str, u64, u64, u64); 4] = [
        ("--servers", u64::from(cfg.servers), 1, tessera_view::cluster_spec::MAX_SERVERS),
        ("--jobs", cfg.jobs, 1, 10_000_000),
        ("--schedulers", u64::from(cfg.schedulers), 1, 1_000_000),
        ("--lag", cfg.lag, 0, 1 << 32),
    ];
    for (setting, value, least, most) in limits {
        if !(least..=most).contains(&value) {
            let expected = format!("in {least}..={most}");
            return Err(SchedulerError::BadSetting { setting, expected, got: value.to_string() });
        }
    }
    if !(cfg.load > 0.0 && cfg.load.is_finite()) {
        return Err(SchedulerError::BadSetting {
            setting: "--load",
            expected: "a positive number".into(),
            got: cfg.load.to_string(),
        });
    }
    let topo = bench_topology(cfg.gpus_per_server)?;
    let spec = ClusterSpec::uniform(topo.clone(), cfg.servers, 16, 16);
    // The change log must cover the lag plus what one round of releases touches.
    let log = ((cfg.lag as usize + 64) * 16).max(1 << 16);
    let mut view = ClusterView::from_spec(&spec).with_limits(log, cfg.jobs as usize);
    let mut shared = LocalView::of_view(&view);
    let mut overlays: Vec<Overlay> = vec![Overlay::default(); cfg.schedulers as usize];
    let mut rng = SmallRng::seed_from_u64(cfg.seed);
    let total_gpus = cfg.servers as u64 * cfg.gpus_per_server as u64;
    let rate_per_s = cfg.load * total_gpus as f64 / sampler.mean_gpu_seconds();

    // Pre-draw the workload so that sampling is not timed.
    let mut arrivals: Vec<(f64, u32, u32)> = Vec::with_capacity(cfg.jobs as usize);
    let mut t = 0.0f64;
    for _ in 0..cfg.jobs {
        t += -(1.0 - rng.random::<f64>()).ln() / rate_per_s;
        let (g, d) = sampler.sample(&mut rng);
        arrivals.push((t, g, d));
    }
    let specs: Vec<JobSpec> =
        [1u32, 2, 4, 8, 16, 32, 64, 128, 256].iter().map(|&g| job_spec(g, cfg.gpus_per_server, &topo)).collect();
    let spec_for = |g: u32| -> JobSpec {
        let i = g.next_power_of_two().trailing_zeros() as usize;
        match specs.get(i) {
            Some(s) if s.total_gpus() >= g => s.clone(),
            _ => job_spec(g, cfg.gpus_per_server, &topo),
        }
    };

    let mut running: BinaryHeap<Reverse<(u64, JobId)>> = BinaryHeap::new();
    let mut search_ns: Vec<u32> = Vec::with_capacity(cfg.jobs as usize * 2);
    let mut approve_ns: Vec<u32> = Vec::with_capacity(cfg.jobs as usize * 2);
    let mut r = PlacementReport {
        servers: cfg.servers as u64,
        gpus: total_gpus,
        jobs: cfg.jobs,
        placed: 0,
        no_fit: 0,
        conflicts: 0,
        retries_exhausted: 0,
        invalid_proposals: 0,
        searches: 0,
        released: 0,
        wall_s: 0.0,
        placements_per_s: 0.0,
        search_p50_us: 0.0,
        search_p99_us: 0.0,
        approve_p50_us: 0.0,
        approve_p99_us: 0.0,
        bytes_per_server: SERVER_RECORD_BYTES as u64,
        scheduler_copy_bytes_per_server: (SERVER_RECORD_BYTES + LocalView::INDEX_BYTES_PER_SERVER) as u64,
        double_allocations: 0,
        invariant_violations: 0,
        final_utilization: 0.0,
        placed_by_level: Default::default(),
        at_preferred_share: 0.0,
        schedulers: cfg.schedulers,
        lag: cfg.lag,
        load: cfg.load,
        trace: sampler.name().to_string(),
        seed: cfg.seed,
    };
    let mut by_level = [0u64; 6];
    let mut at_pref = 0u64;
    let mut next_proposal = 1u64;

    let start = Instant::now();
    for (n, &(now, g, dur)) in arrivals.iter().enumerate() {
        let now_s = now as u64;
        while let Some(&Reverse((end, job))) = running.peek() {
            if end > now_s {
                break;
            }
            running.pop();
            view.release(job, false).map_err(|source| SchedulerError::View {
                action: "release",
                job: Some(job),
                source,
            })?;
            r.released += 1;
        }
        if view.version().0 >= shared.version().0 + cfg.lag {
            shared.catch_up(&view);
            overlays.iter_mut().for_each(Overlay::clear);
        }
        let spec = spec_for(g);
        let prefer = spec.prefer;
        let job = view.submit(spec).map_err(|source| SchedulerError::View { action: "submit", job: None, source })?;
        let sched = n % cfg.schedulers as usize;
        let salt = (sched as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ n as u64;
        let spec = &view.job(job).ok_or(SchedulerError::JobVanished(job))?.spec;
        let mode = cfg.policy.mode(&shared, spec);
        let spec = spec.clone();
        let mut attempts = 0;
        loop {
            let t0 = Instant::now();
            let found = find_placement(&shared, &overlays[sched], &spec, spec.tolerate, mode, salt);
            search_ns.push(t0.elapsed().as_nanos().min(u32::MAX as u128) as u32);
            r.searches += 1;
            let Ok(found) = found else {
                r.no_fit += 1;
                view.cancel(job).map_err(|source| SchedulerError::View { action: "cancel", job: Some(job), source })?;
                break;
            };
            let p = Proposal { id: ProposalId(next_proposal), job, members: found.members, based_on: shared.version() };
            next_proposal += 1;
            let t1 = Instant::now();
            let d = view.propose(&p);
            approve_ns.push(t1.elapsed().as_nanos().min(u32::MAX as u128) as u32);
            match d {
                Decision::Accepted { level, .. } => {
                    r.placed += 1;
                    by_level[level.rank()] += 1;
                    at_pref += (level <= prefer) as u64;
                    running.push(Reverse((now_s + dur as u64, job)));
                    break;
                }
                Decision::Rejected { reason, fresh, .. } if reason.is_conflict() => {
                    r.conflicts += 1;
                    overlays[sched].learn(&fresh);
                    attempts += 1;
                    if attempts > cfg.max_retries {
                        r.retries_exhausted += 1;
                        view.cancel(job).map_err(|source| SchedulerError::View {
                            action: "cancel",
                            job: Some(job),
                            source,
                        })?;
                        break;
                    }
                }
                other => {
                    r.invalid_proposals += 1;
                    view.cancel(job).map_err(|source| SchedulerError::View {
                        action: "cancel",
                        job: Some(job),
                        source,
                    })?;
                    if r.invalid_proposals == 1 {
                        eprintln!("warning: proposal refused for a non-conflict reason: {other:?}");
                    }
                    break;
                }
            }
        }
    }
    r.wall_s = start.elapsed().as_secs_f64();
    r.final_utilization =
        1.0 - view.servers().iter().map(|s| s.free_gpus.count_ones() as u64).sum::<u64>() as f64 / total_gpus as f64;

    let check = tessera_view::invariants::check(&view);
    r.double_allocations = check.double_allocations();
    r.invariant_violations = check.violations.len() as u64;
    for v in check.violations.iter().take(5) {
        eprintln!("invariant violation: {v}");
    }
    r.placements_per_s = r.placed as f64 / r.wall_s.max(1e-9);
    search_ns.sort_unstable();
    approve_ns.sort_unstable();
    r.search_p50_us = percentile_us(&search_ns, 0.5);
    r.search_p99_us = percentile_us(&search_ns, 0.99);
    r.approve_p50_us = percentile_us(&approve_ns, 0.5);
    r.approve_p99_us = percentile_us(&approve_ns, 0.99);
    for l in LocalityLevel::ALL {
        if by_level[l.rank()] > 0 {
            r.placed_by_level.insert(l.as_str().to_string(), by_level[l.rank()]);
        }
    }
    r.at_preferred_share = at_pref as f64 / r.placed.max(1) as f64;
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_run_is_clean_and_conflicts_happen() {
        let cfg = PlacementBench { servers: 64, jobs: 3000, schedulers: 16, lag: 16, load: 1.2, ..Default::default() };
        let r = run(&cfg, &PhillySampler::builtin()).expect("runs");
        assert_eq!(r.double_allocations, 0);
        assert_eq!(r.invariant_violations, 0);
        assert_eq!(r.invalid_proposals, 0, "search and approver disagree");
        assert!(r.placed > 1000, "{r:?}");
        assert!(r.conflicts > 0, "stale views must cause conflicts: {r:?}");
        assert_eq!(r.placed + r.no_fit + r.retries_exhausted, r.jobs);
    }

    #[test]
    fn other_server_sizes_build_and_place_gangs() {
        let cfg =
            PlacementBench { servers: 32, gpus_per_server: 4, jobs: 500, schedulers: 4, lag: 4, ..Default::default() };
        let r = run(&cfg, &PhillySampler::builtin()).expect("runs");
        assert_eq!(r.double_allocations, 0);
        assert!(r.placed_by_level.contains_key("rack") || r.placed_by_level.contains_key("ib-domain"), "{r:?}");
        assert!(bench_topology(7).is_err());
    }
}
