//! Job dependencies, arrays and a cancel's grace, end to end, as real processes on loopback: a
//! view replica, two fake-GPU agents and a scheduler host; jobs submitted with the CLI.
//!
//! - A job submitted `--after` another starts only once that one finished: its command fails
//!   unless the first one's output exists, and its placement comes after the first one's end.
//! - A job after one that fails fails too, saying why, without ever being placed.
//! - An array of three runs three tasks, each told its index and the array's size.
//! - `tessera cancel --grace-s 1` stops a task that ignores SIGTERM within about a second, though
//!   its job file gives it ten minutes.

use std::process::Command;
use std::time::{Duration, Instant};
use tessera_view::{JobId, JobState};
use tessera_view_server::Tuning;

mod common;
use common::*;

/// `tessera ARGS` with `flags`: (success, stdout, stderr).
fn run(args: &[&str], flags: &[String]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera")).args(with(args, flags)).output().expect("run tessera");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

/// The first job id `tessera submit` printed ("submitted job N ..." or "submitted jobs N..=M").
fn submitted(out: &str) -> u64 {
    let rest = out.split("submitted job").nth(1).unwrap_or_else(|| panic!("no job in: {out}"));
    let rest = rest.trim_start_matches('s').trim_start();
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().unwrap_or_else(|_| panic!("no job id in: {out}"))
}

fn write_job(dir: &std::path::Path, name: &str, body: &str) -> String {
    let f = dir.join(format!("{name}.toml"));
    std::fs::write(&f, format!("name = '{name}'\ngpus = 1\n{body}\n")).expect("job file");
    f.display().to_string()
}

#[test]
fn dependencies_arrays_and_a_cancel_grace_work_through_the_cli() {
    let dir = test_dir("tessera-lifecycle-");
    let d = dir.path();
    let (view, addr, mut procs, servers) = two_agent_cluster(d, Tuning { server_lease_ms: 3000, ..tuning() });
    let host_tls = tls(&view, Role::Scheduler, "h1");
    procs.push("h1", tessera(d, "h1.log", &with(&["scheduler", "run", "--view", &addr, "--name", "h1"], &host_tls)));
    let admin = tls(&view, Role::Admin, "root");
    let out_dir = d.join("out");
    std::fs::create_dir(&out_dir).expect("out dir");
    let o = out_dir.display().to_string();

    // first runs until the test lets it go (at most 90 s) and leaves its mark; second fails
    // unless the mark is there.
    let first = write_job(
        d,
        "first",
        &format!(
            "command = ['sh', '-c', 'for i in $(seq 900); do [ -e {o}/go ] && break; sleep 0.1; done; touch {o}/first-done']"
        ),
    );
    let second = write_job(d, "second", &format!("command = ['sh', '-c', 'test -e {o}/first-done']"));
    let (ok, out, err) = run(&["submit", "--view", &addr, &first], &admin);
    assert!(ok, "submit first: {out}{err}");
    let a = submitted(&out);
    let (ok, out, err) = run(&["submit", "--view", &addr, "--after", &a.to_string(), &second], &admin);
    assert!(ok, "submit second: {out}{err}");
    let b = submitted(&out);
    // The chain that fails: doomed exits 3, and its follower is failed with it.
    let doomed = write_job(d, "doomed", "command = ['sh', '-c', 'exit 3']");
    let follower = write_job(d, "follower", &format!("command = ['touch', '{o}/follower-ran']"));
    let (ok, out, err) = run(&["submit", "--view", &addr, &doomed], &admin);
    assert!(ok, "submit doomed: {out}{err}");
    let f = submitted(&out);
    let (ok, out, err) = run(&["submit", "--view", &addr, "--after", &f.to_string(), &follower], &admin);
    assert!(ok, "submit follower: {out}{err}");
    let g = submitted(&out);
    // An array of three.
    let arr = write_job(
        d,
        "arr",
        &format!(
            "command = ['sh', '-c', 'echo $TESSERA_ARRAY_INDEX/$TESSERA_ARRAY_SIZE/$TESSERA_ARRAY_JOB_ID > {o}/arr-$TESSERA_ARRAY_INDEX']"
        ),
    );
    let (ok, out, err) = run(&["submit", "--view", &addr, "--array", "3", &arr], &admin);
    assert!(ok && out.contains("an array of 3"), "submit array: {out}{err}");
    let arr0 = submitted(&out);

    // While first runs, second waits for it, and says so; then first may end.
    let (ok, out, err) = run(&["status", "--view", &addr, &b.to_string()], &admin);
    assert!(ok, "status: {out}{err}");
    assert!(out.contains(&format!("waits    for job(s) {a}")) && out.contains("dependency"), "{out}");
    std::fs::write(out_dir.join("go"), "").expect("let first end");

    rt().block_on(async {
        let mut c = admin_client(&view, vec![addr.clone()]);
        let deadline = Instant::now() + Duration::from_secs(90);
        let ended = |s: &tessera_view::ViewSnapshot, id: u64| {
            s.jobs.iter().any(|j| j.id == JobId(id) && matches!(j.state, JobState::Finished | JobState::Failed))
        };
        wait_view(&mut c, deadline, "every job ended", |s| {
            [a, b, f, g, arr0, arr0 + 1, arr0 + 2].iter().all(|id| ended(s, *id))
        })
        .await;
        let s = snapshot(&mut c).await;
        let job = |id: u64| s.jobs.iter().find(|j| j.id == JobId(id)).expect("job kept");
        let (ja, jb) = (job(a), job(b));
        assert_eq!((ja.state, jb.state), (JobState::Finished, JobState::Finished), "{:?}", jb.error);
        assert!(
            jb.times.placed_ms >= ja.times.ended_ms,
            "second placed at {} before first ended at {}",
            jb.times.placed_ms,
            ja.times.ended_ms
        );
        assert!(jb.ready_ms >= ja.times.ended_ms && jb.ready_ms > 0, "{} vs {}", jb.ready_ms, ja.times.ended_ms);
        let jg = job(g);
        assert_eq!(jg.state, JobState::Failed);
        let why = jg.error.as_deref().unwrap_or("");
        assert!(why.starts_with(&format!("job-{f}, which it waited for, failed")), "{why}");
        assert!(jg.times.placed_ms == 0 && jg.held.is_empty(), "the follower was never placed: {:?}", jg.times);
        assert!(!out_dir.join("follower-ran").exists());
        for i in 0..3u64 {
            let j = job(arr0 + i);
            assert_eq!((j.state, j.array_index), (JobState::Finished, Some(i as u32)));
            let seen = std::fs::read_to_string(out_dir.join(format!("arr-{i}"))).expect("the array task wrote");
            assert_eq!(seen.trim(), format!("{i}/3/{arr0}"));
        }
        // A job after a failed one is refused at submission, with what would work instead.
        let (ok, out, err) = run(&["submit", "--view", &addr, "--after", &f.to_string(), &second], &admin);
        assert!(!ok && err.contains("after_any"), "{out}{err}");
        let (ok, out, err) = run(&["submit", "--view", &addr, "--after-any", &f.to_string(), &second], &admin);
        assert!(ok, "after any end of a failed job: {out}{err}");

        // A task that ignores SIGTERM, with ten minutes of grace in its file, stopped in ~1 s.
        let stubborn = write_job(
            d,
            "stubborn",
            &format!("stop_grace_s = 600\ncommand = ['sh', '-c', 'trap \"\" TERM; echo $$ > {o}/pid; exec sleep 600']"),
        );
        let (ok, out, err) = run(&["submit", "--view", &addr, &stubborn], &admin);
        assert!(ok, "submit stubborn: {out}{err}");
        let st = submitted(&out);
        let pid_file = out_dir.join("pid");
        wait_view(&mut c, deadline, "stubborn running", |s| {
            s.jobs.iter().any(|j| j.id == JobId(st) && j.state == JobState::Running)
        })
        .await;
        while !pid_file.exists() {
            assert!(Instant::now() < deadline, "the stubborn task never wrote its pid");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let pid: i32 = std::fs::read_to_string(&pid_file).expect("pid").trim().parse().expect("a pid");
        let cancelled_at = Instant::now();
        let (ok, out, err) = run(&["cancel", "--view", &addr, "--grace-s", "1", &st.to_string()], &admin);
        assert!(ok, "cancel: {out}{err}");
        let alive = |pid: i32| std::path::Path::new(&format!("/proc/{pid}")).exists() && !zombie(pid);
        while alive(pid) {
            assert!(
                cancelled_at.elapsed() < Duration::from_secs(20),
                "the task outlived its cancel's 1 s grace by far\n{}",
                servers
                    .iter()
                    .map(|s| std::fs::read_to_string(d.join(format!("{s}.log"))).unwrap_or_default())
                    .collect::<String>()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let s = snapshot(&mut c).await;
        let j = s.jobs.iter().find(|j| j.id == JobId(st)).expect("stubborn");
        assert_eq!((j.state, j.cancel_grace_s), (JobState::Failed, Some(1)));
        let logs: String =
            servers.iter().map(|s| std::fs::read_to_string(d.join(format!("{s}.log"))).unwrap_or_default()).collect();
        assert!(logs.contains("grace_ms=1000"), "the agent stopped it with the cancel's grace\n{logs}");
    });
}

/// Whether `pid` is a zombie (dead, not yet reaped by its parent).
fn zombie(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit(')').next().map(|r| r.trim_start().starts_with('Z')))
        .unwrap_or(false)
}

/// The history of ended jobs through the CLI, against a real replica process whose view keeps
/// one ended job: the jobs it forgot are listed in end order, a user sees only its tenant's,
/// `tessera status` reads a forgotten job from the history, and all of it survives a kill -9 and
/// restart of the replica.
#[test]
fn jobs_the_view_forgot_are_read_from_the_history_after_a_restart_too() {
    let dir = test_dir("tessera-history-");
    let d = dir.path();
    let mut spec = spec(2);
    spec.accounting.ended_jobs_kept = 1;
    let mut view = cluster(1, spec, tuning(), false, Some(&d.join("view")));
    let addr = view.addrs()[0].clone();
    let admin = tls(&view, Role::Admin, "root");
    let ana = match view.pki() {
        Some(p) => {
            vec!["--tls".into(), p.issue(Role::User, "ana", &["vision"], &[]).expect("cert").display().to_string()]
        }
        None => vec!["--insecure".into()],
    };
    // Four jobs, two of tenant vision, each cancelled at once: the view keeps the last one.
    let mut ids = Vec::new();
    for (i, tenant) in ["vision", "nlp", "vision", "nlp"].iter().enumerate() {
        let f = write_job(d, &format!("h{i}"), &format!("tenant = '{tenant}'\ncommand = ['true']"));
        let (ok, out, err) = run(&["submit", "--view", &addr, &f], &admin);
        assert!(ok, "submit: {out}{err}");
        let id = submitted(&out);
        let (ok, out, err) =
            run(&["cancel", "--view", &addr, "--reason", &format!("done {i}"), &id.to_string()], &admin);
        assert!(ok, "cancel: {out}{err}");
        ids.push(id);
    }
    let listed = |who: &[String]| -> Vec<u64> {
        let (ok, out, err) = run(&["jobs", "--view", &addr, "--history", "--json"], who);
        assert!(ok, "jobs --history: {out}{err}");
        let page: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        page["jobs"].as_array().expect("jobs").iter().map(|j| j["id"].as_u64().expect("id")).collect()
    };
    for round in ["before", "after"] {
        assert_eq!(listed(&admin), ids[..3].to_vec(), "{round} the restart: the three forgotten, in end order");
        assert_eq!(listed(&ana), vec![ids[0], ids[2]], "{round}: a user of vision sees its tenant's only");
        let (ok, out, err) = run(&["status", "--view", &addr, &ids[1].to_string()], &admin);
        assert!(ok && out.contains("done 1") && out.contains("failed"), "{round}: status from the history: {out}{err}");
        let (ok, out, err) = run(&["jobs", "--view", &addr, "--history", "--limit", "2"], &admin);
        assert!(
            ok && out.contains(&format!("--after {}", ids[1])),
            "{round}: a page and where the next starts: {out}{err}"
        );
        if round == "before" {
            view.kill(1).expect("kill -9 the replica");
            view.restart(1).expect("restart it from its RocksDB directory");
            let mut c = admin_client(&view, vec![addr.clone()]);
            rt().block_on(c.wait_for_leader()).expect("a leader again");
        }
    }
}
