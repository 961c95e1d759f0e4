//! Live migration as real processes on loopback: one view replica (`tessera view serve`),
//! fake-GPU node agents (`tessera agent run`, seed-8gpu, 8 GPUs each) and one scheduler host
//! (`tessera scheduler run`) with live migration every 500 ms. In each test long-running 1-GPU
//! jobs are first placed directly (exact masks) so that enough GPUs are free in total but no
//! server has the blocked job's member free; the blocked job is then submitted, its scheduler
//! finds no group, and the host's migration task moves small jobs out of its way. Each test
//! checks that the blocked job runs within a bound and never beside a moved job, that the moved
//! jobs run again on their new servers (the agents checkpointed the old tasks with SIGUSR1 and
//! started new ones), and that a watcher following the change stream from version 0 never sees
//! a GPU or core held by two jobs.
//!
//! `blocked_eight_gpu_job_starts_after_small_jobs_move`: two servers with 1-GPU jobs on GPUs 0,
//! 2, 4 and 6 (4 free on each, 8 on none); an 8-GPU `tolerate = "server"` job starts once the
//! four small jobs of one server move to the other.
//!
//! `blocked_two_server_gang_starts_after_six_small_jobs_move`: four servers with 5, 5, 3 and 3
//! 1-GPU jobs (half the GPUs busy, 16 free, no server wholly free). A 16-GPU gang of two 8-GPU
//! members (`tolerate = "rack"`) needs two servers freed; the fewest moves are the six jobs of
//! the last two servers onto the first two: more than the 4 a plan could move in all before the
//! bound became per member of the gang ([`MigrationParams::moves_for`]).
//!
//! `the_host_moves_jobs_for_the_smallest_blocked_job_first`: the same four servers, the gang
//! and an 8-GPU job submitted together, the gang first; the host plans for the smaller job
//! first, which runs after three moves, and the gang waits.
//!
//! `under_attained_service_order_the_host_moves_jobs_for_the_higher_queue_first`: a cluster
//! that ranks by attained service. A long 8-GPU job runs on the fourth server until the view
//! moves it to queue 1, and a new 8-GPU job preempts it there; the other three servers hold four
//! 1-GPU jobs each (12 GPUs free, four per server). A 2 × 6 gang (queue 0) and the demoted job
//! (queue 1, the smaller) are then both blocked, and moves can start either but not both: the
//! host plans for the higher queue, so the gang runs and the demoted job keeps waiting.
//!
//! `a_moved_job_with_no_free_home_gets_one_made_by_a_chained_move`: three servers where the
//! one small job to move off a server has no free home of its own shape (a 2-GPU job on one
//! PCIe switch, no switch free elsewhere): a 1-GPU job moves first to make it one, and the leader
//! lets the host's chain of two moves through.
//!
//! [`MigrationParams::moves_for`]: tessera_view::migration_planner::MigrationParams::moves_for

use std::path::PathBuf;
use std::time::{Duration, Instant};
use tessera_proto::v1;
use tessera_view::{
    CoreMask, CpuDemand, Decision, Health, JobId, JobSpec, JobState, LocalityLevel, MemberPlacement, Preemption,
    Proposal, ProposalId, ServerId, ViewSnapshot, ViewVersion,
};
use tessera_view_server::{Tuning, ViewClient};

mod common;
use common::*;

/// The small jobs' command: records its GPU, saves a "checkpoint" on SIGUSR1 and exits.
/// The "work" runs in the background so that the shell takes the signal at once; the trap
/// ends it too, leaving no orphan behind.
const SMALL: &str = "echo started gpus=$CUDA_VISIBLE_DEVICES; trap 'echo checkpointed; kill $!; exit 0' USR1 TERM; \
                     sleep 60 & wait";

fn small_spec(i: usize, gpus: u32) -> v1::JobSpec {
    let mut s = JobSpec::simple(&format!("small-{i}"), 1, gpus);
    s.tolerate = LocalityLevel::Any;
    s.memory_mib_per_gpu = Some(1024);
    s.cpu = CpuDemand::Fixed { cores_per_gpu: 1 };
    s.command = vec!["sh".into(), "-c".into(), SMALL.into()];
    v1::JobSpec::from(&s)
}

