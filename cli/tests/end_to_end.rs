//! The whole system as real processes on loopback: 3 view replicas (`tessera view serve`),
//! 4 fake-GPU node agents (`tessera agent run`, running real shell tasks) and 3 scheduler hosts
//! (`tessera scheduler run`).
//!
//! `thirty_jobs_through_a_leader_kill_and_a_host_kill`: 30 jobs of 1–16 GPUs with mixed
//! locality needs are submitted (some with the `tessera submit` CLI, the rest through the API);
//! a scheduler host that the leader says holds pending jobs is killed with `kill -9`, and later
//! the view leader. Every job must finish, the dead host's jobs placed by the other hosts. A watcher follows the view's change stream from version 0
//! (re-subscribing across the leader kill) and checks at every step that no GPU or core is held
//! by two jobs; every placement is within its job's tolerance; the 16-GPU `tolerate = "rack"`
//! job lands in one rack. Then the CLI's read commands run against the same cluster.

use std::collections::HashMap;
use std::process::{Child, Command};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tessera_proto::v1;
use tessera_view::{ClusterSpec, CpuDemand, JobId, JobSpec, JobState, LocalityLevel, ViewSnapshot};
use tessera_view_server::{Tuning, ViewClient};

mod common;
use common::*;

/// Kills every child on drop (a failed assertion must not leave processes behind).
struct Procs(Vec<(String, Option<Child>)>);

impl Procs {
    fn kill(&mut self, name: &str) {
        for (n, c) in &mut self.0 {
            if n == name
                && let Some(mut c) = c.take()
            {
                c.kill().expect("kill -9");
                c.wait().expect("reap");
            }
        }
    }
}

impl Drop for Procs {
    fn drop(&mut self) {
        for (_, c) in &mut self.0 {
            if let Some(c) = c.as_mut() {
                let _ = c.kill();
                let _ = c.wait();
            }
        }
    }
}

/// The 30 jobs: sizes 1–16 GPUs, various tolerances, each running a short real command.
fn jobs() -> Vec<JobSpec> {
    let shapes: [(u32, u32, LocalityLevel, LocalityLevel); 10] = [
        (1, 1, LocalityLevel::PcieSwitch, LocalityLevel::Any),
        (1, 2, LocalityLevel::PcieSwitch, LocalityLevel::Socket),
        (1, 4, LocalityLevel::Socket, LocalityLevel::Server),
        (2, 2, LocalityLevel::Server, LocalityLevel::Rack),
        (1, 8, LocalityLevel::Server, LocalityLevel::Server),
        (1, 1, LocalityLevel::PcieSwitch, LocalityLevel::PcieSwitch),
        (4, 1, LocalityLevel::Server, LocalityLevel::Any),
        (2, 4, LocalityLevel::Rack, LocalityLevel::Rack),
        (1, 2, LocalityLevel::PcieSwitch, LocalityLevel::Any),
        (1, 4, LocalityLevel::Socket, LocalityLevel::Socket),
    ];
    let mut out = Vec::new();
    for i in 0..29 {
        let (members, g, prefer, tolerate) = shapes[i % shapes.len()];
        let mut s = JobSpec::simple(&format!("e2e-{i}"), members, g);
        s.prefer = prefer;
        s.tolerate = tolerate;
        s.cpu = CpuDemand::Fixed { cores_per_gpu: 2 };
        s.memory_mib_per_gpu = Some(1024);
        // Work for 1-2.5 s, printing the launch environment (checked through `tessera logs`).
        s.command = vec![
            "sh".into(),
            "-c".into(),
            format!("echo rank $RANK of $WORLD_SIZE gpus $CUDA_VISIBLE_DEVICES; sleep 1.{}", (i * 3) % 10 + 2),
        ];
        out.push(s);
    }
    out
}

fn h_placed(h: &Arc<Mutex<History>>, job: JobId) -> bool {
    h.lock().expect("history").placements.contains_key(&job)
}

