//! Hardware discovery: what this machine is, as facts and as the cluster view's server model.
//!
//! [`discover`] reads the host (packages, cores, PUs, NUMA nodes, memory) with hwloc and the
//! GPUs with NVML, then builds a [`Topology`] with the pure function [`topology_from`]. The
//! server registers that model; the view compares it field by field with its configuration set.
//!
//! | module | what it reads |
//! |---|---|
//! | `host` | hwloc (CPUs, memory) and sysfs (each GPU's PCI path, NUMA node, local CPUs) |
//! | `nvml` | NVML: GPUs, NVLink peers, PCIe common ancestors, health counters |
//! | `model` | nothing: facts in, [`Topology`] out |
//! | `health` | [`HealthProbe`]: per-device health for the heartbeat |
//!
//! Without an NVIDIA driver NVML cannot load; discovery then still reports the host and says why
//! there are no GPUs ([`GpuSource::Absent`]). Fake-GPU mode ([`DiscoverOptions::topology`]) takes
//! the devices from a preset or topology file instead, so everything after discovery runs on any
//! machine.
//!
//! Device `i` of the model is NVML device index `i` (NVML orders devices by PCI bus id).

mod health;
mod host;
mod model;
mod nvml;

pub use health::{FAKE_HEALTH_ENV, HealthProbe};
pub use model::{device_type_of, topology_from};

use crate::error::AgentError;
use serde::{Deserialize, Serialize};
use std::fmt::Write as _;
use std::path::Path;
use tessera_view::Topology;
use tessera_view::hash::StateHasher;
use tessera_view::mask::format_indices;
use tessera_view::topology::PRESETS;

/// What to discover.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DiscoverOptions {
    /// Fake-GPU mode: take the devices from this preset name (see
    /// [`tessera_view::topology::PRESETS`]) or topology TOML path instead of NVML. The host is
    /// still read from hwloc.
    pub topology: Option<String>,
}

/// Everything discovery found.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Discovery {
    /// The host, always real (hwloc), also in fake-GPU mode.
    pub host: HostInfo,
    /// Where the devices came from.
    pub gpus: GpuSource,
    /// The server model; `None` when there are no GPUs.
    pub topology: Option<Topology>,
    /// [`fingerprint`] of the model.
    pub fingerprint: Option<String>,
    /// The compiled-in preset equal to the model, names ignored ([`matching_preset`]).
    pub matches_preset: Option<String>,
    /// View core index (`0..topology.cores()`) to the OS CPU ids (PUs) that a task granted that
    /// core is pinned to. Real mode: view core `k` of socket `s` is the `k`-th physical core of
    /// the package behind socket `s`. Fake-GPU mode (a preset usually has more cores than this
    /// machine): view core `i` is the single PU `host_pus_sorted[i % pus]`, so pinning folds onto
    /// the real CPUs. Empty without a model.
    pub core_cpus: Vec<Vec<u32>>,
    /// Things an operator should know (missing counters, folded cores, capped values).
    pub warnings: Vec<String>,
}

/// Where the devices came from.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(tag = "source", rename_all = "kebab-case")]
pub enum GpuSource {
    /// Real GPUs, read with NVML.
    Nvml {
        /// The NVIDIA driver version.
        driver_version: String,
        /// The GPUs, by NVML index.
        gpus: Vec<GpuInfo>,
        /// NVML's common PCIe ancestor of every pair `a < b`.
        pairs: Vec<GpuPair>,
    },
    /// Fake-GPU mode.
    Fake {
        /// The preset name or topology file given.
        file: String,
    },
    /// No GPUs: NVML is unavailable.
    Absent {
        /// Why, e.g. `NVML unavailable: libnvidia-ml.so.1 not found (no NVIDIA driver on this machine)`.
        reason: String,
    },
}

