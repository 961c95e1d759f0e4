//! Tessera's node agent: discovers a server's GPUs (NVML) and host topology (hwloc), maps them
//! to a configuration set, registers with the cluster view under a lease, and runs the tasks of
//! the placements on its server, pinned to their GPUs and cores.
//!
//! Without an NVIDIA driver the agent can take its devices from a topology preset file
//! (fake-GPU mode); every step after discovery is the same code.
//!
//! | module | what it holds |
//! |---|---|
//! | [`discover`] | what this machine is: host (hwloc), GPUs (NVML) or a preset, the server model |
//! | [`agent`] | the main loop: registration, heartbeats, the watch, and the reconciler's async shell |
//! | [`plan`] | the reconciler's decisions, a pure function of the desired and the local task state |
//! | [`task`] | the task runner and its shim (tasks outlive the agent) |
//! | [`logs`] | the agent's gRPC service: task logs |
//! | [`metrics`] | what the agent counts for Prometheus (task starts and exits, adoption, reports, heartbeats) |
//! | [`error`] | [`AgentError`], the crate's one error type |

pub mod agent;
pub mod discover;
pub mod error;
pub mod logs;
pub mod metrics;
pub mod plan;
pub mod task;

pub use error::AgentError;
