//! Priority preemption on a whole `tessera dev` cluster (one process: three replicas, a
//! fake-GPU agent per server, a scheduler host), driven through the public API.
//!
//! `a_production_gang_preempts_best_effort_jobs_which_resume_and_finish`: four best-effort
//! 4-GPU jobs fill both 8-GPU servers. A production 16-GPU gang (two members of 8) is then
//! submitted: nothing fits, so the host's scheduler displaces the jobs it outranks in one
//! `Preempt` command. The test checks that the gang runs within a bound; that every victim went
//! back to pending once (`preemptions` = 1) and its task saved a checkpoint on the stop signal;
//! that after the gang ends every victim runs again, resumes from its checkpoint and finishes;
//! and that a watcher following the change stream from version 0 never saw a GPU or core held
//! by two jobs (a victim's members are released in the same step the gang is placed, so a
//! half-preempted gang would show as a double holding).
//!
//! `a_preemption_stops_the_victim_whose_gpus_it_takes`: of two best-effort victims of one rank,
//! the host displaces the 2-GPU one a 2-GPU job takes whole, not the 8-GPU one that started
//! last and would leave 6 GPUs idle.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use tessera_proto::v1;
use tessera_view::{CpuDemand, Health, JobId, JobSpec, JobState, LocalityLevel};
use tessera_view_server::{Tuning, ViewClient};

mod common;
use common::*;

/// A victim's command: resumes from its checkpoint file if there is one (and then finishes at
/// once); otherwise works until stopped, saving the checkpoint on SIGUSR1 (the agent's
/// checkpoint signal) or SIGTERM.
fn victim_command(ckpt: &Path) -> String {
    let f = ckpt.display();
    format!(
        "if [ -e {f} ]; then echo resumed from $(cat {f}); exit 0; fi; echo started gpus=$CUDA_VISIBLE_DEVICES; \
         trap 'echo step-42 > {f}; echo checkpointed; kill $!; exit 0' USR1 TERM; sleep 120 & wait"
    )
}

/// `tessera dev` on two servers with free ports; stopped (SIGTERM, so it cancels its jobs and
/// stops their tasks) on drop, killed if it does not exit in time.
struct Dev {
    child: Child,
    data: std::path::PathBuf,
}

impl Drop for Dev {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(self.child.id() as i32);
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(20);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        for server in std::fs::read_dir(self.data.join("agents")).into_iter().flatten().flatten() {
            kill_tasks(&server.path());
        }
    }
}

/// Starts `tessera dev` and returns it with its replicas' addresses, read from its banner.
fn start_dev(dir: &Path) -> (Dev, Vec<String>) {
    let data = dir.join("dev");
    let mut child = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args([
            "dev",
            "--servers",
            "2",
            "--racks",
            "1",
            "--view-port",
            "0",
            "--http-port",
            "0",
            "--metrics-port",
            "0",
            "--data-dir",
        ])
        .arg(&data)
        .env("RUST_LOG", "info")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(dir.join("dev.log")).expect("log"))
        .spawn()
        .expect("spawn tessera dev");
    let stdout = child.stdout.take().expect("stdout");
    let dev = Dev { child, data };
    let (tx, rx) = std::sync::mpsc::channel();
    // Reads the banner, then keeps draining stdout so that the process never blocks on it.
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(rest) = line.trim_start().strip_prefix("view (gRPC)") {
                let addrs = rest.split_whitespace().next().unwrap_or_default().to_string();
                let _ = tx.send(addrs);
            }
        }
    });
    let addrs = rx.recv_timeout(Duration::from_secs(60)).expect("tessera dev printed its view addresses");
    (dev, addrs.split(',').map(str::to_string).collect())
}

fn with_command(mut s: JobSpec, class: &str, command: String) -> v1::JobSpec {
    s.class = Some(class.into());
    s.memory_mib_per_gpu = Some(1024);
    s.cpu = CpuDemand::Fixed { cores_per_gpu: 1 };
    s.command = vec!["sh".into(), "-c".into(), command];
    v1::JobSpec::from(&s)
}

