//! The host from hwloc, and each GPU's place in the PCI tree from sysfs.
//!
//! hwloc gives packages, cores, PUs and memory. Two things it could give are read elsewhere:
//! - NUMA nodes: listing `NUMANode` objects panics in hwloc2 2.2.0 (it asks for the wrong
//!   virtual depth), so the count is the weight of the root object's node set.
//! - PCI bridges: hwloc only adds I/O objects when its type filter allows them, and hwloc2's safe
//!   API cannot set filters (that needs FFI, and this workspace forbids `unsafe`). So the PCI
//!   tree comes from sysfs: the real path of `/sys/bus/pci/devices/<bus id>` is the chain
//!   `/sys/devices/pci0000:00/0000:00:01.0/…/<bus id>`, and `numa_node` and `local_cpulist`
//!   sit beside it.
//! - Memory: Linux's `MemTotal` (`/proc/meminfo`) when readable, else hwloc's total. hwloc sums
//!   the per-node `meminfo` files of sysfs, which can lag behind on VMs with hot-plugged memory
//!   (a Firecracker VM here reports 8666 MiB in node0 and 24105 MiB in `/proc/meminfo`).

use super::{Core, HostInfo, Package};
use crate::error::AgentError;
use hwloc2::{ObjectType, TopologyObject};
use std::collections::BTreeMap;
use std::path::Path;

/// Where sysfs lists PCI devices.
const SYSFS_PCI: &str = "/sys/bus/pci/devices";

/// Reads the host with hwloc (memory: see the module documentation).
pub(crate) fn read_host(warnings: &mut Vec<String>) -> Result<HostInfo, AgentError> {
    let topo = hwloc2::Topology::new().ok_or_else(|| AgentError::Hwloc("hwloc could not load a topology".into()))?;
    let pus = topo
        .objects_with_type(&ObjectType::PU)
        .map_err(|e| AgentError::Hwloc(format!("hwloc lists no processing units ({e:?})")))?;
    // Cores keyed by (package, core) logical index, and each package's OS index. A PU with no
    // Core above it (some platforms do not report cores) is its own core, keyed apart from cores.
    let mut cores: BTreeMap<(u32, u64), Core> = BTreeMap::new();
    let mut package_os: BTreeMap<u32, u32> = BTreeMap::new();
    for pu in pus {
        let (pkg_key, pkg_os) =
            ancestor(pu, |t| matches!(t, ObjectType::Package)).map_or((0, 0), |p| (p.logical_index(), p.os_index()));
        let (core_key, core_os) = match ancestor(pu, |t| matches!(t, ObjectType::Core)) {
            Some(c) => (u64::from(c.logical_index()), c.os_index()),
            None => (1 << 32 | u64::from(pu.logical_index()), pu.os_index()),
        };
        package_os.insert(pkg_key, pkg_os);
        cores
            .entry((pkg_key, core_key))
            .or_insert_with(|| Core { index: core_os, pus: Vec::new() })
            .pus
            .push(pu.os_index());
    }
    let mut packages: Vec<Package> = package_os.values().map(|&index| Package { index, cores: Vec::new() }).collect();
    for ((pkg_key, _), mut core) in cores {
        core.pus.sort_unstable();
        let p = package_os.keys().position(|&k| k == pkg_key).unwrap_or(0);
        packages[p].cores.push(core);
    }
    if packages.is_empty() {
        return Err(AgentError::Hwloc("hwloc found no processing units".into()));
    }
    let root = topo.object_at_root();
    // The weight is -1 for an infinite set: a machine without NUMA information has one node.
    let numa_nodes = root.nodeset().map_or(1, |n| n.weight()).max(1) as u32;
    let cores = packages.iter().map(|p| p.cores.len() as u32).sum();
    let pus = packages.iter().flat_map(|p| &p.cores).map(|c| c.pus.len() as u32).sum();
    let hwloc_mib = root.total_memory() >> 20;
    let memory_mib = match meminfo_total_mib() {
        Some(linux_mib) => {
            if linux_mib.abs_diff(hwloc_mib) > linux_mib / 100 {
                warnings.push(format!(
                    "hwloc counts {hwloc_mib} MiB of memory, /proc/meminfo {linux_mib} MiB; the model uses /proc/meminfo"
                ));
            }
            linux_mib
        }
        None => hwloc_mib,
    };
    Ok(HostInfo { packages, numa_nodes, cores, pus, memory_mib })
}

