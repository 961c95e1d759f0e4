//! The user's commands: `tessera submit | status | jobs | servers | cancel | logs`.
//!
//! Each talks gRPC to the view (`--view` or `TESSERA_VIEW`, comma-separated replicas; writes
//! follow the leader). An unreachable view is one line naming the addresses tried. `--json`
//! prints the HTTP API's types ([`tessera_proto::api`]): `status` a `Status` (with a job id, a
//! `JobDetail`), `jobs` a `JobList`, `servers` a `ServerList`, the same as `GET /v1/status`,
//! `/v1/jobs/{id}`, `/v1/jobs` and `/v1/servers`.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tessera_proto::api::{self, GpuCounts, JobDetail, JobList};
use tessera_proto::{trace, v1};
use tessera_scheduler::ViewCache;
use tessera_view::mask::format_indices;
use tessera_view::{Health, Job, JobId, JobSpec, JobState, ViewSnapshot};
use tessera_view_server::ViewClient;
use tessera_view_server::client::ClientError;
use tracing::Instrument;

/// Where the view is.
#[derive(Args, Clone)]
pub struct ViewArg {
    /// View replica addresses, comma-separated `host:port`.
    #[arg(long, env = "TESSERA_VIEW", default_value = "127.0.0.1:7101,127.0.0.1:7102,127.0.0.1:7103")]
    pub view: String,
    #[command(flatten)]
    pub security: crate::tls::SecurityArgs,
}

impl ViewArg {
    pub(crate) fn client(&self) -> Result<ViewClient> {
        self.security.apply(ViewClient::from_list(&self.view)?.with_deadline(Duration::from_secs(5)), "the CLI")
    }
}

#[derive(Args)]
pub struct SubmitArgs {
    #[command(flatten)]
    view: ViewArg,
    /// Job files (TOML).
    #[arg(required = true)]
    files: Vec<PathBuf>,
    /// Wait until every job ends, with a live progress line; exit non-zero if one fails.
    #[arg(long)]
    wait: bool,
    /// With --wait: give up waiting after this many seconds.
    #[arg(long, default_value_t = 3600)]
    timeout_s: u64,
    /// Place each job only after these jobs finished (comma-separated ids; one that fails
    /// fails it too; an array's first id stands for the array). Replaces the files' `after`.
    #[arg(long, value_delimiter = ',')]
    after: Option<Vec<u64>>,
    /// Place each job only after these jobs ended, in any state. Replaces the files' `after_any`.
    #[arg(long, value_delimiter = ',')]
    after_any: Option<Vec<u64>>,
    /// Submit each file as an array of this many jobs (`TESSERA_ARRAY_INDEX` 0..N-1).
    #[arg(long)]
    array: Option<u32>,
}

#[derive(Args)]
pub struct StatusArgs {
    #[command(flatten)]
    view: ViewArg,
    /// A job id: that job in detail. Without: the cluster in brief.
    job: Option<u64>,
    /// Print JSON.
    #[arg(long)]
    json: bool,
    /// With a job id: its trace id (to find its spans in the OTLP back end) and the timeline of
    /// its life, each step with the component that took it and the time since submission.
    #[arg(long, requires = "job")]
    trace: bool,
}

#[derive(Args)]
pub struct ListArgs {
    #[command(flatten)]
    view: ViewArg,
    /// Print JSON.
    #[arg(long)]
    json: bool,
}

