//! The driver thread in-process (one replica on a real RocksDB directory, no network): watch
//! steps fall back to a snapshot when the change log no longer reaches back far enough,
//! linearizable reads wait for the confirmed index, and a preemption is pre-checked by the
//! leader and applied through the log.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tessera_replica::{Answer, Replica, ReplicaConfig};
use tessera_view::{
    ClusterSpec, ClusterView, Command, Decision, JobSpec, JobState, MemberPlacement, Outcome, Preemption, Proposal,
    ProposalId, ServerId, Topology,
};
use tessera_view_server::node::{Driver, DriverConfig, NodeHandle, NodeRequest, ReadOut, ReadTarget, WatchStep};

/// A single-replica driver on its own thread: its handle, and what stops it.
fn start(dir: &std::path::Path) -> (NodeHandle, Running) {
    // A change log of 4 entries: a watcher further behind needs a snapshot.
    let cfg = ReplicaConfig { sync: false, change_log: 4, ..ReplicaConfig::new(1, vec![1], "t") };
    let replica = Replica::open(cfg, dir, || {
        ClusterView::from_spec(&ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 4, 2, 1))
    })
    .expect("open");
    let dcfg = DriverConfig {
        tick: Duration::from_millis(5),
        timeout: Duration::from_secs(5),
        lease: Duration::ZERO,
        scheduler_lease: Duration::from_secs(5),
        queue: 1024,
        peer_queue: 16,
        election: Duration::from_millis(100),
    };
    let addrs = BTreeMap::from([(1, "127.0.0.1:1".to_string())]);
    let (driver, handle) =
        Driver::new(replica, dcfg, addrs, Arc::new(RwLock::new(HashMap::new())), Box::new(|_, _| {}));
    let stopper = driver.stopper();
    let thread = std::thread::spawn(move || driver.run().expect("driver"));
    (handle, Running { stopper, thread })
}

