//! Bounded reservations live (`tessera scheduler run --reservations`), as processes: one
//! `tessera view serve` replica, fake-GPU agents for two seed-8gpu servers, one scheduler host.
//!
//! `a_reservation_starts_a_gang_that_small_jobs_would_starve_and_holds_them_back_only_meanwhile`:
//! 1-GPU jobs are kept running one after another, each told to end only once a newer one runs
//! (or after 2 s), so a 1-GPU job holds a GPU at every moment unless the host withholds the
//! released GPUs. A 16-GPU gang (two members of 8) needs both servers empty at once, which
//! backfilling alone never allows while they run: without `--reservations` the test times out
//! (checked by hand when it was written). With them, once the gang has waited longer than what
//! holding the 1-GPU jobs back costs, the host withholds both servers: the newest 1-GPU job
//! waits instead of taking a released GPU, the last running one ends, and the gang runs. The
//! test checks that the gang ran while a 1-GPU job waited, that the host logged the
//! reservation and counts it in its metrics, that every job then finished, and that a watcher
//! following the change stream from version 0 never saw a GPU or core held by two jobs.

use std::path::Path;
use std::time::{Duration, Instant};
use tessera_proto::v1;
use tessera_view::{CpuDemand, JobId, JobSpec, JobState, LocalityLevel, ViewSnapshot};
use tessera_view_server::ViewClient;

mod common;
use common::*;

fn job(mut s: JobSpec, command: &str) -> v1::JobSpec {
    s.memory_mib_per_gpu = Some(1024);
    s.cpu = CpuDemand::Fixed { cores_per_gpu: 1 };
    s.command = vec!["sh".into(), "-c".into(), command.into()];
    v1::JobSpec::from(&s)
}

/// The host's `/metrics` text, over plain HTTP/1.0 (read to the end of the connection).
fn scrape(addr: &str) -> String {
    use std::io::{Read, Write};
    let mut conn = std::net::TcpStream::connect(addr).expect("connect to the host's metrics");
    conn.set_read_timeout(Some(Duration::from_secs(10))).expect("timeout");
    conn.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n").expect("request");
    let mut text = String::new();
    conn.read_to_string(&mut text).expect("response");
    text
}

/// Submits 1-GPU job `small-n`, which ends when told (file `stop-n` appears in `d`) or after
/// 2 s, whichever comes first; returns its id and `n`.
async fn submit_small(c: &mut ViewClient, d: &Path, n: u32) -> (JobId, u32) {
    let mut s = JobSpec::simple(&format!("small-{n}"), 1, 1);
    (s.prefer, s.tolerate) = (LocalityLevel::Socket, LocalityLevel::Any);
    let stop = d.join(format!("stop-{n}"));
    let spec = job(s, &format!("for i in $(seq 20); do [ -e {} ] && exit 0; sleep 0.1; done", stop.display()));
    let r = c.submit(vec![spec]).await.expect("submit");
    assert!(r[0].error.is_empty(), "{}", r[0].error);
    (JobId(r[0].job), n)
}

fn state(s: &ViewSnapshot, id: JobId) -> Option<JobState> {
    s.jobs.iter().find(|j| j.id == id).map(|j| j.state)
}

fn ended(st: Option<JobState>) -> bool {
    matches!(st, Some(JobState::Finished | JobState::Failed))
}

