//! Accounting: the view's clock, jobs' wall-clock times, and GPU and CPU-core time per tenant
//! and user.
//!
//! The core reads no clock. The leader stamps every log entry it writes with its wall clock
//! ([`crate::Command::Clock`]); the view keeps the largest stamp it applied as its clock, so
//! every replica applies the same times, and a leader whose clock is behind its predecessor's
//! never moves the view's clock back. Jobs' times (submitted, placed, started, ended) and the
//! usage ledger are read from that clock.
//!
//! Usage is charged when a placement is released (the job ended, was re-queued, preempted or
//! moved): the span it held, times its GPUs and cores, goes to the job's own spans and to the
//! ledger, split at hour boundaries into buckets per (hour, tenant, user). A placement still
//! held is charged by the query up to the time asked about. The ledger is part of the view
//! (snapshots, state hash), so it survives leader changes, restarts and forgotten jobs; buckets
//! older than the retention are dropped as the clock passes them.

use crate::ids::JobId;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One hour in milliseconds: the ledger's granularity.
pub const HOUR_MS: u64 = 3_600_000;

/// How long the ledger keeps hourly buckets by default: 92 days.
pub const DEFAULT_USAGE_RETENTION_HOURS: u32 = 24 * 92;

/// Resource time: GPU-milliseconds and CPU-core-milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// GPU-milliseconds.
    pub gpu_ms: u64,
    /// CPU-core-milliseconds.
    pub core_ms: u64,
}

impl Usage {
    /// `gpus` GPUs and `cores` cores held for `ms` milliseconds.
    pub fn of(gpus: u32, cores: u32, ms: u64) -> Usage {
        Usage { gpu_ms: ms.saturating_mul(gpus as u64), core_ms: ms.saturating_mul(cores as u64) }
    }

    /// The sum, saturating.
    pub fn add(&mut self, other: Usage) {
        self.gpu_ms = self.gpu_ms.saturating_add(other.gpu_ms);
        self.core_ms = self.core_ms.saturating_add(other.core_ms);
    }

    /// GPU-hours.
    pub fn gpu_hours(&self) -> f64 {
        self.gpu_ms as f64 / HOUR_MS as f64
    }

    /// CPU-core-hours.
    pub fn core_hours(&self) -> f64 {
        self.core_ms as f64 / HOUR_MS as f64
    }

    /// Whether nothing was used.
    pub fn is_zero(&self) -> bool {
        self.gpu_ms == 0 && self.core_ms == 0
    }
}

/// A job's wall-clock times, Unix milliseconds from the view's clock (0: not yet, or applied
/// before the log carried clocks).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobTimes {
    /// When it was admitted.
    pub submitted_ms: u64,
    /// When its current (or last) placement was approved.
    pub placed_ms: u64,
    /// When every member of its current (or last) placement had started.
    pub started_ms: u64,
    /// When it finished, failed or was cancelled.
    pub ended_ms: u64,
}

/// A span during which a job held a placement.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HeldSpan {
    /// From (Unix ms).
    pub from_ms: u64,
    /// Until (Unix ms).
    pub to_ms: u64,
    /// GPUs held.
    pub gpus: u32,
    /// CPU cores held.
    pub cores: u32,
}

impl HeldSpan {
    /// Its usage within `[from_ms, to_ms)`.
    pub fn usage_within(&self, from_ms: u64, to_ms: u64) -> Usage {
        let lo = self.from_ms.max(from_ms);
        let hi = self.to_ms.min(to_ms);
        Usage::of(self.gpus, self.cores, hi.saturating_sub(lo))
    }
}

/// A ledger bucket's key: the hour (Unix ms / [`HOUR_MS`]), the tenant and the user.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct UsageKey {
    /// Hours since the Unix epoch.
    pub hour: u64,
    /// The tenant charged.
    pub tenant: String,
    /// The submitting user ("" when unknown: submitted without an identity).
    pub user: String,
}

/// Hourly usage per tenant and user, bounded by a retention.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Ledger {
    pub(crate) buckets: BTreeMap<UsageKey, Usage>,
    pub(crate) retention_hours: u32,
}