#[derive(Args)]
pub struct JobsArgs {
    #[command(flatten)]
    list: ListArgs,
    /// Only these states, comma-separated (pending, placed, running, migrating, finished, failed).
    #[arg(long)]
    state: Option<String>,
    /// Only this tenant's jobs.
    #[arg(long)]
    tenant: Option<String>,
    /// Only this submitter's jobs.
    #[arg(long)]
    user: Option<String>,
    /// Only ids above this (the previous page's last id).
    #[arg(long)]
    after: Option<u64>,
    /// Jobs per page, at most 10,000.
    #[arg(long, default_value_t = 1000)]
    limit: usize,
    /// List the jobs the view forgot instead (ended, past the cluster's `ended_jobs_kept`),
    /// from the replica's history, in the order they ended; pages go on with
    /// `--after-ended-ms MS --after ID` as printed.
    #[arg(long, conflicts_with = "state")]
    history: bool,
    /// With --history: jobs that ended since (`7d`, `12h`, a date, RFC 3339).
    #[arg(long, requires = "history")]
    from: Option<String>,
    /// With --history: jobs that ended before this.
    #[arg(long, requires = "history")]
    to: Option<String>,
    /// With --history and --after: the end time of the job named by --after.
    #[arg(long, requires = "history", default_value_t = 0)]
    after_ended_ms: u64,
}

#[derive(Args)]
pub struct CancelArgs {
    #[command(flatten)]
    view: ViewArg,
    /// The jobs (one or more ids).
    #[arg(required = true)]
    jobs: Vec<u64>,
    /// Why (kept as the jobs' error).
    #[arg(long, default_value = "")]
    reason: String,
    /// Seconds the jobs' tasks get between SIGTERM and SIGKILL (default: each job's
    /// `stop_grace_s`, else the agent's).
    #[arg(long, value_parser = clap::value_parser!(u64).range(..=tessera_view::job::MAX_STOP_GRACE_S))]
    grace_s: Option<u64>,
    /// Each id is an array's first job: cancel every job of the array still live.
    #[arg(long)]
    array: bool,
}

#[derive(Args)]
pub struct LogsArgs {
    #[command(flatten)]
    view: ViewArg,
    /// The job.
    job: u64,
    /// The member (rank).
    #[arg(long, default_value_t = 0)]
    member: u32,
    /// Standard error instead of standard output.
    #[arg(long)]
    stderr: bool,
    /// Bytes from the end of the log.
    #[arg(long, default_value_t = 65_536)]
    tail_bytes: u64,
}

pub(crate) fn rt() -> Result<tokio::runtime::Runtime> {
    crate::view::runtime()
}

/// The whole view (linearizable) and the raft index it reflects.
pub(crate) async fn snapshot(c: &mut ViewClient) -> Result<(ViewSnapshot, u64)> {
    let r = c.snapshot(true).await?;
    let s = r.snapshot.context("the view sent no snapshot")?;
    Ok((ViewSnapshot::try_from(s)?, r.applied_index))
}

/// Reads and checks job files; every problem names the file, the line and the field.
fn read_specs(files: &[PathBuf]) -> Result<Vec<JobSpec>, String> {
    let mut specs = Vec::new();
    let mut errors = Vec::new();
    for f in files {
        match JobSpec::from_file(f) {
            Ok(s) => specs.push(s),
            Err(e) => errors.push(e.to_string()),
        }
    }
    if errors.is_empty() { Ok(specs) } else { Err(errors.join("\n")) }
}

pub fn submit(args: SubmitArgs) -> Result<ExitCode> {
    let specs = match read_specs(&args.files).and_then(|s| with_flags(s, &args)) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("{e}");
            return Ok(ExitCode::from(2));
        }
    };
    rt()?.block_on(async move {
        let mut c = args.view.client()?;
        let (ids, refused) = submit_files(&mut c, &specs, &args.files).await?;
        if !args.wait || ids.is_empty() {
            return Ok(if refused > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS });
        }
        let failed = wait_for(&c, &ids, Duration::from_secs(args.timeout_s)).await?;
        Ok(if failed > 0 || refused > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
    })
}

/// The files' specs with the command line's `--after`, `--after-any` and `--array` applied,
/// checked again.
fn with_flags(specs: Vec<JobSpec>, args: &SubmitArgs) -> Result<Vec<JobSpec>, String> {
    specs
        .into_iter()
        .map(|mut s| {
            if let Some(a) = &args.after {
                s.after = a.iter().copied().map(JobId).collect();
            }
            if let Some(a) = &args.after_any {
                s.after_any = a.iter().copied().map(JobId).collect();
            }
            if args.array.is_some() {
                s.array = args.array;
            }
            s.validate().map_err(|e| format!("{}: {e}", s.name))?;
            Ok(s)
        })
        .collect()
}

