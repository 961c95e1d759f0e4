//! A synthetic trace generator, so that results can be checked on workloads no policy was tuned
//! on: Philly's job sizes and heavy-tailed durations (the built-in histogram of
//! `philly-duration-gpus.csv`, [`PhillySampler`]), a share of multi-server jobs (16, 32 and 64
//! GPUs), Philly's model mix, and bursty arrivals, all from one seed.
//!
//! Arrivals follow a two-state Markov-modulated Poisson process: calm periods and bursts whose
//! arrival rate is `burst` times the calm one, each period's length exponential with its own
//! mean. The absolute rate does not matter: the simulator scales arrivals to the offered load it
//! is asked for ([`super::load_scale_for`], [`super::servers_for_load`]).

use super::trace_loader::{SimJob, Trace};
use crate::SchedulerError;
use crate::philly_sampler::PhillySampler;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use std::collections::BTreeMap;

/// Multi-server job sizes and their weights (Philly's 16/32/64-GPU jobs are 74%, 26% and under
/// 1% of its jobs over 8 GPUs; 64 is kept at a tenth so that every seed has some).
const MULTI_SERVER_SIZES: [(u32, f64); 3] = [(16, 0.6), (32, 0.3), (64, 0.1)];

/// Model names with their share of jobs: the seven models of the Philly trace's `job_type`
/// column, each as often as it has batch-size variants there (the column itself is synthetic,
/// uniform over 26 variants).
const MODELS: [(&str, f64); 7] = [
    ("ResNet-18", 5.0),
    ("ResNet-50", 4.0),
    ("LM", 5.0),
    ("Transformer", 5.0),
    ("Recommendation", 5.0),
    ("CycleGAN", 1.0),
    ("A3C", 1.0),
];

/// Mean seconds between arrivals in a calm period (before load scaling).
const CALM_GAP_S: f64 = 600.0;

/// What to generate.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct SyntheticSpec {
    /// The seed: the same seed gives the same trace.
    pub seed: u64,
    /// Jobs.
    pub jobs: usize,
    /// Share of jobs of 16, 32 or 64 GPUs (the rest have Philly's sizes of 1 to 8).
    pub multi_server_share: f64,
    /// Arrival rate in a burst over the calm rate (1: plain Poisson arrivals).
    pub burst: f64,
    /// Mean length of a burst, seconds (before load scaling).
    pub burst_mean_s: f64,
    /// Mean length of a calm period, seconds.
    pub calm_mean_s: f64,
}

impl SyntheticSpec {
    /// 4,000 jobs, 3% of them multi-server, bursts of 4× the calm rate lasting an hour on
    /// average, three hours calm between them.
    pub fn new(seed: u64) -> SyntheticSpec {
        SyntheticSpec {
            seed,
            jobs: 4000,
            multi_server_share: 0.03,
            burst: 4.0,
            burst_mean_s: 3600.0,
            calm_mean_s: 3.0 * 3600.0,
        }
    }

    /// Reads `key=value` pairs separated by commas (`seed=3,jobs=2000,multi=0.05,burst=4`)
    /// over the defaults of [`SyntheticSpec::new`].
    pub fn parse(text: &str) -> Result<SyntheticSpec, SchedulerError> {
        let mut s = SyntheticSpec::new(1);
        for pair in text.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = |expected: &str| SchedulerError::BadSetting {
                setting: "--synthetic",
                expected: expected.to_string(),
                got: pair.to_string(),
            };
            let (k, v) = pair.split_once('=').ok_or_else(|| bad("key=value pairs"))?;
            let number = || v.parse::<f64>().ok().filter(|x| x.is_finite() && *x >= 0.0);
            match k {
                "seed" => s.seed = v.parse().map_err(|_| bad("seed=<integer>"))?,
                "jobs" => s.jobs = v.parse().ok().filter(|n| *n > 0).ok_or_else(|| bad("jobs=<at least 1>"))?,
                "multi" => s.multi_server_share = number().filter(|x| *x <= 1.0).ok_or_else(|| bad("multi=<0..1>"))?,
                "burst" => s.burst = number().filter(|x| *x >= 1.0).ok_or_else(|| bad("burst=<at least 1>"))?,
                "burst_s" => s.burst_mean_s = number().filter(|x| *x > 0.0).ok_or_else(|| bad("burst_s=<seconds>"))?,
                "calm_s" => s.calm_mean_s = number().filter(|x| *x > 0.0).ok_or_else(|| bad("calm_s=<seconds>"))?,
                _ => return Err(bad("keys seed, jobs, multi, burst, burst_s, calm_s")),
            }
        }
        Ok(s)
    }

    /// A short description, for the trace's name.
    pub fn describe(&self) -> String {
        format!(
            "synthetic seed={} jobs={} multi={} burst={}",
            self.seed, self.jobs, self.multi_server_share, self.burst
        )
    }
}

