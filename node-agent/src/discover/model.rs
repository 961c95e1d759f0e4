//! From discovered facts to the server model. Pure: no I/O, unit-testable with made-up GPUs.
//!
//! - Sockets: GPUs grouped by the hwloc package holding most of their local CPUs (a GPU with
//!   none goes to the first package).
//! - PCIe switches: GPUs grouped by their nearest PCIe switch, from `pci_path`. Under a switch a
//!   GPU hangs from one of the switch's downstream ports, so the switch is named by its upstream
//!   port, the second-to-last bridge of the path. A GPU directly under a root port (one bridge)
//!   or on the root bus (none) is alone on its switch.
//! - NVLink groups: maximal fully connected cliques (two or more GPUs) of the NVLink peer graph,
//!   made disjoint greedily: take the lowest GPU not yet in a group, add every higher GPU linked
//!   to all members so far, repeat.
//! - Cores per socket: the fewest physical cores among the packages that hold GPUs, capped so
//!   that the view's 128-core limit holds; memory: the host's, capped to `u32` MiB.
//! - Device type: see [`device_type_of`].
//!
//! Sockets, switches and groups are listed in the order a topology file lists them (sockets by
//! their lowest device, switches by socket then lowest device), so a discovered server equals the
//! preset it is built like.

use super::{GpuInfo, GpuPair, HostInfo, fingerprint};
use crate::error::AgentError;
use std::collections::BTreeMap;
use tessera_view::mask::{MAX_CORES, MAX_DEVICES, format_indices};
use tessera_view::{FieldError, Topology};

/// A model and where its sockets are.
#[derive(Debug)]
pub(crate) struct Model {
    /// The model.
    pub topology: Topology,
    /// Socket `s` of the model is `host.packages[socket_packages[s]]`.
    pub socket_packages: Vec<usize>,
}

/// Builds the server model from discovered facts; see the module documentation for the rules.
/// The model's name is `discovered-<fingerprint>`.
pub fn topology_from(gpus: &[GpuInfo], host: &HostInfo) -> Result<Topology, AgentError> {
    build(gpus, host, &mut Vec::new()).map(|m| m.topology)
}

/// The device type of a GPU: `nvidia-<model>-<memory>g`. The model is the first word of the
/// product name that contains a digit, after dropping the brand words NVIDIA, Tesla, GeForce and
/// Quadro, cut at its first `-` and lower-cased (else the first remaining word, else `gpu`); the
/// memory is `memory_mib` in GiB, rounded. `NVIDIA H100 80GB HBM3` with 81559 MiB gives
/// `nvidia-h100-80g`; `Tesla V100-SXM2-16GB` with 16160 MiB gives `nvidia-v100-16g`.
pub fn device_type_of(name: &str, memory_mib: u64) -> String {
    const BRANDS: &[&str] = &["nvidia", "tesla", "geforce", "quadro"];
    let words: Vec<String> =
        name.split_whitespace().map(str::to_ascii_lowercase).filter(|w| !BRANDS.contains(&w.as_str())).collect();
    let word = words.iter().find(|w| w.chars().any(|c| c.is_ascii_digit())).or(words.first());
    let model: String = word
        .map(|w| w.split('-').next().unwrap_or_default())
        .unwrap_or_default()
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let model = if model.is_empty() { "gpu".to_string() } else { model };
    format!("nvidia-{model}-{}g", (memory_mib + 512) / 1024)
}

