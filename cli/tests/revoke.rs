//! Revocation end to end, as real processes: a user's certificate and a token work; `tessera
//! tls revoke` lists them in the replica's TLS directory and, without a restart, the replica
//! refuses both (`UNAUTHENTICATED`, saying revoked) while another user's calls go on; `tessera
//! policy revoke` does the same for every replica of a cluster in one replicated command.

use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::*;

/// `tessera ARGS`: (success, stdout + stderr).
fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera")).args(args).output().expect("run tessera");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// The id of the job `tessera submit` printed (`submitted job N …`).
fn job_id(out: &str) -> String {
    let id = out.split_whitespace().skip_while(|w| *w != "job").nth(1).and_then(|n| n.parse::<u64>().ok());
    id.unwrap_or_else(|| panic!("no job id in `{out}`")).to_string()
}

/// A bearer token of user `carol` (tenant `vision`) from the CA in `ca`.
fn carol_token(ca: &std::path::Path) -> String {
    let ca = ca.to_str().expect("utf-8");
    let (ok, token) = run(&["token", "create", "--ca", ca, "--role", "user", "--name", "carol", "--tenant", "vision"]);
    assert!(ok, "{token}");
    token.trim().to_string()
}

#[test]
fn a_revoked_certificate_and_token_are_refused_without_a_restart() {
    let dir = test_dir("tessera-revoke-");
    let d = dir.path();
    let view = cluster(1, spec(2), tuning(), false, Some(&d.join("view")));
    let addr = view.addrs()[0].clone();
    let pki = view.pki().expect("TLS is on").clone();
    let alice = pki.issue(Role::User, "alice", &["vision"], &[]).expect("alice");
    let bob = pki.issue(Role::User, "bob", &["vision"], &[]).expect("bob");
    let ca = pki.ca_dir();
    let token = carol_token(&ca);
    let job = d.join("job.toml");
    std::fs::write(&job, "name = \"x\"\ngpus = 1\ncommand = [\"true\"]\n").expect("job file");
    let submit = |tls: &std::path::Path, token: Option<&str>| {
        let mut args =
            vec!["submit", "--view", &addr, "--tls", tls.to_str().expect("utf-8"), job.to_str().expect("utf-8")];
        if let Some(t) = token {
            args.extend(["--token", t]);
        }
        run(&args)
    };
    let (ok, out) = submit(&alice, None);
    assert!(ok, "alice submits: {out}");
    let (ok, out) = submit(&ca, Some(&token));
    assert!(ok, "carol's token submits: {out}");

    let replica_tls = pki.dir_of(Role::Replica, "replica-1");
    let tls_dir = replica_tls.to_str().expect("utf-8");
    let cert = alice.join("cert.pem");
    let (ok, out) = run(&[
        "tls",
        "revoke",
        "--tls-dir",
        tls_dir,
        "--cert",
        cert.to_str().expect("utf-8"),
        "--note",
        "stolen laptop",
    ]);
    assert!(ok && out.contains("revoked certificate of user `alice`"), "{out}");
    let (ok, out) = run(&["tls", "revoke", "--tls-dir", tls_dir, "--token", &token]);
    assert!(ok && out.contains("revoked token"), "{out}");
    let (ok, out) = run(&["tls", "revoke", "--tls-dir", tls_dir, "--token", &token]);
    assert!(ok && out.contains("already revoked"), "{out}");
    let listed = std::fs::read_to_string(replica_tls.join("revoked")).expect("revoked file");
    assert_eq!(listed.lines().count(), 2, "{listed}");

    let t0 = Instant::now();
    loop {
        let (ok, out) = submit(&alice, None);
        if !ok {
            assert!(out.contains("was revoked"), "{out}");
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "alice's certificate still works");
        std::thread::sleep(Duration::from_millis(200));
    }
    let (ok, out) = submit(&ca, Some(&token));
    assert!(!ok && out.contains("was revoked"), "{out}");
    let (ok, out) = submit(&bob, None);
    assert!(ok, "bob is not revoked: {out}");
    drop(view);
}

