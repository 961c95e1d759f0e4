//! `tessera bench agent`: the task path end to end, in one process. One view replica (raft on
//! RocksDB, fsync on), `--servers` fake-GPU agents (seed-8gpu) running in the same process as
//! `tessera dev` will, and a client that keeps every GPU busy with one-GPU jobs running
//! `--command`, following their states through a `Watch` stream. It reports how long a committed
//! placement takes to be seen running and finished, and the jobs completed per second; it exits
//! non-zero if a job fails or the view's invariant checker finds anything.

use anyhow::{Context, Result, bail};
use clap::Args;
use std::collections::HashMap;
use std::process::ExitCode;
use std::time::{Duration, Instant};
use tessera_agent::agent::{AgentConfig, run as run_agent};
use tessera_proto::tls::Role;
use tessera_proto::v1;
use tessera_testkit::LocalCluster;
use tessera_view::{
    ClusterSpec, ClusterView, CoreMask, CpuDemand, Decision, JobId, JobSpec, JobState, LocalityLevel, MemberPlacement,
    Proposal, ProposalId, ServerId, Topology, ViewDelta, ViewSnapshot, ViewVersion, invariants,
};
use tessera_view_server::{Tuning, ViewClient};

#[derive(Args)]
pub struct AgentArgs {
    /// Fake-GPU agents (servers of 8 GPUs), all in this process.
    #[arg(long, default_value_t = 4)]
    servers: u32,
    /// Jobs to run (after one warm-up job per server).
    #[arg(long, default_value_t = 300)]
    jobs: u32,
    /// What each job runs (a shell command line).
    #[arg(long, default_value = "true")]
    command: String,
    /// Print one JSON object.
    #[arg(long)]
    json: bool,
}

pub fn run(args: AgentArgs) -> Result<ExitCode> {
    crate::view::runtime()?.block_on(run_async(args))
}

/// What the watcher saw of each job: when it was first seen running, and how it ended.
#[derive(Default)]
struct Seen {
    running: Option<Instant>,
    ended: Option<(Instant, JobState, Option<String>)>,
}