/// [`topology_from`], also returning the package behind each socket and adding warnings.
pub(crate) fn build(gpus: &[GpuInfo], host: &HostInfo, warnings: &mut Vec<String>) -> Result<Model, AgentError> {
    let invalid = |field: &str, msg: String| AgentError::InvalidModel(FieldError::new(field, msg));
    if gpus.is_empty() {
        return Err(AgentError::NoGpus);
    }
    if gpus.len() > MAX_DEVICES as usize {
        return Err(invalid("devices", format!("{} GPUs; a server has at most {MAX_DEVICES}", gpus.len())));
    }
    let mut gpus: Vec<&GpuInfo> = gpus.iter().collect();
    gpus.sort_by_key(|g| g.index);
    if let Some((i, g)) = gpus.iter().enumerate().find(|(i, g)| g.index as usize != *i) {
        let msg = format!("GPU indices must be 0..{} each once, but position {i} holds GPU {}", gpus.len(), g.index);
        return Err(invalid("devices", msg));
    }
    if host.packages.is_empty() {
        return Err(AgentError::Hwloc("the host has no CPU packages".into()));
    }

    // Sockets: package position -> device mask, then ordered by lowest device.
    let mut by_package: BTreeMap<usize, u64> = BTreeMap::new();
    for g in &gpus {
        *by_package.entry(package_of(g, host, warnings)).or_default() |= 1 << g.index;
    }
    let mut sockets: Vec<(usize, u64)> = by_package.into_iter().collect();
    sockets.sort_by_key(|&(_, m)| m.trailing_zeros());
    let socket_of = |d: u32| sockets.iter().position(|&(_, m)| m >> d & 1 == 1).unwrap_or(0);

    // PCIe switches, each within one socket.
    let mut by_switch: BTreeMap<String, u64> = BTreeMap::new();
    for g in &gpus {
        *by_switch.entry(switch_key(g)).or_default() |= 1 << g.index;
    }
    let mut switches = Vec::new();
    for (key, mask) in by_switch {
        let mut in_sockets: Vec<usize> = (0..64).filter(|d| mask >> d & 1 == 1).map(socket_of).collect();
        in_sockets.sort_unstable();
        in_sockets.dedup();
        if in_sockets.len() > 1 {
            let packages: Vec<String> =
                in_sockets.iter().map(|&s| host.packages[sockets[s].0].index.to_string()).collect();
            return Err(AgentError::SwitchSpansSockets {
                switch: key,
                devices: format_indices(mask),
                packages: packages.join(","),
            });
        }
        switches.push((in_sockets[0], mask));
    }
    switches.sort_by_key(|&(s, m)| (s, m.trailing_zeros()));

    // Cores per socket: the smallest GPU-holding package, within the view's core limit.
    let counts: Vec<u32> = sockets.iter().map(|&(p, _)| host.packages[p].cores.len() as u32).collect();
    let mut cores_per_socket = counts.iter().copied().min().unwrap_or(0);
    if counts.iter().any(|&c| c != cores_per_socket) {
        warnings.push(format!(
            "the packages holding GPUs have {counts:?} cores; the model gives every socket {cores_per_socket}"
        ));
    }
    let limit = MAX_CORES / sockets.len() as u32;
    if cores_per_socket > limit {
        warnings.push(format!(
            "{cores_per_socket} cores per socket exceed the view's {MAX_CORES} cores per server; only the first {limit} of each socket are modelled"
        ));
        cores_per_socket = limit;
    }
    let memory_mib = u32::try_from(host.memory_mib).unwrap_or_else(|_| {
        warnings.push(format!(
            "{} MiB of memory exceed the model's limit; {} MiB are modelled",
            host.memory_mib,
            u32::MAX
        ));
        u32::MAX
    });
    let device_type = device_type_of(&gpus[0].name, gpus[0].memory_mib);
    for g in &gpus[1..] {
        let other = device_type_of(&g.name, g.memory_mib);
        if other != device_type {
            warnings.push(format!("GPU {} is a {other}, GPU 0 a {device_type}; the model says {device_type}", g.index));
        }
    }

    let mut t = Topology {
        name: String::new(),
        device_type,
        devices: gpus.len() as u32,
        sockets: sockets.iter().map(|&(_, m)| m).collect(),
        pcie_switches: switches.into_iter().map(|(_, m)| m).collect(),
        nvlink_groups: nvlink_groups(&gpus),
        cores_per_socket,
        memory_mib,
    };
    t.name = format!("discovered-{}", fingerprint(&t));
    t.validate().map_err(AgentError::InvalidModel)?;
    Ok(Model { topology: t, socket_packages: sockets.into_iter().map(|(p, _)| p).collect() })
}