#[test]
fn a_reservation_starts_a_gang_that_small_jobs_would_starve_and_holds_them_back_only_meanwhile() {
    let dir = test_dir("tessera-reservation-");
    let d = dir.path();
    // Plaintext, so that the test reads the host's /metrics with a bare HTTP request (the
    // other process tests run with mutual TLS).
    let view = tessera_testkit::LocalCluster::builder(spec(2))
        .name("t")
        .replicas(1)
        .tuning(tuning())
        .tls(false)
        .data_dir(&d.join("view"))
        .start_processes(std::path::Path::new(env!("CARGO_BIN_EXE_tessera")))
        .expect("start the replica");
    let addr = view.addrs()[0].clone();
    let mut procs = Procs::default();
    for s in ["r0-s00", "r0-s01"] {
        procs.agent(d, &addr, s, &tls(&view, Role::Agent, s));
    }
    let host_tls = tls(&view, Role::Scheduler, "h1");
    let args =
        ["scheduler", "run", "--view", &addr, "--name", "h1", "--reservations", "--metrics-listen", "127.0.0.1:0"];
    procs.push("h1", tessera(d, "h1.log", &with(&args, &host_tls)));

    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(120);
        let mut c = admin_client(&view, vec![addr.clone()]);
        c.wait_for_leader().await.expect("leader");
        let watcher = Followed::start(c.clone());

        let first = submit_small(&mut c, d, 1).await;
        wait_view(&mut c, deadline, "the first 1-GPU job running", |s| state(s, first.0) == Some(JobState::Running))
            .await;
        let mut smalls = vec![first];

        let mut gang = JobSpec::simple("gang-16", 2, 8);
        (gang.prefer, gang.tolerate) = (LocalityLevel::Rack, LocalityLevel::Any);
        let r = c.submit(vec![job(gang, "echo gang; sleep 2")]).await.expect("submit");
        assert!(r[0].error.is_empty(), "{}", r[0].error);
        let gang = JobId(r[0].job);
        let t0 = Instant::now();

        // A 1-GPU job holds a GPU at every moment: one is told to end only once a newer one
        // runs, and a new one is submitted whenever fewer than two are in the system. Without
        // a reservation the replacement is placed at once and both servers are never empty
        // together; only a host that withholds the released GPUs lets the last one end (its
        // 2 s) with nothing taking its place.
        let held_back: Vec<JobId> = loop {
            let s = snapshot(&mut c).await;
            let gang_state = state(&s, gang);
            if matches!(gang_state, Some(JobState::Running | JobState::Finished)) {
                break smalls
                    .iter()
                    .map(|&(id, _)| id)
                    .filter(|id| state(&s, *id) == Some(JobState::Pending))
                    .collect();
            }
            assert!(Instant::now() < deadline, "the gang never ran: {gang_state:?} after {:?}", t0.elapsed());
            let running: Vec<u32> =
                smalls.iter().filter(|(id, _)| state(&s, *id) == Some(JobState::Running)).map(|&(_, n)| n).collect();
            if let Some((_, older)) = running.split_last() {
                for n in older {
                    std::fs::write(d.join(format!("stop-{n}")), b"").expect("stop file");
                }
            }
            let alive = smalls.iter().filter(|(id, _)| !ended(state(&s, *id))).count();
            if alive < 2 {
                smalls.push(submit_small(&mut c, d, smalls.len() as u32 + 1).await);
                continue;
            }
            let v = s.version.0;
            let mut w = c.clone();
            let _ = tokio::time::timeout(Duration::from_millis(500), async move {
                if let Ok(mut st) = w.watch(v).await {
                    let _ = st.message().await;
                }
            })
            .await;
        };
        eprintln!(
            "the gang ran {} ms after its submission, {} 1-GPU jobs submitted",
            t0.elapsed().as_millis(),
            smalls.len()
        );
        // The newest 1-GPU job was held back while the GPUs it could use were released, and the
        // gang started meanwhile.
        assert!(!held_back.is_empty(), "the gang started while no 1-GPU job waited");
        let loop_jobs: Vec<JobId> = smalls.iter().map(|&(id, _)| id).collect();
        wait_view(&mut c, deadline, "every job finished", |s| {
            loop_jobs.iter().chain([&gang]).all(|id| state(s, *id) == Some(JobState::Finished))
        })
        .await;

        let log = std::fs::read_to_string(d.join("h1.log")).expect("host log");
        assert!(log.contains("reserving servers for a gang"), "the host logged no reservation:\n{log}");
        // The host bound its metrics listener before it started scheduling.
        let metrics_addr = (log.lines())
            .find(|l| l.contains("metrics served at /metrics"))
            .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("addr=")))
            .expect("the host logged its metrics address");
        let text = scrape(metrics_addr);
        let made = text
            .lines()
            .find(|l| l.starts_with("tessera_host_reservations_total{") && l.contains("result=\"made\""))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse::<u64>().ok());
        assert!(made.is_some_and(|m| m >= 1), "no reservation counted:\n{text}");

        let h = watcher.stop().await;
        assert!(h.violations.is_empty(), "double allocation or a gap in the history: {:?}", h.violations);
        assert_eq!(h.partial_gangs, 0, "a gang seen partly placed or partly running");
        assert_eq!(h.placements[&gang].len(), 1, "the gang placed once: {:?}", h.placements[&gang]);
    });
    drop(procs);
}