#[test]
fn a_production_gang_preempts_best_effort_jobs_which_resume_and_finish() {
    let dir = test_dir("tessera-preemption-");
    let d = dir.path();
    let (dev, addrs) = start_dev(d);
    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(120);
        // `tessera dev` runs with TLS: its admin's certificate is in its data directory.
        let admin = tessera_proto::tls::Tls::open(dev.data.join("tls").join("admin-admin")).expect("dev's admin TLS");
        let mut c = ViewClient::new(addrs.clone())
            .expect("client")
            .with_deadline(Duration::from_secs(20))
            .with_security(tessera_proto::tls::Security::Tls(admin));
        c.wait_for_leader().await.expect("leader");
        let watcher = Followed::start(c.clone());

        // Four best-effort jobs of 4 GPUs: both servers full once they run.
        let specs: Vec<v1::JobSpec> = (0..4)
            .map(|i| {
                let mut s = JobSpec::simple(&format!("victim-{i}"), 1, 4);
                (s.prefer, s.tolerate) = (LocalityLevel::Socket, LocalityLevel::Any);
                with_command(s, "best-effort", victim_command(&d.join(format!("victim-{i}.ckpt"))))
            })
            .collect();
        let victims: Vec<JobId> = c
            .submit(specs)
            .await
            .expect("submit")
            .iter()
            .map(|r| {
                assert!(r.error.is_empty(), "{}", r.error);
                JobId(r.job)
            })
            .collect();
        wait_view(&mut c, deadline, "the best-effort jobs running", |s| {
            victims.iter().all(|id| s.jobs.iter().any(|j| j.id == *id && j.state == JobState::Running))
        })
        .await;

        // The production gang: two members of 8 GPUs, anywhere.
        let mut gang = JobSpec::simple("production-16", 2, 8);
        (gang.prefer, gang.tolerate) = (LocalityLevel::Rack, LocalityLevel::Any);
        let gang = with_command(gang, "production", "echo gang gpus=$CUDA_VISIBLE_DEVICES; sleep 2".into());
        let t0 = Instant::now();
        let r = c.submit(vec![gang]).await.expect("submit");
        assert!(r[0].error.is_empty(), "{}", r[0].error);
        let gang = JobId(r[0].job);
        let bound = (t0 + Duration::from_secs(30)).min(deadline);
        wait_view(&mut c, bound, "the production gang running", |s| {
            s.jobs.iter().any(|j| j.id == gang && matches!(j.state, JobState::Running | JobState::Finished))
        })
        .await;
        eprintln!("production gang running after {} ms", t0.elapsed().as_millis());
        let s = snapshot(&mut c).await;
        let job = |id: JobId| s.jobs.iter().find(|j| j.id == id).expect("job kept").clone();
        assert_eq!(job(gang).spec.priority, 100, "the production class");
        for v in &victims {
            let j = job(*v);
            assert_eq!(j.preemptions, 1, "victim {v} preempted once: {j:?}");
            assert_eq!(j.spec.priority, 0, "the best-effort class");
        }

        // Every victim runs again after the gang, resumes from its checkpoint and finishes.
        wait_view(&mut c, deadline, "the gang and every victim finished", |s| {
            victims.iter().chain([&gang]).all(|id| s.jobs.iter().any(|j| j.id == *id && j.state == JobState::Finished))
        })
        .await;
        for (i, v) in victims.iter().enumerate() {
            let ckpt = std::fs::read_to_string(d.join(format!("victim-{i}.ckpt"))).unwrap_or_default();
            assert_eq!(ckpt.trim(), "step-42", "victim {v} saved its checkpoint when stopped");
            let prefix = format!("j{}-p", v.0);
            let outputs: Vec<String> = std::fs::read_dir(dev.data.join("agents"))
                .into_iter()
                .flatten()
                .flatten()
                .flat_map(|server| task_dirs(&server.path()))
                .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix)))
                .map(|p| std::fs::read_to_string(p.join("stdout.log")).unwrap_or_default())
                .collect();
            assert_eq!(outputs.len(), 2, "victim {v}: a task before and one after the gang: {outputs:?}");
            assert!(outputs.iter().any(|o| o.contains("checkpointed")), "victim {v}: {outputs:?}");
            assert!(outputs.iter().any(|o| o.contains("resumed from step-42")), "victim {v}: {outputs:?}");
        }

        let h = watcher.stop().await;
        assert!(h.violations.is_empty(), "double allocation or a gap in the history: {:?}", h.violations);
        for v in &victims {
            assert_eq!(h.placements[v].len(), 2, "victim {v}: placed, preempted, placed again: {:?}", h.placements[v]);
        }
    });
    drop(dev);
}