/// The position in `host.packages` of the package holding most of the GPU's local CPUs (the
/// lowest on a tie); the first package when it has none.
fn package_of(g: &GpuInfo, host: &HostInfo, warnings: &mut Vec<String>) -> usize {
    let overlap: Vec<usize> = host
        .packages
        .iter()
        .map(|p| p.cores.iter().flat_map(|c| &c.pus).filter(|pu| g.cpu_affinity.contains(pu)).count())
        .collect();
    let best = overlap.iter().copied().max().unwrap_or(0);
    if best == 0 {
        warnings.push(format!("GPU {}: no local CPUs known; it is modelled on the first socket", g.index));
        return 0;
    }
    if overlap.iter().filter(|&&n| n > 0).count() > 1 {
        warnings.push(format!(
            "GPU {}: its local CPUs span several packages; it is modelled on the one holding most",
            g.index
        ));
    }
    overlap.iter().position(|&n| n == best).unwrap_or(0)
}

/// The bridge that names a GPU's nearest PCIe switch (see the module documentation).
fn switch_key(g: &GpuInfo) -> String {
    let bridges: Vec<&String> = g.pci_path.iter().filter(|b| !b.starts_with("pci")).collect();
    match bridges.len() {
        0 => format!("{} (alone)", g.pci_bus_id),
        1 => bridges[0].clone(),
        n => bridges[n - 2].clone(),
    }
}

/// Disjoint NVLink cliques, greedily by lowest index (see the module documentation).
fn nvlink_groups(gpus: &[&GpuInfo]) -> Vec<u64> {
    let n = gpus.len() as u32;
    let mut adj = vec![0u64; gpus.len()];
    for g in gpus {
        for &p in g.nvlink_peers.iter().filter(|&&p| p < n && p != g.index) {
            adj[g.index as usize] |= 1 << p;
            adj[p as usize] |= 1 << g.index;
        }
    }
    let mut taken = 0u64;
    let mut groups = Vec::new();
    for i in 0..n {
        if taken >> i & 1 == 1 {
            continue;
        }
        let mut clique = 1u64 << i;
        for j in i + 1..n {
            if taken >> j & 1 == 0 && adj[j as usize] & clique == clique {
                clique |= 1 << j;
            }
        }
        if clique.count_ones() >= 2 {
            taken |= clique;
            groups.push(clique);
        }
    }
    groups
}

/// Warns where NVML's common ancestors disagree with the switches read from sysfs: GPUs at
/// level `internal` or `single` share one switch.
pub(crate) fn cross_check(t: &Topology, pairs: &[GpuPair], warnings: &mut Vec<String>) {
    for p in pairs.iter().filter(|p| (p.level == "internal" || p.level == "single") && p.a.max(p.b) < 64) {
        let both = 1u64 << p.a | 1u64 << p.b;
        if !t.pcie_switches.iter().any(|&s| s & both == both) {
            warnings.push(format!(
                "NVML puts GPUs {} and {} under one PCIe switch, but their sysfs paths do not; the model follows sysfs",
                p.a, p.b
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn device_types_normalize() {
        assert_eq!(device_type_of("NVIDIA H100 80GB HBM3", 81559), "nvidia-h100-80g");
        assert_eq!(device_type_of("Tesla V100-SXM2-16GB", 16160), "nvidia-v100-16g");
        assert_eq!(device_type_of("NVIDIA A100-SXM4-40GB", 40960), "nvidia-a100-40g");
        assert_eq!(device_type_of("NVIDIA GeForce RTX 4090", 24564), "nvidia-4090-24g");
        assert_eq!(device_type_of("NVIDIA", 0), "nvidia-gpu-0g");
    }
}
