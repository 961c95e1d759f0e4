//! Node operations end to end, as real processes on loopback: a view replica, two fake-GPU
//! agents and a scheduler host. A job runs; `tessera servers drain` gives it 2 s; the leader
//! re-queues it whole when the deadline passes and the host places it on the other server.
//! The drained server's agent is killed (the server goes down) and restarted: the cordon
//! holds (draining, not up) until `tessera servers uncordon`. `tessera servers show` lists
//! the server's history, and `tessera servers` marks the cordon.

use std::process::Command;
use std::time::{Duration, Instant};
use tessera_proto::api::ServerDetail;
use tessera_proto::v1;
use tessera_view::{Health, JobId, JobSpec, JobState, ServerId};
use tessera_view_server::Tuning;

mod common;
use common::*;

/// `tessera ARGS` to its end: (success, stdout + stderr).
/// `tessera ARGS` as the cluster's admin.
fn cli(view: &tessera_testkit::ProcessCluster, args: &[&str]) -> (bool, String) {
    let flags = tls(view, Role::Admin, "admin");
    let out = Command::new(env!("CARGO_BIN_EXE_tessera")).args(with(args, &flags)).output().expect("run tessera");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

fn server_of(s: &tessera_view::ViewSnapshot, job: JobId) -> Option<ServerId> {
    let j = s.jobs.iter().find(|j| j.id == job)?;
    (j.state == JobState::Running).then(|| j.placement.as_ref().map(|p| p.members[0].server)).flatten()
}

/// Submits a 2-GPU job that sleeps two minutes and waits for it to run: the job and its server.
async fn long_job_running(c: &mut tessera_view_server::ViewClient, deadline: Instant) -> (JobId, ServerId) {
    let mut spec = JobSpec::simple("long", 1, 2);
    spec.command = vec!["sh".into(), "-c".into(), "sleep 120".into()];
    let r = c.submit(vec![v1::JobSpec::from(&spec)]).await.expect("submit");
    assert!(r[0].error.is_empty(), "{}", r[0].error);
    let job = JobId(r[0].job);
    let mut on = None;
    wait_view(c, deadline, "the job running", |s| {
        on = server_of(s, job);
        on.is_some()
    })
    .await;
    (job, on.expect("placed"))
}

#[test]
fn a_drained_servers_gang_moves_and_its_cordon_outlives_the_agent() {
    let dir = test_dir("tessera-drain-");
    let d = dir.path();
    let tuning = Tuning { server_lease_ms: 2000, scheduler_lease_ms: 1000, ..tuning() };
    let (view, addr, mut procs, servers) = two_agent_cluster(d, tuning);
    let host_tls = tls(&view, Role::Scheduler, "h1");
    let host = with(&["scheduler", "run", "--view", &addr, "--name", "h1"], &host_tls);
    procs.push("h1", tessera(d, "h1.log", &host));

    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut c = admin_client(&view, vec![addr.clone()]);
        c.wait_for_leader().await.expect("leader");
        wait_view(&mut c, deadline, "servers up", |s| s.servers.iter().all(|r| r.health == Health::Up)).await;
        loop {
            if c.agents().await.map(|a| a.len()).unwrap_or(0) == servers.len() {
                break;
            }
            assert!(Instant::now() < deadline, "agents did not register");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        let (job, first) = long_job_running(&mut c, deadline).await;
        let name = servers[first.index()];
        let other = ServerId(1 - first.0);
        assert_eq!(live_tasks(&d.join(format!("agent-{name}"))).len(), 1, "the job's task runs on {name}");

        // The other server fills up, so the drain finds the job no early home.
        let mut filler = JobSpec::simple("filler", 1, 8);
        filler.command = vec!["sh".into(), "-c".into(), "sleep 120".into()];
        let r = c.submit(vec![v1::JobSpec::from(&filler)]).await.expect("submit");
        let filler = JobId(r[0].job);
        wait_view(&mut c, deadline, "the filler running on the other server", |s| server_of(s, filler) == Some(other))
            .await;

        // Drain with a 2 s deadline: the job cannot finish in time nor move, and is re-queued
        // whole at the deadline; once the filler is gone it is placed on the other server (the
        // drained one takes nothing new).
        let (ok, out) =
            cli(&view, &["servers", "drain", name, "--view", &addr, "--timeout-s", "2", "--reason", "swap a PSU"]);
        assert!(ok && out.contains(&format!("draining {name}")), "{out}");
        let t0 = Instant::now();
        wait_view(&mut c, deadline, "the job re-queued", |s| {
            s.jobs.iter().any(|j| j.id == job && j.state == JobState::Pending)
        })
        .await;
        assert!(t0.elapsed() >= Duration::from_millis(1500), "re-queued before the deadline: {:?}", t0.elapsed());
        c.cancel(filler.0).await.expect("cancel the filler");
        wait_view(&mut c, deadline, "the job running on the other server", |s| server_of(s, job) == Some(other)).await;
        let s = snapshot(&mut c).await;
        let j = s.jobs.iter().find(|j| j.id == job).expect("job");
        assert_eq!(j.proposals.len(), 2, "placed twice: {j:?}");
        assert_eq!(s.servers[first.index()].health, Health::Draining);
        // The drained server's agent stopped the evicted task (within its 2 s stop grace).
        let data = d.join(format!("agent-{name}"));
        while !live_tasks(&data).is_empty() {
            assert!(t0.elapsed() < Duration::from_secs(15), "the evicted task still runs on {name}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }

        let (ok, out) = cli(&view, &["servers", "--view", &addr]);
        assert!(ok && out.lines().any(|l| l.starts_with(name) && l.contains("draining: swap a PSU")), "{out}");

        // The drained server's agent dies: the server goes down; back, it stays cordoned.
        procs.kill(name);
        wait_view(&mut c, deadline, "the drained server down", |s| s.servers[first.index()].health == Health::Down)
            .await;
        procs.push(name, agent(d, &addr, name, &tls(&view, Role::Agent, name)));
        loop {
            if c.agents().await.map(|a| a.iter().any(|x| x.name == name)).unwrap_or(false) {
                let s = snapshot(&mut c).await;
                if s.servers[first.index()].health != Health::Down {
                    break;
                }
            }
            assert!(Instant::now() < deadline, "the agent did not come back");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(snapshot(&mut c).await.servers[first.index()].health, Health::Draining, "the cordon held");

        let (ok, out) = cli(&view, &["servers", "show", name, "--view", &addr, "--json"]);
        assert!(ok, "{out}");
        let detail: ServerDetail = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
        let cordon = detail.server.cordon.as_ref().expect("cordoned");
        assert_eq!(cordon.reason, "swap a PSU");
        assert!(cordon.drain_by_ms.is_some_and(|by| by >= cordon.since_ms + 2000), "{cordon:?}");
        let whats: Vec<&str> = detail.history.iter().map(|h| h.why.as_str()).collect();
        for want in ["draining by", "drain deadline passed: 1 gang(s) re-queued", "down", "up, cordoned"] {
            assert!(whats.iter().any(|w| w.starts_with(want)), "no `{want}` in the history: {whats:?}");
        }
        assert!(detail.history.iter().all(|h| h.at_ms > 0), "every change has a time: {:?}", detail.history);
        let (ok, out) = cli(&view, &["servers", "show", name, "--view", &addr]);
        assert!(ok && out.contains("history") && out.contains("swap a PSU"), "{out}");

        let (ok, out) = cli(&view, &["servers", "uncordon", name, "--view", &addr]);
        assert!(ok && out.contains(&format!("uncordoned {name}")), "{out}");
        wait_view(&mut c, deadline, "the server up", |s| s.servers[first.index()].health == Health::Up).await;
        let (ok, out) = cli(&view, &["servers", "cordon", "no-such-server", "--view", &addr]);
        assert!(!ok && out.contains("no server `no-such-server`"), "{out}");
    });
    drop(view);
}

/// A drain with room elsewhere moves the gang at once, long before its deadline: whole, by a
/// migration (its task stopped on the drained server, started on the other), never re-queued.
#[test]
fn a_drain_moves_a_gang_early_when_another_server_has_room() {
    let dir = test_dir("tessera-drain-move-");
    let d = dir.path();
    let (view, addr, mut procs, servers) = two_agent_cluster(d, tuning());
    let host_tls = tls(&view, Role::Scheduler, "h1");
    procs.push("h1", tessera(d, "h1.log", &with(&["scheduler", "run", "--view", &addr, "--name", "h1"], &host_tls)));
    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(90);
        let mut c = admin_client(&view, vec![addr.clone()]);
        c.wait_for_leader().await.expect("leader");
        let (job, first) = long_job_running(&mut c, deadline).await;
        let name = servers[first.index()];
        let other = ServerId(1 - first.0);
        let (ok, out) = cli(&view, &["servers", "drain", name, "--view", &addr, "--timeout-s", "3600"]);
        assert!(ok, "{out}");
        wait_view(&mut c, deadline, "the job running on the other server", |s| server_of(s, job) == Some(other)).await;
        let s = snapshot(&mut c).await;
        let j = s.jobs.iter().find(|j| j.id == job).expect("job");
        assert_eq!(j.proposals.len(), 2, "placed, then moved: {j:?}");
        assert_eq!(j.restarts, 0, "moved, not re-queued: {j:?}");
        let data = d.join(format!("agent-{name}"));
        while !live_tasks(&data).is_empty() {
            assert!(Instant::now() < deadline, "the moved task still runs on {name}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (ok, out) = cli(&view, &["servers", "show", name, "--view", &addr, "--json"]);
        assert!(ok, "{out}");
        let detail: ServerDetail = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert!(detail.history.iter().all(|h| !h.why.contains("deadline passed")), "{:?}", detail.history);
    });
    drop(view);
}
