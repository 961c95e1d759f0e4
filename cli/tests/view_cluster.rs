//! The replicated view as real processes on loopback: `tessera view serve` ×3, driven through
//! the gRPC API with the leader-following client.
//!
//! - `kill_leader_under_load`: proposals from several clients, `kill -9` of the leader, a new
//!   leader approves, the killed replica restarts from its RocksDB directory and catches up;
//!   every acknowledged placement is on every replica, no device is held twice, equal hashes.
//! - `submissions_are_admitted_once_across_a_leader_kill`: submissions under request ids, the
//!   leader killed among them, every request sent again: each job admitted exactly once.
//! - `api_contract`: leader hints on follower writes, linearizable follower reads, watch
//!   deltas (a device reported unhealthy among them), refusals of malformed, oversized and
//!   unknown input with a status that says why.
//! - `membership_and_foreign_data_dir`: a replica added through a raft conf change catches up
//!   and is removed again; a data directory of another cluster is refused at start.
//! - `registration_heartbeat_and_lease_expiry`: node-agent registration checks the server and
//!   its topology; a server whose lease expires is marked down and its gang re-queued whole.

use std::collections::BTreeMap;
use std::process::Command;
use std::time::{Duration, Instant};
use tessera_proto::v1;
use tessera_testkit::ProcessCluster;
use tessera_view::{
    Decision, JobId, JobSpec, LocalityLevel, MemberPlacement, Proposal, ProposalId, ServerId, ViewVersion, invariants,
};
use tessera_view_server::{LEADER_KEY, ServeFile, Tuning, ViewClient};
use tonic::Code;

mod common;
use common::*;

/// Three (or `n`) replica processes over `servers` servers, the tests' tuning.
fn start(n: usize, servers: u32, raft_ports: bool) -> ProcessCluster {
    cluster(n, spec(servers), tuning(), raft_ports, None)
}

/// Replica `addr`'s id in `c`.
fn id_of(c: &ProcessCluster, addr: &str) -> u64 {
    c.id_of(addr).unwrap_or_else(|| panic!("{addr} is not a replica of this cluster"))
}

