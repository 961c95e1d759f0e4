//! Job size and duration samplers from the Philly trace.
//!
//! [`PhillySampler::from_csv`] reads `philly-duration-gpus.csv` (columns `idx, duration_s,
//! num_gpus`; 33,192 real `(duration, GPUs)` pairs) and samples rows uniformly.
//! [`PhillySampler::builtin`] carries a compact copy of the same file: for each GPU count, its
//! row count and 32 duration quantiles (every 5% and densely in the tail), sampled by
//! interpolating the quantile function; its mean GPU-seconds is within 1% of the file's. It is used when the file is not at hand.

use crate::error::SchedulerError;
use rand::Rng;
use std::path::Path;

/// Quantile points (percent) of the built-in duration table; dense in the tail, where most
/// GPU-time is.
pub(crate) const QUANTILES: [f64; 32] = [
    0.0, 5.0, 10.0, 15.0, 20.0, 25.0, 30.0, 35.0, 40.0, 45.0, 50.0, 55.0, 60.0, 65.0, 70.0, 75.0, 80.0, 85.0, 90.0,
    92.0, 94.0, 95.0, 96.0, 97.0, 98.0, 98.5, 99.0, 99.3, 99.6, 99.8, 99.9, 100.0,
];

/// Per GPU count: rows in the trace and duration quantiles at [`QUANTILES`] (seconds).
/// Derived from stanford-futuredata/gavel `philly_job_distribution.pickle` (MIT).
pub(crate) const PHILLY_BUILTIN: &[(u32, u32, [u32; 32])] = &[
    (
        1,
        25304,
        [
            3600, 3982, 4334, 5009, 5413, 5766, 6112, 7137, 8558, 9368, 10710, 12401, 14508, 17739, 22304, 31635,
            44229, 72272, 140113, 188212, 308438, 382849, 516040, 634754, 1001571, 1427761, 1845602, 2127013, 2821635,
            4154760, 4749178, 5196151,
        ],
    ),
    (
        2,
        665,
        [
            3657, 5838, 12805, 21259, 26610, 32932, 44298, 56128, 70712, 83023, 101659, 138279, 170230, 214832, 260099,
            329522, 377961, 488970, 584349, 608135, 693250, 821796, 1098044, 1152745, 1451550, 1565695, 1798344,
            1951431, 2137523, 5065230, 5065230, 5150146,
        ],
    ),
    (
        4,
        3076,
        [
            3609, 5292, 7813, 12861, 14570, 17090, 24571, 33957, 45155, 55939, 71606, 82869, 93899, 115029, 144641,
            177911, 203119, 261199, 398478, 488610, 628493, 807753, 908661, 1085628, 1543257, 1912986, 2050476,
            2072841, 2421023, 4014063, 4718906, 5186933,
        ],
    ),
    (
        8,
        4147,
        [
            3605, 5121, 7449, 10335, 13908, 15295, 20456, 27648, 38085, 52066, 64585, 84303, 106494, 141350, 175750,
            217894, 266268, 368161, 536595, 631875, 783432, 865718, 1050765, 1245993, 1544009, 1941748, 2214025,
            2685610, 3412913, 4179627, 4472936, 5187472,
        ],
    ),
];

/// Linear interpolation of a quantile table at percent `u` (0..100).
fn interpolate(q: &[u32; 32], u: f64) -> f64 {
    let i = QUANTILES.partition_point(|&p| p <= u).clamp(1, QUANTILES.len() - 1);
    let (p0, p1) = (QUANTILES[i - 1], QUANTILES[i]);
    let (a, b) = (q[i - 1] as f64, q[i] as f64);
    a + (b - a) * ((u - p0) / (p1 - p0)).clamp(0.0, 1.0)
}

enum Source {
    Rows(Vec<(u32, u32)>),
    Builtin,
}

/// Samples `(gpus, duration_s)` pairs.
pub struct PhillySampler {
    source: Source,
    name: String,
}

impl std::fmt::Debug for PhillySampler {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PhillySampler").field("source", &self.name).finish()
    }
}

