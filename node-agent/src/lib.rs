//! Tessera's node agent: discovers a server's GPUs (NVML) and host topology (hwloc), maps them
//! to a configuration set, registers with the cluster view under a lease, and runs the tasks of
//! the placements on its server, pinned to their GPUs and cores.
//!
//! Without an NVIDIA driver the agent can take its devices from a topology preset file
//! (fake-GPU mode); every step after discovery is the same code.

pub mod agent;
pub mod discover;
pub mod logs;
pub mod plan;
pub mod task;
