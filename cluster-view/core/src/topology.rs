//! One server model: devices grouped by socket, PCIe switch and NVLink group, as bit masks.
//!
//! Topologies are written as TOML preset files (see `deploy/topologies/`); the presets shipped
//! with Tessera are also compiled in, so `topology = "seed-8gpu"` works from any directory.
//!
//! ```toml
//! name = "seed-8gpu"
//! device_type = "nvidia-v100-16g"
//! devices = 8
//! cores_per_socket = 16
//! memory_mib = 393216
//! [[sockets]]
//! pcie_switches = [[0, 1], [2, 3]]
//! [[sockets]]
//! pcie_switches = [[4, 5], [6, 7]]
//! ```

use crate::error::SpecError;
use crate::locality::LocalityLevel;
use crate::mask::{CoreMask, MAX_CORES, MAX_DEVICES, low_bits};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The presets shipped in `deploy/topologies/`, compiled in: `(name, TOML text)`.
pub const PRESETS: &[(&str, &str)] = &[
    ("seed-8gpu", include_str!("../../../deploy/topologies/seed-8gpu.toml")),
    ("dgx1-v100", include_str!("../../../deploy/topologies/dgx1-v100.toml")),
    ("dgx-h100", include_str!("../../../deploy/topologies/dgx-h100.toml")),
    ("pcie-4gpu", include_str!("../../../deploy/topologies/pcie-4gpu.toml")),
];

