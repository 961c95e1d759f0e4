//! What one simulated policy reports: [`PolicyReport`] with a [`JobRecord`] per job, and its
//! assembly once the run has ended.

use super::*;

/// Points of the utilization series.
const UTILIZATION_POINTS: usize = 400;

/// The results of one policy (the object `tessera sim --json` prints per policy).
#[derive(Clone, Debug, Default, Serialize, PartialEq)]
pub struct PolicyReport {
    /// Jobs simulated.
    pub jobs: u64,
    /// Jobs that finished.
    pub finished: u64,
    /// Mean job completion time (arrival to end), seconds.
    pub avg_jct_s: f64,
    /// Median JCT.
    pub p50_jct_s: f64,
    /// 95th-percentile JCT.
    pub p95_jct_s: f64,
    /// 99th-percentile JCT.
    pub p99_jct_s: f64,
    /// First arrival to last completion, seconds.
    pub makespan_s: f64,
    /// Busy GPU-seconds over GPU capacity × makespan.
    pub gpu_utilization: f64,
    /// Mean queueing delay (arrival to first start) by size bucket.
    pub queue_s_by_size: BTreeMap<String, f64>,
    /// Jobs per size bucket.
    pub jobs_by_size: BTreeMap<String, u64>,
    /// Mean queueing delay over all jobs.
    pub avg_queue_s: f64,
    /// Mean fraction of GPUs free while jobs waited (free GPUs no waiting job could use).
    pub fragmentation: f64,
    /// The part of `fragmentation` made of GPUs free without their proportional core share on
    /// their server (a job granted exactly the share could not use them): mean fraction of the
    /// GPUs, while jobs waited.
    pub coreless: f64,
    /// Share of jobs whose first placement was at their preferred level (the tightest level at
    /// which a job of their size fits a server of the cluster).
    pub preferred_locality_share: f64,
    /// Mean speed of jobs over their run (1 = the trace's duration).
    pub avg_speed: f64,
    /// Jobs moved by migration.
    pub migrations: u64,
    /// GPU-seconds lost to checkpoint-restart of moved jobs.
    pub migration_cost_gpu_s: f64,
    /// Times the migration task planned for a blocked job and no moves within the planner's
    /// bounds freed a group for it (the live host's `tessera_host_migration_plans_total`
    /// with `result="none"`): fragmentation such moves cannot fix, only jobs ending. The simulator
    /// plans when something changes, the live task every interval, so counts compare within
    /// the simulator, not with a live host's. Left out of the JSON when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub migration_no_plan: u64,
    /// Gangs preempted (each released whole, re-queued, resumed later from a checkpoint taken
    /// when it was stopped). Left out of the JSON when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub preemptions: u64,
    /// GPU-seconds preempted gangs lost to checkpoint-restart. Left out of the JSON when 0.
    #[serde(skip_serializing_if = "is_zero_f")]
    pub preemption_cost_gpu_s: f64,
    /// Reservations the host made for starved gangs of whole servers ([`crate::reservation`]).
    /// Left out of the JSON when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub reservations: u64,
    /// Of those, the ones given up after idling their whole budget. Left out of the JSON when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub reservations_given_up: u64,
    /// Job-seconds reservations held other jobs back (the waiting they cost). Left out of the
    /// JSON when 0.
    #[serde(skip_serializing_if = "is_zero_f")]
    pub reservation_held_back_s: f64,
    /// GPU-seconds reservations kept idle that jobs they held back could have used. Left out of
    /// the JSON when 0.
    #[serde(skip_serializing_if = "is_zero_f")]
    pub reserved_idle_gpu_s: f64,
    /// Jobs whose CPU-aware spec could never fit and that ran with the GPU-proportional share.
    pub cpu_fallbacks: u64,
    /// Proposals the approver refused (0 expected: searches plan on a current view).
    pub rejected_proposals: u64,
    /// Mean seconds a job of each size bucket waited while it was blocked by fragmentation: the
    /// cluster had enough free GPUs of its type for it (in one rack or IB domain when its allowed
    /// level is that), yet no placement of its gang existed at its allowed level even with one
    /// core and no memory per GPU. This is what migration can fix, measured by the simulator
    /// itself, whatever the scheduler's verdict.
    pub frag_blocked_s_by_size: BTreeMap<String, f64>,
    /// Jobs the scheduler gave up on (cancelled with its reason; 0 for the built-ins on a
    /// cluster that admitted the jobs). Left out of the JSON when 0.
    #[serde(skip_serializing_if = "is_zero")]
    pub gave_up: u64,
    /// Invariant checks run.
    pub invariant_checks: u64,
    /// Violations they found (0 expected).
    pub invariant_violations: u64,
    /// Sorted JCTs, seconds (for CDFs; not in JSON).
    #[serde(skip)]
    pub jct_s: Vec<f64>,
    /// `(time_s, busy GPU fraction)`, time-averaged over equal intervals (not in JSON).
    #[serde(skip)]
    pub utilization: Vec<(f64, f64)>,
    /// `(gpus, queue_s)` per finished job (not in JSON).
    #[serde(skip)]
    pub queue_by_job: Vec<(u32, f64)>,
    /// Every job in trace order, finished or not (for per-job CSVs; not in JSON).
    #[serde(skip)]
    pub job_records: Vec<JobRecord>,
}

