//! Discovery: the pure model builder on made-up servers, the real host against Linux's own
//! view, fake-GPU mode with every preset, contradictory files, fingerprints and fake health.

use std::collections::BTreeSet;
use std::path::Path;
use tessera_agent::AgentError;
use tessera_agent::discover::{
    DiscoverOptions, Discovery, GpuHealth, GpuInfo, GpuSource, HealthProbe, HostInfo, Package, discover, fingerprint,
    matching_preset, topology_from,
};
use tessera_view::Topology;
use tessera_view::topology::PRESETS;

// ---- made-up servers ------------------------------------------------------------------------

/// `packages` packages of `cores` two-thread cores; package `p` core `c` has PUs
/// `p*cores+c` and `packages*cores + p*cores+c`, as Linux numbers hyperthreads.
fn host(packages: u32, cores: u32, memory_mib: u64) -> HostInfo {
    let n = packages * cores;
    let packages: Vec<Package> = (0..packages)
        .map(|p| Package {
            index: p,
            cores: (0..cores)
                .map(|c| tessera_agent::discover::Core { index: c, pus: vec![p * cores + c, n + p * cores + c] })
                .collect(),
        })
        .collect();
    HostInfo { packages, numa_nodes: 2, cores: n, pus: 2 * n, memory_mib }
}

/// All PUs of package `p` of `host`.
fn package_cpus(h: &HostInfo, p: usize) -> Vec<u32> {
    h.packages[p].cores.iter().flat_map(|c| c.pus.clone()).collect()
}

fn gpu(index: u32, name: &str, memory_mib: u64, cpus: Vec<u32>, pci_path: Vec<String>) -> GpuInfo {
    GpuInfo {
        index,
        uuid: format!("GPU-{index:08x}"),
        name: name.to_string(),
        memory_mib,
        pci_bus_id: format!("0000:{:02x}:00.0", 0x80 + index),
        numa_node: None,
        cpu_affinity: cpus,
        nvlink_peers: Vec::new(),
        pci_path,
        health: GpuHealth { healthy: true, reasons: Vec::new() },
    }
}

/// Eight GPUs, two per PCIe switch (one level: root port, switch upstream port, downstream
/// port), switches 0-1 on package 0 and 2-3 on package 1.
fn eight_under_four_switches(h: &HostInfo, name: &str, memory_mib: u64) -> Vec<GpuInfo> {
    (0..8u32)
        .map(|i| {
            let sw = i / 2;
            let path = vec![
                format!("pci0000:{:02x}", sw * 0x20),
                format!("0000:{:02x}:01.0", sw * 0x20),
                format!("0000:{:02x}:00.0", sw * 0x20 + 1),
                format!("0000:{:02x}:{:02x}.0", sw * 0x20 + 2, i % 2),
            ];
            gpu(i, name, memory_mib, package_cpus(h, (i / 4) as usize), path)
        })
        .collect()
}

fn without_name(mut t: Topology) -> Topology {
    t.name.clear();
    t
}

fn preset(name: &str) -> Topology {
    Topology::preset(name).expect("compiled-in preset")
}

#[test]
fn seed_shaped_server_is_the_seed_preset() {
    let h = host(2, 16, 393216);
    let gpus = eight_under_four_switches(&h, "Tesla V100-SXM2-16GB", 16160);
    let t = topology_from(&gpus, &h).expect("a valid model");
    assert_eq!(without_name(t.clone()), without_name(preset("seed-8gpu")));
    assert_eq!(t.sockets, vec![0x0f, 0xf0]);
    assert_eq!(t.pcie_switches, vec![0x03, 0x0c, 0x30, 0xc0]);
    assert_eq!(t.name, format!("discovered-{}", fingerprint(&t)));
    assert_eq!(matching_preset(&t).as_deref(), Some("seed-8gpu"));
    // The order of the input does not matter.
    let mut reversed = gpus.clone();
    reversed.reverse();
    assert_eq!(topology_from(&reversed, &h).expect("a valid model"), t);
}