/// One GPU as NVML and sysfs see it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuInfo {
    /// NVML index; device `index` of the model.
    pub index: u32,
    /// NVML UUID, e.g. `GPU-5a1f…`.
    pub uuid: String,
    /// Product name, e.g. `NVIDIA H100 80GB HBM3`.
    pub name: String,
    /// Framebuffer memory in MiB.
    pub memory_mib: u64,
    /// PCI bus id as sysfs writes it, e.g. `0000:18:00.0`.
    pub pci_bus_id: String,
    /// NUMA node of the PCI device, if the platform says.
    pub numa_node: Option<i32>,
    /// OS CPU ids local to the GPU (sysfs `local_cpulist`, else NVML's CPU affinity).
    pub cpu_affinity: Vec<u32>,
    /// Indices of the GPUs this one reaches over an active NVLink (directly or through NVSwitch).
    pub nvlink_peers: Vec<u32>,
    /// The PCI bridges from the host bridge down to the GPU's parent, from the sysfs path, e.g.
    /// `["pci0000:00", "0000:00:01.0", "0000:01:00.0", "0000:02:08.0"]`.
    pub pci_path: Vec<String>,
    /// Health at discovery.
    pub health: GpuHealth,
}

/// NVML's closest common PCIe ancestor of two GPUs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuPair {
    /// The lower index.
    pub a: u32,
    /// The higher index.
    pub b: u32,
    /// `internal`, `single` (one PCIe switch), `multiple` (switches, no host bridge),
    /// `hostbridge`, `node` (same NUMA node) or `system`.
    pub level: String,
}

/// Health of one GPU.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct GpuHealth {
    /// Usable.
    pub healthy: bool,
    /// Why not (empty when healthy).
    pub reasons: Vec<String>,
}

impl GpuHealth {
    /// Healthy when there are no reasons.
    pub fn from_reasons(reasons: Vec<String>) -> GpuHealth {
        GpuHealth { healthy: reasons.is_empty(), reasons }
    }
}

/// The host as hwloc sees it (memory: as Linux's `/proc/meminfo` says, see below).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostInfo {
    /// CPU packages (sockets), by OS index.
    pub packages: Vec<Package>,
    /// NUMA nodes (weight of the root object's node set).
    pub numa_nodes: u32,
    /// Physical cores in all.
    pub cores: u32,
    /// PUs (hardware threads) in all.
    pub pus: u32,
    /// Memory in MiB: `MemTotal` of `/proc/meminfo`, else hwloc's sum over NUMA nodes (which
    /// can lag behind on VMs with hot-plugged memory).
    pub memory_mib: u64,
}

/// One CPU package.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Package {
    /// OS index (Linux `physical_package_id`).
    pub index: u32,
    /// Its physical cores, in hwloc's logical order.
    pub cores: Vec<Core>,
}

/// One physical core.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Core {
    /// OS index (Linux `core_id`, unique within a package only).
    pub index: u32,
    /// OS CPU ids of its PUs, ascending.
    pub pus: Vec<u32>,
}

impl HostInfo {
    /// Every PU, ascending.
    pub fn all_pus(&self) -> Vec<u32> {
        let mut pus: Vec<u32> = self.packages.iter().flat_map(|p| p.cores.iter().flat_map(|c| c.pus.clone())).collect();
        pus.sort_unstable();
        pus
    }
}

/// Discovers this machine: the host always; the devices from NVML, or from a preset or file in
/// fake-GPU mode. No GPUs (no driver) is not an error: the result says why in
/// [`GpuSource::Absent`] and has no model.
pub fn discover(opts: &DiscoverOptions) -> Result<Discovery, AgentError> {
    let mut warnings = Vec::new();
    let host = host::read_host(&mut warnings)?;
    if let Some(given) = &opts.topology {
        let t = load_topology(given)?;
        let pus = host.all_pus();
        if (pus.len() as u64) < u64::from(t.cores()) {
            warnings.push(format!(
                "fake-GPU mode: the model's {} cores fold onto this machine's {} CPUs",
                t.cores(),
                pus.len()
            ));
        }
        let core_cpus = (0..t.cores() as usize).map(|i| pus.get(i % pus.len().max(1)).copied().into_iter().collect());
        return Ok(Discovery {
            fingerprint: Some(fingerprint(&t)),
            matches_preset: matching_preset(&t),
            core_cpus: core_cpus.collect(),
            topology: Some(t),
            gpus: GpuSource::Fake { file: given.clone() },
            host,
            warnings,
        });
    }
    let (gpus, topology, core_cpus) = match nvml::read(&host, &mut warnings)? {
        nvml::NvmlRead::Absent(reason) => {
            warnings.push(format!("{reason}; only the host is reported (--topology <preset> runs with fake GPUs)"));
            (GpuSource::Absent { reason }, None, Vec::new())
        }
        nvml::NvmlRead::Found { driver_version, gpus, pairs } if gpus.is_empty() => {
            warnings.push("NVML reports no GPUs on this machine".to_string());
            (GpuSource::Nvml { driver_version, gpus, pairs }, None, Vec::new())
        }
        nvml::NvmlRead::Found { driver_version, gpus, pairs } => {
            let m = model::build(&gpus, &host, &mut warnings)?;
            model::cross_check(&m.topology, &pairs, &mut warnings);
            let cps = m.topology.cores_per_socket as usize;
            let core_cpus =
                m.socket_packages.iter().flat_map(|&p| host.packages[p].cores.iter().take(cps).map(|c| c.pus.clone()));
            let core_cpus = core_cpus.collect();
            (GpuSource::Nvml { driver_version, gpus, pairs }, Some(m.topology), core_cpus)
        }
    };
    Ok(Discovery {
        fingerprint: topology.as_ref().map(fingerprint),
        matches_preset: topology.as_ref().and_then(matching_preset),
        host,
        gpus,
        topology,
        core_cpus,
        warnings,
    })
}

