//! Per-device health for the heartbeat.
//!
//! Real GPUs are asked again through NVML at every probe (a lost handle, uncorrected ECC errors,
//! pages pending retirement). Fake GPUs have no hardware to ask: a stand-in text file, named by
//! the environment variable [`FAKE_HEALTH_ENV`], lists the devices to report unhealthy, so tests
//! can simulate an XID error or a lost GPU without hardware.

use super::nvml::{check_health, unavailable};
use super::{Discovery, GpuSource};
use nvml_wrapper::Nvml;
use std::path::PathBuf;

/// Environment variable naming the fake-GPU health file: one unhealthy device index per line,
/// optionally followed by a space and a reason (`3 XID 79: fell off the bus`). Blank lines and
/// lines starting with `#` are skipped; a missing file means every device is healthy. Read in
/// fake-GPU mode only, at every probe.
pub const FAKE_HEALTH_ENV: &str = "TESSERA_FAKE_GPU_HEALTH";

/// Current per-device health. Build once from a [`Discovery`], then [`HealthProbe::probe`] at
/// every heartbeat.
#[derive(Debug)]
pub struct HealthProbe {
    devices: u32,
    source: Source,
}

#[derive(Debug)]
enum Source {
    /// No devices.
    None,
    /// Real GPUs by UUID, device `i` at position `i`; NVML is loaded again when it was lost.
    Nvml { nvml: Option<Box<Nvml>>, uuids: Vec<String> },
    /// Fake GPUs and their optional health file.
    Fake { file: Option<PathBuf> },
}

impl HealthProbe {
    /// A probe for the devices of `d`. In fake-GPU mode the health file is taken from
    /// [`FAKE_HEALTH_ENV`], if set.
    pub fn new(d: &Discovery) -> HealthProbe {
        let devices = d.topology.as_ref().map_or(0, |t| t.devices);
        let source = match &d.gpus {
            GpuSource::Nvml { gpus, .. } if devices > 0 => {
                let mut gpus: Vec<_> = gpus.iter().collect();
                gpus.sort_by_key(|g| g.index);
                Source::Nvml {
                    nvml: Nvml::init().ok().map(Box::new),
                    uuids: gpus.iter().map(|g| g.uuid.clone()).collect(),
                }
            }
            GpuSource::Fake { .. } => Source::Fake { file: std::env::var_os(FAKE_HEALTH_ENV).map(PathBuf::from) },
            _ => Source::None,
        };
        HealthProbe { devices, source }
    }

    /// Uses `file` as the fake-GPU health file instead of [`FAKE_HEALTH_ENV`] (`None`: every
    /// device healthy). No effect outside fake-GPU mode.
    pub fn with_fake_health_file(mut self, file: Option<PathBuf>) -> HealthProbe {
        if let Source::Fake { file: f } = &mut self.source {
            *f = file;
        }
        self
    }

    /// The devices that are unhealthy now, as a mask (bit `i` = device `i`), and why, one reason
    /// per line, each starting with `GPU <i>: `.
    pub fn probe(&mut self) -> (u64, Vec<String>) {
        match &mut self.source {
            Source::None => (0, Vec::new()),
            Source::Fake { file: None } => (0, Vec::new()),
            Source::Fake { file: Some(file) } => probe_file(file, self.devices),
            Source::Nvml { nvml, uuids } => {
                if nvml.is_none() {
                    match Nvml::init() {
                        Ok(n) => *nvml = Some(Box::new(n)),
                        Err(e) => {
                            let why = unavailable(&e);
                            return (
                                tessera_view::mask::low_bits(uuids.len() as u32),
                                (0..uuids.len()).map(|i| format!("GPU {i}: {why}")).collect(),
                            );
                        }
                    }
                }
                let Some(nvml) = nvml else { return (0, Vec::new()) };
                let (mut mask, mut reasons) = (0u64, Vec::new());
                for (i, uuid) in uuids.iter().enumerate().take(64) {
                    let why = match nvml.device_by_uuid(uuid.as_str()) {
                        Ok(dev) => check_health(&dev).0.reasons,
                        Err(e) => vec![format!("missing GPU {uuid} ({e})")],
                    };
                    if !why.is_empty() {
                        mask |= 1 << i;
                        reasons.extend(why.into_iter().map(|w| format!("GPU {i}: {w}")));
                    }
                }
                (mask, reasons)
            }
        }
    }
}

/// Reads the fake-GPU health file (see [`FAKE_HEALTH_ENV`]).
fn probe_file(file: &PathBuf, devices: u32) -> (u64, Vec<String>) {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return (0, Vec::new()),
        Err(e) => {
            tracing::warn!(file = %file.display(), error = %e, "cannot read the fake GPU health file; all healthy");
            return (0, Vec::new());
        }
    };
    let (mut mask, mut reasons) = (0u64, Vec::new());
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (index, reason) = line.split_once(char::is_whitespace).unwrap_or((line, ""));
        match index.parse::<u32>() {
            Ok(i) if i < devices.min(64) => {
                mask |= 1 << i;
                let reason = reason.trim();
                let reason = if reason.is_empty() {
                    format!("marked unhealthy in {}", file.display())
                } else {
                    reason.to_string()
                };
                reasons.push(format!("GPU {i}: {reason}"));
            }
            _ => tracing::warn!(
                file = %file.display(),
                line = n + 1,
                devices,
                "fake GPU health line does not start with a device index in range; skipped"
            ),
        }
    }
    (mask, reasons)
}
