//! `tessera usage`: GPU-hours and CPU-core-hours per tenant, user or job over a time range
//! (the `Usage` RPC; `--json` prints the same [`UsageReport`] as `GET /v1/usage`), and the
//! wall-clock helpers the job commands print times with.

use crate::jobs::{ViewArg, rt};
use anyhow::{Context, Result, bail};
use clap::Args;
use std::process::ExitCode;
use tessera_proto::api::UsageReport;
use tessera_proto::v1;

#[derive(Args)]
pub struct UsageArgs {
    #[command(flatten)]
    view: ViewArg,
    /// From: RFC 3339 (`2026-11-01T08:00:00Z`), a UTC date (`2026-11-01`), or an age before
    /// now (`90m`, `24h`, `30d`).
    #[arg(long, default_value = "30d")]
    from: String,
    /// Until, in the same forms; default now.
    #[arg(long)]
    to: Option<String>,
    /// Rows per `tenant`, `user` or `job` (jobs still in the view).
    #[arg(long, default_value = "tenant")]
    by: String,
    /// Only this tenant (repeatable).
    #[arg(long = "tenant")]
    tenants: Vec<String>,
    /// At most this many rows, largest first (the total counts every row).
    #[arg(long, default_value_t = 50)]
    limit: u32,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

/// Unix milliseconds now.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// A point in time given as RFC 3339, a UTC date, or an age before `now_ms` (`90m`, `24h`,
/// `30d`, `45s`).
pub fn parse_when(text: &str, now_ms: u64) -> Result<u64> {
    let t = text.trim();
    if let Some(unit) = t.chars().last().filter(|c| "smhd".contains(*c))
        && let Ok(n) = t[..t.len() - 1].parse::<u64>()
    {
        let ms = match unit {
            's' => 1_000,
            'm' => 60_000,
            'h' => 3_600_000,
            _ => 86_400_000,
        };
        return Ok(now_ms.saturating_sub(n.saturating_mul(ms)));
    }
    let parsed = time::OffsetDateTime::parse(t, &time::format_description::well_known::Rfc3339).or_else(|_| {
        time::Date::parse(t, time::macros::format_description!("[year]-[month]-[day]"))
            .map(|d| d.midnight().assume_utc())
    });
    match parsed {
        Ok(at) if at.unix_timestamp() >= 0 => Ok((at.unix_timestamp_nanos() / 1_000_000) as u64),
        Ok(_) => bail!("`{text}` is before 1970"),
        Err(_) => bail!(
            "`{text}` is not a time: RFC 3339 (2026-11-01T08:00:00Z), a date (2026-11-01) or an age (90m, 24h, 30d)"
        ),
    }
}

/// Unix milliseconds as `2026-11-25 08:01:02 UTC` (`-` for 0: not reached).
pub fn format_ms(ms: u64) -> String {
    if ms == 0 {
        return "-".into();
    }
    let fmt = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second] UTC");
    time::OffsetDateTime::from_unix_timestamp_nanos(ms as i128 * 1_000_000)
        .ok()
        .and_then(|t| t.format(fmt).ok())
        .unwrap_or_else(|| format!("{ms} ms"))
}

/// A duration in milliseconds as `3 s`, `4 min 10 s`, `2 h 5 min`, `3 d 4 h`.
pub fn format_span(ms: u64) -> String {
    let s = ms / 1000;
    match s {
        0..60 => format!("{s} s"),
        60..3600 => format!("{} min {} s", s / 60, s % 60),
        3600..86_400 => format!("{} h {} min", s / 3600, s % 3600 / 60),
        _ => format!("{} d {} h", s / 86_400, s % 86_400 / 3600),
    }
}

pub fn run(args: UsageArgs) -> Result<ExitCode> {
    let now = now_ms();
    let from_ms = parse_when(&args.from, now).context("--from")?;
    let to_ms = match &args.to {
        Some(t) => parse_when(t, now).context("--to")?,
        None => 0,
    };
    if to_ms != 0 && from_ms > to_ms {
        bail!("--from ({}) is after --to ({})", format_ms(from_ms), format_ms(to_ms));
    }
    let req = v1::UsageRequest {
        from_ms,
        to_ms,
        by: args.by.clone(),
        tenants: args.tenants.clone(),
        limit: args.limit,
        linearizable: false,
    };
    rt()?.block_on(async move {
        let mut c = args.view.client()?;
        let report = UsageReport::of(&c.usage(req).await?);
        if args.json {
            println!("{}", serde_json::to_string_pretty(&report)?);
            return Ok(ExitCode::SUCCESS);
        }
        println!("usage from {} to {} by {}", format_ms(report.from_ms), format_ms(report.to_ms), report.by);
        let by_job = report.by == "job";
        println!(
            "{:<16} {:<20} {:>8} {:>12} {:>14}",
            "TENANT",
            if by_job { "USER / JOB" } else { "USER" },
            "",
            "GPU-HOURS",
            "CORE-HOURS"
        );
        for r in &report.rows {
            let who = match r.job {
                Some(j) => format!("{} / {j}", if r.user.is_empty() { "-" } else { &r.user }),
                None if r.user.is_empty() => "-".into(),
                None => r.user.clone(),
            };
            println!("{:<16} {:<20} {:>8} {:>12.2} {:>14.2}", r.tenant, who, "", r.usage.gpu_hours, r.usage.core_hours);
        }
        println!(
            "{:<16} {:<20} {:>8} {:>12.2} {:>14.2}",
            "total", "", "", report.total.gpu_hours, report.total.core_hours
        );
        Ok(ExitCode::SUCCESS)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn times_parse_as_dates_ages_and_rfc3339() {
        let now = 1_764_000_000_000;
        assert_eq!(parse_when("24h", now).expect("age"), now - 86_400_000);
        assert_eq!(parse_when("30d", now).expect("age"), now - 30 * 86_400_000);
        assert_eq!(parse_when("1970-01-02", now).expect("date"), 86_400_000);
        assert_eq!(parse_when("1970-01-01T00:00:01Z", now).expect("rfc 3339"), 1_000);
        let e = parse_when("yesterday", now).expect_err("not a time").to_string();
        assert!(e.contains("not a time") && e.contains("RFC 3339"), "{e}");
        assert_eq!(format_ms(86_400_000), "1970-01-02 00:00:00 UTC");
        assert_eq!(format_ms(0), "-");
        assert_eq!(format_span(125_000), "2 min 5 s");
        assert_eq!(format_span(90_061_000), "1 d 1 h");
    }
}
