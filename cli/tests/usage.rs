//! Accounting end to end, as real processes on loopback: a view replica, two fake-GPU agents
//! and a scheduler host. A user of tenant `vision` submits two jobs with the CLI; they run and
//! finish. Their wall-clock times are in the view in order, `tessera status` prints them, and
//! `tessera usage` charges the GPU time they held to `vision` and the user — the same before
//! and after the replica is killed and restarted (the ledger is replicated state, rebuilt from
//! RocksDB). A user of another tenant may not read `vision`'s usage. A job's environment,
//! working directory and time limit reach its task, and the limit fails it and stops the task.

use std::process::Command;
use std::time::{Duration, Instant};
use tessera_proto::api::UsageReport;
use tessera_view::JobState;
use tessera_view_server::Tuning;

mod common;
use common::*;

/// `tessera ARGS` with `flags`: (success, stdout, stderr).
fn run(args: &[&str], flags: &[String]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera")).args(with(args, flags)).output().expect("run tessera");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

fn usage(addr: &str, flags: &[String], extra: &[&str]) -> UsageReport {
    let mut args = vec!["usage", "--view", addr, "--json"];
    if !extra.contains(&"--from") {
        args.extend(["--from", "1d"]);
    }
    args.extend_from_slice(extra);
    let (ok, out, err) = run(&args, flags);
    assert!(ok, "tessera usage failed: {out}{err}");
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("not a usage report ({e}): {out}"))
}

#[test]
fn finished_jobs_are_charged_to_their_tenant_and_user_across_a_restart() {
    let dir = test_dir("tessera-usage-");
    let d = dir.path();
    let (mut view, addr, mut procs, _servers) = two_agent_cluster(d, Tuning { server_lease_ms: 3000, ..tuning() });
    let host_tls = tls(&view, Role::Scheduler, "h1");
    procs.push("h1", tessera(d, "h1.log", &with(&["scheduler", "run", "--view", &addr, "--name", "h1"], &host_tls)));
    let pki = view.pki().expect("TLS is on").clone();
    let ana =
        vec!["--tls".to_string(), pki.issue(Role::User, "ana", &["vision"], &[]).expect("cert").display().to_string()];
    let bob =
        vec!["--tls".to_string(), pki.issue(Role::User, "bob", &["nlp"], &[]).expect("cert").display().to_string()];
    let admin = tls(&view, Role::Admin, "root");

    // Two 2-GPU jobs that each run for a second.
    let job_file = d.join("train.toml");
    std::fs::write(&job_file, "name = 'train'\ngpus = 2\ncommand = ['sh', '-c', 'sleep 1']\n").expect("job file");
    let file = job_file.display().to_string();
    let (ok, out, err) = run(&["submit", "--view", &addr, &file, &file], &ana);
    assert!(ok, "submit: {out}{err}\n{}", view.logs(20));

    rt().block_on(async {
        let mut c = admin_client(&view, vec![addr.clone()]);
        let deadline = Instant::now() + Duration::from_secs(90);
        wait_view(&mut c, deadline, "both jobs finished", |s| {
            s.jobs.iter().filter(|j| j.spec.name == "train" && j.state == JobState::Finished).count() == 2
        })
        .await;
        let s = snapshot(&mut c).await;
        let jobs: Vec<&tessera_view::Job> = s.jobs.iter().filter(|j| j.spec.name == "train").collect();
        assert_eq!(jobs.len(), 2, "two jobs");
        for j in &jobs {
            assert_eq!(j.state, JobState::Finished, "{}", j.id);
            assert_eq!((j.user.as_str(), j.spec.tenant.as_str()), ("ana", "vision"), "the identity's, not the body's");
            let t = j.times;
            assert!(
                0 < t.submitted_ms
                    && t.submitted_ms <= t.placed_ms
                    && t.placed_ms <= t.started_ms
                    && t.started_ms <= t.ended_ms,
                "{}: times out of order: {t:?}",
                j.id
            );
            assert!(t.ended_ms - t.started_ms >= 900, "{}: ran {} ms, slept 1 s", j.id, t.ended_ms - t.started_ms);
            let held: u64 = j.held.iter().map(|h| h.to_ms - h.from_ms).sum();
            assert!(held >= t.ended_ms - t.started_ms && j.held.iter().all(|h| h.gpus == 2), "{}: {:?}", j.id, j.held);
        }
        let expect_gpu_ms: u64 = jobs.iter().flat_map(|j| j.held.iter().map(|h| (h.to_ms - h.from_ms) * 2)).sum();

        // `tessera status` prints the times.
        let id = jobs[0].id.0.to_string();
        let (ok, out, err) = run(&["status", "--view", &addr, &id], &ana);
        assert!(ok && out.contains("submitted") && out.contains("ended") && out.contains("GPU-hours"), "{out}{err}");

        // By user: one row, ana of vision, exactly the spans' GPU time (nothing else ran).
        let by_user = usage(&addr, &ana, &["--by", "user"]);
        assert_eq!(by_user.rows.len(), 1, "{by_user:?}");
        let row = &by_user.rows[0];
        assert_eq!((row.tenant.as_str(), row.user.as_str()), ("vision", "ana"));
        assert_eq!(row.usage.gpu_ms, expect_gpu_ms, "{by_user:?}");
        assert!(row.usage.core_ms > 0, "cores are charged too: {row:?}");
        // By job: the two jobs, the same total.
        let by_job = usage(&addr, &admin, &["--by", "job"]);
        let ids: Vec<Option<u64>> = by_job.rows.iter().map(|r| r.job).collect();
        assert!(jobs.iter().all(|j| ids.contains(&Some(j.id.0))), "{by_job:?}");
        assert_eq!(by_job.total.gpu_ms, expect_gpu_ms);
        // A range before the jobs ran holds none of it.
        let before = usage(&addr, &admin, &["--from", "1970-01-01", "--to", "1970-01-02"]);
        assert_eq!(before.total.gpu_ms, 0, "{before:?}");

        // bob (tenant nlp) may not read vision's usage, and reads only nlp's by default.
        let (ok, out, err) = run(&["usage", "--view", &addr, "--tenant", "vision"], &bob);
        assert!(!ok && err.contains("may not") && err.contains("vision"), "{out}{err}");
        assert_eq!(usage(&addr, &bob, &[]).total.gpu_ms, 0);

        // The ledger is replicated state: the same after the replica restarts from RocksDB.
        let tenant_before = usage(&addr, &admin, &[]);
        view.kill(1).expect("kill the replica");
        view.restart(1).expect("restart it");
        let mut c = admin_client(&view, vec![addr.clone()]);
        c.wait_for_leader().await.expect("leader again");
        let deadline = Instant::now() + Duration::from_secs(30);
        wait_view(&mut c, deadline, "the jobs back", |s| s.jobs.iter().filter(|j| j.spec.name == "train").count() == 2)
            .await;
        let tenant_after = usage(&addr, &admin, &[]);
        assert_eq!(tenant_after.rows, tenant_before.rows, "the ledger changed across a restart");
        assert_eq!(tenant_after.rows[0].usage.gpu_ms, expect_gpu_ms);
    });
}