/// A preset by name, else a topology file.
fn load_topology(given: &str) -> Result<Topology, AgentError> {
    if let Some(t) = Topology::preset(given) {
        return Ok(t);
    }
    let path = Path::new(given);
    if path.exists() || given.contains('/') || given.ends_with(".toml") {
        return Ok(Topology::from_file(path)?);
    }
    let known = PRESETS.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ");
    Err(AgentError::UnknownTopology { name: given.to_string(), known })
}

/// A stable hash of everything in the model but its name, e.g. `tt-3f9a0c12d4e5b6a7` (FNV-1a,
/// the same on every platform and Rust version). Two servers with equal fingerprints register
/// equal models.
pub fn fingerprint(t: &Topology) -> String {
    let mut h = StateHasher::default();
    h.str(&t.device_type);
    h.u64(u64::from(t.devices));
    for masks in [&t.sockets, &t.pcie_switches, &t.nvlink_groups] {
        h.u64(masks.len() as u64);
        masks.iter().for_each(|&m| h.u64(m));
    }
    h.u64(u64::from(t.cores_per_socket));
    h.u64(u64::from(t.memory_mib));
    format!("tt-{:016x}", h.finish())
}

/// The compiled-in preset whose model equals `t` in every field but the name.
pub fn matching_preset(t: &Topology) -> Option<String> {
    PRESETS
        .iter()
        .map(|(n, _)| *n)
        .find(|n| Topology::preset(n).is_some_and(|p| Topology { name: t.name.clone(), ..p } == *t))
        .map(str::to_string)
}

/// The model as a topology preset file (the format of `deploy/topologies/*.toml`), so a server
/// that matches no existing configuration set can start a new one: save it, name it in the
/// cluster spec, and the server registers against it. Parses back to an equal [`Topology`].
pub fn preset_toml(t: &Topology) -> String {
    let list = |mask: u64| -> String {
        let ids: Vec<String> = (0..64).filter(|d| mask >> d & 1 == 1).map(|d: u32| d.to_string()).collect();
        format!("[{}]", ids.join(", "))
    };
    let mut out = format!(
        "# Written by `tessera agent discover --preset`.\nname = \"{}\"\ndevice_type = \"{}\"\ndevices = {}\n\
         cores_per_socket = {}\nmemory_mib = {}\n",
        t.name, t.device_type, t.devices, t.cores_per_socket, t.memory_mib
    );
    if !t.nvlink_groups.is_empty() {
        let groups: Vec<String> = t.nvlink_groups.iter().map(|g| list(*g)).collect();
        let _ = writeln!(out, "nvlink_groups = [{}]", groups.join(", "));
    }
    for socket in &t.sockets {
        let switches: Vec<String> =
            t.pcie_switches.iter().filter(|sw| *sw & socket == **sw).map(|sw| list(*sw)).collect();
        let _ = write!(out, "\n[[sockets]]\npcie_switches = [{}]\n", switches.join(", "));
    }
    out
}