/// Generates the trace `s` describes.
pub fn generate(s: &SyntheticSpec) -> Trace {
    let sampler = PhillySampler::builtin();
    let mut rng = SmallRng::seed_from_u64(s.seed);
    let model_total: f64 = MODELS.iter().map(|m| m.1).sum();
    let multi_total: f64 = MULTI_SERVER_SIZES.iter().map(|m| m.1).sum();
    let exp = |rng: &mut SmallRng, mean: f64| -mean * (1.0 - rng.random::<f64>()).ln();
    let mut bursting = false;
    let mut period_end = exp(&mut rng, s.calm_mean_s);
    let mut t = 0.0;
    let mut jobs = Vec::with_capacity(s.jobs);
    for i in 0..s.jobs {
        // The next arrival, switching periods as the clock passes their ends (memoryless, so
        // the gap is drawn again in the new period from its end).
        loop {
            let gap = exp(&mut rng, if bursting { CALM_GAP_S / s.burst.max(1.0) } else { CALM_GAP_S });
            if t + gap <= period_end {
                t += gap;
                break;
            }
            t = period_end;
            bursting = !bursting;
            period_end = t + exp(&mut rng, if bursting { s.burst_mean_s } else { s.calm_mean_s });
        }
        let (sampled_gpus, duration_s) = sampler.sample(&mut rng);
        let gpus = if rng.random::<f64>() < s.multi_server_share {
            pick(&MULTI_SERVER_SIZES, multi_total, rng.random::<f64>())
        } else {
            sampled_gpus.clamp(1, 8)
        };
        let model = pick(&MODELS, model_total, rng.random::<f64>());
        jobs.push(SimJob {
            name: format!("syn-{}-{i}", s.seed),
            arrival_s: t,
            gpus,
            duration_s: f64::from(duration_s.max(60)),
            job_type: model.to_string(),
            cores_per_gpu: None,
            memory_mib_per_gpu: None,
            gpu_type: None,
        });
    }
    Trace { name: s.describe(), jobs, skipped: BTreeMap::new(), approximated: BTreeMap::new() }
}

/// The item whose cumulative weight first exceeds `u × total`.
fn pick<T: Copy>(items: &[(T, f64)], total: f64, u: f64) -> T {
    let mut left = u * total;
    for &(item, w) in items {
        if left < w {
            return item;
        }
        left -= w;
    }
    items[items.len() - 1].0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_seed_one_trace_and_another_seed_another() {
        let a = generate(&SyntheticSpec::new(3));
        assert_eq!(a, generate(&SyntheticSpec::new(3)));
        assert_ne!(a.jobs, generate(&SyntheticSpec::new(4)).jobs);
        assert!(a.jobs.windows(2).all(|w| w[0].arrival_s <= w[1].arrival_s), "arrivals in order");
    }

    #[test]
    fn sizes_follow_philly_and_the_multi_server_share() {
        let s = SyntheticSpec { jobs: 100_000, multi_server_share: 0.05, ..SyntheticSpec::new(1) };
        let t = generate(&s);
        let share = |f: &dyn Fn(u32) -> bool| t.jobs.iter().filter(|j| f(j.gpus)).count() as f64 / s.jobs as f64;
        let multi = share(&|g| g > 8);
        assert!((multi - 0.05).abs() < 0.005, "multi-server share {multi}");
        // Philly: about 69% of jobs have 1 GPU (the traces' README); here 95% of that.
        let one = share(&|g| g == 1) / 0.95;
        assert!((0.6..0.8).contains(&one), "1-GPU share of the single-server jobs {one}");
        assert!(t.jobs.iter().all(|j| (1..=8).contains(&j.gpus) || [16, 32, 64].contains(&j.gpus)));
        let big = t.jobs.iter().filter(|j| j.gpus == 64).count();
        assert!(big > 0, "some 64-GPU jobs");
    }

    #[test]
    fn bursts_make_arrivals_burstier_than_poisson() {
        // The squared coefficient of variation of the gaps: 1 for Poisson arrivals, more with
        // bursts.
        let cv2 = |burst: f64| {
            let t = generate(&SyntheticSpec { jobs: 50_000, burst, ..SyntheticSpec::new(9) });
            let gaps: Vec<f64> = t.jobs.windows(2).map(|w| w[1].arrival_s - w[0].arrival_s).collect();
            let mean = gaps.iter().sum::<f64>() / gaps.len() as f64;
            let var = gaps.iter().map(|g| (g - mean).powi(2)).sum::<f64>() / gaps.len() as f64;
            var / (mean * mean)
        };
        let (plain, bursty) = (cv2(1.0), cv2(8.0));
        assert!((plain - 1.0).abs() < 0.1, "Poisson: {plain}");
        assert!(bursty > 1.3, "bursty: {bursty}");
    }

    #[test]
    fn settings_parse_and_bad_ones_name_the_flag() {
        let s = SyntheticSpec::parse("seed=7, jobs=200,multi=0.1,burst=2").expect("parse");
        assert_eq!((s.seed, s.jobs, s.multi_server_share, s.burst), (7, 200, 0.1, 2.0));
        for bad in ["jobs=0", "multi=2", "burst=0.5", "colour=red", "seed"] {
            let e = SyntheticSpec::parse(bad).expect_err(bad).to_string();
            assert!(e.contains("--synthetic") && e.contains(bad), "{e}");
        }
    }
}