/// A validated server model. Construct with [`Topology::from_toml`], [`Topology::preset`] or
/// [`Topology::from_file`]; every mask is guaranteed within the device and core counts.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Topology {
    /// Preset name, e.g. `seed-8gpu`.
    pub name: String,
    /// Device type, e.g. `nvidia-h100-80g`; jobs may ask for one.
    pub device_type: String,
    /// Devices per server (1..=64).
    pub devices: u32,
    /// Device masks per socket; they partition the devices.
    pub sockets: Vec<u64>,
    /// Device masks per PCIe switch; they partition the devices and each lies in one socket.
    pub pcie_switches: Vec<u64>,
    /// Device masks of NVLink groups (fully connected); disjoint, may span sockets.
    pub nvlink_groups: Vec<u64>,
    /// Cores per socket; socket `s` owns cores `s*cores_per_socket ..`.
    pub cores_per_socket: u32,
    /// Memory per server in MiB.
    pub memory_mib: u32,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawTopology {
    name: String,
    device_type: String,
    devices: u32,
    cores_per_socket: u32,
    memory_mib: u64,
    #[serde(default)]
    #[allow(dead_code)]
    description: Option<String>,
    sockets: Vec<RawSocket>,
    #[serde(default)]
    nvlink_groups: Vec<Vec<u32>>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSocket {
    pcie_switches: Vec<Vec<u32>>,
}

impl Topology {
    /// Parses and validates topology TOML. `file` names the source in errors.
    pub fn from_toml(file: &str, text: &str) -> Result<Topology, SpecError> {
        let raw: RawTopology = toml::from_str(text).map_err(|e| SpecError::syntax(file, &e))?;
        let inv = |field: String, msg: String| SpecError::invalid(file, field, msg);
        if raw.name.trim().is_empty() {
            return Err(inv("name".into(), "must not be empty".into()));
        }
        if raw.device_type.trim().is_empty() {
            return Err(inv("device_type".into(), "must not be empty".into()));
        }
        if raw.devices == 0 || raw.devices > MAX_DEVICES {
            return Err(inv("devices".into(), format!("must be 1..={MAX_DEVICES}, got {}", raw.devices)));
        }
        if raw.sockets.is_empty() {
            return Err(inv("sockets".into(), "at least one socket is required".into()));
        }
        if raw.cores_per_socket == 0 {
            return Err(inv("cores_per_socket".into(), "must be at least 1".into()));
        }
        let total_cores = raw.cores_per_socket as u64 * raw.sockets.len() as u64;
        if total_cores > MAX_CORES as u64 {
            return Err(inv(
                "cores_per_socket".into(),
                format!(
                    "{} sockets x {} cores = {total_cores} cores; at most {MAX_CORES} per server",
                    raw.sockets.len(),
                    raw.cores_per_socket
                ),
            ));
        }
        if raw.memory_mib == 0 || raw.memory_mib > u32::MAX as u64 {
            return Err(inv("memory_mib".into(), format!("must be 1..={}, got {}", u32::MAX, raw.memory_mib)));
        }
        let mask_of = |field: String, list: &[u32]| -> Result<u64, SpecError> {
            if list.is_empty() {
                return Err(inv(field, "an empty device group".into()));
            }
            let mut m = 0u64;
            for &d in list {
                if d >= raw.devices {
                    return Err(inv(
                        field,
                        format!("device {d} is out of range (devices = {}, indices 0..{})", raw.devices, raw.devices),
                    ));
                }
                if m >> d & 1 == 1 {
                    return Err(inv(field, format!("device {d} is listed twice")));
                }
                m |= 1 << d;
            }
            Ok(m)
        };
        let mut sockets = Vec::new();
        let mut switches = Vec::new();
        let mut seen = 0u64;
        for (s, sock) in raw.sockets.iter().enumerate() {
            if sock.pcie_switches.is_empty() {
                return Err(inv(
                    format!("sockets[{s}].pcie_switches"),
                    "a socket needs at least one PCIe switch".into(),
                ));
            }
            let mut smask = 0u64;
            for (p, sw) in sock.pcie_switches.iter().enumerate() {
                let field = format!("sockets[{s}].pcie_switches[{p}]");
                let m = mask_of(field.clone(), sw)?;
                if m & seen != 0 {
                    let d = (m & seen).trailing_zeros();
                    return Err(inv(field, format!("device {d} already belongs to another PCIe switch")));
                }
                seen |= m;
                smask |= m;
                switches.push(m);
            }
            sockets.push(smask);
        }
        let all = low_bits(raw.devices);
        if seen != all {
            let d = (all & !seen).trailing_zeros();
            return Err(inv(
                "sockets".into(),
                format!("device {d} is under no PCIe switch (every device 0..{} must be)", raw.devices),
            ));
        }
        let mut nvlink_groups = Vec::new();
        let mut nv_seen = 0u64;
        for (g, group) in raw.nvlink_groups.iter().enumerate() {
            let field = format!("nvlink_groups[{g}]");
            let m = mask_of(field.clone(), group)?;
            if m.count_ones() < 2 {
                return Err(inv(field, "an NVLink group needs at least two devices".into()));
            }
            if m & nv_seen != 0 {
                return Err(inv(
                    field,
                    format!("device {} is already in another NVLink group", (m & nv_seen).trailing_zeros()),
                ));
            }
            nv_seen |= m;
            nvlink_groups.push(m);
        }
        Ok(Topology {
            name: raw.name,
            device_type: raw.device_type,
            devices: raw.devices,
            sockets,
            pcie_switches: switches,
            nvlink_groups,
            cores_per_socket: raw.cores_per_socket,
            memory_mib: raw.memory_mib as u32,
        })
    }

    /// Reads and validates a topology file.
    pub fn from_file(path: &Path) -> Result<Topology, SpecError> {
        let text = SpecError::read(path)?;
        Topology::from_toml(&path.display().to_string(), &text)
    }

    /// A compiled-in preset by name (see [`PRESETS`]).
    pub fn preset(name: &str) -> Option<Topology> {
        PRESETS.iter().find(|(n, _)| *n == name).map(|(n, text)| {
            // The presets are validated by a unit test; a broken one is a build defect.
            Topology::from_toml(&format!("<preset {n}>"), text)
                .unwrap_or_else(|e| panic!("compiled-in preset {n} is invalid: {e}"))
        })
    }

    /// Mask of every device.
    #[inline]
    pub fn all_devices(&self) -> u64 {
        low_bits(self.devices)
    }

    /// Total cores.
    #[inline]
    pub fn cores(&self) -> u32 {
        self.cores_per_socket * self.sockets.len() as u32
    }

    /// Mask of every core.
    pub fn all_cores(&self) -> CoreMask {
        CoreMask::range(0, self.cores())
    }

    /// Cores of socket `s`.
    pub fn socket_cores(&self, s: usize) -> CoreMask {
        CoreMask::range(s as u32 * self.cores_per_socket, self.cores_per_socket)
    }

    /// The device groups of an intra-server level: `PcieSwitch` gives the PCIe switches and the
    /// NVLink groups, `Socket` the sockets, `Server` the whole server; looser levels have none.
    pub fn groups(&self, level: LocalityLevel) -> Vec<u64> {
        match level {
            LocalityLevel::PcieSwitch => self.pcie_switches.iter().chain(self.nvlink_groups.iter()).copied().collect(),
            LocalityLevel::Socket => self.sockets.clone(),
            LocalityLevel::Server => vec![self.all_devices()],
            _ => Vec::new(),
        }
    }

    /// The tightest intra-server level that contains every device of `mask`.
    pub fn level_of(&self, mask: u64) -> LocalityLevel {
        let within = |g: &u64| mask & !g == 0;
        if self.pcie_switches.iter().any(within) || self.nvlink_groups.iter().any(within) {
            LocalityLevel::PcieSwitch
        } else if self.sockets.iter().any(within) {
            LocalityLevel::Socket
        } else {
            LocalityLevel::Server
        }
    }

    /// The largest group size at an intra-server level (how many GPUs can share it).
    pub fn max_group(&self, level: LocalityLevel) -> u32 {
        self.groups(level).iter().map(|g| g.count_ones()).max().unwrap_or(0)
    }

    /// Sockets whose devices intersect `mask`, as a bit set over socket indices.
    pub fn sockets_of(&self, mask: u64) -> u64 {
        self.sockets.iter().enumerate().filter(|(_, s)| *s & mask != 0).fold(0u64, |acc, (i, _)| acc | 1 << i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_preset_parses() {
        for (name, _) in PRESETS {
            let t = Topology::preset(name).expect("preset");
            assert_eq!(&t.name, name);
            assert_eq!(t.sockets.iter().fold(0, |a, s| a | s), t.all_devices());
        }
    }

    #[test]
    fn seed_levels() {
        let t = Topology::preset("seed-8gpu").expect("preset");
        assert_eq!(t.devices, 8);
        assert_eq!(t.level_of(0b11), LocalityLevel::PcieSwitch);
        assert_eq!(t.level_of(0b1111), LocalityLevel::Socket);
        assert_eq!(t.level_of(0b1_0001), LocalityLevel::Server);
        assert_eq!(t.max_group(LocalityLevel::Socket), 4);
    }

    fn err(text: &str) -> String {
        Topology::from_toml("t.toml", text).map(|_| ()).expect_err("must fail").to_string()
    }

    const HEAD: &str = "name='x'\ndevice_type='gpu'\ncores_per_socket=4\nmemory_mib=1024\n";

    #[test]
    fn bad_topologies_name_file_and_field() {
        let e = err(&format!("{HEAD}devices=2\n[[sockets]]\npcie_switches=[[0,1,2]]\n"));
        assert!(
            e.contains("t.toml") && e.contains("sockets[0].pcie_switches[0]") && e.contains("device 2 is out of range"),
            "{e}"
        );
        let e = err(&format!("{HEAD}devices=4\n[[sockets]]\npcie_switches=[[0,1]]\n"));
        assert!(e.contains("device 2 is under no PCIe switch"), "{e}");
        let e =
            err(&format!("{HEAD}devices=2\n[[sockets]]\npcie_switches=[[0,1]]\n[[sockets]]\npcie_switches=[[1]]\n"));
        assert!(e.contains("sockets[1].pcie_switches[0]") && e.contains("already belongs"), "{e}");
        let e = err(&format!("{HEAD}devices=65\n[[sockets]]\npcie_switches=[[0]]\n"));
        assert!(e.contains("`devices`"), "{e}");
        let e = err(&format!("{HEAD}devices=0\n[[sockets]]\npcie_switches=[[0]]\n"));
        assert!(e.contains("`devices`"), "{e}");
        let e = err(&format!("{HEAD}devices=2\nbogus=1\n[[sockets]]\npcie_switches=[[0,1]]\n"));
        assert!(e.contains("bogus"), "{e}");
        let e = err(&format!("{HEAD}devices=2\nnvlink_groups=[[0]]\n[[sockets]]\npcie_switches=[[0,1]]\n"));
        assert!(e.contains("nvlink_groups[0]"), "{e}");
        let e = err(
            "name='x'\ndevice_type='g'\ndevices=2\ncores_per_socket=100\nmemory_mib=1\n[[sockets]]\npcie_switches=[[0]]\n[[sockets]]\npcie_switches=[[1]]\n",
        );
        assert!(e.contains("at most 128"), "{e}");
        let e = err("name = \n");
        assert!(e.contains("t.toml") && e.contains("line 1"), "{e}");
    }
}
