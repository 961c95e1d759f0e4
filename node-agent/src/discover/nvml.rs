//! GPUs from NVML, placed in the PCI tree with sysfs.
//!
//! Only what the model needs is fatal (a GPU's handle, UUID, name, memory, PCI bus id); every
//! other call that fails (NotSupported, NoPermission, …) becomes a warning and the fact is left
//! out.

use super::host::{PciFacts, pci_facts, sysfs_bus_id};
use super::{GpuHealth, GpuInfo, GpuPair, HostInfo};
use crate::error::{AgentError, chain};
use nvml_wrapper::enum_wrappers::device::{EccCounter, MemoryError, TopologyLevel};
use nvml_wrapper::error::NvmlError;
use nvml_wrapper::{Device, Nvml};
use std::collections::BTreeSet;

/// NVLinks per GPU that NVML can describe (`NVML_NVLINK_MAX_LINKS`).
const MAX_NVLINKS: u32 = 18;

/// What NVML found.
#[derive(Debug)]
pub(crate) enum NvmlRead {
    /// NVML cannot be used; why.
    Absent(String),
    /// NVML works.
    Found {
        /// Driver version.
        driver_version: String,
        /// The GPUs by index.
        gpus: Vec<GpuInfo>,
        /// Common ancestors of every pair.
        pairs: Vec<GpuPair>,
    },
}

/// Why NVML cannot be used, in plain words.
pub(crate) fn unavailable(e: &NvmlError) -> String {
    match e {
        NvmlError::LibloadingError(_) => {
            "NVML unavailable: libnvidia-ml.so.1 not found (no NVIDIA driver on this machine)".to_string()
        }
        NvmlError::DriverNotLoaded => "NVML unavailable: the NVIDIA kernel driver is not loaded".to_string(),
        NvmlError::NoPermission => "NVML unavailable: no permission to talk to the NVIDIA driver".to_string(),
        e => format!("NVML unavailable: {e}"),
    }
}

/// Reads every GPU.
pub(crate) fn read(host: &HostInfo, warnings: &mut Vec<String>) -> Result<NvmlRead, AgentError> {
    let nvml = match Nvml::init() {
        Ok(n) => n,
        Err(e) => return Ok(NvmlRead::Absent(unavailable(&e))),
    };
    let fatal = |what: String| move |source: NvmlError| AgentError::Nvml { what, source };
    let driver_version = nvml.sys_driver_version().unwrap_or_else(|e| {
        warnings.push(format!("NVML driver version unavailable: {e}"));
        "unknown".to_string()
    });
    let count = nvml.device_count().map_err(fatal("device_count".into()))?;
    let mut devices = Vec::new();
    let mut gpus = Vec::new();
    for i in 0..count {
        let dev = nvml.device_by_index(i).map_err(fatal(format!("device_by_index({i})")))?;
        let pci = dev.pci_info().map_err(fatal(format!("pci_info of GPU {i}")))?;
        let pci_bus_id = sysfs_bus_id(&pci.bus_id);
        let facts = pci_facts(&pci_bus_id).unwrap_or_else(|e| {
            warnings.push(format!("GPU {i}: {}; its PCIe switch and local CPUs are unknown", chain(&e)));
            PciFacts::default()
        });
        let cpu_affinity = if facts.cpus.is_empty() { nvml_cpus(&dev, host, i, warnings) } else { facts.cpus.clone() };
        let numa_node = facts.numa_node.or_else(|| dev.numa_node_id().ok().and_then(|n| i32::try_from(n).ok()));
        let (health, notes) = check_health(&dev);
        warnings.extend(notes.into_iter().map(|n| format!("GPU {i}: {n}")));
        gpus.push(GpuInfo {
            index: i,
            uuid: dev.uuid().map_err(fatal(format!("uuid of GPU {i}")))?,
            name: dev.name().map_err(fatal(format!("name of GPU {i}")))?,
            memory_mib: dev.memory_info().map_err(fatal(format!("memory_info of GPU {i}")))?.total >> 20,
            pci_bus_id,
            numa_node,
            cpu_affinity,
            nvlink_peers: Vec::new(),
            pci_path: facts.path,
            health,
        });
        devices.push(dev);
    }
    nvlink_peers(&devices, &mut gpus, warnings);
    let mut pairs = Vec::new();
    for a in 0..devices.len() {
        for b in a + 1..devices.len() {
            match nvml.topology_common_ancestor(&devices[a], &devices[b]) {
                Ok(level) => pairs.push(GpuPair { a: a as u32, b: b as u32, level: level_name(level).to_string() }),
                Err(e) => warnings.push(format!("NVML common ancestor of GPUs {a} and {b} unavailable: {e}")),
            }
        }
    }
    Ok(NvmlRead::Found { driver_version, gpus, pairs })
}