/// Polls `f` (a call that succeeds until the revocation reaches the replica it asks) until it
/// fails, for at most 20 s; returns its last output.
fn until_refused(what: &str, f: impl Fn() -> (bool, String)) -> String {
    let t0 = Instant::now();
    loop {
        let (ok, out) = f();
        if !ok {
            return out;
        }
        assert!(t0.elapsed() < Duration::from_secs(20), "{what} still works: {out}");
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn one_replicated_revocation_is_refused_by_every_replica_and_can_be_lifted() {
    let dir = test_dir("tessera-revoke-view-");
    let d = dir.path();
    let view = cluster(3, spec(2), tuning(), false, Some(&d.join("view")));
    let addrs = view.addrs();
    let all = addrs.join(",");
    let pki = view.pki().expect("TLS is on").clone();
    let alice = pki.issue(Role::User, "alice", &["vision"], &[]).expect("alice");
    let bob = pki.issue(Role::User, "bob", &["vision"], &[]).expect("bob");
    let admin = pki.issue(Role::Admin, "ops", &[], &[]).expect("admin");
    let ca = pki.ca_dir();
    let token = carol_token(&ca);
    let job = d.join("job.toml");
    std::fs::write(&job, "name = \"x\"\ngpus = 1\ncommand = [\"true\"]\n").expect("job file");
    let path = |p: &std::path::Path| p.to_str().expect("utf-8").to_string();
    // One replica at a time: a job read (GetJob, what a user may read) is served by the replica
    // asked. A job of the tenant's to read, once every replica has it.
    let (ok, out) = run(&["submit", "--view", &all, "--tls", &path(&bob), &path(&job)]);
    assert!(ok, "bob submits: {out}");
    let id = job_id(&out);
    let status = |addr: &str, tls: &std::path::Path, token: Option<&str>| {
        let mut args =
            vec!["status".to_string(), id.clone(), "--view".into(), addr.to_string(), "--tls".into(), path(tls)];
        if let Some(t) = token {
            args.extend(["--token".to_string(), t.to_string()]);
        }
        run(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    for a in &addrs {
        let t0 = Instant::now();
        while !status(a, &bob, None).0 {
            assert!(t0.elapsed() < Duration::from_secs(20), "job {id} never reached {a}: {}", status(a, &bob, None).1);
            std::thread::sleep(Duration::from_millis(100));
        }
        let (ok, out) = status(a, &alice, None);
        assert!(ok, "alice reads {a}: {out}");
        let (ok, out) = status(a, &ca, Some(&token));
        assert!(ok, "carol's token reads {a}: {out}");
    }
    let admin_args = |rest: &[&str]| {
        let mut args = vec!["policy".to_string()];
        args.extend(rest.iter().map(|s| s.to_string()));
        args.extend(["--view".to_string(), all.clone(), "--tls".to_string(), path(&admin)]);
        run(&args.iter().map(String::as_str).collect::<Vec<_>>())
    };
    // A user may not revoke (only an admin changes policy), and nothing changes.
    let cert = alice.join("cert.pem");
    let (ok, out) = run(&["policy", "revoke", &path(&cert), "--view", &all, "--tls", &path(&bob)]);
    assert!(!ok && out.to_lowercase().contains("permission"), "{out}");
    let (ok, out) = admin_args(&["revoke", &path(&cert), "--note", "stolen laptop"]);
    assert!(ok && out.contains("revoked certificate") && out.contains("user/alice"), "{out}");
    let (ok, out) = admin_args(&["revoke", &token]);
    assert!(ok && out.contains("revoked token") && out.contains("user/carol"), "{out}");
    let (ok, out) = admin_args(&["revoke", "sha256:abc"]);
    assert!(!ok && out.contains("64 lowercase hex"), "{out}");
    // Every replica refuses both, without a file written or a restart; bob goes on.
    for a in &addrs {
        let out = until_refused(&format!("alice's certificate at {a}"), || status(a, &alice, None));
        assert!(out.contains("was revoked"), "{a}: {out}");
        let out = until_refused(&format!("carol's token at {a}"), || status(a, &ca, Some(&token)));
        assert!(out.contains("was revoked"), "{a}: {out}");
        let (ok, out) = status(a, &bob, None);
        assert!(ok, "bob is not revoked ({a}): {out}");
    }
    for i in 1..=addrs.len() {
        assert!(!pki.dir_of(Role::Replica, &format!("replica-{i}")).join("revoked").exists());
    }
    let (ok, out) = admin_args(&["--json"]);
    assert!(ok, "{out}");
    let listed: serde_json::Value = serde_json::from_str(&out).expect("policy JSON");
    let revoked = listed["revocations"].as_array().expect("revocations");
    assert_eq!(revoked.len(), 2, "{out}");
    assert!(revoked.iter().any(|r| r["subject"] == "user/alice" && r["note"] == "stolen laptop"), "{out}");
    // Lifted: alice's certificate works again everywhere; carol's token stays refused.
    let (ok, out) = admin_args(&["unrevoke", &path(&cert)]);
    assert!(ok, "{out}");
    for a in &addrs {
        let t0 = Instant::now();
        while !status(a, &alice, None).0 {
            assert!(t0.elapsed() < Duration::from_secs(20), "alice still refused at {a}");
            std::thread::sleep(Duration::from_millis(100));
        }
        let (ok, out) = status(a, &ca, Some(&token));
        assert!(!ok && out.contains("was revoked"), "{a}: {out}");
    }
    drop(view);
}

/// `tessera token issue`: an admin asks the cluster for a token, which the answering replica
/// signs with its own certificate; it works like a CA-signed one, on every replica, and a user
/// may not ask. (That revoking the signer's certificate takes its tokens with it is tested on
/// `authenticate`, in tessera-proto: here it would also cut that replica off its peers.)
#[test]
fn an_admin_is_issued_a_token_by_the_cluster_and_nobody_else_is() {
    let dir = test_dir("tessera-token-issue-");
    let d = dir.path();
    let view = cluster(3, spec(2), tuning(), false, Some(&d.join("view")));
    let addrs = view.addrs();
    let all = addrs.join(",");
    let pki = view.pki().expect("TLS is on").clone();
    let admin = pki.issue(Role::Admin, "ops", &[], &[]).expect("admin");
    let bob = pki.issue(Role::User, "bob", &["vision"], &[]).expect("bob");
    let ca = pki.ca_dir();
    let path = |p: &std::path::Path| p.to_str().expect("utf-8").to_string();
    let issue = |tls: &std::path::Path, role: &str| {
        let args = ["token", "issue", "--view", &all, "--tls", &path(tls), "--role", role, "--name", "dana"];
        let tenant: &[&str] = if role == "user" { &["--tenant", "vision"] } else { &[] };
        run(&[&args[..], tenant, &["--ttl-s", "600"]].concat())
    };
    let (ok, out) = issue(&bob, "user");
    assert!(!ok && out.contains("issue tokens (admins only)"), "{out}");
    let (ok, out) = issue(&admin, "replica");
    assert!(!ok && out.contains("certificates, not tokens"), "{out}");
    let (ok, out) = issue(&admin, "user");
    assert!(ok && out.contains("signed by replica"), "{out}");
    let token = out.lines().find(|l| l.starts_with("tsr2.")).unwrap_or_else(|| panic!("no token in {out}")).to_string();
    let job = d.join("job.toml");
    std::fs::write(&job, "name = \"x\"\ngpus = 1\ncommand = [\"true\"]\n").expect("job file");
    let (ok, out) = run(&["submit", "--view", &all, "--tls", &path(&ca), "--token", &token, &path(&job)]);
    assert!(ok, "dana's issued token submits: {out}");
    let id = job_id(&out);
    // Every replica takes it (each checks the signer against the CA it holds).
    for a in &addrs {
        let t0 = Instant::now();
        loop {
            let (ok, out) = run(&["status", &id, "--view", a, "--tls", &path(&ca), "--token", &token]);
            if ok {
                assert!(out.contains(&format!("job {id}")), "{out}");
                break;
            }
            assert!(!out.contains("token"), "{a} refused the token: {out}");
            assert!(t0.elapsed() < Duration::from_secs(20), "job {id} never reached {a}: {out}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    drop(view);
}
