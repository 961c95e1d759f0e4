//! The systemd units of `deploy/systemd/`, checked offline: `systemd-analyze verify` finds
//! nothing to say about them, every `ExecStart` is a command line the `tessera` binary accepts,
//! and the replica's socket units bind exactly the addresses its example config names, under the
//! names the replica tells its sockets apart by (`LISTEN_FDNAMES`).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use tessera_view_server::ServeFile;

/// Where the units expect the binary.
const INSTALLED: &str = "/usr/local/bin/tessera";

fn units_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/systemd")
}

/// The unit files, by name.
fn units() -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir(units_dir()).expect("deploy/systemd") {
        let path = e.expect("entry").path();
        let name = path.file_name().expect("name").to_string_lossy().into_owned();
        if name.ends_with(".service") || name.ends_with(".socket") {
            out.insert(name, std::fs::read_to_string(&path).expect("read unit"));
        }
    }
    out
}

/// Every value of `key` in `unit`'s `[section]`, in order.
fn values(unit: &str, section: &str, key: &str) -> Vec<String> {
    let mut current = "";
    let mut out = Vec::new();
    for line in unit.lines().map(str::trim) {
        if line.starts_with('[') {
            current = line;
        } else if let Some((k, v)) = line.split_once('=')
            && current == format!("[{section}]")
            && k.trim() == key
        {
            out.push(v.trim().to_string());
        }
    }
    out
}

#[test]
fn systemd_analyze_verify_finds_nothing_in_the_units() {
    let dir = tempfile::tempdir().expect("tmp");
    let units = units();
    assert!(units.len() >= 6, "the replica (service and 3 sockets), agent and scheduler units: {:?}", units.keys());
    let mut paths = Vec::new();
    for (name, text) in &units {
        // The binary this test was built with stands where the units expect it installed
        // (verify checks that ExecStart names an executable).
        let text = text.replace(INSTALLED, env!("CARGO_BIN_EXE_tessera"));
        let path = dir.path().join(name);
        std::fs::write(&path, text).expect("write unit");
        paths.push(path);
    }
    let out = Command::new("systemd-analyze")
        .args(["verify", "--man=no", "--generators=no"])
        .args(&paths)
        .output()
        .expect("systemd-analyze (Debian's systemd package; deploy/install-deps.sh installs it)");
    let said = String::from_utf8_lossy(&out.stderr).into_owned() + &String::from_utf8_lossy(&out.stdout);
    // A value systemd cannot parse is only a warning (exit 0), so any output is a failure.
    assert!(out.status.success() && said.trim().is_empty(), "systemd-analyze verify: {said}");
}

#[test]
fn every_exec_start_is_a_command_line_the_binary_accepts() {
    for (name, text) in units().iter().filter(|(n, _)| n.ends_with(".service")) {
        let exec = values(text, "Service", "ExecStart");
        assert_eq!(exec.len(), 1, "{name}: one ExecStart");
        let mut words = exec[0].split_whitespace();
        assert_eq!(words.next(), Some(INSTALLED), "{name}");
        let args: Vec<&str> = words.collect();
        // clap refuses an unknown subcommand or flag before it reaches --help.
        let out = Command::new(env!("CARGO_BIN_EXE_tessera")).args(&args).arg("--help").output().expect("run tessera");
        assert!(out.status.success(), "{name}: `tessera {}`: {}", args.join(" "), String::from_utf8_lossy(&out.stderr));
    }
}

#[test]
fn the_replica_sockets_are_the_addresses_its_config_names() {
    let units = units();
    let service = &units["tessera-replica.service"];
    let exec = values(service, "Service", "ExecStart").join(" ");
    assert!(exec.ends_with("--config /etc/tessera/replica.toml"), "{exec}");
    let config = ServeFile::from_file(&units_dir().join("replica.toml")).expect("the example config parses");
    let want = config.listen_addrs();
    let sockets: Vec<String> =
        values(service, "Service", "Sockets").join(" ").split_whitespace().map(String::from).collect();
    let mut named = BTreeMap::new();
    for s in &sockets {
        let unit = units.get(s).unwrap_or_else(|| panic!("{s} is named by the service but not shipped"));
        let name = values(unit, "Socket", "FileDescriptorName");
        let listen = values(unit, "Socket", "ListenStream");
        assert_eq!((name.len(), listen.len()), (1, 1), "{s}: one name, one address");
        assert_eq!(values(unit, "Socket", "Service"), ["tessera-replica.service"], "{s}");
        named.insert(name[0].clone(), listen[0].parse::<std::net::SocketAddr>().expect("an address"));
    }
    let expected: BTreeMap<String, std::net::SocketAddr> =
        [("client", Some(want.client)), ("raft", want.raft), ("http", want.http)]
            .into_iter()
            .filter_map(|(k, a)| a.map(|a| (k.to_string(), a)))
            .collect();
    assert_eq!(named, expected, "socket names and addresses against replica.toml");
    // The rest of the example is a valid replica config once its cluster spec exists.
    let mut config = config;
    config.cluster_spec = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/clusters/dev.toml");
    let cfg = config.into_config().expect("a valid replica config");
    assert_eq!((cfg.peers.len(), cfg.raft_peers.len()), (3, 3));
}

#[test]
fn the_environment_files_set_only_what_the_binary_reads() {
    for file in ["agent.env", "scheduler.env"] {
        let text = std::fs::read_to_string(units_dir().join(file)).expect("env file");
        let keys: Vec<&str> = text
            .lines()
            .map(str::trim)
            .filter(|l| !l.is_empty() && !l.starts_with('#'))
            .map(|l| l.split_once('=').expect("KEY=value").0)
            .collect();
        assert!(keys.contains(&"TESSERA_VIEW"), "{file}: where the view is");
        for k in keys {
            assert!(["TESSERA_VIEW", "TESSERA_TLS", "RUST_LOG"].contains(&k), "{file}: {k} is read by nothing");
        }
    }
}