/// A blocked job of `members` × `per` GPUs at exactly `level`, one core and 1 GiB per GPU.
fn blocked_spec(name: &str, members: u32, per: u32, level: LocalityLevel) -> JobSpec {
    let mut s = JobSpec::simple(name, members, per);
    (s.prefer, s.tolerate) = (level, level);
    s.memory_mib_per_gpu = Some(1024);
    s.cpu = CpuDemand::Fixed { cores_per_gpu: 1 };
    s.command = vec!["sh".into(), "-c".into(), format!("echo {name} gpus=$CUDA_VISIBLE_DEVICES; sleep 60")];
    s
}

/// What a scenario ended with: the small jobs moved (job, old server, new server), the
/// servers the blocked job that ran is on, the other blocked jobs' states then, and the
/// demoted job's record then (scenarios with one).
struct Outcome {
    moves: Vec<(JobId, u32, u32)>,
    blocked_on: Vec<u32>,
    others: Vec<JobState>,
    demoted: Option<tessera_view::Job>,
}

/// The attained-service threshold of the cluster a demoted job is made on, GPU-seconds: an
/// 8-GPU job reaches it in 5 s, a 1-GPU job in 40 s, longer than the scenario's bound from the
/// small jobs' start to the blocked job's, so they stay in queue 0 throughout.
const DEMOTE_AT_GPU_S: u64 = 40;

/// The command of a job that works until stopped, saving a "checkpoint" on the stop signal.
fn long_command(name: &str) -> Vec<String> {
    let script = format!(
        "echo {name} gpus=$CUDA_VISIBLE_DEVICES; trap 'echo checkpointed; kill $!; exit 0' USR1 TERM; sleep 60 & wait"
    );
    vec!["sh".into(), "-c".into(), script]
}

/// A demoted job on `server` (free), made as a host would leave one: an 8-GPU job `demoted-8`
/// placed there runs until the view moves it to queue 1, then a new 8-GPU job of the same
/// priority, which outranks it, preempts it there in one `Preempt` command. Returns the demoted
/// job, pending in queue 1, once the new one runs.
async fn demote(c: &mut ViewClient, server: u32, deadline: Instant) -> JobId {
    let mut specs = Vec::new();
    for name in ["demoted-8", "new-8"] {
        let mut s = blocked_spec(name, 1, 8, LocalityLevel::Server);
        s.command = long_command(name);
        specs.push(v1::JobSpec::from(&s));
    }
    let r = c.submit(specs).await.expect("submit");
    assert!(r.iter().all(|r| r.error.is_empty()), "{r:?}");
    let (demoted, new) = (JobId(r[0].job), JobId(r[1].job));
    // The whole server: every GPU, with one core of each GPU's four.
    let member = one_core_per_gpu(server, 0xff);
    place(c, demoted, member, 90).await;
    let job = |s: &ViewSnapshot, id: JobId| s.jobs.iter().find(|j| j.id == id).cloned().expect("job kept");
    wait_view(c, deadline, "the first 8-GPU job running in queue 1", |s| {
        let j = job(s, demoted);
        j.state == JobState::Running && j.service_queue == 1
    })
    .await;
    let proposal = Proposal { id: ProposalId(91), job: new, members: vec![member], based_on: ViewVersion(0) };
    let pre = Preemption { proposal, victims: vec![demoted], reason: "a new job outranks it".into() };
    let d = c.preempt(v1::Preemption::from(&pre)).await.expect("preempt");
    assert!(matches!(decision(&d[0]), Some(Decision::Accepted { .. })), "{d:?}");
    wait_view(c, deadline, "the new job running, the demoted one pending", |s| {
        job(s, new).state == JobState::Running && job(s, demoted).state == JobState::Pending
    })
    .await;
    demoted
}