async fn run_async(args: AgentArgs) -> Result<ExitCode> {
    if args.servers == 0 || args.servers > 64 {
        bail!("--servers must be 1..=64");
    }
    let tmp = tempfile::Builder::new().prefix("tessera-bench-agent-").tempdir()?;
    let dir = tmp.path();
    let spec =
        ClusterSpec::uniform(Topology::preset("seed-8gpu").context("the seed-8gpu preset")?, args.servers, 64, 1);
    let tuning = Tuning { tick_ms: 20, server_lease_ms: 5000, ..Tuning::default() };
    let cluster = LocalCluster::builder(spec).name("bench-agent").tuning(tuning).data_dir(dir).start().await?;
    let addr = cluster.addrs()[0].clone();
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|s| *s).await;
    };
    let mut c =
        ViewClient::new(vec![addr.clone()])?.with_deadline(Duration::from_secs(20)).with_security(cluster.security());
    c.wait_for_leader().await.context("the bench replica elected no leader")?;
    let exe = std::env::current_exe()?.display().to_string();
    let mut agents = Vec::new();
    for s in 0..args.servers {
        let name = format!("rack-0-s{s:02}");
        let cfg = AgentConfig {
            view: vec![addr.clone()],
            security: cluster.security_for(Role::Agent, &name, &[])?,
            name,
            data_dir: dir.join(format!("agent-{s}")),
            topology: Some("seed-8gpu".into()),
            shim: vec![exe.clone(), "agent".into(), "shim".into()],
            stop_grace: Duration::from_secs(2),
            peers_on_loopback: true,
            fake_health_file: None,
            listen: None,
            metrics: Default::default(),
        };
        agents.push(tokio::spawn(run_agent(cfg, stopped(stop_rx.clone()))));
    }

    // Follow every job's state from a snapshot and the watch stream.
    let snap = c.snapshot(true).await?.snapshot.context("no snapshot")?;
    let from = snap.version;
    let mut stream = c.watch(from).await?;
    let (seen_tx, mut seen_rx) = tokio::sync::mpsc::unbounded_channel::<(JobId, JobState, Instant, Option<String>)>();
    tokio::spawn(async move {
        while let Ok(Some(ev)) = stream.message().await {
            let now = Instant::now();
            let jobs = match ev.event {
                Some(v1::watch_event::Event::Delta(d)) => ViewDelta::try_from(d).map(|d| d.jobs).unwrap_or_default(),
                Some(v1::watch_event::Event::Snapshot(s)) => {
                    ViewSnapshot::try_from(s).map(|s| s.jobs).unwrap_or_default()
                }
                None => Vec::new(),
            };
            for j in jobs {
                let _ = seen_tx.send((j.id, j.state, now, j.error));
            }
        }
    });

    let shell = vec!["sh".to_string(), "-c".to_string(), args.command.clone()];
    // Popped from the back: device 0 of every server first, so the warm-up covers each agent.
    let mut free: Vec<(u32, u32)> = (0..8).flat_map(|g| (0..args.servers).map(move |s| (s, g))).rev().collect();
    let mut slot_of: HashMap<JobId, (u32, u32)> = HashMap::new();
    let mut accepted: HashMap<JobId, Instant> = HashMap::new();
    let mut seen: HashMap<JobId, Seen> = HashMap::new();
    let total = args.jobs + args.servers;
    let (mut placed, mut ended, mut next_id) = (0u32, 0u32, 1u64);
    let mut measured_from = None;
    let t_end = Instant::now() + Duration::from_secs(600);
    while ended < total {
        // Warm-up: one job per server first, alone, so agent start-up is not measured.
        let limit = if ended < args.servers { args.servers } else { total };
        while placed < limit && !free.is_empty() {
            let (s, g) = free.pop().context("free slot")?;
            let mut spec = JobSpec::simple(&format!("bench-{placed}"), 1, 1);
            spec.tolerate = LocalityLevel::Any;
            spec.cpu = CpuDemand::Fixed { cores_per_gpu: 1 };
            spec.memory_mib_per_gpu = Some(1024);
            spec.command = shell.clone();
            let r = c.submit(vec![v1::JobSpec::from(&spec)]).await?;
            let job = JobId(r[0].job);
            if !r[0].error.is_empty() {
                bail!("submission refused: {}", r[0].error);
            }
            let p = Proposal {
                id: ProposalId(next_id),
                job,
                members: vec![MemberPlacement {
                    server: ServerId(s),
                    gpus: 1 << g,
                    cores: CoreMask::range(g * 4, 1),
                    memory_mib: 1024,
                }],
                based_on: ViewVersion(0),
            };
            next_id += 1;
            let d = c.propose(vec![v1::Proposal::from(&p)]).await?;
            let decided = d[0].decision.clone().map(tessera_proto::RemoteDecision::try_from).transpose()?;
            if !matches!(decided, Some(Decision::Accepted { .. })) {
                bail!("placement refused: {decided:?}");
            }
            accepted.insert(job, Instant::now());
            slot_of.insert(job, (s, g));
            placed += 1;
        }
        let left = t_end.saturating_duration_since(Instant::now());
        let (job, state, at, error) = tokio::time::timeout(left, seen_rx.recv())
            .await
            .context("jobs did not finish within 10 minutes")?
            .context("the watch stream ended")?;
        let entry = seen.entry(job).or_default();
        if state == JobState::Running && entry.running.is_none() {
            entry.running = Some(at);
        }
        if matches!(state, JobState::Finished | JobState::Failed) && entry.ended.is_none() {
            entry.ended = Some((at, state, error));
            ended += 1;
            if let Some(slot) = slot_of.remove(&job) {
                free.push(slot);
            }
            if ended == args.servers {
                measured_from = Some(Instant::now());
            }
        }
    }
    let wall = measured_from.map_or(0.0, |t| t.elapsed().as_secs_f64());

    // Measured jobs only (ids after the warm-up's).
    let mut start_us = Vec::new();
    let mut done_us = Vec::new();
    let mut failed = Vec::new();
    let mut ids: Vec<&JobId> = accepted.keys().collect();
    ids.sort();
    for id in ids.into_iter().skip(args.servers as usize) {
        let (t0, s) = (accepted[id], &seen[id]);
        if let Some(r) = s.running {
            start_us.push(r.saturating_duration_since(t0).as_micros() as u64);
        }
        if let Some((t, state, err)) = &s.ended {
            done_us.push(t.saturating_duration_since(t0).as_micros() as u64);
            if *state != JobState::Finished {
                failed.push(format!("{id}: {}", err.clone().unwrap_or_default()));
            }
        }
    }
    start_us.sort_unstable();
    done_us.sort_unstable();
    let snap = c.snapshot(true).await?.snapshot.context("no snapshot")?;
    let view = ClusterView::from_snapshot(ViewSnapshot::try_from(snap)?);
    let report = invariants::check(&view);
    let _ = stop_tx.send(true);
    for ag in agents {
        let _ = ag.await;
    }
    cluster.stop().await.context("the bench replica failed")?;
    let pct = tessera_testkit::commit_load::percentile;
    let out = serde_json::json!({
        "servers": args.servers,
        "jobs": args.jobs,
        "command": args.command,
        "completed_per_s": args.jobs as f64 / wall.max(1e-9),
        "wall_s": wall,
        "seen_running": start_us.len(),
        "start_p50_ms": pct(&start_us, 0.5),
        "start_p99_ms": pct(&start_us, 0.99),
        "finish_p50_ms": pct(&done_us, 0.5),
        "finish_p99_ms": pct(&done_us, 0.99),
        "failed": failed.len(),
        "invariant_violations": report.violations.len(),
    });
    if args.json {
        println!("{out}");
    } else {
        println!("{}", serde_json::to_string_pretty(&out)?);
    }
    if !failed.is_empty() || !report.is_clean() {
        eprintln!("bench: failed jobs {failed:?}; violations {:?}", report.violations);
        return Ok(ExitCode::FAILURE);
    }
    Ok(ExitCode::SUCCESS)
}
