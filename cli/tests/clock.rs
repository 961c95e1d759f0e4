//! Clock faults on real replica processes: every replica's wall clock is faked by libfaketime
//! (`LD_PRELOAD`, an offset file per replica that the test rewrites; monotonic time untouched),
//! as an NTP step or an operator's `date` would move it.
//!
//! - `a_step_of_the_wall_clocks_moves_no_time_limit`: a job placed with a 10-minute limit; every
//!   replica's clock stepped a day forward, the leader killed (its successor's clock is a day
//!   ahead too), then every clock stepped a day back. Through all of it the view's clock stays
//!   within two seconds of true time and the job keeps its GPUs. With the leader writing its
//!   wall clock as it reads (before `tessera_replica::clock`), the first step moves the view's
//!   clock a day ahead, past the job's limit: this test fails on such stamps (checked). The
//!   chaos suite's `clock-jump` fault checks the same across containers.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tessera_proto::v1;
use tessera_testkit::{LocalCluster, ProcessCluster};
use tessera_view::{Decision, JobId, JobSpec, JobState, LocalityLevel, Proposal, ProposalId, ViewVersion};
use tessera_view_server::ViewClient;

mod common;
use common::*;

/// Where Debian's libfaketime package puts the library (deploy/install-deps.sh installs it).
const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// How far from true time the view's clock may read: its slew over the test's minute is 30 ms;
/// the rest is the time between the last entry and the read.
const TOLERANCE_MS: i64 = 2_000;

fn true_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970").as_millis() as i64
}

/// Sets every replica's clock `offset_s` from true time.
fn step_clocks(dir: &Path, offset_s: i64) {
    for id in 1..=3 {
        std::fs::write(clock_file(dir, id), format!("{offset_s:+}\n")).expect("write a clock file");
    }
}

fn clock_file(dir: &Path, id: u64) -> PathBuf {
    dir.join(format!("clock-{id}"))
}

fn start(dir: &Path) -> ProcessCluster {
    assert!(
        Path::new(LIBFAKETIME).exists(),
        "{LIBFAKETIME} is missing: install Debian's libfaketime package (deploy/install-deps.sh does)"
    );
    step_clocks(dir, 0);
    let file = dir.join("clock-{replica}");
    LocalCluster::builder(spec(2))
        .name("t")
        .replicas(3)
        .tuning(tuning())
        .data_dir(&dir.join("cluster"))
        .env("LD_PRELOAD", LIBFAKETIME)
        .env("FAKETIME_TIMESTAMP_FILE", &file.display().to_string())
        // Read the file at every wall-clock call, so a step takes effect at once; the
        // monotonic clock (raft's ticks, leases, the leader's elapsed time) is left alone.
        .env("FAKETIME_NO_CACHE", "1")
        .env("DONT_FAKE_MONOTONIC", "1")
        .start_processes(Path::new(env!("CARGO_BIN_EXE_tessera")))
        .expect("start the replica processes")
}

/// Writes one entry (a submission, which the leader stamps with its clock), then reads the
/// view's clock and the job's state from the leader.
async fn clock_after_a_write(c: &mut ViewClient, n: usize, job: JobId) -> (i64, JobState) {
    let mut s = JobSpec::simple(&format!("tick-{n}"), 1, 1);
    s.tolerate = LocalityLevel::Any;
    let r = c.submit(vec![v1::JobSpec::from(&s)]).await.expect("submit");
    assert!(r[0].error.is_empty(), "{}", r[0].error);
    let snap = snapshot(c).await;
    let j = snap.jobs.iter().find(|j| j.id == job).expect("the limited job");
    (snap.now_ms as i64, j.state)
}

#[test]
fn a_step_of_the_wall_clocks_moves_no_time_limit() {
    let tmp = test_dir("clock");
    let dir = tmp.path();
    let mut cluster = start(dir);
    let addrs = cluster.addrs();
    rt().block_on(async {
        let mut c = admin_client(&cluster, addrs.clone());
        c.wait_for_leader().await.expect("leader");
        // A job with a 10-minute limit, placed on server 0.
        let mut s = JobSpec::simple("limited", 1, 1);
        s.tolerate = LocalityLevel::Any;
        s.memory_mib_per_gpu = Some(1024);
        s.run.time_limit_s = Some(600);
        let r = c.submit(vec![v1::JobSpec::from(&s)]).await.expect("submit");
        assert!(r[0].error.is_empty(), "{}", r[0].error);
        let job = JobId(r[0].job);
        let p = Proposal { id: ProposalId(7), job, members: vec![member(0, 1, 0)], based_on: ViewVersion(0) };
        let d = c.propose(vec![v1::Proposal::from(&p)]).await.expect("propose");
        assert!(matches!(decision(&d[0]), Some(Decision::Accepted { .. })), "{:?}", d[0]);

        let mut n = 0;
        let check = |what: &str, (now, state): (i64, JobState)| {
            let error = now - true_ms();
            assert!(error.abs() <= TOLERANCE_MS, "{what}: the view's clock is {error} ms from true time");
            assert_eq!(state, JobState::Placed, "{what}: the limited job lost its GPUs");
        };
        n += 1;
        check("before any step", clock_after_a_write(&mut c, n, job).await);

        // A day forward on every replica: the leader's own clock, then a successor's.
        step_clocks(dir, 86_400);
        n += 1;
        check("a day forward", clock_after_a_write(&mut c, n, job).await);
        let leader = c.wait_for_leader().await.expect("leader");
        let old = cluster.id_of(&leader.leader_addr).expect("the leader is a replica");
        cluster.kill(old).expect("kill -9 the leader");
        n += 1;
        check("a day forward, new leader", clock_after_a_write(&mut c, n, job).await);
        cluster.restart(old).expect("restart the old leader");

        // A day back on every replica.
        step_clocks(dir, -86_400);
        n += 1;
        check("a day back", clock_after_a_write(&mut c, n, job).await);
        // The view's clock goes on at the rate of true time; a second later it has moved.
        let (before, _) = clock_after_a_write(&mut c, 100, job).await;
        let t = Instant::now();
        while Instant::now().duration_since(t) < Duration::from_millis(1_100) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (after, state) = clock_after_a_write(&mut c, 101, job).await;
        assert!(after - before >= 1_000, "the view's clock moved {} ms in 1.1 s", after - before);
        check("a day back, a second later", (after, state));
    });
}
