//! Transport security and authorization against a real replica (mutual TLS on loopback):
//! every forbidden call of issue 15 §2 is refused with `PERMISSION_DENIED` and changes nothing,
//! a caller without a certificate or token is `UNAUTHENTICATED`, plaintext, foreign-CA and
//! expired certificates never get a call through, tokens work and expire, and the audit log
//! holds the refusals and the admin's actions.

use std::path::Path;
use std::time::{Duration, Instant};
use tessera_proto::tls::issue::{Request, issue_pem};
use tessera_proto::tls::material::{CA_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE};
use tessera_proto::tls::{CallerAuth, Identity, Role, Security, Tls, token};
use tessera_proto::v1;
use tessera_testkit::{LocalCluster, Pki};
use tessera_view::{ClusterSpec, JobSpec, Topology};
use tessera_view_server::{ClientError, Tuning, ViewClient};
use tonic::Code;

fn code<T: std::fmt::Debug>(r: Result<T, ClientError>) -> Option<Code> {
    match r {
        Ok(v) => panic!("allowed: {v:?}"),
        Err(e) => e.status().map(|s| s.code()),
    }
}

fn client(cluster: &LocalCluster, security: Security) -> ViewClient {
    ViewClient::new(cluster.addrs()).expect("client").with_deadline(Duration::from_secs(5)).with_security(security)
}

fn spec(name: &str, tenant: Option<&str>) -> v1::JobSpec {
    let mut s = JobSpec::simple(name, 1, 1);
    if let Some(t) = tenant {
        s.tenant = t.to_string();
    }
    v1::JobSpec::from(&s)
}

/// A plain gRPC client of the cluster's first replica as `sec` (no retries, no leader
/// following: every refusal is seen as it is).
async fn raw_client(cluster: &LocalCluster, sec: Security) -> v1::view_client::ViewClient<tonic::transport::Channel> {
    let ep = tonic::transport::Endpoint::from_shared(format!("https://{}", cluster.addrs()[0]))
        .expect("endpoint")
        .tls_config(sec.client_config().expect("TLS"))
        .expect("TLS config");
    v1::view_client::ViewClient::new(ep.connect().await.expect("connect"))
}