/// Submits checked specs read from `files`; prints each job's id (an array's ids) or why it
/// was refused, and answers the admitted jobs' ids (every member of an array) and how many
/// specs were refused.
///
/// The submission is a `cli.submit` span, the root of the jobs' trace, or a child of the
/// caller's when `TRACEPARENT` is set (a pipeline that submits jobs inside its own trace).
pub async fn submit_files(c: &mut ViewClient, specs: &[JobSpec], files: &[PathBuf]) -> Result<(Vec<JobId>, usize)> {
    let span = tracing::info_span!(target: trace::TARGET, "cli.submit", specs = specs.len());
    let outer = std::env::var("TRACEPARENT").unwrap_or_default();
    if let Some(cx) = trace::remote_from(|k| (k == trace::TRACEPARENT).then_some(outer.as_str())) {
        trace::set_parent(&span, cx);
    }
    let results = c.submit(specs.iter().map(v1::JobSpec::from).collect()).instrument(span).await?;
    let mut ids = Vec::new();
    let mut refused = 0;
    for ((r, spec), f) in results.iter().zip(specs).zip(files) {
        if r.error.is_empty() {
            let all = api::Submitted::of(r.job, spec).jobs;
            let what = match all.last() {
                Some(last) if all.len() > 1 => format!("jobs {}..={last} (an array of {})", r.job, all.len()),
                _ => format!("job {}", r.job),
            };
            let waits = if spec.after.is_empty() && spec.after_any.is_empty() {
                String::new()
            } else {
                let list = |v: &[JobId]| v.iter().map(|j| j.0.to_string()).collect::<Vec<_>>().join(",");
                format!(", after [{}] after_any [{}]", list(&spec.after), list(&spec.after_any))
            };
            println!("submitted {what} `{}` ({} GPUs each{waits}) from {}", spec.name, spec.total_gpus(), f.display());
            ids.extend(all.into_iter().map(JobId));
        } else {
            eprintln!("{}: refused ({}): {}", f.display(), api::refusal_code(r.refusal()), r.error);
            refused += 1;
        }
    }
    Ok((ids, refused))
}

/// Follows jobs until each ends, redrawing one progress line; prints each job's end. Answers
/// how many failed.
pub async fn wait_for(c: &ViewClient, ids: &[JobId], timeout: Duration) -> Result<usize> {
    let cache = ViewCache::connect(c.clone()).await?;
    let start = Instant::now();
    let mut reported = std::collections::HashSet::new();
    let mut failed = 0;
    let tty = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let mut last_line = String::new();
    // Where each job ran: its placement is gone from the view once it ends.
    let mut ran_on: std::collections::HashMap<JobId, String> = std::collections::HashMap::new();
    loop {
        let (line, ended): (String, Vec<Job>) = cache.read(|s| {
            let mut counts = [0usize; 6];
            let mut ended = Vec::new();
            for id in ids {
                let Some(j) = s.jobs.get(id) else { continue };
                if let Some(p) = &j.placement {
                    let members: Vec<String> = p
                        .members
                        .iter()
                        .map(|m| format!("{}[{}]", s.server_name(m.server), format_indices(m.gpus)))
                        .collect();
                    ran_on.insert(j.id, format!("{} ({})", members.join(" "), p.level));
                }
                counts[j.state as usize] += 1;
                if matches!(j.state, JobState::Finished | JobState::Failed) && !reported.contains(id) {
                    ended.push(j.clone());
                }
            }
            let line = format!(
                "[{:>5.1}s] {} jobs: {} pending, {} placed, {} running, {} finished, {} failed",
                start.elapsed().as_secs_f64(),
                ids.len(),
                counts[JobState::Pending as usize],
                counts[JobState::Placed as usize] + counts[JobState::Migrating as usize],
                counts[JobState::Running as usize],
                counts[JobState::Finished as usize],
                counts[JobState::Failed as usize]
            );
            (line, ended)
        });
        for j in ended {
            reported.insert(j.id);
            if j.state == JobState::Failed {
                failed += 1;
            }
            let why = j.error.as_deref().map(|e| format!(": {e}")).unwrap_or_default();
            let on = ran_on.get(&j.id).map(|w| format!(" on {w}")).unwrap_or_default();
            if tty {
                eprint!("\r\x1b[2K");
            }
            println!("job {} `{}` {}{on}{why}", j.id.0, j.spec.name, j.state.as_str());
        }
        if tty {
            eprint!("\r\x1b[2K{line}");
            let _ = std::io::stderr().flush();
        } else if line != last_line && start.elapsed() > Duration::from_millis(1) {
            // Not a terminal: a line only when the counts change, without the clock.
            let counts = line.split_once("] ").map(|(_, r)| r.to_string()).unwrap_or_default();
            if last_line.split_once("] ").map(|(_, r)| r) != Some(counts.as_str()) {
                eprintln!("{line}");
            }
        }
        last_line = line;
        if reported.len() == ids.len() {
            if tty {
                eprintln!();
            }
            return Ok(failed);
        }
        if start.elapsed() > timeout {
            bail!("gave up waiting after {} s: {}", timeout.as_secs(), last_line);
        }
        let seen = cache.version();
        cache.changed_since(seen, Duration::from_millis(250)).await;
    }
}