#[test]
fn a_job_runs_with_its_env_and_workdir_and_fails_at_its_time_limit() {
    let dir = test_dir("tessera-limit-");
    let d = dir.path();
    let (view, addr, mut procs, servers) = two_agent_cluster(d, Tuning { server_lease_ms: 3000, ..tuning() });
    let host_tls = tls(&view, Role::Scheduler, "h1");
    procs.push("h1", tessera(d, "h1.log", &with(&["scheduler", "run", "--view", &addr, "--name", "h1"], &host_tls)));
    let admin = tls(&view, Role::Admin, "root");
    let work = d.join("work");
    std::fs::create_dir(&work).expect("workdir");
    let job_file = d.join("limited.toml");
    std::fs::write(
        &job_file,
        format!(
            "name = 'limited'\ngpus = 1\nenv = {{ GREETING = 'hello' }}\nworkdir = '{}'\ntime_limit_s = 2\n\
             command = ['sh', '-c', 'echo $GREETING; pwd; exec sleep 60']\n",
            work.display()
        ),
    )
    .expect("job file");
    let (ok, out, err) = run(&["submit", "--view", &addr, &job_file.display().to_string()], &admin);
    assert!(ok, "submit: {out}{err}");

    rt().block_on(async {
        let mut c = admin_client(&view, vec![addr.clone()]);
        let deadline = Instant::now() + Duration::from_secs(60);
        wait_view(&mut c, deadline, "the job failed by its limit", |s| {
            s.jobs.iter().any(|j| j.spec.name == "limited" && j.state == JobState::Failed)
        })
        .await;
        let s = snapshot(&mut c).await;
        let j = s.jobs.iter().find(|j| j.spec.name == "limited").expect("job");
        assert!(j.error.as_deref().is_some_and(|e| e.contains("time limit of 2 s")), "{:?}", j.error);
        let held = j.times.ended_ms - j.times.placed_ms;
        // The leader writes the clock within a housekeeping round of the deadline.
        assert!((2_000..10_000).contains(&held), "held {held} ms for a 2 s limit: {:?}", j.times);
        // Its agent stops the task.
        loop {
            if servers.iter().all(|s| live_tasks(&d.join(format!("agent-{s}"))).is_empty()) {
                break;
            }
            assert!(Instant::now() < deadline, "the task outlived its time limit");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let id = j.id.0.to_string();
        let (ok, out, err) = run(&["logs", "--view", &addr, &id], &admin);
        let real = std::fs::canonicalize(&work).expect("canonical");
        assert!(ok && out.contains("hello") && out.contains(&real.display().to_string()), "{out}{err}");
    });
}
