//! Live migration as real processes on loopback: one view replica (`tessera view serve`), two
//! fake-GPU node agents (`tessera agent run`, seed-8gpu, 8 GPUs each) and one scheduler host
//! (`tessera scheduler run`) with live migration every 500 ms.
//!
//! `blocked_eight_gpu_job_starts_after_small_jobs_move`: eight long-running 1-GPU jobs are
//! placed directly (exact masks) on GPUs 0, 2, 4 and 6 of both servers, so each server has 4
//! free GPUs and none has 8. An 8-GPU `tolerate = "server"` job is then submitted; its
//! scheduler finds no group, and the host's migration task moves the four small jobs of one
//! server to the other. The test checks that the 8-GPU job runs within a bound, that the moved
//! jobs run again on their new server (the agents checkpointed the old tasks with SIGUSR1 and
//! started new ones), and that a watcher following the change stream from version 0 never
//! sees a GPU or core held by two jobs.

use std::path::PathBuf;
use std::time::{Duration, Instant};
use tessera_proto::v1;
use tessera_view::{
    CoreMask, CpuDemand, Decision, Health, JobId, JobSpec, JobState, LocalityLevel, MemberPlacement, Proposal,
    ProposalId, ServerId, ViewSnapshot, ViewVersion,
};
use tessera_view_server::Tuning;

mod common;
use common::*;

/// The small jobs' command: records its GPU, saves a "checkpoint" on SIGUSR1 and exits.
/// The "work" runs in the background so that the shell takes the signal at once; the trap
/// ends it too, leaving no orphan behind.
const SMALL: &str = "echo started gpus=$CUDA_VISIBLE_DEVICES; trap 'echo checkpointed; kill $!; exit 0' USR1 TERM; \
                     sleep 60 & wait";

fn small_spec(i: usize) -> v1::JobSpec {
    let mut s = JobSpec::simple(&format!("small-{i}"), 1, 1);
    s.tolerate = LocalityLevel::Any;
    s.memory_mib_per_gpu = Some(1024);
    s.cpu = CpuDemand::Fixed { cores_per_gpu: 1 };
    s.command = vec!["sh".into(), "-c".into(), SMALL.into()];
    v1::JobSpec::from(&s)
}

