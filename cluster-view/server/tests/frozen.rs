//! A replica that is frozen (its host stopped, `docker pause`, SIGSTOP) accepts connections in
//! its kernel and never answers. A client's call used to wait on it for the whole deadline and
//! fail, and the next call began on it again: clients (agents, scheduler hosts, the CLI) were
//! cut off for as long as the freeze lasted, although its peers had elected a new leader within
//! a second. Found by the chaos suite (`deploy/chaos/run.sh`, seed 1, the `pause-leader`
//! fault: 4.4 s without an approval during a 4.4 s pause). Now one attempt waits at most
//! `ViewClient::attempt_timeout` and the call goes on to the next replica.

use std::time::{Duration, Instant};
use tessera_testkit::LocalCluster;
use tessera_view::{ClusterSpec, JobSpec, Topology};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frozen_replica_holds_one_attempt_not_the_call() {
    let spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 1, 2, 1);
    let cluster = LocalCluster::builder(spec).replicas(1).start().await.expect("cluster");
    cluster.client().expect("client").wait_for_leader().await.expect("leader");
    // The frozen replica: a socket whose connections the kernel completes and nobody serves.
    let frozen = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let frozen_addr = frozen.local_addr().expect("address").to_string();
    let mut addrs = vec![frozen_addr.clone()];
    addrs.extend(cluster.addrs());
    let deadline = Duration::from_secs(3);
    let mut c = tessera_view_server::ViewClient::new(addrs)
        .expect("client")
        .with_deadline(deadline)
        .with_security(cluster.security());
    assert_eq!(c.attempt_timeout(), Duration::from_secs(1));

    let wire = tessera_proto::v1::JobSpec::from(&JobSpec::simple("after-a-freeze", 1, 1));
    let t0 = Instant::now();
    let first = c.submit(vec![wire.clone()]).await;
    let took = t0.elapsed();
    assert!(first.is_ok(), "the call failed on the frozen replica: {first:?}");
    assert!(
        took < c.attempt_timeout() + Duration::from_millis(900),
        "one attempt on the frozen replica, then the live one: took {took:?}"
    );
    assert_ne!(c.current(), frozen_addr, "the client stays off the frozen replica");

    // The next call begins where the last one succeeded.
    let t1 = Instant::now();
    c.submit(vec![wire]).await.expect("second submission");
    assert!(t1.elapsed() < Duration::from_millis(500), "the second call took {:?}", t1.elapsed());
    cluster.stop().await.expect("stop");
}