#[test]
fn dgx_h100_shaped_server_is_the_dgx_h100_preset() {
    let h = host(2, 56, 2_097_152);
    // Two levels of switches: one per socket half, each with two lower switches of two GPUs.
    let gpus: Vec<GpuInfo> = (0..8u32)
        .map(|i| {
            let (upper, lower) = (i / 4, i / 2);
            let path = vec![
                format!("pci0000:{:02x}", upper * 0x40),
                format!("0000:{:02x}:01.0", upper * 0x40),
                format!("0000:{:02x}:00.0", upper * 0x40 + 1),
                format!("0000:{:02x}:{:02x}.0", upper * 0x40 + 2, lower % 2),
                format!("0000:{:02x}:00.0", 0x10 * lower + 3),
                format!("0000:{:02x}:{:02x}.0", 0x10 * lower + 4, i % 2),
            ];
            let mut g = gpu(i, "NVIDIA H100 80GB HBM3", 81559, package_cpus(&h, upper as usize), path);
            g.nvlink_peers = (0..8).filter(|&p| p != i).collect();
            g
        })
        .collect();
    let t = topology_from(&gpus, &h).expect("a valid model");
    assert_eq!(without_name(t.clone()), without_name(preset("dgx-h100")));
    assert_eq!(t.nvlink_groups, vec![0xff]);
    assert_eq!(matching_preset(&t).as_deref(), Some("dgx-h100"));
}

#[test]
fn hybrid_cube_mesh_gives_two_nvlink_groups() {
    let h = host(2, 20, 524288);
    let mut gpus = eight_under_four_switches(&h, "Tesla V100-SXM2-32GB", 32510);
    for g in &mut gpus {
        let i = g.index;
        // Fully connected quads plus the cross links i <-> i+4, listed on one side only.
        let quad = i / 4 * 4;
        g.nvlink_peers = (quad..quad + 4).filter(|&p| p > i).collect();
        if i < 4 {
            g.nvlink_peers.push(i + 4);
        }
    }
    let t = topology_from(&gpus, &h).expect("a valid model");
    assert_eq!(t.nvlink_groups, vec![0x0f, 0xf0]);
    assert_eq!(matching_preset(&t).as_deref(), Some("dgx1-v100"));
}

#[test]
fn switch_spanning_sockets_is_refused() {
    let h = host(2, 16, 393216);
    let mut gpus = eight_under_four_switches(&h, "Tesla V100-SXM2-16GB", 16160);
    // GPU 3 shares a switch with GPU 2 but claims the other package's CPUs.
    gpus[3].cpu_affinity = package_cpus(&h, 1);
    let e = topology_from(&gpus, &h).expect_err("a switch across sockets must be refused");
    match &e {
        AgentError::SwitchSpansSockets { devices, packages, .. } => {
            assert_eq!((devices.as_str(), packages.as_str()), ("2-3", "0,1"));
        }
        other => panic!("wrong error: {other}"),
    }
    assert!(e.to_string().contains("must lie within one socket"), "{e}");
}

#[test]
fn sparse_facts_still_make_a_model_and_bad_input_is_an_error() {
    let h = host(1, 8, 65536);
    // No PCI path and no affinity: each GPU alone on its switch, all on the first socket.
    let gpus: Vec<GpuInfo> = (0..2).map(|i| gpu(i, "NVIDIA A100-SXM4-40GB", 40960, vec![], vec![])).collect();
    let t = topology_from(&gpus, &h).expect("a valid model");
    assert_eq!((t.sockets.clone(), t.pcie_switches.clone()), (vec![0b11], vec![0b01, 0b10]));
    assert_eq!((t.device_type.as_str(), t.cores_per_socket, t.memory_mib), ("nvidia-a100-40g", 8, 65536));
    assert!(matches!(topology_from(&[], &h), Err(AgentError::NoGpus)));
    let gap = [gpus[0].clone(), GpuInfo { index: 5, ..gpus[1].clone() }];
    let e = topology_from(&gap, &h).expect_err("indices must be 0..n");
    assert!(e.to_string().contains("`devices`"), "{e}");
}

// ---- this machine ---------------------------------------------------------------------------

fn read(path: impl AsRef<Path>) -> String {
    std::fs::read_to_string(path.as_ref()).unwrap_or_else(|e| panic!("{}: {e}", path.as_ref().display()))
}

fn cpulist(s: &str) -> Vec<u32> {
    let mut out = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => out.extend(a.parse::<u32>().expect("cpu")..=b.parse::<u32>().expect("cpu")),
            None => out.push(part.parse().expect("cpu")),
        }
    }
    out
}

fn real() -> Discovery {
    discover(&DiscoverOptions::default()).expect("discovery on this machine")
}

