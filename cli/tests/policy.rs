//! Quotas and priority classes changed on a running cluster, as real processes on loopback: an
//! admin sets tenant `vision`'s quota and adds a class with `tessera policy`; a user may not.
//! The next submissions are judged by them (a job over the quota is refused, a job of the new
//! class gets its priority, a job over the tenant's quota at its class is refused), they
//! survive a replica's restart (replicated, in RocksDB), and removing the quota admits the
//! larger job.

use std::process::Command;

mod common;
use common::*;

/// `tessera ARGS` with `flags`: (success, stdout, stderr).
fn run(args: &[&str], flags: &[String]) -> (bool, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_tessera")).args(with(args, flags)).output().expect("run tessera");
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into(), String::from_utf8_lossy(&out.stderr).into())
}

#[test]
fn an_admin_changes_quotas_and_classes_on_a_running_cluster_and_they_bind_the_next_submissions() {
    let dir = test_dir("tessera-policy-");
    let d = dir.path();
    let mut view = cluster(1, spec(1), tuning(), false, Some(&d.join("view")));
    let addr = view.addrs()[0].clone();
    let admin = tls(&view, Role::Admin, "root");
    let pki = view.pki().expect("TLS is on").clone();
    let ana =
        vec!["--tls".to_string(), pki.issue(Role::User, "ana", &["vision"], &[]).expect("cert").display().to_string()];
    rt().block_on(admin_client(&view, vec![addr.clone()]).wait_for_leader()).expect("a leader");

    let job = |name: &str, gpus: u32, class: &str| {
        let f = d.join(format!("{name}.toml"));
        std::fs::write(&f, format!("name = '{name}'\ngpus = {gpus}\ncommand = ['true']\n{class}")).expect("job file");
        f.display().to_string()
    };
    let (big, small, urgent) = (job("big", 4, ""), job("small", 1, ""), job("urgent", 1, "priority = 'urgent'\n"));

    // A user may not change policy; nothing changes.
    let (ok, out, err) = run(&["policy", "quota", "vision", "1", "--view", &addr], &ana);
    assert!(!ok && err.contains("PermissionDenied") && err.contains("admins only"), "{out}{err}");

    // The admin sets a quota and adds a class.
    let (ok, out, err) = run(&["policy", "quota", "vision", "2", "--view", &addr], &admin);
    assert!(ok && out.contains("tenant `vision` may hold 2 GPUs"), "{out}{err}");
    let (ok, out, err) = run(&["policy", "class", "urgent", "500", "--view", &addr], &admin);
    assert!(ok, "{out}{err}");
    let (ok, out, err) = run(&["policy", "class", "urgent", "soon", "--view", &addr], &admin);
    assert!(!ok && err.contains("give a number, or `none`"), "{out}{err}");

    // The next submissions are judged by them.
    let (ok, out, err) = run(&["submit", "--view", &addr, &big], &ana);
    assert!(!ok && format!("{out}{err}").contains("quota of 2"), "{out}{err}");
    let (ok, out, err) = run(&["submit", "--view", &addr, &small, &urgent], &ana);
    assert!(ok, "{out}{err}");
    let priority = |name: &str| {
        let (ok, out, err) = run(&["jobs", "--view", &addr, "--json"], &admin);
        assert!(ok, "{out}{err}");
        let list: serde_json::Value = serde_json::from_str(&out).expect("JSON");
        let j = list["jobs"].as_array().expect("jobs").iter().find(|j| j["name"] == name).cloned();
        j.unwrap_or_else(|| panic!("no job {name} in {list}"))["priority"].as_i64().expect("a priority")
    };
    assert_eq!((priority("urgent"), priority("small")), (500, 0));

    // A quota at the new class and above: 1 GPU. A 2-GPU job of that class can never fit it; the
    // same job without the class is judged by the tenant's quota of 2 alone.
    let (ok, out, err) = run(&["policy", "quota", "vision", "1", "--class", "urgent", "--view", &addr], &admin);
    assert!(ok && out.contains("may hold 1 GPUs at class `urgent` and above"), "{out}{err}");
    let pair = job("urgent-pair", 2, "priority = 500\n");
    let (ok, out, err) = run(&["submit", "--view", &addr, &pair], &ana);
    assert!(!ok && format!("{out}{err}").contains("at class `urgent`"), "{out}{err}");
    let (ok, out, err) = run(&["policy", "quota", "vision", "1", "--class", "nightly", "--view", &addr], &admin);
    assert!(!ok && err.contains("unknown priority class `nightly`"), "{out}{err}");

    // Replicated state: the same after the replica restarts from its RocksDB.
    view.kill(1).expect("kill");
    view.restart(1).expect("restart");
    rt().block_on(admin_client(&view, vec![addr.clone()]).wait_for_leader()).expect("a leader");
    let (ok, out, err) = run(&["policy", "--view", &addr, "--json"], &admin);
    assert!(ok, "{out}{err}");
    let shown: serde_json::Value = serde_json::from_str(&out).expect("JSON");
    assert_eq!(shown["quotas"], serde_json::json!([{ "tenant": "vision", "gpus": 2, "held": 0 }]), "{shown}");
    assert_eq!(shown["classes"][0], serde_json::json!({ "class": "urgent", "priority": 500 }), "{shown}");
    let held_urgent = serde_json::json!([{ "tenant": "vision", "class": "urgent", "gpus": 1, "held": 0 }]);
    assert_eq!(shown["class_quotas"], held_urgent, "{shown}");

    // Removed: the larger job is admitted.
    let (ok, out, err) = run(&["policy", "quota", "vision", "none", "--view", &addr], &admin);
    assert!(ok && out.contains("no quota"), "{out}{err}");
    let (ok, out, err) = run(&["submit", "--view", &addr, &big], &ana);
    assert!(ok, "{out}{err}");
    let (ok, out, _) = run(&["policy", "--view", &addr], &admin);
    assert!(ok && out.contains("quotas (GPUs per tenant): none") && out.contains("urgent"), "{out}");
}