/// Waits until every replica answers with the same, non-zero applied index; an error names
/// what each replica last said when that does not happen within 30 s.
async fn converge(c: &mut ViewClient, addrs: &[String]) -> Result<u64, String> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let mut applied = Vec::new();
        for a in addrs {
            applied.push(c.status_of(a).await.map(|s| s.applied_index).map_err(|e| e.to_string()));
        }
        if let Ok(first) = &applied[0]
            && *first > 0
            && applied.iter().all(|x| x.as_ref() == Ok(first))
        {
            return Ok(*first);
        }
        if Instant::now() > deadline {
            return Err(format!("replicas did not converge within 30 s: {applied:?}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn submit(c: &mut ViewClient, n: usize) -> Vec<u64> {
    let specs: Vec<v1::JobSpec> = (0..n)
        .map(|i| {
            let mut s = JobSpec::simple(&format!("j{i}"), 1, 1);
            s.tolerate = LocalityLevel::Any;
            s.memory_mib_per_gpu = Some(1024);
            v1::JobSpec::from(&s)
        })
        .collect();
    let r = c.submit(specs).await.expect("submit");
    r.iter()
        .map(|x| {
            assert!(x.error.is_empty(), "{}", x.error);
            x.job
        })
        .collect()
}

#[test]
fn kill_leader_under_load() {
    const SERVERS: u32 = 16;
    // Raft on its own ports here (the other tests share the client port).
    let mut cluster = start(3, SERVERS, true);
    let addrs = cluster.addrs();
    let rt = rt();
    let result = rt.block_on(async {
        let mut c = admin_client(&cluster, addrs.clone());
        let leader = c.wait_for_leader().await.expect("leader");
        // The client port does not serve raft when raft has its own port.
        let mut rc = v1::raft_client::RaftClient::new(channel(&cluster, Role::Replica, "replica-9", &addrs[0]).await);
        let batch = v1::RaftBatch { cluster: String::new(), from: 2, to: 1, messages: vec![] };
        let s = rc.send(tokio_stream::iter(vec![batch])).await.expect_err("no raft on the client port");
        assert_eq!(s.code(), Code::Unimplemented, "{s:?}");
        // Each slot (server, gpu) is one 1-GPU job.
        let jobs = submit(&mut c, 120).await;
        let mut acked: BTreeMap<u64, (u64, MemberPlacement)> = BTreeMap::new();
        let mut next = 0usize;
        let mut killed: Option<(Instant, String)> = None;
        let mut committed_after_kill = 0;
        let mut pid = 1u64;
        let deadline = Instant::now() + Duration::from_secs(60);
        while next < jobs.len() {
            assert!(Instant::now() < deadline, "load did not finish within 60 s\n{}", cluster.logs(15));
            // A request of up to 8 proposals: job k on server k % 16, GPU (k / 16) % 8.
            let mut props = Vec::new();
            for (k, job) in jobs.iter().enumerate().skip(next).take(8) {
                let server = (k % SERVERS as usize) as u32;
                let gpu = (k / SERVERS as usize) % 8;
                props.push(Proposal {
                    id: ProposalId(1000 + k as u64),
                    job: JobId(*job),
                    members: vec![member(server, 1 << gpu, 4 * gpu as u32)],
                    based_on: ViewVersion(0),
                });
            }
            let wire: Vec<v1::Proposal> = props.iter().map(v1::Proposal::from).collect();
            let results = c.propose(wire).await.expect("propose");
            let mut all_known = true;
            for (p, r) in props.iter().zip(&results) {
                match decision(r) {
                    Some(Decision::Accepted { .. } | Decision::AlreadyApplied { .. }) => {
                        acked.insert(p.job.0, (p.id.0, p.members[0]));
                        if let Some((_, old)) = &killed
                            && c.current() != old
                        {
                            committed_after_kill += 1;
                        }
                    }
                    Some(Decision::Rejected { reason, .. }) => panic!("proposal {} rejected: {reason}", p.id),
                    None => all_known = false,
                }
            }
            if all_known {
                next += props.len();
            }
            pid += 1;
            if pid == 6 && killed.is_none() {
                let s = c.wait_for_leader().await.expect("leader");
                cluster.kill(id_of(&cluster, &s.leader_addr)).expect("kill -9 the leader");
                killed = Some((Instant::now(), s.leader_addr.clone()));
            }
        }
        let (kill_at, old) = killed.expect("the leader was killed");
        assert!(committed_after_kill > 0, "no approval by a new leader after the kill");
        let new = c.wait_for_leader().await.expect("new leader");
        assert_ne!(new.leader_addr, old, "the killed replica cannot lead");
        assert!(new.term > leader.term, "a new term after the failover");
        let failover = kill_at.elapsed();
        // Restart the killed replica: it recovers from RocksDB and catches up (by log or snapshot).
        cluster.restart(id_of(&cluster, &old)).expect("restart");
        if let Err(e) = converge(&mut c, &addrs).await {
            panic!("{e}\n{}", cluster.logs(15));
        }
        let mut hashes = Vec::new();
        for a in &addrs {
            let v = view_of(&mut c, a).await;
            let rep = invariants::check(&v);
            assert!(rep.is_clean(), "{a}: {:?}", rep.violations);
            for (job, (proposal, m)) in &acked {
                let j = v.job(JobId(*job)).unwrap_or_else(|| panic!("{a}: acknowledged job {job} missing"));
                let p = j.placement.as_ref().unwrap_or_else(|| panic!("{a}: acknowledged job {job} not placed"));
                assert_eq!(p.proposal, ProposalId(*proposal), "{a}: job {job}");
                assert_eq!(p.members, vec![*m], "{a}: job {job}");
            }
            hashes.push(v.state_hash());
        }
        assert!(hashes.windows(2).all(|w| w[0] == w[1]), "state hashes differ: {hashes:x?}");
        // No slot acknowledged twice.
        let mut slots = std::collections::HashSet::new();
        for (_, m) in acked.values() {
            assert!(slots.insert((m.server, m.gpus)), "slot {:?} acknowledged twice", (m.server, m.gpus));
        }
        (acked.len(), failover)
    });
    assert_eq!(result.0, 120);
}

fn submission(k: usize, i: usize) -> v1::JobSpec {
    let mut s = JobSpec::simple(&format!("sub-{k}-{i}"), 1, 1);
    s.tolerate = LocalityLevel::Any;
    s.memory_mib_per_gpu = Some(1024);
    v1::JobSpec::from(&s)
}

/// Submissions carry a request id and the view admits a job at most once per id, so a client
/// that retries across a leader kill, or sends a whole request again because it never saw the
/// answer, gets the jobs admitted the first time and never a second copy.
#[test]
fn submissions_are_admitted_once_across_a_leader_kill() {
    const REQUESTS: usize = 24;
    const PER: usize = 3;
    let mut cluster = start(3, 4, false);
    let addrs = cluster.addrs();
    let rt = rt();
    rt.block_on(async {
        let mut c = admin_client(&cluster, addrs.clone());
        c.wait_for_leader().await.expect("leader");
        let mut first: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        let mut killed = None;
        for k in 0..REQUESTS {
            if k == REQUESTS / 3 {
                let s = c.wait_for_leader().await.expect("leader");
                let id = id_of(&cluster, &s.leader_addr);
                cluster.kill(id).expect("kill -9 the leader");
                killed = Some(id);
            }
            let specs = (0..PER).map(|i| submission(k, i)).collect();
            let r = c.submit_as(&format!("sub-{k}"), specs).await.unwrap_or_else(|e| panic!("request {k}: {e}"));
            assert!(r.iter().all(|x| x.error.is_empty() && x.job != 0), "request {k}: {r:?}");
            first.insert(k, r.iter().map(|x| x.job).collect());
        }
        let killed = killed.expect("the leader was killed");
        // A client that lost every answer sends every request again, unchanged, to the new leader.
        for (k, jobs) in &first {
            let specs = (0..PER).map(|i| submission(*k, i)).collect();
            let r = c.submit_as(&format!("sub-{k}"), specs).await.expect("resend");
            let again: Vec<u64> = r.iter().map(|x| x.job).collect();
            assert_eq!(&again, jobs, "request sub-{k} sent again admitted other jobs: {r:?}");
        }
        // The same id with another spec is refused, and admits nothing.
        let r = c.submit_as("sub-0", vec![submission(99, 0)]).await.expect("reuse");
        assert!(r[0].job == 0 && r[0].error.contains("another spec"), "{r:?}");
        // A malformed request id is refused with the reason.
        let e = c.submit_as("has space", vec![submission(98, 0)]).await.expect_err("bad id");
        assert_eq!(e.status().map(|s| s.code()), Some(Code::InvalidArgument), "{e}");
        // The killed replica comes back and catches up; every replica holds each job once.
        cluster.restart(killed).expect("restart");
        if let Err(e) = converge(&mut c, &addrs).await {
            panic!("{e}\n{}", cluster.logs(15));
        }
        for a in &addrs {
            let v = view_of(&mut c, a).await;
            let rep = invariants::check(&v);
            assert!(rep.is_clean(), "{a}: {:?}", rep.violations);
            assert_eq!(v.jobs().len(), REQUESTS * PER, "{a}: jobs admitted");
            for (k, jobs) in &first {
                for (i, job) in jobs.iter().enumerate() {
                    let j = v.job(JobId(*job)).unwrap_or_else(|| panic!("{a}: job {job} missing"));
                    assert_eq!(j.request.as_ref().map(|r| r.as_str().to_string()), Some(format!("sub-{k}/{i}")));
                }
            }
        }
    });
}

#[test]
fn api_contract() {
    let cluster = start(3, 8, false);
    let addrs = cluster.addrs();
    rt().block_on(async {
        let mut c = admin_client(&cluster, addrs.clone());
        let leader = c.wait_for_leader().await.expect("leader");
        let follower = addrs.iter().find(|a| **a != leader.leader_addr).expect("a follower").clone();
        let mut raw = v1::view_client::ViewClient::new(channel(&cluster, Role::Admin, "admin", &follower).await);
        // A follower names the leader only once it has heard from it: wait for that (bounded).
        let t0 = std::time::Instant::now();
        while c.status_of(&follower).await.expect("status").leader_addr != leader.leader_addr {
            assert!(t0.elapsed() < Duration::from_secs(10), "follower {follower} never learned the leader");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }

        // A write sent to a follower: UNAVAILABLE with the leader's address.
        let s = raw
            .cancel_job(v1::CancelJobRequest { job: 1, ..Default::default() })
            .await
            .expect_err("follower refuses writes");
        assert_eq!(s.code(), Code::Unavailable, "{s:?}");
        assert_eq!(s.metadata().get(LEADER_KEY).and_then(|v| v.to_str().ok()), Some(leader.leader_addr.as_str()));
        assert!(s.message().contains("leader is replica"), "{}", s.message());

        // Watch from the current version on the follower, then write through the leader.
        let v0 = c.status_of(&follower).await.expect("status").version;
        let mut watch = raw.watch(v1::WatchRequest { from_version: v0 }).await.expect("watch").into_inner();
        let jobs = submit(&mut c, 1).await;
        let ev = tokio::time::timeout(Duration::from_secs(10), watch.message()).await.expect("a watch event in time");
        match ev.expect("stream").expect("event").event {
            Some(v1::watch_event::Event::Delta(d)) => {
                assert!(d.to > v0 && d.jobs.iter().any(|j| j.id == jobs[0]), "delta {d:?} lacks job {}", jobs[0])
            }
            other => panic!("expected a delta, got {other:?}"),
        }
        // A device reported unhealthy reaches watchers beside its server's record (a host's
        // victim choice needs to know it stays taken).
        c.heartbeat(0, Some(0b10), vec!["GPU 1: test".into()], "").await.expect("heartbeat");
        let t0 = std::time::Instant::now();
        let mask = loop {
            let left = Duration::from_secs(10).saturating_sub(t0.elapsed());
            let ev = tokio::time::timeout(left, watch.message()).await.expect("the server's change in time");
            match ev.expect("stream").expect("event").event {
                Some(v1::watch_event::Event::Delta(d)) => {
                    if let Some(i) = d.servers.iter().position(|e| e.server_id == 0) {
                        assert_eq!(d.unhealthy.len(), d.servers.len(), "one mask per record: {d:?}");
                        break d.unhealthy[i];
                    }
                }
                other => panic!("expected a delta, got {other:?}"),
            }
        };
        assert_eq!(mask, 0b10);

        // Linearizable read on the follower sees the write; so does GetJob.
        let s = raw.snapshot(v1::ReadRequest { linearizable: true }).await.expect("read").into_inner();
        assert!(s.snapshot.expect("body").jobs.iter().any(|j| j.id == jobs[0]));
        let j = raw.get_job(v1::GetJobRequest { job: jobs[0], linearizable: true }).await.expect("get").into_inner();
        assert_eq!(j.job.expect("job").id, jobs[0]);
        let s = raw.get_job(v1::GetJobRequest { job: 999_999, linearizable: false }).await.expect_err("unknown job");
        assert_eq!(s.code(), Code::NotFound);

        let mut lead =
            v1::view_client::ViewClient::new(channel(&cluster, Role::Admin, "admin", &leader.leader_addr).await);
        // A proposal for a server and devices that do not exist: refused with a reason.
        let p = Proposal {
            id: ProposalId(7),
            job: JobId(jobs[0]),
            members: vec![member(500, 1, 0)],
            based_on: ViewVersion(0),
        };
        let r = lead
            .propose(v1::ProposeRequest { proposals: vec![v1::Proposal::from(&p)], for_job: None, target: Vec::new() })
            .await
            .expect("propose")
            .into_inner();
        match decision(&r.results[0]) {
            Some(Decision::Rejected { reason, .. }) => {
                assert!(!reason.conflict && reason.message.contains("500"), "{reason}")
            }
            other => panic!("expected a rejection, got {other:?}"),
        }
        let p = Proposal {
            id: ProposalId(8),
            job: JobId(jobs[0]),
            members: vec![member(0, 1 << 9, 0)],
            based_on: ViewVersion(0),
        };
        let r = lead
            .propose(v1::ProposeRequest { proposals: vec![v1::Proposal::from(&p)], for_job: None, target: Vec::new() })
            .await
            .expect("propose")
            .into_inner();
        assert!(matches!(decision(&r.results[0]), Some(Decision::Rejected { .. })), "device 9 of an 8-GPU server");
        // An unknown job.
        let p = Proposal {
            id: ProposalId(9),
            job: JobId(424_242),
            members: vec![member(0, 1, 0)],
            based_on: ViewVersion(0),
        };
        let r = lead
            .propose(v1::ProposeRequest { proposals: vec![v1::Proposal::from(&p)], for_job: None, target: Vec::new() })
            .await
            .expect("propose")
            .into_inner();
        assert!(matches!(decision(&r.results[0]), Some(Decision::Rejected { .. })), "unknown job");

        // Malformed: no proposals; a spec that breaks its own rules; a missing topology.
        let s = lead
            .propose(v1::ProposeRequest { proposals: vec![], for_job: None, target: Vec::new() })
            .await
            .expect_err("empty");
        assert_eq!(s.code(), Code::InvalidArgument);
        let mut bad = v1::JobSpec::from(&JobSpec::simple("bad", 1, 1));
        bad.gpus_per_member = 0;
        let s = lead
            .submit_job(v1::SubmitJobRequest { specs: vec![bad], request_id: String::new() })
            .await
            .expect_err("bad spec");
        assert_eq!(s.code(), Code::InvalidArgument);
        assert!(s.message().contains("gpus_per_member"), "{}", s.message());
        let s = lead
            .register_server(v1::RegisterServerRequest { name: "r0-0".into(), topology: None, ..Default::default() })
            .await
            .expect_err("no topology");
        assert_eq!(s.code(), Code::InvalidArgument);
        // A job no server could ever hold is refused at submission with the reason.
        let huge = v1::JobSpec::from(&JobSpec::simple("huge", 1, 64));
        let r = lead
            .submit_job(v1::SubmitJobRequest { specs: vec![huge], request_id: String::new() })
            .await
            .expect("submit")
            .into_inner();
        assert!(r.results[0].job == 0 && !r.results[0].error.is_empty(), "{:?}", r.results[0]);
        assert_eq!(r.results[0].refusal(), v1::SubmitRefusal::NeverFits, "{:?}", r.results[0]);

        // Oversized: more than max_request_bytes (4 MiB default).
        let mut big = v1::JobSpec::from(&JobSpec::simple("big", 1, 1));
        big.command = vec!["x".repeat(5 << 20)];
        let s = lead
            .submit_job(v1::SubmitJobRequest { specs: vec![big], request_id: String::new() })
            .await
            .expect_err("oversized");
        assert!(matches!(s.code(), Code::OutOfRange | Code::ResourceExhausted), "{s:?}");

        // Garbage bytes on the raft port: refused, the replica keeps serving.
        let mut rc =
            v1::raft_client::RaftClient::new(channel(&cluster, Role::Replica, "replica-9", &leader.leader_addr).await);
        let batch = v1::RaftBatch { cluster: "nope".into(), from: 1, to: 2, messages: vec![vec![1, 2, 3]] };
        let s = rc.send(tokio_stream::iter(vec![batch])).await.expect_err("foreign cluster");
        assert_eq!(s.code(), Code::PermissionDenied);
        let st = c.status_of(&leader.leader_addr).await.expect("still serving");
        let batch =
            v1::RaftBatch { cluster: st.cluster.clone(), from: 2, to: st.replica, messages: vec![vec![0xff; 7]] };
        let s = rc.send(tokio_stream::iter(vec![batch])).await.expect_err("garbage message");
        assert_eq!(s.code(), Code::InvalidArgument);
        c.status_of(&leader.leader_addr).await.expect("still serving after garbage");
    });
    cluster.stop(Duration::from_secs(10)).expect("a clean stop on SIGTERM");
}

#[test]
fn membership_and_foreign_data_dir() {
    let mut cluster = start(3, 4, false);
    let addrs = cluster.addrs();
    rt().block_on(async {
        let mut c = admin_client(&cluster, addrs.clone());
        c.wait_for_leader().await.expect("leader");
        // A young cluster (its log still whole): the new replica must still catch up through a
        // snapshot, which carries the membership, and end with the same voters as the others.
        submit(&mut c, 5).await;
        let (id, new) = cluster.start_joining().expect("start replica 4");
        assert_eq!(id, 4);
        let new_addr = new.client.to_string();
        let voters = c.add_replica(4, &new_addr, "").await.expect("add replica 4");
        assert_eq!(voters, vec![1, 2, 3, 4]);
        let mut all = addrs.clone();
        all.push(new_addr.clone());
        if let Err(e) = converge(&mut c, &all).await {
            panic!("new replica did not catch up: {e}\n{}", cluster.logs(15));
        }
        let h: Vec<u64> = {
            let mut h = Vec::new();
            for a in &all {
                h.push(c.status_of(a).await.expect("status").state_hash);
            }
            h
        };
        assert!(h.windows(2).all(|w| w[0] == w[1]), "{h:x?}");
        for a in &all {
            let st = c.status_of(a).await.expect("status");
            assert_eq!(st.voters, vec![1, 2, 3, 4], "{a} (replica {}) voters", st.replica);
        }
        let log4 = std::fs::read_to_string(cluster.log_path(4).expect("replica 4")).expect("replica 4 log");
        assert!(log4.contains("installed snapshot"), "replica 4 caught up without a snapshot:\n{log4}");
        let voters = c.remove_replica(4).await.expect("remove replica 4");
        assert_eq!(voters, vec![1, 2, 3]);
        let s = c.add_replica(0, "x:1", "").await.expect_err("id 0");
        assert_eq!(s.status().map(|s| s.code()), Some(Code::InvalidArgument));
    });
    // Replica 1's directory, opened as a replica of another cluster: refused with a clear error.
    cluster.kill(1).expect("kill replica 1");
    let mut file = ServeFile::from_file(cluster.config_path(1).expect("replica 1")).expect("replica 1's config");
    file.cluster = "other".into();
    file.peers = vec![format!("1={}", addrs[0])];
    let foreign = cluster.dir().join("replica-1-other.toml");
    file.write(&foreign).expect("config");
    let out = Command::new(env!("CARGO_BIN_EXE_tessera"))
        .args(["view", "serve", "--config"])
        .arg(&foreign)
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "started on a foreign data dir");
    assert!(err.contains("belongs to cluster") && err.contains("`t@"), "{err}");
}

#[test]
fn registration_heartbeat_and_lease_expiry() {
    let cluster = cluster(1, spec(4), Tuning { server_lease_ms: 600, ..tuning() }, false, None);
    let addr = cluster.addrs()[0].clone();
    let outcome = rt().block_on(async {
        let mut c = admin_client(&cluster, vec![addr.clone()]);
        c.wait_for_leader().await.expect("leader");
        let mut g = v1::view_client::ViewClient::new(channel(&cluster, Role::Admin, "admin", &addr).await);
        let seed = tessera_view::Topology::preset("seed-8gpu").expect("preset");
        // Unknown server; a topology that contradicts the configuration set.
        let s = g
            .register_server(v1::RegisterServerRequest {
                name: "nope".into(),
                topology: Some(v1::Topology::from(&seed)),
                ..Default::default()
            })
            .await
            .expect_err("unknown server");
        assert_eq!(s.code(), Code::NotFound, "{s:?}");
        let v = view_of(&mut c, &addr).await;
        let (n0, n1) = (
            v.server_name(ServerId(0)).expect("name").to_string(),
            v.server_name(ServerId(1)).expect("name").to_string(),
        );
        let mut wrong = seed.clone();
        wrong.memory_mib /= 2;
        let s = g
            .register_server(v1::RegisterServerRequest {
                name: n0.clone(),
                topology: Some(v1::Topology::from(&wrong)),
                ..Default::default()
            })
            .await
            .expect_err("wrong topology");
        assert_eq!(s.code(), Code::FailedPrecondition, "{s:?}");
        assert!(s.message().contains("memory"), "{}", s.message());
        let r0 = g
            .register_server(v1::RegisterServerRequest {
                name: n0.clone(),
                topology: Some(v1::Topology::from(&seed)),
                ..Default::default()
            })
            .await
            .expect("register")
            .into_inner();
        assert_eq!((r0.server, r0.lease_ms), (0, 600));
        g.register_server(v1::RegisterServerRequest {
            name: n1,
            topology: Some(v1::Topology::from(&seed)),
            ..Default::default()
        })
        .await
        .expect("register");
        // A job on server 1, which will stop heartbeating; server 0 keeps its lease.
        let jobs = submit(&mut c, 1).await;
        let p = Proposal {
            id: ProposalId(1),
            job: JobId(jobs[0]),
            members: vec![member(1, 1, 0)],
            based_on: ViewVersion(0),
        };
        let r = c.propose(vec![v1::Proposal::from(&p)]).await.expect("propose");
        assert!(matches!(decision(&r[0]), Some(Decision::Accepted { .. })), "{r:?}");
        let t0 = Instant::now();
        loop {
            g.heartbeat(v1::HeartbeatRequest { server: 0, ..Default::default() })
                .await
                .expect("server 0 keeps its lease");
            let v = view_of(&mut c, &addr).await;
            let job = v.job(JobId(jobs[0])).expect("job");
            if v.servers()[1].health == tessera_view::Health::Down {
                assert_eq!(job.state, tessera_view::JobState::Pending, "the gang goes back to pending whole");
                assert!(job.placement.is_none());
                assert_eq!(v.servers()[0].health, tessera_view::Health::Up, "the heartbeating server stays up");
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "server 1 never marked down");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let expired_after = t0.elapsed();
        // A heartbeat after expiry is refused; registering again brings the server back.
        let s = g.heartbeat(v1::HeartbeatRequest { server: 1, ..Default::default() }).await.expect_err("expired");
        assert_eq!(s.code(), Code::FailedPrecondition);
        g.register_server(v1::RegisterServerRequest {
            name: n0,
            topology: Some(v1::Topology::from(&seed)),
            ..Default::default()
        })
        .await
        .expect("re-register");
        expired_after
    });
    cluster.stop(Duration::from_secs(10)).expect("a clean stop on SIGTERM");
    assert!(outcome >= Duration::from_millis(300), "expired too early: {outcome:?}");
}
