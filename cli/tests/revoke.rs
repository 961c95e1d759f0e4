//! Revocation end to end, as real processes: a user's certificate and a token work; `tessera
//! tls revoke` lists them in the replica's TLS directory and, without a restart, the replica
//! refuses both (`UNAUTHENTICATED`, saying revoked) while another user's calls go on.

use std::process::Command;
use std::time::{Duration, Instant};

mod common;
use common::*;

/// `tessera ARGS`: (success, stdout + stderr).
fn run(args: &[&str]) -> (bool, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera")).args(args).output().expect("run tessera");
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
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
    let (ok, token) = run(&[
        "token",
        "create",
        "--ca",
        ca.to_str().expect("utf-8"),
        "--role",
        "user",
        "--name",
        "carol",
        "--tenant",
        "vision",
    ]);
    assert!(ok, "{token}");
    let token = token.trim().to_string();
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