/// A TLS directory with the CA's certificate alone (a token's caller).
fn ca_only(pki: &Pki, dir: &Path) -> Security {
    std::fs::create_dir_all(dir).expect("dir");
    std::fs::copy(pki.ca_dir().join(CA_FILE), dir.join(CA_FILE)).expect("copy ca.pem");
    Security::Tls(Tls::open(dir).expect("CA-only directory"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_forbidden_call_is_refused_and_changes_nothing() {
    let spec_ = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 2, 2, 1);
    let tuning = Tuning { tick_ms: 20, sync: false, scheduler_lease_ms: 200, ..Tuning::default() };
    let cluster = LocalCluster::builder(spec_).name("authz").tuning(tuning).start().await.expect("cluster");
    let pki = cluster.pki().expect("TLS is on by default").clone();
    let mut admin = cluster.client().expect("admin");
    admin.wait_for_leader().await.expect("leader");
    let as_ =
        |role, name: &str, tenants: &[&str]| client(&cluster, cluster.security_for(role, name, tenants).expect("cert"));
    let mut alice = as_(Role::User, "alice", &["vision"]);
    let mut agent = as_(Role::Agent, "r0-s00", &[]);
    let mut host_a = as_(Role::Scheduler, "host-a", &[]);
    let mut host_b = as_(Role::Scheduler, "host-b", &[]);

    // A user of one tenant who names none submits for it: the tenant comes from the identity.
    let r = alice.submit(vec![spec("mine", None)]).await.expect("alice submits");
    let mine = r[0].job;
    let job = admin.job(mine, true).await.expect("job").job.expect("job");
    assert_eq!(job.spec.expect("spec").tenant, "vision");
    assert!(alice.job(mine, false).await.is_ok(), "a user reads its own tenant's job");
    // The admin submits for another tenant; host-b adopts it.
    let theirs = admin.submit(vec![spec("theirs", Some("nlp"))]).await.expect("admin submits")[0].job;
    let t0 = Instant::now();
    loop {
        let got = host_b.adopt_jobs("host-b", Vec::new(), 16).await.expect("host-b adopts");
        if got.adopted.contains(&theirs) || got.kept.contains(&theirs) {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "host-b never got job {theirs}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    let before = admin.status().await.expect("status");
    let denied = Some(Code::PermissionDenied);
    // Users: their tenants only, no whole-view reads, no operators' or components' calls.
    assert_eq!(code(alice.submit(vec![spec("x", Some("nlp"))]).await), denied);
    assert_eq!(code(alice.job(theirs, false).await), denied);
    assert_eq!(code(alice.cancel(theirs).await), denied);
    assert_eq!(code(alice.snapshot(false).await), denied);
    assert_eq!(code(alice.cordon_server(0, v1::CordonAction::Drain, "mine now", 60).await), denied);
    assert_eq!(code(alice.add_replica(9, "127.0.0.1:1", "").await), denied);
    assert_eq!(code(alice.remove_replica(1).await), denied);
    assert_eq!(code(alice.adopt_jobs("alice", Vec::new(), 1).await), denied);
    assert_eq!(code(alice.release(mine, false).await), denied);
    // An agent: its own server only.
    assert_eq!(code(agent.heartbeat(1, None, Vec::new(), "").await), denied);
    let topo = v1::Topology::from(&Topology::preset("seed-8gpu").expect("preset"));
    assert_eq!(code(agent.register_server("r0-s01", topo.clone(), "").await), denied);
    assert_eq!(code(agent.submit(vec![spec("x", None)]).await), denied);
    assert_eq!(code(agent.cordon_server(1, v1::CordonAction::Cordon, "", 0).await), denied);
    // A scheduler host: its own name, and no job another host holds.
    assert_eq!(code(host_a.adopt_jobs("host-b", Vec::new(), 1).await), denied);
    // One GPU with its share of cores and memory: a placement the approver accepts.
    let on = |server: u32| {
        let t = Topology::preset("seed-8gpu").expect("preset");
        let (cores, memory) = (t.cores() / t.devices, t.memory_mib / t.devices);
        v1::MemberPlacement::from(&tessera_view::MemberPlacement {
            server: tessera_view::ServerId(server),
            gpus: 1,
            cores: tessera_view::CoreMask::range(0, cores),
            memory_mib: memory,
        })
    };
    let member = on(0);
    let p = v1::Proposal { id: 77, job: theirs, members: vec![member], based_on: 0 };
    assert_eq!(code(host_a.propose(vec![p.clone()]).await), denied);
    assert_eq!(code(host_a.migrate(Some(theirs), Vec::new(), vec![p.clone()]).await), denied);
    assert_eq!(code(host_a.release(theirs, true).await), denied);
    // Nor a pending job nobody gave it (`mine`: host-b's, or nobody's once that lease lapsed),
    // nor moves that name no job they make room for.
    let p_mine = v1::Proposal { id: 78, job: mine, ..p.clone() };
    assert_eq!(code(host_a.propose(vec![p_mine.clone()]).await), denied);
    assert_eq!(code(host_a.migrate(None, Vec::new(), vec![p_mine]).await), denied);
    assert_eq!(code(host_a.add_replica(9, "127.0.0.1:1", "").await), denied);
    // Raft: replicas only, an admin included.
    let raft = {
        let sec = cluster.security();
        let ep = tonic::transport::Endpoint::from_shared(format!("https://{}", cluster.addrs()[0]))
            .expect("endpoint")
            .tls_config(sec.client_config().expect("TLS"))
            .expect("TLS config");
        v1::raft_client::RaftClient::new(ep.connect().await.expect("connect"))
    };
    let batch = v1::RaftBatch { cluster: "authz".into(), from: 2, to: 1, messages: vec![vec![1, 2, 3]] };
    let s = raft.clone().send(tokio_stream::iter(vec![batch])).await.expect_err("admin speaks no raft");
    assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
    // Nothing changed.
    let after = admin.status().await.expect("status");
    assert_eq!(
        (after.version, after.state_hash),
        (before.version, before.state_hash),
        "a refused call changed the view"
    );

    // The holder may: host-b places its job (renewing its hold first: the lease is short).
    let t0 = Instant::now();
    loop {
        host_b.adopt_jobs("host-b", vec![theirs], 0).await.expect("host-b renews");
        match host_b.propose(vec![p.clone()]).await {
            Ok(r) => {
                let d =
                    tessera_proto::RemoteDecision::try_from(r[0].decision.clone().expect("decided")).expect("decision");
                assert!(d.is_placed(), "{d:?}");
                break;
            }
            Err(e) if e.status().is_some_and(|s| s.code() == Code::PermissionDenied) => {
                assert!(t0.elapsed() < Duration::from_secs(10), "host-b never proposed for its job: {e}");
            }
            Err(e) => panic!("host-b proposes: {e}"),
        }
    }
    // A placed job is no host's: it cannot release it, and moves of it must name a pending job
    // the mover holds, and help that job to its target: here an 8-GPU job, for which server 0
    // must be emptied of `theirs`.
    assert_eq!(code(host_b.release(theirs, false).await), denied);
    let room = {
        let mut s = JobSpec::simple("room", 1, 8);
        s.tenant = "nlp".into();
        admin.submit(vec![v1::JobSpec::from(&s)]).await.expect("admin submits")[0].job
    };
    let whole = |server: u32| {
        let t = Topology::preset("seed-8gpu").expect("preset");
        v1::MemberPlacement::from(&tessera_view::MemberPlacement {
            server: tessera_view::ServerId(server),
            gpus: t.all_devices(),
            cores: t.all_cores(),
            memory_mib: t.memory_mib,
        })
    };
    let on_gpu = |server: u32, gpu: u32| {
        let t = Topology::preset("seed-8gpu").expect("preset");
        let (cores, memory) = (t.cores() / t.devices, t.memory_mib / t.devices);
        v1::MemberPlacement::from(&tessera_view::MemberPlacement {
            server: tessera_view::ServerId(server),
            gpus: 1 << gpu,
            cores: tessera_view::CoreMask::range(gpu * cores, cores),
            memory_mib: memory,
        })
    };
    let moved = v1::Proposal { id: 79, members: vec![on(1)], ..p.clone() };
    assert_eq!(code(host_a.migrate(Some(room), vec![whole(0)], vec![moved.clone()]).await), denied);
    let version = admin.status().await.expect("status").version;
    // The holder's moves that do not help: no target, a target that is free already, a move
    // onto the target itself.
    let onto = v1::Proposal { id: 80, members: vec![on_gpu(0, 7)], ..p.clone() };
    for (target, moves) in
        [(Vec::new(), vec![moved.clone()]), (vec![whole(1)], vec![moved.clone()]), (vec![whole(0)], vec![onto])]
    {
        let t0 = Instant::now();
        loop {
            host_b.adopt_jobs("host-b", vec![room], 0).await.expect("host-b renews");
            let e = host_b.migrate(Some(room), target.clone(), moves.clone()).await.expect_err("unhelpful moves");
            let s = e.status().expect("a status");
            assert_eq!(s.code(), Code::PermissionDenied, "{s:?}");
            if s.message().contains("do not help") {
                break;
            }
            // Refused as not the holder: the short lease lapsed between the renewal and the call.
            assert!(t0.elapsed() < Duration::from_secs(10), "never refused for the moves themselves: {s:?}");
        }
    }
    assert_eq!(admin.status().await.expect("status").version, version, "a refused migration changed the view");
    let t0 = Instant::now();
    loop {
        host_b.adopt_jobs("host-b", vec![room], 0).await.expect("host-b renews");
        match host_b.migrate(Some(room), vec![whole(0)], vec![moved.clone()]).await {
            Ok(r) => {
                let d =
                    tessera_proto::RemoteDecision::try_from(r[0].decision.clone().expect("decided")).expect("decision");
                assert!(matches!(d, tessera_proto::RemoteDecision::Accepted { .. }), "{d:?}");
                break;
            }
            Err(e) if e.status().is_some_and(|s| s.code() == Code::PermissionDenied) => {
                assert!(t0.elapsed() < Duration::from_secs(10), "host-b never migrated for its job: {e}");
            }
            Err(e) => panic!("host-b migrates: {e}"),
        }
    }
    // A resend of the applied move (a client's retry after a lost answer) is answered
    // `AlreadyApplied` and changes nothing, while the job it made room for waits and once it is
    // placed (its target is free now, and it is no host's then).
    let already = |r: Vec<v1::ProposeResult>| {
        let d = tessera_proto::RemoteDecision::try_from(r[0].decision.clone().expect("decided")).expect("decision");
        assert!(matches!(d, tessera_proto::RemoteDecision::AlreadyApplied { .. }), "{d:?}");
    };
    let version = admin.status().await.expect("status").version;
    host_b.adopt_jobs("host-b", vec![room], 0).await.expect("host-b renews");
    already(host_b.migrate(Some(room), vec![whole(0)], vec![moved.clone()]).await.expect("a resend before"));
    assert_eq!(admin.status().await.expect("status").version, version, "a resend changed the view");
    let placed = v1::Proposal { id: 81, job: room, members: vec![whole(0)], ..p.clone() };
    let d = admin.propose(vec![placed]).await.expect("admin places room");
    assert!(tessera_proto::RemoteDecision::try_from(d[0].decision.clone().expect("decided")).expect("d").is_placed());
    already(host_b.migrate(Some(room), vec![whole(0)], vec![moved.clone()]).await.expect("a resend after"));

    // The admin may: a cordon, audited.
    admin.cordon_server(1, v1::CordonAction::Cordon, "audit me", 0).await.expect("admin cordons");

    // No certificate and no token: UNAUTHENTICATED. With a token: the token's identity.
    let dir = tempfile::tempdir().expect("tmp");
    let mut anonymous = client(&cluster, ca_only(&pki, &dir.path().join("ca-only")));
    assert_eq!(code(anonymous.status().await), Some(Code::Unauthenticated));
    let key = std::fs::read_to_string(pki.ca_dir().join(CA_KEY_FILE)).expect("CA key");
    let alice_id = Identity::new(Role::User, "alice", &["vision".into()]).expect("identity");
    let now = tessera_proto::tls::unix_s();
    let with_token = |t: &str| {
        client(&cluster, ca_only(&pki, &dir.path().join("ca-only")))
            .with_auth(CallerAuth::new(Some(t), None).expect("auth"))
    };
    let good = token::create(&key, &alice_id, now, 600).expect("token");
    assert!(with_token(&good).job(mine, false).await.is_ok(), "a token's user reads its job");
    assert_eq!(code(with_token(&good).job(theirs, false).await), denied);
    let expired = token::create(&key, &alice_id, now - 100, 10).expect("token");
    assert_eq!(code(with_token(&expired).job(mine, false).await), Some(Code::Unauthenticated));
    let other = Pki::create(&dir.path().join("other")).expect("another CA");
    let foreign_key = std::fs::read_to_string(other.ca_dir().join(CA_KEY_FILE)).expect("key");
    let forged =
        token::create(&foreign_key, &Identity::new(Role::Admin, "mallory", &[]).expect("id"), now, 600).expect("token");
    assert_eq!(code(with_token(&forged).status().await), Some(Code::Unauthenticated));
    // Only a replica acts on behalf of another caller.
    let mut on_behalf = as_(Role::User, "mallory", &["nlp"])
        .with_auth(CallerAuth::new(None, Some(&Identity::new(Role::Admin, "root", &[]).expect("id"))).expect("auth"));
    assert_eq!(code(on_behalf.status().await), Some(Code::Unauthenticated));

    // Plaintext, a foreign CA's certificate, an expired one: no call gets through.
    let short = |sec: Security| client(&cluster, sec).with_deadline(Duration::from_millis(800));
    assert!(short(Security::Insecure).status().await.is_err(), "plaintext answered");
    assert!(
        short(other.admin().expect("foreign admin")).status().await.is_err(),
        "a foreign CA's certificate answered"
    );
    let ca = std::fs::read_to_string(pki.ca_dir().join(CA_FILE)).expect("CA");
    let long_ago = time::OffsetDateTime::now_utc() - time::Duration::days(10);
    let req = Request {
        identity: Identity::new(Role::Admin, "old", &[]).expect("id"),
        hosts: Vec::new(),
        not_before: long_ago,
        not_after: long_ago + time::Duration::days(1),
    };
    let (cert, key) = issue_pem(&ca, &std::fs::read_to_string(pki.ca_dir().join(CA_KEY_FILE)).expect("key"), &req)
        .expect("an expired certificate");
    let old = dir.path().join("expired");
    std::fs::create_dir_all(&old).expect("dir");
    for (f, t) in [(CA_FILE, &ca), (CERT_FILE, &cert), (KEY_FILE, &key)] {
        std::fs::write(old.join(f), t).expect("write");
    }
    assert!(
        short(Security::Tls(Tls::open(&old).expect("dir"))).status().await.is_err(),
        "an expired certificate answered"
    );

    // The audit log: the refusals, who asked, and the admin's cordon.
    let audit = std::fs::read_to_string(cluster.dir().join("replica-1").join("audit.jsonl")).expect("audit log");
    let lines: Vec<serde_json::Value> = audit.lines().map(|l| serde_json::from_str(l).expect("JSON line")).collect();
    let has = |method: &str, who: &str, allowed: bool| {
        lines.iter().any(|l| l["method"] == method && l["who"]["name"] == who && l["allowed"] == allowed)
    };
    assert!(has("CordonServer", "alice", false), "{audit}");
    assert!(has("Heartbeat", "r0-s00", false), "{audit}");
    assert!(has("Propose", "host-a", false), "{audit}");
    assert!(has("Migrate", "host-a", false), "{audit}");
    assert!(has("Release", "host-b", false), "{audit}");
    assert!(has("Raft.Send", "admin", false), "{audit}");
    assert!(has("CordonServer", "admin", true), "{audit}");
    assert!(lines.iter().any(|l| l["who"].is_null() && l["allowed"] == false), "the anonymous call: {audit}");
    drop((alice, agent, host_a, host_b, raft));
    cluster.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewed_certificate_is_served_without_a_restart() {
    let spec_ = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 1, 1, 1);
    let tuning = Tuning { tick_ms: 20, sync: false, ..Tuning::default() };
    let cluster = LocalCluster::builder(spec_).name("renew").tuning(tuning).start().await.expect("cluster");
    let pki = cluster.pki().expect("TLS").clone();
    let mut admin = cluster.client().expect("admin");
    admin.wait_for_leader().await.expect("leader");
    let served = || async {
        // The certificate the replica presents to a new connection.
        let sec = cluster.security();
        let tls = sec.tls().expect("TLS").current();
        let mut roots = tokio_rustls::rustls::RootCertStore::empty();
        for c in tokio_rustls::rustls::pki_types::CertificateDer::pem_slice_iter(tls.ca_pem.as_bytes()) {
            roots.add(c.expect("pem")).expect("root");
        }
        use tokio_rustls::rustls::pki_types::pem::PemObject as _;
        let cfg = tokio_rustls::rustls::ClientConfig::builder_with_provider(tessera_proto::tls::material::provider())
            .with_safe_default_protocol_versions()
            .expect("versions")
            .with_root_certificates(roots)
            .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(&cluster.addrs()[0]).await.expect("connect");
        let name = tokio_rustls::rustls::pki_types::ServerName::try_from("127.0.0.1").expect("name");
        let s = tokio_rustls::TlsConnector::from(std::sync::Arc::new(cfg)).connect(name, tcp).await.expect("handshake");
        s.get_ref().1.peer_certificates().expect("certificate")[0].to_vec()
    };
    let first = served().await;
    // Renewal: a new certificate over the replica's directory.
    let renewed = pki.issue(Role::Replica, "replica-1", &[], &[]).expect("renew");
    let want = {
        use tokio_rustls::rustls::pki_types::pem::PemObject as _;
        tokio_rustls::rustls::pki_types::CertificateDer::from_pem_file(renewed.join(CERT_FILE)).expect("cert").to_vec()
    };
    assert_ne!(first, want, "a new certificate was issued");
    let t0 = Instant::now();
    while served().await != want {
        assert!(t0.elapsed() < Duration::from_secs(10), "the replica still serves its old certificate");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // And the cluster still works with it.
    admin.status().await.expect("status after renewal");
    cluster.stop().await.expect("stop");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_caller_over_its_rate_is_told_to_back_off_and_others_are_served() {
    let spec_ = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 1, 1, 1);
    let tuning = Tuning { tick_ms: 20, sync: false, caller_rate: 5, ..Tuning::default() };
    let cluster = LocalCluster::builder(spec_).name("rate").tuning(tuning).start().await.expect("cluster");
    cluster.client().expect("admin").wait_for_leader().await.expect("leader");
    let raw = |sec: Security| raw_client(&cluster, sec);
    let mut alice = raw(cluster.security_for(Role::User, "alice", &["vision"]).expect("cert")).await;
    let mut codes = Vec::new();
    for _ in 0..8 {
        codes.push(alice.status(v1::StatusRequest {}).await.err().map(|s| s.code()));
    }
    // A burst of 5 (a second's worth at 5 a second), then RESOURCE_EXHAUSTED: clients back off.
    assert_eq!(&codes[..5], &[None; 5], "{codes:?}");
    assert!(codes[5..].contains(&Some(Code::ResourceExhausted)), "{codes:?}");
    // Another caller, and the admin, are served meanwhile.
    let mut bob = raw(cluster.security_for(Role::User, "bob", &["vision"]).expect("cert")).await;
    bob.status(v1::StatusRequest {}).await.expect("bob has his own bucket");
    let mut admin = raw(cluster.security()).await;
    for _ in 0..20 {
        admin.status(v1::StatusRequest {}).await.expect("admins are not limited");
    }
    cluster.stop().await.expect("stop");
}

/// Watch streams are bounded per caller as well as per replica: one scheduler host cannot hold
/// them all; another caller still gets its own; a stream closed gives its place back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_caller_cannot_take_every_watch_stream() {
    let spec_ = ClusterSpec::uniform(Topology::preset("seed-8gpu").expect("preset"), 1, 1, 1);
    let tuning = Tuning { tick_ms: 20, sync: false, max_watchers: 4, max_watchers_per_caller: 2, ..Tuning::default() };
    let cluster = LocalCluster::builder(spec_).name("watchers").tuning(tuning).start().await.expect("cluster");
    cluster.client().expect("admin").wait_for_leader().await.expect("leader");
    let raw = |sec: Security| raw_client(&cluster, sec);
    let watch = |mut c: v1::view_client::ViewClient<tonic::transport::Channel>| async move {
        c.watch(v1::WatchRequest { from_version: 0 }).await.map(tonic::Response::into_inner)
    };
    let host_a = raw(cluster.security_for(Role::Scheduler, "host-a", &[]).expect("cert")).await;
    let host_b = raw(cluster.security_for(Role::Scheduler, "host-b", &[]).expect("cert")).await;
    let admin = raw(cluster.security()).await;
    let first = watch(host_a.clone()).await.expect("host-a's first stream");
    let _second = watch(host_a.clone()).await.expect("host-a's second stream");
    let refused = watch(host_a.clone()).await.expect_err("a third stream of one caller");
    assert_eq!(refused.code(), Code::ResourceExhausted, "{refused:?}");
    assert!(refused.message().contains("at most 2 per caller"), "{}", refused.message());
    let _b = watch(host_b.clone()).await.expect("another caller is served");
    let _admin = watch(admin.clone()).await.expect("an admin counts toward the replica's bound only");
    let full = watch(admin.clone()).await.expect_err("the replica's bound");
    assert!(full.message().contains("at most 4"), "{}", full.message());
    // A closed stream gives its place back (once the replica's task sees it closed).
    drop(first);
    let t0 = Instant::now();
    loop {
        match watch(host_a.clone()).await {
            Ok(_) => break,
            Err(s) => assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "the closed stream's place never came back");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    cluster.stop().await.expect("stop");
}
