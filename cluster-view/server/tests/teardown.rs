//! A replica whose runtime goes away under it (a test that drops its cluster, a process that
//! shuts its runtime down) still stops its driver thread and closes its RocksDB before the
//! runtime is gone: a driver left running until the process exits can abort it in RocksDB's
//! static destructors ("pthread lock: Invalid argument", SIGABRT, seen in CI).

use tessera_testkit::LocalCluster;
use tessera_view::{ClusterSpec, Topology};

/// Threads of this process named as a replica's driver (`replica-ID`).
fn driver_threads() -> usize {
    std::fs::read_dir("/proc/self/task")
        .expect("/proc/self/task")
        .filter_map(|t| std::fs::read_to_string(t.ok()?.path().join("comm")).ok())
        .filter(|name| name.trim_end().starts_with("replica-"))
        .count()
}

#[test]
fn a_replica_dropped_with_its_runtime_stops_its_driver_thread() {
    assert_eq!(driver_threads(), 0, "nothing else in this binary runs a replica");
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
    rt.block_on(async {
        let spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 2, 2, 1);
        let cluster = LocalCluster::builder(spec).name("teardown").tls(false).start().await.expect("replica");
        cluster.client().expect("client").wait_for_leader().await.expect("the replica elected itself");
        assert_eq!(driver_threads(), 1, "the replica's driver runs");
        // Dropped, not stopped: the stop signal is sent, but nothing polls the replica again.
        drop(cluster);
    });
    // Dropping the runtime drops the replica's task mid-way.
    drop(rt);
    assert_eq!(driver_threads(), 0, "the driver thread ended with its runtime, its database closed");
}