impl Default for Ledger {
    fn default() -> Ledger {
        Ledger { buckets: BTreeMap::new(), retention_hours: DEFAULT_USAGE_RETENTION_HOURS }
    }
}

impl Ledger {
    /// An empty ledger keeping `retention_hours` (at least 1).
    pub fn with_retention(retention_hours: u32) -> Ledger {
        Ledger { buckets: BTreeMap::new(), retention_hours: retention_hours.max(1) }
    }

    /// Rebuilds a ledger from its buckets.
    pub fn from_buckets(retention_hours: u32, buckets: impl IntoIterator<Item = (UsageKey, Usage)>) -> Ledger {
        Ledger {
            buckets: buckets.into_iter().filter(|(_, u)| !u.is_zero()).collect(),
            retention_hours: retention_hours.max(1),
        }
    }

    /// How many hours it keeps.
    pub fn retention_hours(&self) -> u32 {
        self.retention_hours
    }

    /// Every bucket, oldest hour first.
    pub fn buckets(&self) -> impl Iterator<Item = (&UsageKey, &Usage)> {
        self.buckets.iter()
    }

    /// Charges a span to `tenant` and `user`, split at hour boundaries.
    pub fn charge(&mut self, tenant: &str, user: &str, span: &HeldSpan) {
        let mut at = span.from_ms;
        while at < span.to_ms {
            let hour = at / HOUR_MS;
            let end = ((hour + 1) * HOUR_MS).min(span.to_ms);
            let u = Usage::of(span.gpus, span.cores, end - at);
            if !u.is_zero() {
                let key = UsageKey { hour, tenant: tenant.to_string(), user: user.to_string() };
                self.buckets.entry(key).or_default().add(u);
            }
            at = end;
        }
    }

    /// Drops the buckets older than the retention at `now_ms`.
    pub fn prune(&mut self, now_ms: u64) {
        let first_kept = (now_ms / HOUR_MS).saturating_sub(self.retention_hours as u64 - 1);
        while let Some(entry) = self.buckets.first_entry() {
            if entry.key().hour >= first_kept {
                break;
            }
            entry.remove();
        }
    }

    /// The buckets whose hour lies in `[from_ms, to_ms)`, rounded out to whole hours.
    pub fn within(&self, from_ms: u64, to_ms: u64) -> impl Iterator<Item = (&UsageKey, &Usage)> {
        let (first, last) = (from_ms / HOUR_MS, to_ms.div_ceil(HOUR_MS));
        self.buckets.iter().filter(move |(k, _)| k.hour >= first && k.hour < last)
    }
}

/// How usage is grouped in a report.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum UsageBy {
    /// One row per tenant.
    Tenant,
    /// One row per (tenant, user).
    User,
    /// One row per job still in the view.
    Job,
}

impl UsageBy {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            UsageBy::Tenant => "tenant",
            UsageBy::User => "user",
            UsageBy::Job => "job",
        }
    }
}

impl std::str::FromStr for UsageBy {
    type Err = String;
    fn from_str(s: &str) -> Result<UsageBy, String> {
        match s {
            "tenant" => Ok(UsageBy::Tenant),
            "user" => Ok(UsageBy::User),
            "job" => Ok(UsageBy::Job),
            other => Err(format!("unknown grouping `{other}`: tenant, user or job")),
        }
    }
}

/// One row of a usage report.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageRow {
    /// The tenant.
    pub tenant: String,
    /// The user (empty when grouped by tenant, or unknown).
    pub user: String,
    /// The job, when grouped by job.
    pub job: Option<JobId>,
    /// Its usage within the range.
    pub usage: Usage,
}

/// A usage report over a time range.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct UsageReport {
    /// From (Unix ms), rounded down to the hour for the ledger's part.
    pub from_ms: u64,
    /// Until (Unix ms).
    pub to_ms: u64,
    /// How rows are grouped.
    pub by: UsageBy,
    /// Rows, largest GPU time first (ties by tenant, user, job).
    pub rows: Vec<UsageRow>,
    /// The sum of every row.
    pub total: Usage,
}