#[test]
fn host_agrees_with_linux() {
    let h = real().host;
    let processors = read("/proc/cpuinfo").lines().filter(|l| l.starts_with("processor")).count();
    assert_eq!(h.pus as usize, processors);
    let pus = h.all_pus();
    assert_eq!(pus.len(), processors);
    assert_eq!(pus.iter().collect::<BTreeSet<_>>().len(), pus.len(), "a PU listed twice: {pus:?}");
    let topo = |cpu: u32, file: &str| read(format!("/sys/devices/system/cpu/cpu{cpu}/topology/{file}"));
    let mut package_ids = BTreeSet::new();
    for p in &h.packages {
        for c in &p.cores {
            for &pu in &c.pus {
                assert_eq!(
                    c.pus,
                    cpulist(&topo(pu, "thread_siblings_list")),
                    "core {} of package {}",
                    c.index,
                    p.index
                );
                assert_eq!(topo(pu, "physical_package_id").trim(), p.index.to_string(), "package of CPU {pu}");
            }
        }
        package_ids.insert(p.index);
    }
    let linux_packages: BTreeSet<String> =
        pus.iter().map(|&pu| topo(pu, "physical_package_id").trim().to_string()).collect();
    assert_eq!(h.packages.len(), linux_packages.len());
    assert_eq!(package_ids.len(), h.packages.len());
    assert_eq!(h.cores as usize, h.packages.iter().map(|p| p.cores.len()).sum::<usize>());
    let mem_kib: u64 = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .expect("MemTotal in /proc/meminfo");
    let linux_mib = mem_kib as f64 / 1024.0;
    assert!((h.memory_mib as f64 - linux_mib).abs() <= linux_mib * 0.01, "{} MiB vs {linux_mib} MiB", h.memory_mib);
    assert!(h.numa_nodes >= 1);
    if let Ok(nodes) = std::fs::read_dir("/sys/devices/system/node") {
        let n = nodes.filter_map(Result::ok).filter(|e| e.file_name().to_string_lossy().starts_with("node")).count();
        if n > 0 {
            assert_eq!(h.numa_nodes as usize, n);
        }
    }
}

#[test]
fn without_a_driver_the_host_is_reported_and_nvml_is_named() {
    let d = real();
    match &d.gpus {
        GpuSource::Absent { reason } => {
            assert!(reason.contains("NVML"), "{reason}");
            assert!(d.topology.is_none() && d.fingerprint.is_none() && d.matches_preset.is_none());
            assert!(d.core_cpus.is_empty());
            assert!(d.warnings.iter().any(|w| w.contains("NVML")), "{:?}", d.warnings);
            assert!(d.render().contains(reason.as_str()), "{}", d.render());
            assert_eq!(HealthProbe::new(&d).probe(), (0, Vec::new()));
            let json = serde_json::to_value(&d).expect("json");
            assert_eq!(json["gpus"]["source"], "absent");
        }
        // On a machine with NVIDIA GPUs: the model covers them and every view core is pinned.
        GpuSource::Nvml { gpus, .. } if !gpus.is_empty() => {
            let t = d.topology.as_ref().expect("a model for real GPUs");
            assert_eq!(t.devices as usize, gpus.len());
            assert_eq!(d.core_cpus.len(), t.cores() as usize);
            assert!(d.core_cpus.iter().all(|c| !c.is_empty()));
        }
        GpuSource::Nvml { .. } => assert!(d.topology.is_none()),
        GpuSource::Fake { .. } => panic!("fake GPUs without --topology"),
    }
    assert!(d.render().starts_with("host: "), "{}", d.render());
}

// ---- fake-GPU mode --------------------------------------------------------------------------

fn fake(topology: &str) -> Result<Discovery, AgentError> {
    discover(&DiscoverOptions { topology: Some(topology.to_string()) })
}

#[test]
fn every_preset_fakes_exactly_its_topology() {
    for (name, text) in PRESETS {
        let want = preset(name);
        let d = fake(name).expect("a preset");
        assert_eq!(d.topology.as_ref(), Some(&want), "{name}");
        assert!(matches!(&d.gpus, GpuSource::Fake { file } if file == name));
        assert_eq!(d.matches_preset.as_deref(), Some(*name));
        assert_eq!(d.fingerprint.as_deref(), Some(fingerprint(&want).as_str()));
        let pus = d.host.all_pus();
        assert_eq!(d.core_cpus.len(), want.cores() as usize, "{name}");
        for (i, cpus) in d.core_cpus.iter().enumerate() {
            assert_eq!(cpus, &vec![pus[i % pus.len()]], "{name}: view core {i}");
        }
        // The same text from a file gives the same model.
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join(format!("{name}.toml"));
        std::fs::write(&path, text).expect("write");
        let from_file = fake(&path.display().to_string()).expect("a valid file");
        assert_eq!(from_file.topology, Some(want));
        assert_eq!(from_file.matches_preset.as_deref(), Some(*name));
        assert!(d.render().contains(&format!("matches preset {name}")), "{}", d.render());
        let json = serde_json::to_string(&d).expect("json");
        let back: Discovery = serde_json::from_str(&json).expect("round trip");
        assert_eq!(back.topology, d.topology);
    }
}