/// Attained-service order live: a cluster whose spec sets a threshold of 8 GPU-seconds, one
/// seed-8gpu server (`tessera view serve`, `tessera agent run`, `tessera scheduler run` as
/// processes). A long 8-GPU job runs; the view moves it to queue 1 once it has held its GPUs
/// for a second (the leader writes a clock entry at the mark). A new 8-GPU job of the same
/// class is then submitted: it ranks above the one that ran long, so the host preempts that
/// one, which checkpoints, runs again after the new job ends, resumes and finishes.
#[test]
fn a_job_that_ran_long_goes_down_a_queue_and_a_new_job_of_its_class_preempts_it() {
    let dir = test_dir("tessera-las-");
    let d = dir.path();
    let mut spec = spec(1);
    spec.priorities.attained_service_gpu_s = vec![8];
    let tuning = Tuning { server_lease_ms: 3000, scheduler_lease_ms: 1000, ..tuning() };
    let view = cluster(1, spec, tuning, false, Some(&d.join("view")));
    let addr = view.addrs()[0].clone();
    let mut procs = Procs::default();
    procs.agent(d, &addr, "r0-s00", &tls(&view, Role::Agent, "r0-s00"));
    let host_tls = tls(&view, Role::Scheduler, "h1");
    procs.push("h1", tessera(d, "h1.log", &with(&["scheduler", "run", "--view", &addr, "--name", "h1"], &host_tls)));

    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut c = admin_client(&view, vec![addr.clone()]);
        c.wait_for_leader().await.expect("leader");
        let watcher = Followed::start(c.clone());
        let ckpt = d.join("long.ckpt");
        let long = with_command(JobSpec::simple("long", 1, 8), "batch", victim_command(&ckpt));
        let r = c.submit(vec![long]).await.expect("submit");
        assert!(r[0].error.is_empty(), "{}", r[0].error);
        let long = JobId(r[0].job);
        let job = |s: &tessera_view::ViewSnapshot, id: JobId| s.jobs.iter().find(|j| j.id == id).cloned();
        wait_view(&mut c, deadline, "the long job running in queue 1", |s| {
            job(s, long).is_some_and(|j| j.state == JobState::Running && j.service_queue == 1)
        })
        .await;

        let t0 = Instant::now();
        let new = with_command(JobSpec::simple("new", 1, 8), "batch", "echo new; sleep 1".into());
        let r = c.submit(vec![new]).await.expect("submit");
        assert!(r[0].error.is_empty(), "{}", r[0].error);
        let new = JobId(r[0].job);
        let bound = (t0 + Duration::from_secs(30)).min(deadline);
        wait_view(&mut c, bound, "the new job running", |s| {
            job(s, new).is_some_and(|j| matches!(j.state, JobState::Running | JobState::Finished))
        })
        .await;
        eprintln!("the new job ran {} ms after its submission", t0.elapsed().as_millis());
        let s = snapshot(&mut c).await;
        let l = job(&s, long).expect("kept");
        assert_eq!((l.preemptions, l.spec.priority), (1, job(&s, new).expect("kept").spec.priority), "{l:?}");

        // The long job runs again once the new one ended, resumes from its checkpoint and ends.
        wait_view(&mut c, deadline, "both jobs finished", |s| {
            [long, new].iter().all(|id| job(s, *id).is_some_and(|j| j.state == JobState::Finished))
        })
        .await;
        assert_eq!(std::fs::read_to_string(&ckpt).unwrap_or_default().trim(), "step-42", "checkpointed when stopped");
        let h = watcher.stop().await;
        assert!(h.violations.is_empty(), "double allocation or a gap in the history: {:?}", h.violations);
        assert_eq!(h.placements[&long].len(), 2, "placed, preempted, placed again: {:?}", h.placements[&long]);
    });
    drop(procs);
}