#[test]
fn blocked_eight_gpu_job_starts_after_small_jobs_move() {
    let dir = test_dir("tessera-migration-");
    let d = dir.path();
    let tuning = Tuning { server_lease_ms: 3000, scheduler_lease_ms: 1000, ..tuning() };
    let (view, addr, mut procs, servers) = two_agent_cluster(d, tuning);

    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut c = admin_client(&view, vec![addr.clone()]);
        c.wait_for_leader().await.expect("leader");
        let watcher = Followed::start(c.clone());
        // Both agents registered and their servers up.
        loop {
            let agents = c.agents().await.map(|a| a.len()).unwrap_or(0);
            if agents == servers.len() {
                break;
            }
            assert!(Instant::now() < deadline, "agents did not register");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        wait_view(&mut c, deadline, "servers up", |s| s.servers.iter().all(|r| r.health == Health::Up)).await;

        // Fragment on purpose: 1-GPU jobs on GPUs 0, 2, 4, 6 of both servers (one per PCIe
        // switch, cores of the GPU's socket): 4 free GPUs on each, 8 on none.
        let specs: Vec<v1::JobSpec> = (0..8).map(small_spec).collect();
        let r = c.submit(specs).await.expect("submit");
        let mut small = Vec::new();
        let mut proposals = Vec::new();
        for (i, r) in r.iter().enumerate() {
            assert!(r.error.is_empty(), "{}", r.error);
            let job = JobId(r.job);
            let (server, gpu) = (i as u32 / 4, 2 * (i as u32 % 4));
            small.push((job, server));
            let member = MemberPlacement {
                server: ServerId(server),
                gpus: 1 << gpu,
                cores: CoreMask::range(4 * gpu, 1),
                memory_mib: 1024,
            };
            let p = Proposal { id: ProposalId(100 + i as u64), job, members: vec![member], based_on: ViewVersion(0) };
            proposals.push(v1::Proposal::from(&p));
        }
        for (i, d) in c.propose(proposals).await.expect("propose").iter().enumerate() {
            assert!(matches!(decision(d), Some(Decision::Accepted { .. })), "small job {i}: {d:?}");
        }
        let ids: Vec<JobId> = small.iter().map(|(j, _)| *j).collect();
        wait_view(&mut c, deadline, "small jobs running", |s| {
            ids.iter().all(|id| s.jobs.iter().any(|j| j.id == *id && j.state == JobState::Running))
        })
        .await;

        // The scheduler host, with live migration every 500 ms, and the blocked 8-GPU job.
        let host_tls = tls(&view, Role::Scheduler, "h1");
        let host = with(&["scheduler", "run", "--view", &addr, "--name", "h1", "--migrate-every-ms", "500"], &host_tls);
        procs.push("h1", tessera(d, "h1.log", &host));
        let mut big = JobSpec::simple("big-8", 1, 8);
        big.prefer = LocalityLevel::Server;
        big.tolerate = LocalityLevel::Server;
        big.memory_mib_per_gpu = Some(1024);
        big.cpu = CpuDemand::Fixed { cores_per_gpu: 1 };
        big.command = vec!["sh".into(), "-c".into(), "echo big gpus=$CUDA_VISIBLE_DEVICES; sleep 60".into()];
        let t0 = Instant::now();
        let r = c.submit(vec![v1::JobSpec::from(&big)]).await.expect("submit");
        assert!(r[0].error.is_empty(), "{}", r[0].error);
        let big = JobId(r[0].job);
        let log = || std::fs::read_to_string(d.join("h1.log")).unwrap_or_default();
        let bound = (t0 + Duration::from_secs(25)).min(deadline);
        wait_view(&mut c, bound, "the 8-GPU job running", |s| {
            s.jobs.iter().any(|j| j.id == big && j.state == JobState::Running)
        })
        .await;
        eprintln!("8-GPU job running after {} ms", t0.elapsed().as_millis());

        // The moved jobs run again, on the other server.
        let moved: Vec<(JobId, u32)> = {
            let s = c.snapshot(true).await.expect("snapshot").snapshot.expect("body");
            let s = ViewSnapshot::try_from(s).expect("snapshot");
            let server_of = |id: JobId| {
                let j = s.jobs.iter().find(|j| j.id == id).expect("job kept");
                (j.state, j.placement.as_ref().map(|p| p.members[0].server.0))
            };
            let (_, big_server) = server_of(big);
            let big_server = big_server.expect("the big job is placed");
            small
                .iter()
                .filter_map(|&(id, was)| match server_of(id) {
                    (st, Some(now)) if now != was => {
                        assert_ne!(now, big_server, "job {id} moved onto the big job's server");
                        Some((id, now)).filter(|_| st == JobState::Running || st == JobState::Migrating)
                    }
                    _ => None,
                })
                .collect()
        };
        assert!(!moved.is_empty(), "no small job was moved\n{}", log());
        let moved_ids: Vec<JobId> = moved.iter().map(|(j, _)| *j).collect();
        wait_view(&mut c, deadline, "moved jobs running again", |s| {
            moved_ids.iter().all(|id| s.jobs.iter().any(|j| j.id == *id && j.state == JobState::Running))
        })
        .await;
        // On disk: the old task saved its checkpoint on SIGUSR1; the new one started on the
        // new server (task directories `j<job>-p<proposal>-m0` under each agent's data dir).
        for (job, now) in &moved {
            let prefix = format!("j{}-p", job.0);
            let on = |server: usize| -> Vec<PathBuf> {
                task_dirs(&procs.data_dirs[server])
                    .into_iter()
                    .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix)))
                    .collect()
            };
            let new = on(*now as usize);
            assert_eq!(new.len(), 1, "job {job}: one task on its new server: {new:?}");
            let out = std::fs::read_to_string(new[0].join("stdout.log")).unwrap_or_default();
            assert!(out.contains("started"), "job {job} on its new server: {out:?}");
            let old = on(1 - *now as usize);
            assert_eq!(old.len(), 1, "job {job}: its old task: {old:?}");
            let out = std::fs::read_to_string(old[0].join("stdout.log")).unwrap_or_default();
            assert!(out.contains("checkpointed"), "job {job}'s old task was not checkpointed: {out:?}");
        }

        let h = watcher.stop().await;
        assert!(h.violations.is_empty(), "double allocation or a gap in the history: {:?}", h.violations);
        for (job, now) in &moved {
            assert_eq!(
                h.placements[job].last().map(|p| p.0),
                Some(*now),
                "job {job}'s placements: {:?}",
                h.placements[job]
            );
            assert!(h.placements[job].len() >= 2, "job {job}'s placements: {:?}", h.placements[job]);
        }
    });
}
