//! The `tessera` binary, run as a user would: exit codes, output, and errors on bad input.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn tessera(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tessera")).args(args).current_dir(repo()).output().expect("run tessera")
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn text(o: &Output) -> (String, String) {
    (String::from_utf8_lossy(&o.stdout).into_owned(), String::from_utf8_lossy(&o.stderr).into_owned())
}

#[test]
fn shipped_files_check_and_place() {
    for (kind, pattern) in [("topology", "deploy/topologies"), ("cluster", "deploy/clusters"), ("job", "deploy/jobs")] {
        let mut files: Vec<String> = std::fs::read_dir(repo().join(pattern))
            .expect("dir")
            .map(|e| format!("{pattern}/{}", e.expect("entry").file_name().to_string_lossy()))
            .filter(|f| f.ends_with(".toml"))
            .collect();
        files.sort();
        let mut args = vec!["check", kind];
        args.extend(files.iter().map(String::as_str));
        let o = tessera(&args);
        assert!(o.status.success(), "{kind}: {:?}", text(&o));
    }
    let o = tessera(&[
        "place",
        "--cluster",
        "deploy/clusters/dev.toml",
        "deploy/jobs/alexnet-2gpu.toml",
        "deploy/jobs/bert-16gpu.toml",
        "deploy/jobs/resnet50-4gpu.toml",
    ]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{out}\n{err}");
    assert!(out.contains("bert-16gpu") && out.contains("placed at rack"), "{out}");
    assert!(out.contains("invariants: ok"), "{out}");
}

#[test]
fn bad_files_name_file_and_field_and_fail() {
    let dir = tempfile::tempdir().expect("tmp");
    let job = dir.path().join("bad-job.toml");
    std::fs::write(&job, "name = 'x'\ngpus = 4\n[locality]\nprefer = 'server'\ntolerate = 'socket'\n").expect("write");
    let o = tessera(&["check", "job", job.to_str().expect("utf8")]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("bad-job.toml") && err.contains("locality.tolerate"), "{err}");

    let topo = dir.path().join("bad-topo.toml");
    std::fs::write(
        &topo,
        "name='t'\ndevice_type='g'\ndevices=4\ncores_per_socket=8\nmemory_mib=1024\n[[sockets]]\npcie_switches=[[0,1],[2,9]]\n",
    )
    .expect("write");
    let o = tessera(&["check", "topology", topo.to_str().expect("utf8")]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("bad-topo.toml") && err.contains("sockets[0].pcie_switches[1]") && err.contains("9"), "{err}");

    let syntax = dir.path().join("syntax.toml");
    std::fs::write(&syntax, "name = 'x'\ngpus = \n").expect("write");
    let o = tessera(&["check", "job", syntax.to_str().expect("utf8")]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("syntax.toml") && err.contains("line 2"), "{err}");

    let o = tessera(&["place", "--cluster", "/nonexistent/cluster.toml", "deploy/jobs/lm-1gpu.toml"]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("/nonexistent/cluster.toml") && err.contains("cannot read"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn job_that_can_never_fit_is_refused_with_the_reason() {
    let dir = tempfile::tempdir().expect("tmp");
    let job = dir.path().join("huge.toml");
    std::fs::write(&job, "name = 'huge'\ngpus = 64\nmembers = 8\n[locality]\ntolerate = 'rack'\n").expect("write");
    let o = tessera(&["check", "job", job.to_str().expect("utf8"), "--cluster", "deploy/clusters/dev.toml"]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert!(err.contains("can never fit") && err.contains("rack"), "{err}");
    let o = tessera(&["place", "--cluster", "deploy/clusters/dev.toml", job.to_str().expect("utf8")]);
    let (out, _) = text(&o);
    assert!(!o.status.success() && out.contains("refused"), "{out}");
}

#[test]
fn bench_prints_the_promised_json() {
    let o = tessera(&["bench", "placement", "--servers", "300", "--jobs", "3000", "--schedulers", "16", "--json"]);
    let (out, err) = text(&o);
    assert!(o.status.success(), "{err}");
    let v: serde_json::Value = serde_json::from_str(out.trim()).expect("one JSON object");
    for key in [
        "servers",
        "gpus",
        "jobs",
        "placed",
        "conflicts",
        "wall_s",
        "placements_per_s",
        "search_p50_us",
        "search_p99_us",
        "bytes_per_server",
        "double_allocations",
    ] {
        assert!(v.get(key).is_some(), "missing {key} in {out}");
    }
    assert_eq!(v["servers"], 300);
    assert_eq!(v["gpus"], 2400);
    assert_eq!(v["double_allocations"], 0);
    assert_eq!(v["bytes_per_server"], 32);
    assert!(v["placed"].as_u64().expect("placed") > 2000, "{out}");

    let o = tessera(&["bench", "placement", "--gpus-per-server", "7"]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("--gpus-per-server"), "{err}");
    let o = tessera(&["bench", "placement", "--trace", "/nonexistent.csv"]);
    let (_, err) = text(&o);
    assert!(!o.status.success() && err.contains("/nonexistent.csv"), "{err}");
}

#[test]
fn submit_names_file_line_and_field_of_a_bad_job_and_checks_every_example() {
    let dir = tempfile::tempdir().expect("tmp");
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "name = \"x\"\ngpus = 2\n\n[locality]\nprefer = \"server\"\ntolerate = \"socket\"\n")
        .expect("write");
    // The file is read before the view is contacted: no cluster needed to be told what is wrong.
    let o = tessera(&["submit", "--view", "127.0.0.1:1", bad.to_str().expect("path")]);
    let (_, err) = text(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("bad.toml:6: field `locality.tolerate`"), "{err}");
    std::fs::write(&bad, "name = \"x\"\ngpus = 2\ncolour = \"red\"\n").expect("write");
    let (_, err) = text(&tessera(&["submit", "--view", "127.0.0.1:1", bad.to_str().expect("path")]));
    assert!(err.contains("bad.toml") && err.contains("line 3") && err.contains("colour"), "{err}");
    // Every shipped example job is valid and fits the dev cluster.
    let mut args = vec!["check", "job", "--cluster", "deploy/clusters/dev.toml"];
    let examples: Vec<String> = std::fs::read_dir(repo().join("examples/jobs"))
        .expect("examples/jobs")
        .map(|e| format!("examples/jobs/{}", e.expect("entry").file_name().to_string_lossy()))
        .collect();
    args.extend(examples.iter().map(String::as_str));
    let o = tessera(&args);
    assert!(o.status.success(), "{:?}", text(&o));
}

#[test]
fn an_unreachable_view_is_one_line_naming_the_address() {
    // A port held by a bound socket that does not listen: connecting is refused, and no other
    // process can take the port while the test runs.
    let closed = closed_port();
    let addr = closed.1.to_string();
    for args in [vec!["jobs"], vec!["cancel", "3"]] {
        let mut a = args.clone();
        a.extend(["--view", addr.as_str(), "--insecure"]);
        let o = tessera(&a);
        let (_, err) = text(&o);
        assert!(!o.status.success(), "{args:?}");
        assert_eq!(err.trim().lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(&addr), "{args:?}: {err}");
    }
    // Neither a TLS directory nor --insecure: one line saying what to give, nothing sent.
    let o = tessera(&["jobs", "--view", addr.as_str()]);
    let (_, err) = text(&o);
    assert!(!o.status.success());
    assert_eq!(err.trim().lines().count(), 1, "{err}");
    assert!(err.contains("--tls DIR") && err.contains("--insecure"), "{err}");
}

/// A TCP socket bound to a loopback port without listening on it, and the address.
fn closed_port() -> (std::os::fd::OwnedFd, std::net::SocketAddr) {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, SockaddrIn, bind, getsockname, socket};
    use std::os::fd::AsRawFd;
    let fd = socket(AddressFamily::Inet, SockType::Stream, SockFlag::SOCK_CLOEXEC, None).expect("socket");
    bind(fd.as_raw_fd(), &SockaddrIn::new(127, 0, 0, 1, 0)).expect("bind");
    let a: SockaddrIn = getsockname(fd.as_raw_fd()).expect("getsockname");
    (fd, std::net::SocketAddr::from((a.ip(), a.port())))
}

/// `tessera view serve` started with sockets bound by its parent (systemd socket activation):
/// sockets that contradict the configuration, or that cannot be told apart, are refused with
/// the reason before anything is served.
#[test]
fn passed_sockets_must_match_the_config_and_be_named() {
    use command_fds::{CommandFdExt, FdMapping};
    use std::os::fd::OwnedFd;
    use tessera_view_server::{ListenAddrs, Listeners, ServeConfig, ServeFile};
    let dir = tempfile::tempdir().expect("tmp");
    let spec =
        tessera_view::ClusterSpec::uniform(tessera_view::Topology::preset("seed-8gpu").expect("preset"), 2, 2, 1);
    let spec_file = spec.write_files(dir.path()).expect("spec files");
    let config = dir.path().join("replica-1.toml");
    let listen = |raft: bool| Listeners::loopback(raft, false).expect("bind");
    // The file names one client address; the sockets passed are others.
    let written = listen(false);
    let addrs: ListenAddrs = written.addrs().expect("addrs");
    let cfg = ServeConfig::new(1, "t", spec, dir.path().join("data")).with_peers(&[addrs]);
    ServeFile::new(&cfg, &addrs, spec_file).write(&config).expect("config");
    let serve = |l: Listeners, names: Option<&str>| {
        let mut fds: Vec<OwnedFd> = vec![l.client.into()];
        fds.extend(l.raft.map(OwnedFd::from));
        let n = fds.len();
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_tessera"));
        cmd.args(["view", "serve", "--config"]).arg(&config).env("LISTEN_FDS", n.to_string()).env_remove("LISTEN_PID");
        match names {
            Some(v) => cmd.env("LISTEN_FDNAMES", v),
            None => cmd.env_remove("LISTEN_FDNAMES"),
        };
        let maps = fds.into_iter().enumerate().map(|(i, parent_fd)| FdMapping { parent_fd, child_fd: 3 + i as i32 });
        cmd.fd_mappings(maps.collect()).expect("fd mappings");
        let o = cmd.output().expect("run tessera view serve");
        assert!(!o.status.success(), "served on sockets it should refuse: {:?}", text(&o));
        text(&o).1
    };
    let other = listen(false);
    let other_addr = other.addrs().expect("addrs").client;
    let err = serve(other, None);
    assert!(
        err.contains(&format!("`client` socket is {other_addr}")) && err.contains(&addrs.client.to_string()),
        "{err}"
    );
    let err = serve(listen(true), None);
    assert!(err.contains("2 sockets but no LISTEN_FDNAMES"), "{err}");
    let err = serve(listen(true), Some("client:grpc"));
    assert!(err.contains("unknown socket name `grpc`"), "{err}");
    let err = serve(listen(true), Some("raft:raft"));
    assert!(err.contains("passed twice"), "{err}");
    drop(written);
}