fn placement_text(j: &Job, s: &ViewSnapshot) -> String {
    match &j.placement {
        None => "-".into(),
        Some(p) => {
            let members: Vec<String> = p
                .members
                .iter()
                .map(|m| {
                    let n = s.server_names.get(m.server.index()).cloned().unwrap_or_else(|| m.server.to_string());
                    format!("{n}[{}]", format_indices(m.gpus))
                })
                .collect();
            format!("{} ({})", members.join(" "), p.level)
        }
    }
}

/// `status JOB --trace`: the trace to look up, then each step at its offset from the first.
fn print_trace(d: &JobDetail) {
    use crate::usage::{format_ms, format_span};
    let j = &d.job;
    println!("job {} `{}`: {}", j.id, j.name, j.state.as_str());
    match (&d.trace_id, &d.traceparent) {
        (Some(id), Some(parent)) => println!("  trace    {id} (admitted under traceparent {parent})"),
        _ => println!("  trace    none (admitted by a release that recorded no traces)"),
    }
    let first = d.timeline.first().map_or(0, |s| s.at_ms);
    for s in &d.timeline {
        let since = s.at_ms.saturating_sub(first);
        let offset = if since < 60_000 {
            format!("+{:.3} s", since as f64 / 1000.0)
        } else {
            format!("+{}", format_span(since))
        };
        println!("  {offset:>12}  {:<9} {:<9} {}  {}", s.step, s.by, format_ms(s.at_ms), s.detail);
    }
}

/// A job's times, as `status` prints them: submitted, placed (with the wait), started, ended
/// (with the run time), and the GPU time its placements held.
fn time_lines(j: &Job, now_ms: u64) -> Vec<String> {
    use crate::usage::{format_ms, format_span};
    let t = j.times;
    let mut out = Vec::new();
    if t.submitted_ms == 0 {
        return out;
    }
    out.push(format!("submitted {}", format_ms(t.submitted_ms)));
    if t.placed_ms != 0 {
        let first = j.held.first().map_or(t.placed_ms, |s| s.from_ms);
        out.push(format!(
            "placed    {} (waited {})",
            format_ms(t.placed_ms),
            format_span(first.saturating_sub(t.submitted_ms))
        ));
    }
    if t.started_ms != 0 {
        out.push(format!("started   {}", format_ms(t.started_ms)));
    }
    if t.ended_ms != 0 {
        out.push(format!(
            "ended     {} (after {} in all)",
            format_ms(t.ended_ms),
            format_span(t.ended_ms.saturating_sub(t.submitted_ms))
        ));
    }
    let used = j.usage_within(0, u64::MAX, if t.ended_ms != 0 { t.ended_ms } else { now_ms });
    if !used.is_zero() {
        out.push(format!("used      {:.2} GPU-hours, {:.2} core-hours", used.gpu_hours(), used.core_hours()));
    }
    out
}