/// Agents for `servers`, a small job on each `(server, GPU mask)` of `layout`, a migrating scheduler
/// host, then the jobs of `blocked` in one submission: waits for `blocked[runs]` to run and
/// checks what every scenario must hold (module doc). With `demote_on`, the cluster ranks by
/// attained service and a demoted job is made on that server first ([`demote`]).
fn scenario(
    prefix: &str,
    servers: &[&str],
    layout: &[(u32, u64)],
    blocked: &[JobSpec],
    runs: usize,
    demote_on: Option<u32>,
) -> Outcome {
    let dir = test_dir(prefix);
    let d = dir.path();
    let tuning = Tuning { server_lease_ms: 3000, scheduler_lease_ms: 1000, ..tuning() };
    let mut cluster_spec = spec(servers.len() as u32);
    if demote_on.is_some() {
        cluster_spec.priorities.attained_service_gpu_s = vec![DEMOTE_AT_GPU_S];
    }
    let (view, addr, mut procs) = agent_cluster_of(d, cluster_spec, tuning, servers);

    rt().block_on(async {
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut c = admin_client(&view, vec![addr.clone()]);
        c.wait_for_leader().await.expect("leader");
        let watcher = Followed::start(c.clone());
        // Every agent registered and its server up.
        loop {
            let agents = c.agents().await.map(|a| a.len()).unwrap_or(0);
            if agents == servers.len() {
                break;
            }
            assert!(Instant::now() < deadline, "agents did not register");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        wait_view(&mut c, deadline, "servers up", |s| s.servers.iter().all(|r| r.health == Health::Up)).await;
        let demoted = match demote_on {
            Some(server) => Some(demote(&mut c, server, deadline).await),
            None => None,
        };

        // Fragment on purpose: one small job per (server, GPU mask) of the layout, on one core
        // per GPU from its first GPU's four on.
        let specs: Vec<v1::JobSpec> = layout.iter().enumerate().map(|(i, l)| small_spec(i, l.1.count_ones())).collect();
        let r = c.submit(specs).await.expect("submit");
        let mut small = Vec::new();
        let mut proposals = Vec::new();
        for (i, (r, &(server, gpus))) in r.iter().zip(layout).enumerate() {
            assert!(r.error.is_empty(), "{}", r.error);
            let job = JobId(r.job);
            small.push((job, server));
            let member = MemberPlacement {
                server: ServerId(server),
                gpus,
                cores: CoreMask::range(4 * gpus.trailing_zeros(), gpus.count_ones()),
                memory_mib: 1024 * gpus.count_ones(),
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

        // The scheduler host, with live migration every 500 ms, and the blocked job.
        let host_tls = tls(&view, Role::Scheduler, "h1");
        let host = with(&["scheduler", "run", "--view", &addr, "--name", "h1", "--migrate-every-ms", "500"], &host_tls);
        procs.push("h1", tessera(d, "h1.log", &host));
        let t0 = Instant::now();
        let r = c.submit(blocked.iter().map(v1::JobSpec::from).collect()).await.expect("submit");
        assert!(r.iter().all(|r| r.error.is_empty()), "{r:?}");
        let big = JobId(r[runs].job);
        let others: Vec<JobId> = r.iter().enumerate().filter(|&(i, _)| i != runs).map(|(_, r)| JobId(r.job)).collect();
        let log = || std::fs::read_to_string(d.join("h1.log")).unwrap_or_default();
        let bound = (t0 + Duration::from_secs(25)).min(deadline);
        wait_view(&mut c, bound, "the blocked job running", |s| {
            s.jobs.iter().any(|j| j.id == big && j.state == JobState::Running)
        })
        .await;
        eprintln!("{} running after {} ms", blocked[runs].name, t0.elapsed().as_millis());

        // The moved jobs, never on the blocked job's servers, run again.
        let (moves, blocked_on, others, demoted) = {
            let s = snapshot(&mut c).await;
            let placed = |id: JobId| {
                let j = s.jobs.iter().find(|j| j.id == id).expect("job kept");
                (j.state, j.placement.as_ref().map(|p| p.members.iter().map(|m| m.server.0).collect::<Vec<_>>()))
            };
            let mut blocked_on = placed(big).1.expect("the blocked job is placed");
            blocked_on.sort_unstable();
            let mut moves = Vec::new();
            for &(id, was) in &small {
                let (state, now) = placed(id);
                let now = now.expect("small jobs stay placed")[0];
                if now != was {
                    assert!(!blocked_on.contains(&now), "job {id} moved onto the blocked job's server {now}");
                    assert!(matches!(state, JobState::Running | JobState::Migrating), "job {id} moved: {state:?}");
                    moves.push((id, was, now));
                }
            }
            let others: Vec<JobState> = others.iter().map(|&id| placed(id).0).collect();
            let demoted = demoted.map(|id| s.jobs.iter().find(|j| j.id == id).cloned().expect("job kept"));
            (moves, blocked_on, others, demoted)
        };
        assert!(!moves.is_empty(), "no small job was moved\n{}", log());
        assert!(
            log().contains("migration: moved jobs to free a group for a blocked job"),
            "the host logged no plan\n{}",
            log()
        );
        let moved_ids: Vec<JobId> = moves.iter().map(|m| m.0).collect();
        wait_view(&mut c, deadline, "moved jobs running again", |s| {
            moved_ids.iter().all(|id| s.jobs.iter().any(|j| j.id == *id && j.state == JobState::Running))
        })
        .await;
        // On disk: the old task saved its checkpoint on SIGUSR1; the new one started on the
        // new server (task directories `j<job>-p<proposal>-m0` under each agent's data dir).
        for &(job, was, now) in &moves {
            let prefix = format!("j{}-p", job.0);
            let on = |server: u32| -> Vec<PathBuf> {
                task_dirs(&procs.data_dirs[server as usize])
                    .into_iter()
                    .filter(|p| p.file_name().is_some_and(|n| n.to_string_lossy().starts_with(&prefix)))
                    .collect()
            };
            let new = on(now);
            assert_eq!(new.len(), 1, "job {job}: one task on its new server: {new:?}");
            let out = std::fs::read_to_string(new[0].join("stdout.log")).unwrap_or_default();
            assert!(out.contains("started"), "job {job} on its new server: {out:?}");
            let old = on(was);
            assert_eq!(old.len(), 1, "job {job}: its old task: {old:?}");
            let out = std::fs::read_to_string(old[0].join("stdout.log")).unwrap_or_default();
            assert!(out.contains("checkpointed"), "job {job}'s old task was not checkpointed: {out:?}");
        }

        let h = watcher.stop().await;
        assert!(h.violations.is_empty(), "double allocation or a gap in the history: {:?}", h.violations);
        for &(job, _, now) in &moves {
            assert_eq!(
                h.placements[&job].last().map(|p| p.0),
                Some(now),
                "job {job}'s placements: {:?}",
                h.placements[&job]
            );
            assert!(h.placements[&job].len() >= 2, "job {job}'s placements: {:?}", h.placements[&job]);
        }
        Outcome { moves, blocked_on, others, demoted }
    })
}

#[test]
fn blocked_eight_gpu_job_starts_after_small_jobs_move() {
    // GPUs 0, 2, 4 and 6 busy on both servers (one per PCIe switch): 4 free on each, 8 on none.
    let layout: Vec<(u32, u64)> = (0..2).flat_map(|s| [0, 2, 4, 6].map(|g| (s, 1 << g))).collect();
    let big = blocked_spec("big-8", 1, 8, LocalityLevel::Server);
    let o = scenario("tessera-migration-", &["r0-s00", "r0-s01"], &layout, &[big], 0, None);
    let [server] = o.blocked_on[..] else { panic!("one member: {:?}", o.blocked_on) };
    assert!(o.moves.iter().all(|&(_, was, now)| was == server && now != server), "moves: {:?}", o.moves);
}

/// 5, 5, 3 and 3 busy GPUs on four servers: 16 free (3, 3, 5, 5), no server wholly free, half
/// the GPUs busy (the host plans moves only from that use on).
fn four_servers_sixteen_free() -> Vec<(u32, u64)> {
    let busy: [&[u32]; 4] = [&[0, 1, 2, 4, 6], &[0, 1, 2, 4, 6], &[0, 2, 4], &[0, 2, 4]];
    busy.iter().enumerate().flat_map(|(s, gpus)| gpus.iter().map(move |&g| (s as u32, 1 << g))).collect()
}

#[test]
fn a_moved_job_with_no_free_home_gets_one_made_by_a_chained_move() {
    // Server 0: a 2-GPU job on one PCIe switch (GPUs 0 and 1). Server 1: 1-GPU jobs on GPUs 0,
    // 2, 4, 6 and 7: no switch whole. Server 2: a 4-GPU and a 3-GPU job, GPU 7 free. Freeing
    // server 0 for the 8-GPU job moves the pair, which has no free switch anywhere; a 1-GPU job
    // of server 1 moves to server 2's free GPU first, and the pair takes the switch it left.
    // The leader lets the host make the chain (the first move frees what the second takes).
    let mut layout: Vec<(u32, u64)> = vec![(0, 0b11)];
    layout.extend([0, 2, 4, 6, 7].map(|g| (1, 1 << g)));
    layout.extend([(2, 0b1111), (2, 0b111_0000)]);
    let big = blocked_spec("big-8", 1, 8, LocalityLevel::Server);
    let o = scenario("tessera-migration-chain-", &["r0-s00", "r0-s01", "r0-s02"], &layout, &[big], 0, None);
    assert_eq!(o.blocked_on, vec![0], "the 8-GPU job runs where the pair was");
    let mut hops: Vec<(u32, u32)> = o.moves.iter().map(|&(_, was, now)| (was, now)).collect();
    hops.sort_unstable();
    assert_eq!(hops, vec![(0, 1), (1, 2)], "moves: {:?}", o.moves);
}

#[test]
fn blocked_two_server_gang_starts_after_six_small_jobs_move() {
    let layout = four_servers_sixteen_free();
    let gang = blocked_spec("gang-16", 2, 8, LocalityLevel::Rack);
    let o = scenario("tessera-migration-gang-", &["r0-s00", "r0-s01", "r0-s02", "r0-s03"], &layout, &[gang], 0, None);
    assert_eq!(o.blocked_on, vec![2, 3], "the gang runs on the two servers the fewest moves free");
    // Six moves: more than the 4 a plan could make in all before the bound was per member.
    assert_eq!(o.moves.len(), 6, "moves: {:?}", o.moves);
    assert!(o.moves.iter().all(|&(_, was, now)| was >= 2 && now < 2), "moves: {:?}", o.moves);
}

#[test]
fn the_host_moves_jobs_for_the_smallest_blocked_job_first() {
    // The gang test's layout (16 GPUs free, 3, 3, 5 and 5, no server whole), and the gang
    // submitted together with an 8-GPU job, the gang first: moves could free room for either
    // but not for both. The migration task plans for the smallest blocked job first
    // (`migration_task::plan_order`): the 8-GPU job runs after the three jobs of server 2 or 3
    // move, and 8 GPUs free are then too few to plan for the gang, which keeps waiting.
    let layout = four_servers_sixteen_free();
    let blocked =
        [blocked_spec("gang-16", 2, 8, LocalityLevel::Rack), blocked_spec("big-8", 1, 8, LocalityLevel::Server)];
    let o = scenario("tessera-migration-order-", &["r0-s00", "r0-s01", "r0-s02", "r0-s03"], &layout, &blocked, 1, None);
    let [server] = o.blocked_on[..] else { panic!("one member: {:?}", o.blocked_on) };
    assert!(server >= 2, "the 8-GPU job runs where the fewest moves free a server: {server}");
    assert_eq!(o.moves.len(), 3, "moves: {:?}", o.moves);
    assert_eq!(o.others, vec![JobState::Pending], "the gang waits");
}

#[test]
fn under_attained_service_order_the_host_moves_jobs_for_the_higher_queue_first() {
    // Servers 0–2 with 1-GPU jobs on GPUs 0, 2, 4 and 6 (12 free, four on each, none whole); on
    // server 3 a new 8-GPU job runs where it preempted `demoted-8`, now pending in queue 1.
    // Moves can start the 8-GPU demoted job (the four jobs of one server onto the other two) or
    // the 2 × 6 gang (two jobs from each of two servers onto the third), not both. The task
    // plans for the higher queue first (`migration_task::plan_order`), though the demoted job is
    // smaller: the gang runs, and nobody is preempted. With the queue left out of the order, the
    // moves started the demoted job instead, and the gang then preempted it and the new job,
    // both in queue 1 by then, and ran on their servers (0 and 3).
    let layout: Vec<(u32, u64)> = (0..3).flat_map(|s| [0, 2, 4, 6].map(|g| (s, 1 << g))).collect();
    let gang = blocked_spec("gang-12", 2, 6, LocalityLevel::Rack);
    let servers = ["r0-s00", "r0-s01", "r0-s02", "r0-s03"];
    let o = scenario("tessera-migration-las-", &servers, &layout, &[gang], 0, Some(3));
    assert_eq!(o.blocked_on.len(), 2, "two members: {:?}", o.blocked_on);
    assert!(o.blocked_on.iter().all(|&s| s < 3), "the gang runs beside the small jobs: {:?}", o.blocked_on);
    assert_eq!(o.moves.len(), 4, "moves: {:?}", o.moves);
    let d = o.demoted.expect("a demoted job");
    assert_eq!((d.state, d.service_queue, d.preemptions), (JobState::Pending, 1, 1), "the demoted job waits: {d:?}");
}