impl PhillySampler {
    /// Reads `philly-duration-gpus.csv`.
    pub fn from_csv(path: &Path) -> Result<PhillySampler, SchedulerError> {
        let file = path.display().to_string();
        let mut rdr =
            csv::Reader::from_path(path).map_err(|e| SchedulerError::Csv { file: file.clone(), source: e })?;
        let headers = rdr.headers().map_err(|e| SchedulerError::Csv { file: file.clone(), source: e })?.clone();
        let col = |name: &'static str| {
            headers
                .iter()
                .position(|h| h.trim() == name)
                .ok_or(SchedulerError::MissingColumn { file: file.clone(), column: name })
        };
        let (dc, gc) = (col("duration_s")?, col("num_gpus")?);
        let mut rows = Vec::new();
        for (i, rec) in rdr.records().enumerate() {
            let row = i as u64 + 1;
            let rec = rec.map_err(|e| SchedulerError::BadValue {
                file: file.clone(),
                row,
                column: "duration_s",
                message: e.to_string(),
            })?;
            let parse = |c: usize, column: &'static str| -> Result<f64, SchedulerError> {
                let raw = rec.get(c).unwrap_or("").trim();
                raw.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0).ok_or_else(|| SchedulerError::BadValue {
                    file: file.clone(),
                    row,
                    column,
                    message: format!("`{raw}` is not a non-negative number"),
                })
            };
            let d = parse(dc, "duration_s")?;
            let g = parse(gc, "num_gpus")?;
            if g < 1.0 || g.fract() != 0.0 || g > 4096.0 {
                return Err(SchedulerError::BadValue {
                    file: file.clone(),
                    row,
                    column: "num_gpus",
                    message: format!("{g} is not a whole GPU count in 1..=4096"),
                });
            }
            rows.push((g as u32, d.min(u32::MAX as f64) as u32));
        }
        if rows.is_empty() {
            return Err(SchedulerError::EmptyTrace { file });
        }
        Ok(PhillySampler { name: file, source: Source::Rows(rows) })
    }

    /// The compiled-in histogram of the same trace.
    pub fn builtin() -> PhillySampler {
        PhillySampler { source: Source::Builtin, name: "built-in Philly histogram".into() }
    }

    /// Where the samples come from.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// One `(gpus, duration_s)` sample.
    pub fn sample(&self, rng: &mut impl Rng) -> (u32, u32) {
        match &self.source {
            Source::Rows(rows) => rows[rng.random_range(0..rows.len())],
            Source::Builtin => {
                let total: u32 = PHILLY_BUILTIN.iter().map(|r| r.1).sum();
                let mut pick = rng.random_range(0..total);
                let row = PHILLY_BUILTIN
                    .iter()
                    .find(|r| {
                        if pick < r.1 {
                            true
                        } else {
                            pick -= r.1;
                            false
                        }
                    })
                    .unwrap_or(&PHILLY_BUILTIN[0]);
                (row.0, interpolate(&row.2, rng.random::<f64>() * 100.0) as u32)
            }
        }
    }

    /// Mean of `gpus × duration_s` over the distribution.
    pub fn mean_gpu_seconds(&self) -> f64 {
        match &self.source {
            Source::Rows(rows) => rows.iter().map(|&(g, d)| g as f64 * d as f64).sum::<f64>() / rows.len() as f64,
            Source::Builtin => {
                let total: f64 = PHILLY_BUILTIN.iter().map(|r| r.1 as f64).sum();
                PHILLY_BUILTIN
                    .iter()
                    .map(|(g, n, q)| {
                        let mean_d: f64 = (1..QUANTILES.len())
                            .map(|i| (q[i - 1] as f64 + q[i] as f64) / 2.0 * (QUANTILES[i] - QUANTILES[i - 1]) / 100.0)
                            .sum();
                        *n as f64 / total * *g as f64 * mean_d
                    })
                    .sum()
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;

    #[test]
    fn builtin_matches_the_trace_shape() {
        let s = PhillySampler::builtin();
        let mut rng = rand::rngs::SmallRng::seed_from_u64(1);
        let n = 100_000;
        let ones = (0..n).filter(|_| s.sample(&mut rng).0 == 1).count();
        // 25,304 of 33,192 rows are 1-GPU jobs (76%).
        assert!((ones as f64 / n as f64 - 0.762).abs() < 0.01, "{ones}");
        // The trace's mean GPU-seconds per job is 360,612; the histogram should be close.
        let m = s.mean_gpu_seconds();
        assert!((m / 360_612.0 - 1.0).abs() < 0.02, "{m}");
    }

    #[test]
    fn bad_rows_name_row_and_column() {
        let dir = std::env::temp_dir().join(format!("tessera-trace-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp");
        let p = dir.join("t.csv");
        std::fs::write(&p, "idx,duration_s,num_gpus\n0,10,1\n1,abc,2\n").expect("write");
        let e = PhillySampler::from_csv(&p).expect_err("bad").to_string();
        assert!(e.contains("row 2") && e.contains("duration_s"), "{e}");
        std::fs::write(&p, "idx,duration_s\n0,10\n").expect("write");
        let e = PhillySampler::from_csv(&p).expect_err("bad").to_string();
        assert!(e.contains("num_gpus"), "{e}");
        std::fs::write(&p, "idx,duration_s,num_gpus\n0,10,0\n").expect("write");
        assert!(PhillySampler::from_csv(&p).is_err());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