/// `MemTotal` of `/proc/meminfo` in MiB.
fn meminfo_total_mib() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    let kib = text.lines().find_map(|l| l.strip_prefix("MemTotal:"))?.trim().strip_suffix("kB")?.trim();
    kib.parse::<u64>().ok().map(|k| k >> 10)
}

/// The nearest ancestor of `obj` whose type satisfies `want`.
fn ancestor(obj: &TopologyObject, want: impl Fn(ObjectType) -> bool) -> Option<&TopologyObject> {
    let mut cur = obj.parent();
    while let Some(o) = cur {
        if want(o.object_type()) {
            return Some(o);
        }
        cur = o.parent();
    }
    None
}

/// A GPU's place as sysfs tells it.
#[derive(Debug, Default)]
pub(crate) struct PciFacts {
    /// Bridges from the host bridge down to the device's parent.
    pub path: Vec<String>,
    /// `numa_node`, `None` for -1 or unreadable.
    pub numa_node: Option<i32>,
    /// `local_cpulist`, empty if unreadable.
    pub cpus: Vec<u32>,
}

/// Reads the sysfs entry of PCI device `bus_id` (sysfs form, `0000:18:00.0`).
pub(crate) fn pci_facts(bus_id: &str) -> Result<PciFacts, AgentError> {
    let dir = Path::new(SYSFS_PCI).join(bus_id);
    let real = std::fs::canonicalize(&dir).map_err(|source| AgentError::Sysfs { path: dir.clone(), source })?;
    let parts: Vec<String> = real.iter().map(|c| c.to_string_lossy().into_owned()).collect();
    let start = parts.iter().position(|c| c.starts_with("pci")).unwrap_or(parts.len());
    let path = parts[start..parts.len().saturating_sub(1).max(start)].to_vec();
    let read = |name: &str| std::fs::read_to_string(dir.join(name)).ok();
    let numa_node = read("numa_node").and_then(|s| s.trim().parse::<i32>().ok()).filter(|&n| n >= 0);
    let cpus = read("local_cpulist").and_then(|s| parse_cpulist(&s)).unwrap_or_default();
    Ok(PciFacts { path, numa_node, cpus })
}

/// NVML's bus id (`00000000:18:00.0`, 8-digit domain, upper case) in sysfs form
/// (`0000:18:00.0`).
pub(crate) fn sysfs_bus_id(id: &str) -> String {
    let id = id.trim().to_ascii_lowercase();
    match id.split_once(':') {
        Some((domain, rest)) => match u32::from_str_radix(domain, 16) {
            Ok(d) => format!("{d:04x}:{rest}"),
            Err(_) => id,
        },
        None => id,
    }
}

/// Parses a Linux CPU list such as `0-3,8,10-11`; `None` if malformed.
pub(crate) fn parse_cpulist(s: &str) -> Option<Vec<u32>> {
    let mut cpus = Vec::new();
    for part in s.trim().split(',').filter(|p| !p.is_empty()) {
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b) = (a.parse::<u32>().ok()?, b.parse::<u32>().ok()?);
                if b < a || b - a > 1 << 16 {
                    return None;
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().ok()?),
        }
    }
    cpus.sort_unstable();
    cpus.dedup();
    Some(cpus)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpulists_parse() {
        assert_eq!(parse_cpulist("0-3,8,10-11\n"), Some(vec![0, 1, 2, 3, 8, 10, 11]));
        assert_eq!(parse_cpulist(""), Some(vec![]));
        assert_eq!(parse_cpulist("3-1"), None);
        assert_eq!(parse_cpulist("x"), None);
    }

    #[test]
    fn bus_ids_normalize() {
        assert_eq!(sysfs_bus_id("00000000:3B:00.0"), "0000:3b:00.0");
        assert_eq!(sysfs_bus_id("0000:3b:00.0"), "0000:3b:00.0");
        assert_eq!(sysfs_bus_id("00000001:C1:00.1"), "0001:c1:00.1");
    }
}