/// The driver's thread and its stop flag.
struct Running {
    stopper: Arc<std::sync::atomic::AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

/// Stops the driver and waits for its thread, before the test's directory is removed and the
/// process exits: a driver still running then (RocksDB open, its files deleted, the process
/// tearing down) made the test binary abort at exit now and then ("pthread lock: Invalid
/// argument", SIGABRT, about 1 run in 6).
fn stop(r: Running) {
    r.stopper.store(true, std::sync::atomic::Ordering::Relaxed);
    r.thread.join().expect("the driver thread");
}

/// Polls the status until the single replica has elected itself (bounded).
async fn until_leader(node: &NodeHandle) {
    let t0 = Instant::now();
    loop {
        let s = node.ask(NodeRequest::Status).await.expect("status");
        if s.role == "leader" {
            return;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "no leader");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

#[test]
fn watch_falls_back_to_snapshot_and_reads_wait_for_commit() {
    let dir = tempfile::tempdir().expect("tmp");
    let (node, running) = start(dir.path());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    rt.block_on(async {
        until_leader(&node).await;
        let v0 = node.ask(NodeRequest::Status).await.expect("status").version;
        let mut last = 0;
        for i in 0..10 {
            let (a, v) = node
                .ask(|r| NodeRequest::Commands(vec![(Command::submit(JobSpec::simple(&format!("j{i}"), 1, 1)), r)]))
                .await
                .expect("submit");
            assert!(matches!(a, Answer::Applied(Outcome::Submitted(Ok(_)))), "{a:?}");
            last = v;
        }
        match node.ask(|r| NodeRequest::Delta(v0, r)).await.expect("delta") {
            WatchStep::Snapshot(s) => assert_eq!(s.version, last, "the snapshot is current"),
            WatchStep::Delta(d) => panic!("10 changes behind with a 4-entry change log, got a delta {d:?}"),
        }
        match node.ask(|r| NodeRequest::Delta(last - 1, r)).await.expect("delta") {
            WatchStep::Delta(d) => assert_eq!((d.from, d.to, d.jobs.len()), (last - 1, last, 1)),
            WatchStep::Snapshot(_) => panic!("one change behind must get a delta"),
        }
        let read = node
            .ask(|reply| NodeRequest::Read { linearizable: true, what: ReadTarget::Snapshot, reply })
            .await
            .expect("linearizable read");
        match read {
            ReadOut::Snapshot(s, _) => assert_eq!(s.version, last),
            other => panic!("wrong read: {other:?}"),
        }
    });
    stop(running);
}

#[test]
fn a_preemption_is_prechecked_by_the_leader_and_applied_through_the_log() {
    let dir = tempfile::tempdir().expect("tmp");
    let (node, running) = start(dir.path());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    rt.block_on(async {
        until_leader(&node).await;
        let submit = |spec: JobSpec| {
            let node = node.clone();
            async move {
                match node.ask(|r| NodeRequest::Commands(vec![(Command::submit(spec), r)])).await.expect("submit") {
                    (Answer::Applied(Outcome::Submitted(Ok(id))), _) => id,
                    other => panic!("submit answered {other:?}"),
                }
            }
        };
        let snapshot = || {
            let node = node.clone();
            async move {
                match node.ask(|reply| NodeRequest::Read { linearizable: true, what: ReadTarget::Snapshot, reply }).await {
                    Ok(ReadOut::Snapshot(s, _)) => {
                        ClusterView::from_snapshot(tessera_view::ViewSnapshot::try_from(*s).expect("valid snapshot"))
                    }
                    other => panic!("snapshot read answered {other:?}"),
                }
            }
        };
        let low = submit(JobSpec::simple("low", 1, 8)).await;
        let view = snapshot().await;
        let members = whole_server(&view, &view.job(low).expect("low").spec);
        let p = Proposal { id: ProposalId(1), job: low, members: members.clone(), based_on: view.version() };
        let (a, _) = node.ask(|r| NodeRequest::Propose(vec![(p, r)])).await.expect("propose");
        assert!(matches!(a, Answer::Applied(Outcome::Decided(ref d)) if d[0].is_placed()), "{a:?}");
        // An equal-priority job may not preempt: refused by the leader's pre-check, at once.
        let peer = submit(JobSpec::simple("peer", 1, 8)).await;
        let pre = |id: u64, job, based_on| Preemption {
            proposal: Proposal { id: ProposalId(id), job, members: members.clone(), based_on },
            victims: vec![low],
            reason: "test".into(),
        };
        let version = snapshot().await.version();
        let (a, _) = node.ask(|r| NodeRequest::Commands(vec![(Command::Preempt(pre(2, peer, version)), r)])).await.expect("ask");
        assert!(
            matches!(&a, Answer::Immediate(Decision::Rejected { reason, .. }) if reason.code() == "victim_not_preemptible"),
            "{a:?}"
        );
        // A higher-priority one takes the server through the log.
        let high = submit(JobSpec { priority: 10, ..JobSpec::simple("high", 1, 8) }).await;
        let version = snapshot().await.version();
        let (a, _) = node.ask(|r| NodeRequest::Commands(vec![(Command::Preempt(pre(3, high, version)), r)])).await.expect("ask");
        assert!(matches!(&a, Answer::Applied(Outcome::Decided(d)) if d[0].is_placed()), "{a:?}");
        let view = snapshot().await;
        let victim = view.job(low).expect("victim");
        assert_eq!((victim.state, victim.preemptions), (JobState::Pending, 1));
        assert_eq!(view.job(high).expect("preemptor").state, JobState::Placed);
        assert!(tessera_view::invariants::check(&view).is_clean());
    });
    stop(running);
}

/// The whole of server 0 for an 8-GPU job, with the shared fit function.
fn whole_server(view: &ClusterView, spec: &JobSpec) -> Vec<MemberPlacement> {
    let rec = *view.server(ServerId(0)).expect("server");
    let topo = view.topology_of(rec.config_set);
    let req = tessera_view::fit::member_request(spec, topo);
    let (m, _) = tessera_view::fit::plan_member(
        topo,
        &rec,
        ServerId(0),
        &req,
        tessera_view::LocalityLevel::Server,
        tessera_view::fit::FitMode::Pack,
    )
    .expect("fits an empty server");
    vec![m]
}