/// One job's run: when it arrived, started and ended, and where it ran.
#[derive(Clone, Debug, PartialEq)]
pub struct JobRecord {
    /// The trace's job id.
    pub name: String,
    /// GPUs.
    pub gpus: u32,
    /// Arrival (after load scaling), seconds.
    pub arrival_s: f64,
    /// First start, if it started.
    pub start_s: Option<f64>,
    /// End, if it finished.
    pub end_s: Option<f64>,
    /// Locality level of its last placement (after any moves), if it started.
    pub level: Option<LocalityLevel>,
    /// Times it was moved by migration.
    pub moves: u64,
}

impl Sim<'_> {
    pub(super) fn report(mut self, trace: &Trace) -> PolicyReport {
        let mut rep = std::mem::take(&mut self.rep);
        rep.jobs = self.jobs.len() as u64;
        let held = self.reservations.stats();
        (rep.reservations, rep.reservations_given_up) = (held.made, held.abandoned);
        (rep.reservation_held_back_s, rep.reserved_idle_gpu_s) = (held.held_back_s, held.idled_gpu_s);
        rep.job_records = self
            .jobs
            .iter()
            .zip(&trace.jobs)
            .map(|(j, t)| JobRecord {
                name: t.name.clone(),
                gpus: j.gpus,
                arrival_s: j.arrival_s,
                start_s: j.start_s,
                end_s: j.finish_s,
                level: j.start_s.map(|_| j.level),
                moves: j.moves,
            })
            .collect();
        let first = self.jobs.iter().map(|j| j.arrival_s).fold(f64::INFINITY, f64::min);
        let last = self.jobs.iter().filter_map(|j| j.finish_s).fold(0.0, f64::max);
        let mut jct = Vec::new();
        let mut queue_sum = [0.0f64; 4];
        let mut queue_n = [0u64; 4];
        let mut at_pref = 0u64;
        let mut frag_sum = [0.0f64; 4];
        let mut frag_n = [0u64; 4];
        for j in &self.jobs {
            let b = size_bucket(j.gpus);
            frag_sum[b] += j.frag_blocked_s;
            frag_n[b] += 1;
        }
        let mut speed_sum = 0.0;
        for j in &self.jobs {
            let (Some(start), Some(end)) = (j.start_s, j.finish_s) else { continue };
            rep.finished += 1;
            jct.push(end - j.arrival_s);
            let b = size_bucket(j.gpus);
            queue_sum[b] += start - j.arrival_s;
            queue_n[b] += 1;
            rep.queue_by_job.push((j.gpus, start - j.arrival_s));
            at_pref += u64::from(j.at_preferred);
            if end > start {
                speed_sum += j.speed_time / (end - start);
            }
        }
        jct.sort_by(f64::total_cmp);
        let n = jct.len().max(1) as f64;
        let pct = |p: f64| -> f64 {
            if jct.is_empty() {
                return 0.0;
            }
            jct[((p * jct.len() as f64).ceil() as usize).clamp(1, jct.len()) - 1]
        };
        rep.avg_jct_s = jct.iter().sum::<f64>() / n;
        rep.p50_jct_s = pct(0.50);
        rep.p95_jct_s = pct(0.95);
        rep.p99_jct_s = pct(0.99);
        rep.makespan_s = if last > first { last - first } else { 0.0 };
        rep.gpu_utilization =
            if rep.makespan_s > 0.0 { self.busy_area / (self.total_gpus as f64 * rep.makespan_s) } else { 0.0 };
        for (b, name) in SIZE_BUCKETS.iter().enumerate() {
            let mean = if queue_n[b] > 0 { queue_sum[b] / queue_n[b] as f64 } else { 0.0 };
            rep.queue_s_by_size.insert((*name).to_string(), mean);
            rep.jobs_by_size.insert((*name).to_string(), queue_n[b]);
            let frag = if frag_n[b] > 0 { frag_sum[b] / frag_n[b] as f64 } else { 0.0 };
            rep.frag_blocked_s_by_size.insert((*name).to_string(), frag);
        }
        rep.avg_queue_s = queue_sum.iter().sum::<f64>() / n;
        rep.fragmentation =
            if self.frag_time > 0.0 { self.frag_area / (self.total_gpus as f64 * self.frag_time) } else { 0.0 };
        rep.coreless =
            if self.frag_time > 0.0 { self.coreless_area / (self.total_gpus as f64 * self.frag_time) } else { 0.0 };
        rep.preferred_locality_share = at_pref as f64 / n;
        rep.avg_speed = speed_sum / n;
        rep.utilization = downsample(&self.busy_series, last, self.total_gpus);
        rep.jct_s = jct;
        rep
    }
}

/// Time-averages a step series of busy GPUs into [`UTILIZATION_POINTS`] equal intervals.
fn downsample(series: &[(f64, u64)], end: f64, total: u64) -> Vec<(f64, f64)> {
    if end <= 0.0 || total == 0 {
        return Vec::new();
    }
    let dt = end / UTILIZATION_POINTS as f64;
    let mut out = Vec::with_capacity(UTILIZATION_POINTS);
    let mut k = 0;
    for p in 0..UTILIZATION_POINTS {
        let (a, b) = (p as f64 * dt, (p + 1) as f64 * dt);
        let mut area = 0.0;
        while k + 1 < series.len() && series[k + 1].0 <= a {
            k += 1;
        }
        let mut q = k;
        while q < series.len() && series[q].0 < b {
            let from = series[q].0.max(a);
            let to = series.get(q + 1).map_or(b, |n| n.0.min(b));
            area += series[q].1 as f64 * (to - from).max(0.0);
            q += 1;
        }
        out.push((a, area / dt / total as f64));
    }
    out
}

fn is_zero_f(x: &f64) -> bool {
    *x == 0.0
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}