impl UsageReport {
    /// Sorts the rows, caps them at `limit` and sums the total over every row (also the ones
    /// cut).
    pub(crate) fn new(from_ms: u64, to_ms: u64, by: UsageBy, mut rows: Vec<UsageRow>, limit: usize) -> UsageReport {
        let mut total = Usage::default();
        for r in &rows {
            total.add(r.usage);
        }
        rows.retain(|r| !r.usage.is_zero());
        rows.sort_by(|a, b| {
            b.usage
                .gpu_ms
                .cmp(&a.usage.gpu_ms)
                .then(b.usage.core_ms.cmp(&a.usage.core_ms))
                .then_with(|| (&a.tenant, &a.user, a.job).cmp(&(&b.tenant, &b.user, b.job)))
        });
        rows.truncate(limit);
        UsageReport { from_ms, to_ms, by, rows, total }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(from_ms: u64, to_ms: u64, gpus: u32) -> HeldSpan {
        HeldSpan { from_ms, to_ms, gpus, cores: 2 * gpus }
    }

    #[test]
    fn a_span_is_split_at_hour_boundaries_and_sums_to_the_whole() {
        let mut l = Ledger::default();
        let s = span(HOUR_MS / 2, 2 * HOUR_MS + 60_000, 4);
        l.charge("vision", "ana", &s);
        let hours: Vec<u64> = l.buckets().map(|(k, _)| k.hour).collect();
        assert_eq!(hours, vec![0, 1, 2]);
        let mut sum = Usage::default();
        for (_, u) in l.buckets() {
            sum.add(*u);
        }
        assert_eq!(sum, Usage::of(4, 8, s.to_ms - s.from_ms));
        assert_eq!(l.buckets().next().map(|(_, u)| u.gpu_ms), Some(4 * HOUR_MS / 2));
        // A range rounds out to whole hours.
        let first: u64 = l.within(HOUR_MS, 2 * HOUR_MS).map(|(_, u)| u.gpu_ms).sum();
        assert_eq!(first, 4 * HOUR_MS);
    }

    #[test]
    fn an_empty_span_charges_nothing_and_retention_drops_old_hours() {
        let mut l = Ledger::with_retention(2);
        l.charge("t", "u", &span(5, 5, 8));
        assert_eq!(l.buckets().count(), 0);
        for h in 0..5 {
            l.charge("t", "u", &span(h * HOUR_MS, h * HOUR_MS + 1000, 1));
        }
        l.prune(4 * HOUR_MS + 10);
        let hours: Vec<u64> = l.buckets().map(|(k, _)| k.hour).collect();
        assert_eq!(hours, vec![3, 4], "the current hour and the one before");
    }

    #[test]
    fn a_held_span_is_clipped_to_the_range() {
        let s = span(1_000, 5_000, 2);
        assert_eq!(s.usage_within(0, 10_000).gpu_ms, 8_000);
        assert_eq!(s.usage_within(2_000, 3_000).gpu_ms, 2_000);
        assert_eq!(s.usage_within(6_000, 9_000), Usage::default());
    }

    #[test]
    fn rows_sort_by_gpu_time_and_the_total_counts_rows_cut_by_the_limit() {
        let row = |t: &str, g: u64| UsageRow {
            tenant: t.into(),
            user: String::new(),
            job: None,
            usage: Usage { gpu_ms: g, core_ms: 0 },
        };
        let r = UsageReport::new(0, 1, UsageBy::Tenant, vec![row("a", 1), row("b", 3), row("c", 2), row("d", 0)], 2);
        let names: Vec<&str> = r.rows.iter().map(|r| r.tenant.as_str()).collect();
        assert_eq!(names, vec!["b", "c"]);
        assert_eq!(r.total.gpu_ms, 6);
        assert_eq!("user".parse::<UsageBy>(), Ok(UsageBy::User));
        assert!("team".parse::<UsageBy>().unwrap_err().contains("tenant, user or job"));
    }
}
