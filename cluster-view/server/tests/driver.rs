//! The driver thread in-process (one replica on a real RocksDB directory, no network): watch
//! steps fall back to a snapshot when the change log no longer reaches back far enough, and
//! linearizable reads wait for the confirmed index.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, RwLock};
use std::time::{Duration, Instant};
use tessera_replica::{Answer, Replica, ReplicaConfig};
use tessera_view::{ClusterSpec, ClusterView, Command, JobSpec, Outcome, Topology};
use tessera_view_server::node::{Driver, DriverConfig, NodeHandle, NodeRequest, ReadOut, ReadTarget, WatchStep};

fn start(dir: &std::path::Path) -> NodeHandle {
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
    };
    let addrs = BTreeMap::from([(1, "127.0.0.1:1".to_string())]);
    let (driver, handle) =
        Driver::new(replica, dcfg, addrs, Arc::new(RwLock::new(HashMap::new())), Box::new(|_, _| {}));
    std::thread::spawn(move || driver.run().expect("driver"));
    handle
}

#[test]
fn watch_falls_back_to_snapshot_and_reads_wait_for_commit() {
    let dir = tempfile::tempdir().expect("tmp");
    let node = start(dir.path());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("rt");
    rt.block_on(async {
        // Wait until the single replica has elected itself.
        let t0 = Instant::now();
        loop {
            let s = node.ask(NodeRequest::Status).await.expect("status");
            if s.role == "leader" {
                break;
            }
            assert!(t0.elapsed() < Duration::from_secs(10), "no leader");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
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
            ReadOut::Job(..) => panic!("wrong read"),
        }
    });
}