/// Two seed-8gpu servers as processes. Server 1 runs a 2-GPU best-effort job beside a 6-GPU
/// production one; server 0 an 8-GPU best-effort job, started last (by run start, the victim
/// that loses the least work). A 2-GPU batch job is then submitted: the host preempts the 2-GPU
/// job, whose GPUs it takes, and leaves the 8-GPU one running, which would have left 6 GPUs
/// idle (`preemption::Score`). Before stop 49 the 8-GPU job was the one stopped.
#[test]
fn a_preemption_stops_the_victim_whose_gpus_it_takes() {
    let dir = test_dir("tessera-victim-");
    let d = dir.path();
    let tuning = Tuning { server_lease_ms: 3000, scheduler_lease_ms: 1000, ..tuning() };
    let servers = ["r0-s00", "r0-s01"];
    let (view, addr, mut procs) = agent_cluster(d, tuning, &servers);
    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut c = admin_client(&view, vec![addr.clone()]);
        c.wait_for_leader().await.expect("leader");
        let watcher = Followed::start(c.clone());
        while c.agents().await.map(|a| a.len()).unwrap_or(0) < servers.len() {
            assert!(Instant::now() < deadline, "agents did not register");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        wait_view(&mut c, deadline, "servers up", |s| s.servers.iter().all(|r| r.health == Health::Up)).await;
        let long = |name: &str| victim_command(&d.join(format!("{name}.ckpt")));
        let specs = vec![
            with_command(JobSpec::simple("small", 1, 2), "best-effort", long("small")),
            with_command(JobSpec::simple("prod", 1, 6), "production", long("prod")),
            with_command(JobSpec::simple("big", 1, 8), "best-effort", long("big")),
        ];
        let r = c.submit(specs).await.expect("submit");
        assert!(r.iter().all(|r| r.error.is_empty()), "{r:?}");
        let [small, prod, big] = [0, 1, 2].map(|i| JobId(r[i].job));
        let job =
            |s: &tessera_view::ViewSnapshot, id: JobId| s.jobs.iter().find(|j| j.id == id).cloned().expect("kept");
        place(&mut c, small, one_core_per_gpu(1, 0b0000_0011), 1).await;
        place(&mut c, prod, one_core_per_gpu(1, 0b1111_1100), 2).await;
        wait_view(&mut c, deadline, "the first two running", |s| {
            [small, prod].iter().all(|&id| job(s, id).state == JobState::Running)
        })
        .await;
        place(&mut c, big, one_core_per_gpu(0, 0xff), 3).await;
        wait_view(&mut c, deadline, "the 8-GPU job running", |s| job(s, big).state == JobState::Running).await;

        let host_tls = tls(&view, Role::Scheduler, "h1");
        procs
            .push("h1", tessera(d, "h1.log", &with(&["scheduler", "run", "--view", &addr, "--name", "h1"], &host_tls)));
        let new = with_command(JobSpec::simple("new", 1, 2), "batch", "echo new; sleep 1".into());
        let r = c.submit(vec![new]).await.expect("submit");
        assert!(r[0].error.is_empty(), "{}", r[0].error);
        let new = JobId(r[0].job);
        wait_view(&mut c, deadline, "the new job running", |s| {
            matches!(job(s, new).state, JobState::Running | JobState::Finished)
        })
        .await;
        let s = snapshot(&mut c).await;
        let placed_on = |id: JobId| job(&s, id).placement.map(|p| p.members[0].server.0);
        assert_eq!(placed_on(new), Some(1), "the new job runs where the small one ran");
        assert_eq!(job(&s, small).preemptions, 1, "{:?}", job(&s, small));
        let b = job(&s, big);
        assert_eq!((b.preemptions, b.state), (0, JobState::Running), "the 8-GPU job keeps running: {b:?}");
        let h = watcher.stop().await;
        assert!(h.violations.is_empty(), "double allocation or a gap in the history: {:?}", h.violations);
    });
    drop(procs);
}
