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

use crate::error::{FieldError, SpecError};
use crate::locality::LocalityLevel;
use crate::mask::{CoreMask, MAX_CORES, MAX_DEVICES, format_indices, low_bits};
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
/// [`Topology::from_file`]; every mask is guaranteed within the device and core counts. A value
/// built any other way (its fields are public) is checked with [`Topology::validate`].
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

/// The file format, read by [`Topology::from_toml`] and written by [`Topology::to_toml`].
#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawTopology {
    name: String,
    device_type: String,
    devices: u32,
    cores_per_socket: u32,
    memory_mib: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    description: Option<String>,
    sockets: Vec<RawSocket>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    nvlink_groups: Vec<Vec<u32>>,
}

#[derive(Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct RawSocket {
    pcie_switches: Vec<Vec<u32>>,
}

/// The kinds of device group, for messages.
#[derive(Clone, Copy)]
enum Group {
    PcieSwitch,
    Socket,
    NvLink,
}

impl Group {
    fn name(self) -> &'static str {
        match self {
            Group::PcieSwitch => "PCIe switch",
            Group::Socket => "socket",
            Group::NvLink => "NVLink group",
        }
    }
}

impl Topology {
    /// Parses and validates topology TOML. `file` names the source in errors.
    ///
    /// Only what a built [`Topology`] cannot express is checked while parsing (a device listed
    /// twice in one list, a device index too large for a mask, memory beyond `u32`); everything
    /// else is [`Topology::validate`]'s, with switches named by where the file lists them.
    pub fn from_toml(file: &str, text: &str) -> Result<Topology, SpecError> {
        let raw: RawTopology = toml::from_str(text).map_err(|e| SpecError::syntax(file, &e))?;
        let inv = |field: String, msg: String| SpecError::invalid(file, field, msg);
        let memory_mib = u32::try_from(raw.memory_mib)
            .map_err(|_| inv("memory_mib".into(), format!("must be 1..={}, got {}", u32::MAX, raw.memory_mib)))?;
        let mask_of = |field: String, list: &[u32]| -> Result<u64, SpecError> {
            let mut m = 0u64;
            for &d in list {
                if d >= MAX_DEVICES {
                    return Err(inv(field, format!("device {d} is out of range (a server has at most {MAX_DEVICES})")));
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
        // The path of each switch as the file lists it, for `check`.
        let mut switch_fields = Vec::new();
        for (s, sock) in raw.sockets.iter().enumerate() {
            let mut smask = 0u64;
            for (p, sw) in sock.pcie_switches.iter().enumerate() {
                let field = format!("sockets[{s}].pcie_switches[{p}]");
                let m = mask_of(field.clone(), sw)?;
                smask |= m;
                switches.push(m);
                switch_fields.push(field);
            }
            sockets.push(smask);
        }
        let mut nvlink_groups = Vec::new();
        for (g, group) in raw.nvlink_groups.iter().enumerate() {
            nvlink_groups.push(mask_of(format!("nvlink_groups[{g}]"), group)?);
        }
        let t = Topology {
            name: raw.name,
            device_type: raw.device_type,
            devices: raw.devices,
            sockets,
            pcie_switches: switches,
            nvlink_groups,
            cores_per_socket: raw.cores_per_socket,
            memory_mib,
        };
        t.check(&|i| switch_fields[i].clone()).map_err(|e| e.in_file(file))?;
        Ok(t)
    }

    /// The topology in its file format: [`Topology::from_toml`] reads it back equal, for every
    /// topology whose PCIe switches are listed socket by socket (as parsed and preset ones are).
    /// `file` names the topology in the (unexpected) error of a value TOML cannot hold.
    pub fn to_toml(&self, file: &str) -> Result<String, SpecError> {
        let indices = |m: u64| (0..MAX_DEVICES).filter(|d| m >> d & 1 == 1).collect::<Vec<u32>>();
        let raw = RawTopology {
            name: self.name.clone(),
            device_type: self.device_type.clone(),
            devices: self.devices,
            cores_per_socket: self.cores_per_socket,
            memory_mib: u64::from(self.memory_mib),
            description: None,
            sockets: self
                .sockets
                .iter()
                .map(|&s| RawSocket {
                    pcie_switches: self.pcie_switches.iter().filter(|&&p| p & s == p).map(|&p| indices(p)).collect(),
                })
                .collect(),
            nvlink_groups: self.nvlink_groups.iter().map(|&g| indices(g)).collect(),
        };
        toml::to_string(&raw).map_err(|e| SpecError::Syntax { file: file.to_string(), message: e.to_string() })
    }

    /// Checks every guarantee of a topology, for a value built in code or decoded from outside:
    /// a non-empty name and device type; 1..=64 devices; at least one socket; 1..=128 cores in
    /// all; non-zero memory; PCIe switches and sockets each partition the devices (no empty
    /// group, no device out of range, none in two groups, none left out); every switch lies
    /// within one socket; NVLink groups are within range, disjoint and have at least two devices.
    ///
    /// Fields are named as in topology files: `sockets[s]`, a switch as
    /// [`Topology::switch_field`] names it, `nvlink_groups[g]`.
    pub fn validate(&self) -> Result<(), FieldError> {
        self.check(&|i| self.switch_field(i))
    }

    /// The field path that names PCIe switch `i` in errors: `sockets[s].pcie_switches[p]` for the
    /// `p`-th switch of the first socket `s` that contains it, as a topology file lists it, or
    /// `pcie_switches[i]` for an empty switch or one in no socket.
    pub fn switch_field(&self, i: usize) -> String {
        let socket_of = |sw: u64| if sw == 0 { None } else { self.sockets.iter().position(|&s| sw & !s == 0) };
        match self.pcie_switches.get(i).and_then(|&sw| socket_of(sw)) {
            Some(s) => {
                let p = self.pcie_switches[..i].iter().filter(|&&o| socket_of(o) == Some(s)).count();
                format!("sockets[{s}].pcie_switches[{p}]")
            }
            None => format!("pcie_switches[{i}]"),
        }
    }

    /// The device group a field path of a [`FieldError`] from [`Topology::validate`] names
    /// (`sockets[s]`, a switch as [`Topology::switch_field`] names it, `nvlink_groups[g]`), if any.
    pub fn group_at(&self, field: &str) -> Option<u64> {
        let indexed = |groups: &[u64], name: &str| {
            let i: usize = field.strip_prefix(name)?.strip_prefix('[')?.strip_suffix(']')?.parse().ok()?;
            groups.get(i).copied()
        };
        if field.contains("pcie_switches[") {
            (0..self.pcie_switches.len()).find(|&i| self.switch_field(i) == field).map(|i| self.pcie_switches[i])
        } else {
            indexed(&self.sockets, "sockets").or_else(|| indexed(&self.nvlink_groups, "nvlink_groups"))
        }
    }

    /// [`Topology::validate`] with PCIe switch `i` named `switch_field(i)`.
    fn check(&self, switch_field: &dyn Fn(usize) -> String) -> Result<(), FieldError> {
        let bad = |field: &str, msg: String| Err(FieldError::new(field, msg));
        if self.name.trim().is_empty() {
            return bad("name", "must not be empty".into());
        }
        if self.device_type.trim().is_empty() {
            return bad("device_type", "must not be empty".into());
        }
        if self.devices == 0 || self.devices > MAX_DEVICES {
            return bad("devices", format!("must be 1..={MAX_DEVICES}, got {}", self.devices));
        }
        if self.sockets.is_empty() {
            return bad("sockets", "at least one socket is required".into());
        }
        if self.cores_per_socket == 0 {
            return bad("cores_per_socket", "must be at least 1".into());
        }
        let total_cores = u64::from(self.cores_per_socket) * self.sockets.len() as u64;
        if total_cores > u64::from(MAX_CORES) {
            return bad(
                "cores_per_socket",
                format!(
                    "{} sockets x {} cores = {total_cores} cores; at most {MAX_CORES} per server",
                    self.sockets.len(),
                    self.cores_per_socket
                ),
            );
        }
        if self.memory_mib == 0 {
            return bad("memory_mib", format!("must be 1..={}, got 0", u32::MAX));
        }
        // Switches before sockets: a topology file states the switches, and its sockets are
        // their unions, so a bad device is reported where the file lists it.
        let mut seen = 0u64;
        for (i, &sw) in self.pcie_switches.iter().enumerate() {
            self.check_group(sw, seen, Group::PcieSwitch, || switch_field(i))?;
            seen |= sw;
        }
        self.check_cover(seen, Group::PcieSwitch)?;
        seen = 0;
        for (s, &sock) in self.sockets.iter().enumerate() {
            self.check_group(sock, seen, Group::Socket, || format!("sockets[{s}]"))?;
            seen |= sock;
        }
        self.check_cover(seen, Group::Socket)?;
        for (i, &sw) in self.pcie_switches.iter().enumerate() {
            if !self.sockets.iter().any(|&s| sw & !s == 0) {
                return Err(FieldError::new(
                    switch_field(i),
                    format!(
                        "the switch (devices {}) spans sockets; a PCIe switch must lie within one socket",
                        format_indices(sw)
                    ),
                ));
            }
        }
        seen = 0;
        for (g, &group) in self.nvlink_groups.iter().enumerate() {
            let field = || format!("nvlink_groups[{g}]");
            self.check_group(group, seen, Group::NvLink, field)?;
            if group.count_ones() < 2 {
                return Err(FieldError::new(
                    field(),
                    "the group has fewer than two devices; an NVLink group needs at least two".to_string(),
                ));
            }
            seen |= group;
        }
        Ok(())
    }

    /// One group of a partition (or of the disjoint NVLink groups): not empty, within range and
    /// disjoint from the groups before it (`seen`). An error names the group's `field`.
    fn check_group(
        &self,
        group: u64,
        seen: u64,
        kind: Group,
        field: impl FnOnce() -> String,
    ) -> Result<(), FieldError> {
        if group == 0 {
            return Err(FieldError::new(
                field(),
                match kind {
                    Group::Socket => "an empty socket; a socket needs at least one PCIe switch",
                    _ => "an empty device group",
                },
            ));
        }
        let n = self.devices;
        let beyond = group & !self.all_devices();
        if beyond != 0 {
            let d = beyond.trailing_zeros();
            let also = if beyond.count_ones() > 1 {
                format!("; it names devices {}", format_indices(beyond))
            } else {
                String::new()
            };
            return Err(FieldError::new(
                field(),
                format!("device {d} is out of range (devices = {n}, indices 0..{n}){also}"),
            ));
        }
        if group & seen != 0 {
            let d = (group & seen).trailing_zeros();
            return Err(FieldError::new(
                field(),
                format!("device {d} is in two groups: it already belongs to another {}", kind.name()),
            ));
        }
        Ok(())
    }

    /// The groups of a partition (their union `seen`) leave no device out.
    fn check_cover(&self, seen: u64, kind: Group) -> Result<(), FieldError> {
        let all = self.all_devices();
        if seen == all {
            return Ok(());
        }
        let (d, n) = ((all & !seen).trailing_zeros(), self.devices);
        let (field, missing) = match kind {
            Group::Socket => ("sockets", format!("device {d} is in no socket")),
            _ => ("pcie_switches", format!("device {d} is under no PCIe switch")),
        };
        Err(FieldError::new(field, format!("device {d} is in no group: {missing} (every device 0..{n} must be)")))
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

    #[test]
    fn parse_only_and_moved_checks_name_the_listed_field() {
        let e = err(&format!("{HEAD}devices=2\n[[sockets]]\npcie_switches=[[0,70]]\n"));
        assert!(e.contains("sockets[0].pcie_switches[0]") && e.contains("device 70 is out of range"), "{e}");
        let e = err(&format!("{HEAD}devices=2\n[[sockets]]\npcie_switches=[[0,1,1]]\n"));
        assert!(e.contains("listed twice"), "{e}");
        let e = err(
            "name='x'\ndevice_type='g'\ndevices=1\ncores_per_socket=1\nmemory_mib=5000000000\n[[sockets]]\npcie_switches=[[0]]\n",
        );
        assert!(e.contains("`memory_mib`"), "{e}");
        let e = err(&format!("{HEAD}devices=2\n[[sockets]]\npcie_switches=[[0,1]]\n[[sockets]]\npcie_switches=[]\n"));
        assert!(e.contains("`sockets[1]`") && e.contains("at least one PCIe switch"), "{e}");
        let e =
            err(&format!("{HEAD}devices=2\n[[sockets]]\npcie_switches=[[0]]\n[[sockets]]\npcie_switches=[[1],[]]\n"));
        assert!(e.contains("`sockets[1].pcie_switches[1]`") && e.contains("empty"), "{e}");
        let e = err(&format!("{HEAD}devices=4\nnvlink_groups=[[0,1],[1,2]]\n[[sockets]]\npcie_switches=[[0,1,2,3]]\n"));
        assert!(e.contains("nvlink_groups[1]") && e.contains("another NVLink group"), "{e}");
    }

    #[test]
    fn built_values_are_validated_like_files() {
        for (name, _) in PRESETS {
            assert_eq!(Topology::preset(name).expect("preset").validate(), Ok(()));
        }
        let seed = Topology::preset("seed-8gpu").expect("preset");
        let broken = |f: &dyn Fn(&mut Topology)| {
            let mut t = seed.clone();
            f(&mut t);
            t.validate().expect_err("must be refused")
        };
        // Switches [0,1] [2,3] | [4,5] [6,7]: the last one now overlaps the one before it.
        let e = broken(&|t| t.pcie_switches[3] = 0b1110_0000);
        assert_eq!(e.field, "sockets[1].pcie_switches[1]");
        assert!(e.message.contains("device 5") && e.message.contains("already belongs"), "{e}");
        let e = broken(&|t| t.pcie_switches[3] = 0b0100_0000);
        assert_eq!(e.field, "pcie_switches");
        assert!(e.message.contains("device 7 is under no PCIe switch"), "{e}");
        // Switch 1 now spans sockets, but switch 2 (the first of socket 1) overlaps it first.
        let e = broken(&|t| t.pcie_switches[1] = 0b1_1100);
        assert_eq!(e.field, "sockets[1].pcie_switches[0]", "{e}");
        assert!(e.message.contains("device 4 is in two groups"), "{e}");
        let e = broken(&|t| t.pcie_switches = vec![0b11, 0b1100, 0b11_0000, 0b1100_0000, 0]);
        assert_eq!((e.field.as_str(), e.message.as_str()), ("pcie_switches[4]", "an empty device group"));
        let e = broken(&|t| t.sockets = vec![0b111, 0b1111_1000]);
        assert_eq!(e.field, "pcie_switches[1]");
        assert!(e.message.contains("spans sockets"), "{e}");
        let e = broken(&|t| t.sockets[1] = 0b0111_0000);
        assert_eq!(e.field, "sockets", "{e}");
        assert!(e.message.contains("device 7 is in no socket"), "{e}");
        let e = broken(&|t| t.memory_mib = 0);
        assert_eq!(e.to_string(), format!("field `memory_mib`: must be 1..={}, got 0", u32::MAX));
        assert_eq!(seed.group_at("sockets[1]"), Some(0b1111_0000));
        assert_eq!(seed.group_at("sockets[1].pcie_switches[1]"), Some(0b1100_0000));
        assert_eq!(seed.group_at("pcie_switches[1]"), None);
        assert_eq!(seed.group_at("sockets[2]"), None);
        assert_eq!(seed.group_at("sockets"), None);
        assert_eq!(seed.switch_field(9), "pcie_switches[9]");
    }
}