/// OS CPU ids as runs, e.g. `0-3,8`; `-` when empty.
fn format_cpus(cpus: &[u32]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    let mut runs: Vec<(u32, u32)> = Vec::new();
    for c in sorted {
        match runs.last_mut() {
            Some((_, b)) if *b + 1 == c => *b = c,
            Some((_, b)) if *b == c => {}
            _ => runs.push((c, c)),
        }
    }
    if runs.is_empty() {
        return "-".to_string();
    }
    runs.iter().map(|&(a, b)| if a == b { a.to_string() } else { format!("{a}-{b}") }).collect::<Vec<_>>().join(",")
}

/// Device masks as `[0-3] [4-7]`, or `none`.
fn format_masks(masks: &[u64]) -> String {
    if masks.is_empty() {
        return "none".to_string();
    }
    masks.iter().map(|&m| format!("[{}]", format_indices(m))).collect::<Vec<_>>().join(" ")
}

impl Discovery {
    /// A human-readable report, for `tessera agent discover`.
    pub fn render(&self) -> String {
        let mut out = String::new();
        let h = &self.host;
        let _ = writeln!(
            out,
            "host: {} packages, {} cores, {} PUs, {} NUMA nodes, {} MiB memory",
            h.packages.len(),
            h.cores,
            h.pus,
            h.numa_nodes,
            h.memory_mib
        );
        for p in &h.packages {
            let pus: Vec<u32> = p.cores.iter().flat_map(|c| c.pus.clone()).collect();
            let _ = writeln!(out, "  package {}: {} cores, CPUs {}", p.index, p.cores.len(), format_cpus(&pus));
        }
        match &self.gpus {
            GpuSource::Absent { reason } => {
                let _ = writeln!(out, "GPUs: none ({reason})");
            }
            GpuSource::Fake { file } => {
                let _ = writeln!(out, "GPUs: fake, from {file}");
            }
            GpuSource::Nvml { driver_version, gpus, pairs } => {
                let _ = writeln!(out, "GPUs: {} via NVML, driver {driver_version}", gpus.len());
                for g in gpus {
                    let peers: Vec<String> = g.nvlink_peers.iter().map(u32::to_string).collect();
                    let health = if g.health.healthy { "healthy".to_string() } else { g.health.reasons.join("; ") };
                    let _ = writeln!(
                        out,
                        "  GPU {} {} ({} MiB) at {}, NUMA {}, CPUs {}, NVLink peers {}, under {}: {health}",
                        g.index,
                        g.name,
                        g.memory_mib,
                        g.pci_bus_id,
                        g.numa_node.map_or("-".to_string(), |n| n.to_string()),
                        format_cpus(&g.cpu_affinity),
                        if peers.is_empty() { "-".to_string() } else { peers.join(",") },
                        g.pci_path.last().map_or("-", String::as_str),
                    );
                }
                for p in pairs {
                    let _ = writeln!(out, "  GPU {} - GPU {}: {}", p.a, p.b, p.level);
                }
            }
        }
        if let Some(t) = &self.topology {
            let _ = writeln!(
                out,
                "model: {} ({}, {} devices, {} sockets x {} cores, {} MiB)",
                t.name,
                t.device_type,
                t.devices,
                t.sockets.len(),
                t.cores_per_socket,
                t.memory_mib
            );
            let _ = writeln!(out, "  sockets: {}", format_masks(&t.sockets));
            let _ = writeln!(out, "  PCIe switches: {}", format_masks(&t.pcie_switches));
            let _ = writeln!(out, "  NVLink groups: {}", format_masks(&t.nvlink_groups));
            let _ = writeln!(
                out,
                "  fingerprint {}, {}",
                self.fingerprint.as_deref().unwrap_or("-"),
                self.matches_preset.as_ref().map_or("matches no preset".to_string(), |p| format!("matches preset {p}"))
            );
            let pinned: Vec<u32> = self.core_cpus.iter().flatten().copied().collect();
            let _ = writeln!(out, "  {} view cores pinned to CPUs {}", self.core_cpus.len(), format_cpus(&pinned));
        } else {
            let _ = writeln!(out, "model: none");
        }
        for w in &self.warnings {
            let _ = writeln!(out, "warning: {w}");
        }
        out
    }
}