#[test]
fn unknown_or_contradictory_topologies_are_errors_naming_file_and_field() {
    let e = fake("no-such-preset").expect_err("unknown");
    assert!(matches!(e, AgentError::UnknownTopology { .. }) && e.to_string().contains("seed-8gpu"), "{e}");
    let dir = tempfile::tempdir().expect("tempdir");
    let head = "name = 'bad'\ndevice_type = 'gpu'\ncores_per_socket = 4\nmemory_mib = 1024\n";
    let cases = [
        (
            "five.toml",
            "devices = 4\n[[sockets]]\npcie_switches = [[0, 1], [2, 3, 5]]\n",
            "sockets[0].pcie_switches[1]",
            "device 5",
        ),
        (
            "twice.toml",
            "devices = 4\n[[sockets]]\npcie_switches = [[0, 1]]\n[[sockets]]\npcie_switches = [[1, 2, 3]]\n",
            "sockets[1].pcie_switches[0]",
            "device 1 is in two groups",
        ),
    ];
    for (file, body, field, what) in cases {
        let path = dir.path().join(file);
        std::fs::write(&path, format!("{head}{body}")).expect("write");
        let e = fake(&path.display().to_string()).expect_err("a contradictory file");
        let msg = e.to_string();
        assert!(matches!(e, AgentError::FakeTopology(_)), "{msg}");
        assert!(msg.contains(&path.display().to_string()) && msg.contains(field) && msg.contains(what), "{msg}");
    }
    let missing = dir.path().join("missing.toml");
    let e = fake(&missing.display().to_string()).expect_err("a missing file");
    assert!(e.to_string().contains("missing.toml"), "{e}");
}

#[test]
fn fingerprints_ignore_the_name_only() {
    let seed = preset("seed-8gpu");
    let renamed = Topology { name: "rack-3-server-7".into(), ..seed.clone() };
    assert_eq!(fingerprint(&seed), fingerprint(&renamed));
    let fp = fingerprint(&seed);
    assert!(fp.starts_with("tt-") && fp.len() == 19 && fp[3..].chars().all(|c| c.is_ascii_hexdigit()), "{fp}");
    assert_eq!(matching_preset(&renamed).as_deref(), Some("seed-8gpu"));
    let mut moved = seed.clone();
    moved.pcie_switches = vec![0x01, 0x0e, 0x30, 0xc0];
    assert_ne!(fingerprint(&moved), fp);
    assert_eq!(matching_preset(&moved), None);
    let mut linked = seed.clone();
    linked.nvlink_groups = vec![0x03];
    assert_ne!(fingerprint(&linked), fp);
    let mut bigger = seed;
    bigger.memory_mib += 1;
    assert_ne!(fingerprint(&bigger), fp);
    let all: BTreeSet<String> = PRESETS.iter().map(|(n, _)| fingerprint(&preset(n))).collect();
    assert_eq!(all.len(), PRESETS.len(), "presets must have distinct fingerprints");
}

#[test]
fn fake_health_file_marks_devices_unhealthy() {
    let d = fake("seed-8gpu").expect("preset");
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("health");
    let mut probe = HealthProbe::new(&d).with_fake_health_file(Some(file.clone()));
    assert_eq!(probe.probe(), (0, Vec::new()), "no file: all healthy");
    std::fs::write(&file, "# injected faults\n3 XID 79: fell off the bus\n\n6\nbogus\n99 out of range\n")
        .expect("write");
    let (mask, reasons) = probe.probe();
    assert_eq!(mask, 1 << 3 | 1 << 6);
    assert_eq!(reasons[0], "GPU 3: XID 79: fell off the bus");
    assert!(reasons[1].starts_with("GPU 6: marked unhealthy"), "{reasons:?}");
    assert_eq!(reasons.len(), 2);
    std::fs::write(&file, "").expect("write");
    assert_eq!(probe.probe(), (0, Vec::new()), "cleared");
    let mut healthy = HealthProbe::new(&d).with_fake_health_file(None);
    assert_eq!(healthy.probe(), (0, Vec::new()));
    fn send<T: Send>(_: &T) {}
    send(&probe);
}

#[test]
fn preset_toml_parses_back_to_the_same_model() {
    for (name, _) in tessera_view::topology::PRESETS {
        let t = tessera_view::Topology::preset(name).expect("preset");
        let text = tessera_agent::discover::preset_toml(&t);
        let back = tessera_view::Topology::from_toml("emitted", &text).expect("emitted preset parses");
        assert_eq!(back, t, "{text}");
    }
}
