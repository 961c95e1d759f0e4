//! The hot per-server state the search and the approver read: 32 bytes.

use crate::ids::ConfigSetId;
use crate::mask::CoreMask;
use serde::{Deserialize, Serialize};
use std::fmt;

/// Whether a server takes new placements.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
#[repr(u8)]
pub enum Health {
    /// Accepts placements.
    #[default]
    Up = 0,
    /// Keeps running tasks, accepts no new placements.
    Draining = 1,
    /// Lost: its gangs are failed and re-queued.
    Down = 2,
}

impl Health {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Up => "up",
            Health::Draining => "draining",
            Health::Down => "down",
        }
    }
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The hot state of one server. Names, leases and per-server versions live in cold tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ServerRecord {
    /// Free devices (bit `i` = device `i`).
    pub free_gpus: u64,
    /// Free CPU cores.
    pub free_cores: CoreMask,
    /// Free memory in MiB.
    pub free_memory_mib: u32,
    /// Its configuration set.
    pub config_set: ConfigSetId,
    /// Up, draining or down.
    pub health: Health,
}

/// Bytes of hot state per server; the design's bound is 32.
pub const SERVER_RECORD_BYTES: usize = std::mem::size_of::<ServerRecord>();
const _: () = assert!(SERVER_RECORD_BYTES <= 32, "ServerRecord must stay within 32 bytes");
