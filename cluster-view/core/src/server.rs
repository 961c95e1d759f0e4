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
    /// Removed from the cluster by an operator: a tombstone that offers nothing, whose id is
    /// never reused (see [`crate::layout`]).
    Removed = 3,
}

impl Health {
    /// Lower-case name.
    pub fn as_str(self) -> &'static str {
        match self {
            Health::Up => "up",
            Health::Draining => "draining",
            Health::Down => "down",
            Health::Removed => "removed",
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

impl ServerRecord {
    /// Gives member `m`'s devices, cores and memory back to this record, less the devices in
    /// `unhealthy` (the server's [`crate::ClusterView::unhealthy_devices`]): a released device
    /// that is unhealthy stays taken. What the approver does at a release, and what every search
    /// that frees a running job's members on a copy must do alike.
    #[inline]
    pub fn give_back(&mut self, m: &crate::MemberPlacement, unhealthy: u64) {
        self.free_gpus |= m.gpus & !unhealthy;
        self.free_cores = self.free_cores.or(m.cores);
        self.free_memory_mib = self.free_memory_mib.saturating_add(m.memory_mib);
    }
}

/// Bytes of hot state per server; the design's bound is 32.
pub const SERVER_RECORD_BYTES: usize = std::mem::size_of::<ServerRecord>();
const _: () = assert!(SERVER_RECORD_BYTES <= 32, "ServerRecord must stay within 32 bytes");

/// Most characters of a cordon's reason.
pub const MAX_CORDON_REASON_CHARS: usize = 256;

/// Most characters of a [`HealthChange::why`] (a cordon's reason and what happened).
pub const MAX_HEALTH_WHY_CHARS: usize = 400;

/// Health changes kept per server; the oldest is forgotten first.
pub const HEALTH_HISTORY: usize = 16;

/// An operator's hold on a server: it takes no new placements while its running gangs go on
/// (its hot health is [`Health::Draining`] while it is alive). With `drain_by_ms` it is being
/// drained: the gangs still on it at that time are re-queued whole
/// ([`crate::Command::Evict`], proposed by the leader), to restart elsewhere from their
/// checkpoints. Kept across agent restarts and lost leases until lifted.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Cordon {
    /// Why, in the operator's words (at most [`MAX_CORDON_REASON_CHARS`]).
    pub reason: String,
    /// When it was set: Unix milliseconds on the leader that proposed it.
    pub since_ms: u64,
    /// A drain's deadline (Unix milliseconds); `None` for a plain cordon.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain_by_ms: Option<u64>,
}

/// One change of a server's health or cordon, as its history keeps it.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct HealthChange {
    /// The view version of the change.
    pub version: crate::ViewVersion,
    /// Unix milliseconds on the leader that proposed it (0 when the proposer gave none).
    pub at_ms: u64,
    /// The server's health after it.
    pub health: Health,
    /// Whether the server is cordoned after it.
    pub cordoned: bool,
    /// What happened, in words.
    pub why: String,
}