pub fn status(args: StatusArgs) -> Result<ExitCode> {
    rt()?.block_on(async move {
        let mut c = args.view.client()?;
        if let Some(id) = args.job {
            // GetJob: a user may read its tenants' jobs, not the whole view. Server names come
            // from the view when the caller may read it (else `#id`).
            let (j, waiting) = match c.job(id, false).await {
                Ok(r) => (Job::try_from(r.job.context("the view sent no job")?)?, r.waiting),
                Err(ClientError::Status { status, .. }) if status.code() == tonic::Code::NotFound => {
                    bail!("no job {id} in the view (never submitted, or ended long ago)")
                }
                Err(e) => return Err(e.into()),
            };
            let j = &j;
            let server_names = match snapshot(&mut c).await {
                Ok((s, _)) => s.server_names,
                Err(_) => Vec::new(),
            };
            let waiting = waiting.as_ref().map(api::WaitInfo::of_wire);
            if args.trace && !args.json {
                print_trace(&JobDetail::of(j, &server_names));
                return Ok(ExitCode::SUCCESS);
            }
            if args.json {
                let mut detail = JobDetail::of(j, &server_names);
                detail.waiting = waiting;
                println!("{}", serde_json::to_string_pretty(&detail)?);
                return Ok(ExitCode::SUCCESS);
            }
            let spec = &j.spec;
            println!("job {} `{}`: {}", j.id.0, spec.name, j.state.as_str());
            println!(
                "  asks     {} x {} GPUs{}, prefer {}, tolerate {}{}",
                spec.members,
                spec.gpus_per_member,
                spec.gpu_type.as_ref().map(|t| format!(" of {t}")).unwrap_or_default(),
                spec.prefer,
                spec.tolerate,
                spec.relax_after_s.map(|r| format!(" (relax every {r} s)")).unwrap_or_default()
            );
            println!("  scheduler {}", spec.scheduler.as_deref().unwrap_or("(the host's default)"));
            if !j.user.is_empty() {
                println!("  user     {} (tenant {})", j.user, spec.tenant);
            }
            if let Some(limit) = spec.run.time_limit_s {
                let until =
                    j.deadline_ms().map(|d| format!(" (until {})", crate::usage::format_ms(d))).unwrap_or_default();
                println!("  limit    {limit} s per placement{until}");
            }
            if let Some(r) = &spec.run.restart {
                let next = if j.not_before_ms > crate::usage::now_ms() && j.state == JobState::Pending {
                    format!("; placed again from {}", crate::usage::format_ms(j.not_before_ms))
                } else {
                    String::new()
                };
                println!(
                    "  restart  {} of {} restarts used (after a failure, first wait {} s, doubling){next}",
                    j.restarts, r.max, r.backoff_s
                );
            }
            if let Some(g) = spec.run.stop_grace_s {
                println!("  grace    {g} s from SIGTERM to SIGKILL when stopped");
            }
            if let (Some(i), Some(first)) = (j.array_index, j.array_first()) {
                println!("  array    index {i} of {} (the array is jobs {first}..)", spec.array.unwrap_or(1));
            }
            for (what, deps) in [("after", &spec.after), ("after_any", &spec.after_any)] {
                if !deps.is_empty() {
                    let ids: Vec<String> = deps.iter().map(|d| d.0.to_string()).collect();
                    println!("  {what:<8} {}", ids.join(", "));
                }
            }
            if !j.waiting_for.is_empty() {
                let ids: Vec<String> = j.waiting_for.iter().map(|(d, _)| d.0.to_string()).collect();
                println!("  waits    for job(s) {} to end", ids.join(", "));
            }
            if let Some(w) = &spec.run.workdir {
                println!("  workdir  {w}");
            }
            if !spec.run.env.is_empty() {
                let names: Vec<&str> = spec.run.env.keys().map(String::as_str).collect();
                println!("  env      {}", names.join(" "));
            }
            for line in time_lines(j, crate::usage::now_ms()) {
                println!("  {line}");
            }
            println!(
                "  priority {}{}{}{}",
                spec.priority,
                spec.class.as_ref().map(|c| format!(" (class {c})")).unwrap_or_default(),
                if j.service_queue > 0 { format!(", service queue {}", j.service_queue) } else { String::new() },
                if j.preemptions > 0 { format!(", preempted {} times", j.preemptions) } else { String::new() }
            );
            if let Some(p) = &j.placement {
                println!("  placed   at {} (proposal {:x})", p.level, p.proposal.0);
                for (rank, m) in p.members.iter().enumerate() {
                    let n = api::server_name(&server_names, m.server.0);
                    let task = j.tasks.get(rank).map(|t| format!("{t:?}").to_lowercase()).unwrap_or_default();
                    println!(
                        "    rank {rank}: {n} GPUs {} cores {} memory {} MiB  {task}",
                        format_indices(m.gpus),
                        m.cores.format(),
                        m.memory_mib
                    );
                }
            }
            if let Some(w) = &waiting {
                println!("  waiting  {}: {}", w.reason, w.message);
                println!(
                    "           place {} in the queue, waited {}",
                    w.position + 1,
                    crate::usage::format_span(w.waited_ms)
                );
            }
            if let Some(e) = &j.error {
                println!("  error    {e}");
            }
            return Ok(ExitCode::SUCCESS);
        }
        let (s, _) = snapshot(&mut c).await?;
        let gpus = GpuCounts::of(&s);
        let up = s.servers.iter().filter(|r| r.health == Health::Up).count();
        let mut st = c.status().await?;
        // Scheduler hosts are known to the leader only.
        if st.role != "leader"
            && !st.leader_addr.is_empty()
            && let Ok(l) = c.status_of(&st.leader_addr.clone()).await
        {
            st = l;
        }
        let hosts: Vec<String> =
            st.scheduler_hosts.iter().map(|h| format!("{} ({} pending jobs)", h.host, h.jobs.len())).collect();
        if args.json {
            println!("{}", serde_json::to_string(&api::Status::of(&st, &s))?);
        } else {
            println!("cluster {} — leader replica {} at {} (term {})", st.cluster, st.leader, st.leader_addr, st.term);
            let servers = s.servers.iter().filter(|r| r.health != Health::Removed).count();
            println!("servers {servers} ({up} up), GPUs {} ({} free)", gpus.total, gpus.free);
            let jobs: Vec<String> =
                api::jobs_by_state(&s).iter().filter(|(_, v)| **v > 0).map(|(k, v)| format!("{v} {k}")).collect();
            println!("jobs    {}", if jobs.is_empty() { "none".to_string() } else { jobs.join(", ") });
            println!(
                "schedulers holding jobs: {}",
                if hosts.is_empty() { "none".to_string() } else { hosts.join(", ") }
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub fn jobs(args: JobsArgs) -> Result<ExitCode> {
    if args.limit == 0 || args.limit > api::MAX_JOB_PAGE {
        bail!("--limit must be 1 to {}", api::MAX_JOB_PAGE);
    }
    if args.history {
        return history(args);
    }
    let filter = api::JobFilter {
        states: match &args.state {
            Some(s) => api::JobFilter::parse_states(s).map_err(anyhow::Error::msg)?,
            None => Vec::new(),
        },
        tenant: args.tenant.clone(),
        user: args.user.clone(),
        after: args.after,
        limit: args.limit,
    };
    let args = args.list;
    rt()?.block_on(async move {
        let mut c = args.view.client()?;
        let (s, applied) = snapshot(&mut c).await?;
        let mut list = JobList::of(&s, applied);
        filter.apply(&mut list);
        if args.json {
            println!("{}", serde_json::to_string(&list)?);
            return Ok(ExitCode::SUCCESS);
        }
        let shown: std::collections::HashSet<u64> = list.jobs.iter().map(|j| j.id).collect();
        let mut jobs: Vec<&Job> = s.jobs.iter().filter(|j| shown.contains(&j.id.0)).collect();
        jobs.sort_by_key(|j| j.id);
        let now = crate::usage::now_ms();
        println!("{:>6} {:<9} {:>5} {:<24} {:<12} {:>12} PLACEMENT", "ID", "STATE", "GPUS", "NAME", "TENANT", "AGE");
        for j in jobs {
            // Since submission, until now or the end.
            let age = match j.times {
                t if t.submitted_ms == 0 => "-".to_string(),
                t if t.ended_ms != 0 => crate::usage::format_span(t.ended_ms.saturating_sub(t.submitted_ms)),
                t => crate::usage::format_span(now.saturating_sub(t.submitted_ms)),
            };
            println!(
                "{:>6} {:<9} {:>5} {:<24} {:<12} {:>12} {}",
                j.id.0,
                j.state.as_str(),
                j.spec.total_gpus(),
                j.spec.name,
                j.spec.tenant,
                age,
                placement_text(j, &s)
            );
        }
        if let Some(next) = list.next_after {
            println!("{} of {} jobs shown; next page: --after {next}", list.jobs.len(), list.total);
        }
        Ok(ExitCode::SUCCESS)
    })
}

/// `tessera jobs --history`: a page of the jobs the view forgot, in the order they ended.
fn history(args: JobsArgs) -> Result<ExitCode> {
    let now = crate::usage::now_ms();
    let when = |t: &Option<String>| t.as_deref().map(|t| crate::usage::parse_when(t, now)).transpose();
    let req = v1::HistoryRequest {
        from_ms: when(&args.from)?.unwrap_or(0),
        to_ms: when(&args.to)?.unwrap_or(0),
        tenants: args.tenant.iter().cloned().collect(),
        user: args.user.clone().unwrap_or_default(),
        after_ended_ms: args.after_ended_ms,
        after_job: args.after.unwrap_or(0),
        limit: args.limit as u32,
    };
    let json = args.list.json;
    rt()?.block_on(async move {
        let mut c = args.list.view.client()?;
        let page = api::JobHistory::of(&c.history(req).await?);
        if json {
            println!("{}", serde_json::to_string(&page)?);
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "{:>6} {:<9} {:>5} {:<24} {:<12} {:<12} {:<20} ERROR",
            "ID", "STATE", "GPUS", "NAME", "TENANT", "USER", "ENDED"
        );
        for j in &page.jobs {
            let error: String = j.error.as_deref().unwrap_or("-").chars().take(60).collect();
            println!(
                "{:>6} {:<9} {:>5} {:<24} {:<12} {:<12} {:<20} {error}",
                j.id,
                j.state.as_str(),
                j.gpus,
                j.name,
                j.tenant,
                j.user,
                j.ended_ms.map(crate::usage::format_ms).unwrap_or_else(|| "-".into()),
            );
        }
        if let (Some(ms), Some(id)) = (page.next_after_ended_ms, page.next_after_job) {
            println!("{} jobs shown; next page: --history --after-ended-ms {ms} --after {id}", page.jobs.len());
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub fn servers(args: ListArgs, filter: api::ServerFilter) -> Result<ExitCode> {
    rt()?.block_on(async move {
        let mut c = args.view.client()?;
        let (s, _) = snapshot(&mut c).await?;
        let list = filter.list(&s);
        if args.json {
            println!("{}", serde_json::to_string(&list)?);
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "{:<16} {:<8} {:<16} {:<8} {:<20} {:>9} {:>12}  CORDON",
            "NAME", "HEALTH", "TYPE", "RACK", "GPUS (x used . free)", "CORES", "MEMORY MIB"
        );
        for r in &list.servers {
            let cordon = match &r.cordon {
                Some(c) if c.drain_by_ms.is_some() => format!("draining: {}", c.reason),
                Some(c) => format!("cordoned: {}", c.reason),
                None => "-".into(),
            };
            println!(
                "{:<16} {:<8} {:<16} {:<8} {:<20} {:>9} {:>12}  {}",
                r.name,
                r.health.as_str(),
                r.device_type,
                r.rack,
                r.gpu_bitmap,
                format!("{}/{}", r.cores_free, r.cores),
                r.memory_free_mib,
                cordon
            );
        }
        if let Some(next) = list.next_after {
            println!("{} of {} servers shown; next page: --after {next}", list.servers.len(), list.total);
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub fn cancel(args: CancelArgs) -> Result<ExitCode> {
    rt()?.block_on(async move {
        let mut c = args.view.client()?;
        let mut ids = Vec::new();
        for &id in &args.jobs {
            if !args.array {
                ids.push(id);
                continue;
            }
            let j = c.job(id, true).await?.job.context("no job in the answer")?;
            let j = Job::try_from(j)?;
            match (j.array_index, j.spec.array) {
                (Some(0), Some(n)) => ids.extend(id..id.saturating_add(u64::from(n))),
                _ => bail!("job {id} is not the first job of an array (give its first id, or drop --array)"),
            }
        }
        let mut failed = 0;
        for id in ids {
            match c.cancel_with(id, &args.reason, args.grace_s).await {
                Ok(_) => println!("cancelled job {id}"),
                // An array member that already ended (or was forgotten since) is no failure of
                // `--array`.
                Err(ClientError::Status { status, .. })
                    if args.array
                        && matches!(status.code(), tonic::Code::FailedPrecondition | tonic::Code::NotFound) =>
                {
                    println!("job {id} had already ended")
                }
                Err(e) => {
                    eprintln!("job {id}: {e}");
                    failed += 1;
                }
            }
        }
        Ok(if failed > 0 { ExitCode::FAILURE } else { ExitCode::SUCCESS })
    })
}

/// The tail of a member's log: from the agent of the member's server while the job holds a
/// placement, otherwise from whichever agent still has it.
pub async fn fetch_logs(
    c: &mut ViewClient,
    job: u64,
    member: u32,
    stderr: bool,
    tail: u64,
) -> Result<v1::LogsResponse> {
    let req = v1::LogsRequest { job, member, stderr, tail_bytes: tail };
    let j = c.job(job, true).await?.job.context("no job in the answer")?;
    if let Some(p) = &j.placement {
        let m = p
            .members
            .get(member as usize)
            .with_context(|| format!("job {job} has {} members; no member {member}", p.members.len()))?;
        return Ok(c.logs(m.server, req).await?);
    }
    // Ended (or re-queued): ask every agent; the newest task directory wins on each.
    let mut last = None;
    for a in c.agents().await? {
        match c.logs_at(&a.addr, req).await {
            Ok(r) => return Ok(r),
            Err(e) => last = Some(e),
        }
    }
    match last {
        Some(e) => bail!("no agent has logs of job {job} member {member} (last answer: {e})"),
        None => bail!("no agent has registered an address to ask for logs"),
    }
}

pub fn logs(args: LogsArgs) -> Result<ExitCode> {
    rt()?.block_on(async move {
        let mut c = args.view.client()?;
        let r = fetch_logs(&mut c, args.job, args.member, args.stderr, args.tail_bytes).await?;
        if r.truncated {
            eprintln!(
                "... ({} bytes before the last {} left out; --tail-bytes for more)",
                r.size - r.data.len() as u64,
                r.data.len()
            );
        }
        std::io::stdout().write_all(&r.data)?;
        Ok(ExitCode::SUCCESS)
    })
}