#[test]
fn thirty_jobs_through_a_leader_kill_and_a_host_kill() {
    let dir = test_dir("tessera-e2e-");
    let d = dir.path();
    // 4 servers of 8 GPUs: two racks of two.
    let spec = ClusterSpec::from_toml(
        "e2e",
        "name = \"e2e\"\n[[racks]]\nname = \"ra\"\nib_domain = \"ib0\"\ntopology = \"seed-8gpu\"\nservers = 2\n\
         [[racks]]\nname = \"rb\"\nib_domain = \"ib0\"\ntopology = \"seed-8gpu\"\nservers = 2\n",
        None,
    )
    .expect("spec");
    let tuning = Tuning { server_lease_ms: 3000, scheduler_lease_ms: 2000, ..tuning() };
    let mut replicas = cluster(3, spec, tuning, true, Some(&d.join("view")));
    let addrs = replicas.addrs();
    let mut procs = Procs(Vec::new());
    let view = addrs.join(",");
    for s in ["ra-s00", "ra-s01", "rb-s00", "rb-s01"] {
        procs.0.push((s.to_string(), Some(agent(d, &view, s, &tls(&replicas, Role::Agent, s)))));
    }
    for h in ["h1", "h2", "h3"] {
        let host_tls = tls(&replicas, Role::Scheduler, h);
        let args = with(&["scheduler", "run", "--view", &view, "--name", h, "--max-jobs", "6"], &host_tls);
        procs.0.push((h.to_string(), Some(tessera(d, &format!("{h}.log"), &args))));
    }

    let admin = tls(&replicas, Role::Admin, "admin");
    let rt = rt();
    rt.block_on(async {
        let mut c = admin_client(&replicas, addrs.clone());
        c.wait_for_leader().await.expect("leader");
        let watcher = Followed::start(c.clone());

        // The 16-GPU rack job through the CLI, from a file, like a user would.
        let file = d.join("big.toml");
        std::fs::write(
            &file,
            "name = \"big-16\"\ngpus = 16\nmembers = 2\ncommand = [\"sh\", \"-c\", \"echo big rank $RANK; sleep 2\"]\n\
             [locality]\nprefer = \"rack\"\ntolerate = \"rack\"\n[cpu]\ncores_per_gpu = 2\n",
        )
        .expect("job file");
        let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
            .args(["submit", "--view", &view])
            .args(&admin)
            .arg(&file)
            .output()
            .expect("tessera submit");
        assert!(out.status.success(), "tessera submit: {}", String::from_utf8_lossy(&out.stderr));
        let text = String::from_utf8_lossy(&out.stdout);
        let big: u64 =
            text.split_whitespace().nth(2).and_then(|w| w.parse().ok()).unwrap_or_else(|| panic!("job id in {text:?}"));
        let specs = jobs();
        let results = c.submit(specs.iter().map(v1::JobSpec::from).collect()).await.expect("submit");
        let mut ids: Vec<JobId> = results
            .iter()
            .map(|r| {
                assert!(r.error.is_empty(), "refused: {}", r.error);
                JobId(r.job)
            })
            .collect();
        ids.push(JobId(big));
        let tolerate: HashMap<JobId, LocalityLevel> = ids
            .iter()
            .zip(specs.iter().map(|s| s.tolerate).chain([LocalityLevel::Rack]))
            .map(|(j, t)| (*j, t))
            .collect();

        let ended = |c: &mut ViewClient| {
            let mut c = c.clone();
            let ids = ids.clone();
            async move {
                // A linearizable read can time out while a new leader is elected: ask again.
                let s = c.snapshot(true).await.ok()?.snapshot.expect("body");
                let s = ViewSnapshot::try_from(s).expect("snapshot");
                let done = s.jobs.iter().filter(|j| ids.contains(&j.id) && j.state == JobState::Finished).count();
                let failed: Vec<String> = s
                    .jobs
                    .iter()
                    .filter(|j| ids.contains(&j.id) && j.state == JobState::Failed)
                    .map(|j| format!("{}: {:?}", j.id, j.error))
                    .collect();
                Some((done, failed))
            }
        };
        let deadline = Instant::now() + Duration::from_secs(240);
        let mut killed_leader = false;
        // A host holding pending jobs is killed first; its jobs must be placed by the others.
        let orphans: Vec<u64> = loop {
            assert!(Instant::now() < deadline, "no scheduler host ever held a job");
            let st = c.wait_for_leader().await.expect("leader");
            let st = c.status_of(&st.leader_addr).await.unwrap_or(st);
            if let Some(h) = st.scheduler_hosts.iter().find(|h| h.host == "h1" && !h.jobs.is_empty()) {
                procs.kill("h1");
                break h.jobs.clone();
            }
            let mut w = c.clone();
            let _ = tokio::time::timeout(Duration::from_millis(500), async move {
                if let Ok(mut s) = w.watch(st.version).await {
                    let _ = s.message().await;
                }
            })
            .await;
        };
        loop {
            assert!(Instant::now() < deadline, "jobs did not finish in time");
            let Some((done, failed)) = ended(&mut c).await else { continue };
            assert!(failed.is_empty(), "jobs failed: {failed:?}");
            if done == ids.len() {
                break;
            }
            assert!(Instant::now() < deadline, "only {done} of {} jobs finished in time", ids.len());
            if !killed_leader && done >= 8 {
                let st = c.wait_for_leader().await.expect("leader");
                replicas.kill(st.leader).expect("kill -9 the leader");
                killed_leader = true;
            }
            let v = c.status().await.map(|s| s.version).unwrap_or(0);
            // Wait for the view to change rather than a fixed time.
            let mut w = c.clone();
            let _ = tokio::time::timeout(Duration::from_secs(2), async move {
                if let Ok(mut st) = w.watch(v).await {
                    let _ = st.message().await;
                }
            })
            .await;
        }
        assert!(killed_leader, "the leader was killed before all jobs finished");
        // The dead host's pending jobs were adopted and placed by the others (all finished).
        for j in &orphans {
            assert!(h_placed(watcher.history(), JobId(*j)), "job {j} held by the killed host was never placed");
        }
        let h = watcher.stop().await;
        assert!(h.violations.is_empty(), "double allocation or a gap in the history: {:?}", h.violations);
        // Every job was seen placed, within its tolerance.
        for id in &ids {
            let seen = h.placements.get(id).unwrap_or_else(|| panic!("job {id} never seen placed"));
            for (_, level) in seen {
                assert!(*level <= tolerate[id], "job {id} placed at {level}, tolerates {}", tolerate[id]);
            }
        }
        let big_levels = &h.placements[&JobId(big)];
        assert!(big_levels.iter().all(|(_, l)| *l <= LocalityLevel::Rack), "16-GPU job in one rack: {big_levels:?}");
        drop(h);

        // The read commands against the same cluster.
        let run = |args: &[&str]| {
            let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
                .args(args)
                .args(["--view", &view])
                .args(&admin)
                .output()
                .expect("run");
            assert!(out.status.success(), "tessera {args:?}: {}", String::from_utf8_lossy(&out.stderr));
            String::from_utf8_lossy(&out.stdout).to_string()
        };
        // `--json` prints the HTTP API's JobList.
        let list: tessera_proto::api::JobList = serde_json::from_str(&run(&["jobs", "--json"])).expect("jobs --json");
        assert_eq!(list.jobs.len(), 30);
        assert!(list.jobs.iter().all(|j| j.state == JobState::Finished), "{list:?}");
        assert!(run(&["servers"]).contains("ra-s00"));
        assert!(run(&["status"]).contains("30 finished"));

        let logs = run(&["logs", &big.to_string(), "--member", "1"]);
        assert!(logs.contains("big rank 1"), "logs of the big job's rank 1: {logs:?}");
    });
}
