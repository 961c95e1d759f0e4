//! The cluster's layout changed while it runs, as real processes on loopback: a view replica,
//! two fake-GPU (seed-8gpu) agents and a scheduler host. `tessera config-sets add` brings a
//! new GPU type, `tessera servers add` a server of it; a job of that type (refused before)
//! waits until the server's agent registers with the right topology (one with another is
//! refused), then runs there. The server cannot be removed while the job runs; drained and
//! empty it is removed, its agent is turned away for good, and the set goes after it.

use std::process::{Child, Command};
use std::time::{Duration, Instant};
use tessera_proto::api::{ConfigSetList, LayoutChanged};
use tessera_proto::v1;
use tessera_view::{Health, JobId, JobSpec, JobState, ServerId};
use tessera_view_server::Tuning;

mod common;
use common::*;

/// `tessera ARGS` as the cluster's admin, to its end: (success, stdout + stderr).
fn cli(view: &tessera_testkit::ProcessCluster, args: &[&str]) -> (bool, String) {
    let flags = tls(view, Role::Admin, "admin");
    let out = Command::new(env!("CARGO_BIN_EXE_tessera")).args(with(args, &flags)).output().expect("run tessera");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    (out.status.success(), text)
}

/// Waits (bounded) for `child` to exit; its exit status.
fn exited(child: &mut Child, within: Duration) -> std::process::ExitStatus {
    let deadline = Instant::now() + within;
    loop {
        if let Some(st) = child.try_wait().expect("wait") {
            return st;
        }
        assert!(Instant::now() < deadline, "the process did not exit within {within:?}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn servers_and_configuration_sets_are_added_and_removed_on_a_running_cluster() {
    let dir = test_dir("tessera-layout-");
    let d = dir.path();
    let tuning = Tuning { server_lease_ms: 2000, scheduler_lease_ms: 1000, ..tuning() };
    let (view, addr, mut procs, _) = two_agent_cluster(d, tuning);
    let host_tls = tls(&view, Role::Scheduler, "h1");
    procs.push("h1", tessera(d, "h1.log", &with(&["scheduler", "run", "--view", &addr, "--name", "h1"], &host_tls)));

    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut c = admin_client(&view, vec![addr.clone()]);
        c.wait_for_leader().await.expect("leader");
        wait_view(&mut c, deadline, "servers up", |s| s.servers.iter().all(|r| r.health == Health::Up)).await;

        let mut a100 = JobSpec::simple("a100", 1, 1);
        a100.gpu_type = Some("nvidia-a100-40g".into());
        a100.command = vec!["sh".into(), "-c".into(), "sleep 120".into()];
        let r = c.submit(vec![v1::JobSpec::from(&a100)]).await.expect("submit");
        assert!(r[0].error.contains("never fit"), "no A100 yet: {:?}", r[0]);

        // A configuration set of A100 servers in a new rack, then one server of it.
        let (ok, out) = cli(
            &view,
            &["config-sets", "add", "--view", &addr, "--rack", "r9", "--ib-domain", "ib-9", "--topology", "pcie-4gpu"],
        );
        assert!(ok && out.contains("added configuration set 1"), "{out}");
        let (ok, out) = cli(
            &view,
            &["config-sets", "add", "--view", &addr, "--rack", "r0", "--ib-domain", "ib-7", "--topology", "pcie-4gpu"],
        );
        assert!(!ok && out.contains("rack `r0` is in InfiniBand domain"), "{out}");
        let (ok, out) =
            cli(&view, &["servers", "add", "--view", &addr, "--config-set", "r9/pcie-4gpu", "--count", "1", "--json"]);
        assert!(ok, "{out}");
        let added: LayoutChanged = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(added.servers, vec!["r9-s00".to_string()]);
        let (ok, out) = cli(&view, &["servers", "add", "--view", &addr, "--config-set", "1", "r9-s00"]);
        assert!(!ok && out.contains("server `r9-s00` already exists"), "{out}");
        let (ok, out) = cli(&view, &["config-sets", "--view", &addr, "--json"]);
        assert!(ok, "{out}");
        let sets: ConfigSetList = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out}"));
        assert_eq!(
            sets.config_sets.iter().map(|s| (s.name.as_str(), s.servers)).collect::<Vec<_>>(),
            [("r0/seed-8gpu", 2), ("r9/pcie-4gpu", 1)]
        );
        let new = ServerId(2);
        assert_eq!(snapshot(&mut c).await.servers[new.index()].health, Health::Down, "down until its agent registers");

        // Admitted now; it waits for the server's agent. An agent with another topology is
        // turned away; one with the set's comes up and the job runs there.
        let r = c.submit(vec![v1::JobSpec::from(&a100)]).await.expect("submit");
        assert!(r[0].error.is_empty(), "{:?}", r[0]);
        let job = JobId(r[0].job);
        let agent_tls = tls(&view, Role::Agent, "r9-s00");
        let agent_tls: Vec<&str> = agent_tls.iter().map(String::as_str).collect();
        let mut wrong = agent_of(d, &addr, "r9-s00", "seed-8gpu", &agent_tls);
        assert!(!exited(&mut wrong, Duration::from_secs(30)).success(), "an agent of the wrong topology registered");
        let log = std::fs::read_to_string(d.join("r9-s00-seed-8gpu.log")).expect("log");
        assert!(log.contains("differs from its configuration set"), "{log}");
        procs.push("r9-s00", agent_of(d, &addr, "r9-s00", "pcie-4gpu", &agent_tls));
        wait_view(&mut c, deadline, "the A100 job running on the new server", |s| {
            s.jobs.iter().any(|j| {
                j.id == job
                    && j.state == JobState::Running
                    && j.placement.as_ref().is_some_and(|p| p.members[0].server == new)
            })
        })
        .await;

        // Busy: refused. Drained and empty: removed; its agent is turned away and exits.
        let (ok, out) = cli(&view, &["servers", "remove", "--view", &addr, "r9-s00"]);
        assert!(!ok && out.contains("still hosts job(s)") && out.contains("drain it first"), "{out}");
        let (ok, out) = cli(&view, &["servers", "drain", "r9-s00", "--view", &addr, "--timeout-s", "1"]);
        assert!(ok, "{out}");
        wait_view(&mut c, deadline, "the job re-queued", |s| {
            s.jobs.iter().any(|j| j.id == job && j.state == JobState::Pending)
        })
        .await;
        let (ok, out) = cli(&view, &["servers", "remove", "--view", &addr, "r9-s00"]);
        assert!(ok && out.contains("removed r9-s00"), "{out}");
        let s = snapshot(&mut c).await;
        assert_eq!(s.servers[new.index()].health, Health::Removed);
        let agent = procs.children.iter_mut().find(|(n, _)| n == "r9-s00").map(|(_, c)| c).expect("the agent");
        assert!(!exited(agent, Duration::from_secs(30)).success(), "the removed server's agent kept running");
        let log = std::fs::read_to_string(d.join("r9-s00-pcie-4gpu.log")).expect("log");
        assert!(log.contains("was removed from the cluster"), "{log}");

        let (ok, out) = cli(&view, &["servers", "--view", &addr]);
        assert!(ok && !out.contains("r9-s00") && out.contains("r0-s01"), "{out}");
        let (ok, out) = cli(&view, &["servers", "--view", &addr, "--health", "removed"]);
        assert!(ok && out.contains("r9-s00"), "{out}");
        let (ok, out) = cli(&view, &["config-sets", "remove", "--view", &addr, "r9/pcie-4gpu"]);
        assert!(ok && out.contains("removed configuration set 1"), "{out}");
        // The job of the removed type still waits (nothing is cancelled for it).
        let s = snapshot(&mut c).await;
        assert_eq!(s.jobs.iter().find(|j| j.id == job).map(|j| j.state), Some(JobState::Pending));
        c.cancel_because(job.0, "test over").await.expect("cancel");
    });
    drop(view);
}
