//! A watch stream follows a view that moves: a replica that knows no leader (an election, or cut
//! off from the others) refuses new watches and ends its streams after a grace, with
//! `UNAVAILABLE`, so that watchers (node agents, scheduler hosts) go to a replica that is in
//! touch. Before, an agent watching a replica partitioned from the others saw its stale view
//! forever and never started the placements committed meanwhile (found by cutting the leader's
//! container off the raft network in the compose cluster).

use std::time::{Duration, Instant};
use tessera_view::{ClusterSpec, Topology};
use tessera_view_server::{ClientError, ListenAddrs, Listeners, ServeConfig, Tuning, ViewClient, serve};
use tokio::sync::oneshot;

struct Node {
    stop: Option<oneshot::Sender<()>>,
    done: tokio::task::JoinHandle<()>,
}

/// Serves replica `id` of the 3 whose addresses are `addrs`, on `listeners`.
fn start(id: u64, listeners: Listeners, addrs: &[ListenAddrs], dir: &std::path::Path) -> Node {
    let spec = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 2, 2, 1);
    // Elections in 200–400 ms: the grace to end a leaderless watch is 800 ms.
    let tuning = Tuning { tick_ms: 20, election_tick: 10, sync: false, server_lease_ms: 0, ..Tuning::default() };
    let pki = tessera_testkit::Pki::create(&dir.join("tls")).expect("CA");
    let tls = pki.issue(tessera_proto::tls::Role::Replica, &format!("r{id}"), &[], &[]).expect("certificate");
    let cfg = ServeConfig::new(id, "watch", spec, dir.join(format!("r{id}")))
        .with_peers(addrs)
        .with_tuning(tuning)
        .with_tls(tls);
    let (tx, rx) = oneshot::channel();
    let done = tokio::spawn(async move {
        serve(listeners, cfg, async move {
            let _ = rx.await;
        })
        .await
        .expect("replica");
    });
    Node { stop: Some(tx), done }
}

impl Node {
    async fn stop(mut self) {
        let _ = self.stop.take().expect("running").send(());
        let _ = self.done.await;
    }
}

/// An admin of the replicas' CA (made by the first replica started).
fn admin(dir: &std::path::Path) -> tessera_proto::tls::Security {
    tessera_testkit::Pki::create(&dir.join("tls")).expect("CA").admin().expect("admin")
}

fn unavailable(e: &ClientError) -> bool {
    e.to_string().contains("no leader")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_without_a_leader_sends_its_watchers_elsewhere() {
    let dir = tempfile::tempdir().expect("tmp");
    let listeners: Vec<Listeners> = (0..3).map(|_| Listeners::loopback(true, false).expect("bind")).collect();
    let addrs: Vec<ListenAddrs> = listeners.iter().map(|l| l.addrs().expect("addrs")).collect();
    let mut listeners = listeners.into_iter();
    let one = start(1, listeners.next().expect("1"), &addrs, dir.path());
    let lone = addrs[0].client.to_string();
    // Alone of three, replica 1 never knows a leader: its watch is refused.
    let mut c = ViewClient::new(vec![lone.clone()])
        .expect("client")
        .with_security(admin(dir.path()))
        .with_deadline(Duration::from_millis(1500));
    let refused = c.watch(0).await.expect_err("no leader, no watch");
    assert!(unavailable(&refused), "{refused}");
    // With the others up, a leader is elected and the watch is served.
    let others: Vec<Node> =
        (2..=3).map(|id| start(id, listeners.next().expect("listener"), &addrs, dir.path())).collect();
    let mut probe = ViewClient::new(vec![lone.clone()])
        .expect("client")
        .with_security(admin(dir.path()))
        .with_deadline(Duration::from_secs(10));
    probe.wait_for_leader().await.expect("a leader");
    // A client of replica 1 alone (a watch is served by any replica in touch with a leader, so
    // no hint takes it elsewhere).
    let mut c = ViewClient::new(vec![lone.clone()])
        .expect("client")
        .with_security(admin(dir.path()))
        .with_deadline(Duration::from_secs(10));
    let t0 = Instant::now();
    let mut stream = loop {
        match c.watch(0).await {
            Ok(s) => {
                assert_eq!(c.current(), lone, "the watch is on replica 1");
                break s;
            }
            Err(e) => assert!(t0.elapsed() < Duration::from_secs(10), "no watch served: {e}"),
        }
    };
    // (Nothing has changed since version 0, so the stream is quiet: it carries changes only.)
    // The others go away: replica 1 loses its leader (or, leading, steps down without a quorum),
    // and its stream ends with UNAVAILABLE instead of going quiet for ever.
    for n in others {
        n.stop().await;
    }
    let t1 = Instant::now();
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        loop {
            match stream.message().await {
                Ok(Some(_)) => continue,
                Ok(None) => return None,
                Err(s) => return Some(s),
            }
        }
    })
    .await
    .expect("the stream ends within 10 s");
    let status = ended.expect("an error, not a quiet end");
    assert_eq!(status.code(), tonic::Code::Unavailable, "{status}");
    assert!(status.message().contains("no leader"), "{status}");
    eprintln!("stream ended {} ms after the others stopped", t1.elapsed().as_millis());
    one.stop().await;
}