/// NVML's name of a common-ancestor level, as `nvidia-smi topo` abbreviates it.
fn level_name(level: TopologyLevel) -> &'static str {
    match level {
        TopologyLevel::Internal => "internal",
        TopologyLevel::Single => "single",
        TopologyLevel::Multiple => "multiple",
        TopologyLevel::HostBridge => "hostbridge",
        TopologyLevel::Node => "node",
        TopologyLevel::System => "system",
    }
}

/// The GPU's CPU affinity from NVML (a bit mask in 64-bit words), when sysfs has none.
fn nvml_cpus(dev: &Device, host: &HostInfo, i: u32, warnings: &mut Vec<String>) -> Vec<u32> {
    let max_pu = host.all_pus().last().copied().unwrap_or(0);
    match dev.cpu_affinity(max_pu as usize / 64 + 1) {
        Ok(words) => (0..words.len() as u32 * 64).filter(|&c| words[c as usize / 64] >> (c % 64) & 1 == 1).collect(),
        Err(e) => {
            warnings.push(format!("GPU {i}: CPU affinity unavailable ({e})"));
            Vec::new()
        }
    }
}

/// Fills `nvlink_peers`: GPUs at the far end of an active link, and, for GPUs linked to
/// something that is not a GPU (an NVSwitch), every other such GPU. One NVSwitch fabric per
/// server is assumed, as on DGX and HGX boards.
fn nvlink_peers(devices: &[Device], gpus: &mut [GpuInfo], warnings: &mut Vec<String>) {
    let mut on_switch = BTreeSet::new();
    let mut peers: Vec<BTreeSet<u32>> = vec![BTreeSet::new(); gpus.len()];
    for (i, dev) in devices.iter().enumerate() {
        for link in 0..MAX_NVLINKS {
            let l = dev.link_wrapper_for(link);
            match l.is_active() {
                Ok(true) => {}
                Ok(false) => continue,
                // No NVLink on this GPU, or no more links.
                Err(NvmlError::NotSupported | NvmlError::InvalidArg) => break,
                Err(e) => {
                    warnings.push(format!("GPU {i}: state of NVLink {link} unavailable ({e})"));
                    continue;
                }
            }
            match l.remote_pci_info() {
                Ok(remote) => {
                    let remote = sysfs_bus_id(&remote.bus_id);
                    match gpus.iter().position(|g| g.pci_bus_id == remote) {
                        Some(p) if p != i => {
                            peers[i].insert(p as u32);
                        }
                        Some(_) => {}
                        None => {
                            on_switch.insert(i as u32);
                        }
                    }
                }
                Err(e) => warnings.push(format!("GPU {i}: far end of NVLink {link} unavailable ({e})")),
            }
        }
    }
    for (i, g) in gpus.iter_mut().enumerate() {
        if on_switch.contains(&(i as u32)) {
            peers[i].extend(on_switch.iter().filter(|&&p| p != i as u32));
        }
        g.nvlink_peers = peers[i].iter().copied().collect();
    }
}

/// A GPU's health: unhealthy on uncorrected ECC errors since the driver loaded, on memory pages
/// pending retirement, or when the GPU is lost. Also returns notes on counters that cannot be
/// read (NotSupported, NoPermission), which do not make a GPU unhealthy.
pub(crate) fn check_health(dev: &Device) -> (GpuHealth, Vec<String>) {
    let (mut reasons, mut notes) = (Vec::new(), Vec::new());
    let mut failed = |what: &str, e: NvmlError| match e {
        NvmlError::GpuLost => Some("GPU lost (fallen off the bus); reset the GPU or reboot".to_string()),
        e => {
            notes.push(format!("{what} unavailable ({e})"));
            None
        }
    };
    let ecc = match dev.total_ecc_errors(MemoryError::Uncorrected, EccCounter::Volatile) {
        Ok(0) => None,
        Ok(n) => Some(format!("{n} uncorrected ECC errors since the driver loaded; drain and reset the GPU")),
        Err(e) => failed("uncorrected ECC error count", e),
    };
    let pending = match dev.are_pages_pending_retired() {
        Ok(false) => None,
        Ok(true) => Some("memory pages are pending retirement; reset the GPU".to_string()),
        Err(e) => failed("page retirement state", e),
    };
    reasons.extend(ecc);
    reasons.extend(pending);
    reasons.dedup();
    (GpuHealth::from_reasons(reasons), notes)
}
