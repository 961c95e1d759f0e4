//! [`AgentError`]: the one error type of the node agent, for discovery, registration, following
//! the view, refusing members and running tasks.
//!
//! Each variant says what went wrong with the ids it concerns and what to do about it. A variant
//! that wraps a cause keeps it as its [`std::error::Error::source`] and does not repeat it in its
//! message: reports that print the chain (`{e:#}` in the CLI, [`chain`] in the agent's logs and
//! in the exit messages it sends to the view) show every cause once.
//!
//! | variants | raised by | what the caller does |
//! |---|---|---|
//! | [`Hwloc`](AgentError::Hwloc) … [`NothingToOffer`](AgentError::NothingToOffer) | [`crate::discover`] | fix the host or give a model with `--topology`; the agent does not start |
//! | [`ViewAddresses`](AgentError::ViewAddresses) … [`Panicked`](AgentError::Panicked) | [`crate::agent::run`] | fix the configuration or the view; the agent stops |
//! | [`View`](AgentError::View) … [`EmptyWatchEvent`](AgentError::EmptyWatchEvent) | the watch | read the view again (the loop does) |
//! | [`JobNotInCopy`](AgentError::JobNotInCopy) … [`MissingCores`](AgentError::MissingCores) | a member to start | report the member as not startable (the loop does) |
//! | [`Io`](AgentError::Io) … [`CgroupWrite`](AgentError::CgroupWrite) | [`crate::task`] and its shim | see each variant |

use crate::task::TaskId;
use nix::errno::Errno;
use nix::sys::signal::Signal;
use nvml_wrapper::error::NvmlError;
use std::io;
use std::path::PathBuf;
use tessera_proto::client::ClientError;
use tessera_view::{FieldError, JobId, SpecError};
use thiserror::Error;

/// What went wrong in the agent: why it did not start or stopped ([`crate::agent::run`]'s
/// error), why discovery failed, why it read the view again (a watch event it could not apply),
/// why it refused a member (reported to the view as the member's exit message), or why the task
/// runner failed.
#[derive(Debug, Error)]
pub enum AgentError {
    // Discovery: what this machine is.
    /// hwloc could not read the host.
    #[error("cannot read the host topology with hwloc: {0}; check that libhwloc 2 is installed and /sys is mounted")]
    Hwloc(String),
    /// The fake-GPU topology file is unreadable or contradicts itself: its message names the
    /// file and the field; fix the file or name a preset.
    #[error(transparent)]
    FakeTopology(#[from] SpecError),
    /// The fake-GPU topology is neither a preset name nor a file.
    #[error(
        "fake-GPU topology `{name}` is neither a compiled-in preset ({known}) nor a file; name a preset or give the path of a topology .toml file"
    )]
    UnknownTopology {
        /// What was given.
        name: String,
        /// The preset names.
        known: String,
    },
    /// An NVML call whose answer the model needs failed.
    #[error("NVML {what} failed; check the GPUs with `nvidia-smi`, or give the model with --topology")]
    Nvml {
        /// The call and device, e.g. `pci_info of GPU 3`.
        what: String,
        /// NVML's error.
        source: NvmlError,
    },
    /// There are no GPUs to model.
    #[error("no GPUs to model; a server model needs at least one device")]
    NoGpus,
    /// GPUs under one PCIe switch have their CPUs on different sockets.
    #[error(
        "PCIe switch {switch} holds GPUs {devices} whose local CPUs are on different packages ({packages}); a switch must lie within one socket; check the GPUs' local_cpulist in sysfs, or give the model with --topology"
    )]
    SwitchSpansSockets {
        /// The switch's upstream bridge (PCI bus id).
        switch: String,
        /// Its GPUs, e.g. `2,3`.
        devices: String,
        /// The hwloc package indices they map to, e.g. `0,1`.
        packages: String,
    },
    /// A GPU's sysfs entry cannot be resolved (its PCIe path and local CPUs stay unknown).
    #[error("cannot resolve {}", path.display())]
    Sysfs {
        /// The sysfs path.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// The discovered facts do not make a valid model (the field error has no cause of its own).
    #[error("the discovered topology is invalid: {0}; give the server model with --topology instead")]
    InvalidModel(FieldError),
    /// Discovery found no model to register (no driver, or no GPUs): the server has nothing
    /// to offer.
    #[error(
        "{reason}; this server has nothing to offer (for a machine without GPUs, run in fake-GPU mode with --topology PRESET|FILE)"
    )]
    NothingToOffer {
        /// Why there is no model, e.g. that NVML is unavailable.
        reason: String,
    },

    // Starting and running the agent.
    /// The view addresses given to the agent are unusable.
    #[error("the view addresses are unusable; check --view")]
    ViewAddresses(#[source] ClientError),
    /// The view refused the registration for good (unknown name, different topology): fix the
    /// cluster spec or the server's name; retrying does not help.
    #[error("the view refused server `{name}`: {why}")]
    Refused {
        /// The server name.
        name: String,
        /// The view's reason.
        why: String,
    },
    /// The agent's TLS directory cannot serve (no certificate of its own).
    #[error("TLS: {0}")]
    Tls(String),
    /// The agent's own gRPC service (task logs) cannot listen where it was told to.
    #[error("cannot serve the agent service on {addr}; give another --listen address")]
    Listen {
        /// The address asked for.
        addr: String,
        /// Why.
        source: io::Error,
    },
    /// A task of the agent itself (the heartbeats, the device health probe) panicked or was
    /// cancelled: a bug; the log above says more.
    #[error("the agent's {what} task ended abnormally")]
    Panicked {
        /// Which task, e.g. `heartbeat`.
        what: &'static str,
        /// How it ended.
        source: tokio::task::JoinError,
    },

    // Following the view.
    /// A call to the view failed while (re)loading the local copy.
    #[error(transparent)]
    View(#[from] ClientError),
    /// The view answered a snapshot request with no snapshot.
    #[error("the view answered no snapshot")]
    NoSnapshot,
    /// A watch event that does not decode.
    #[error("malformed {what} from the view")]
    Malformed {
        /// `snapshot` or `delta`.
        what: &'static str,
        /// Why it does not decode.
        source: tessera_proto::WireError,
    },
    /// A watch snapshot older than the local copy.
    #[error("snapshot at version {version} but the copy is at {copy}")]
    StaleSnapshot {
        /// The snapshot's version.
        version: u64,
        /// The local copy's version.
        copy: u64,
    },
    /// A watch delta that does not start where the local copy is.
    #[error("delta from version {from} but the copy is at {copy}")]
    DeltaGap {
        /// Where the delta starts.
        from: u64,
        /// The local copy's version.
        copy: u64,
    },
    /// A watch event with nothing in it.
    #[error("empty watch event")]
    EmptyWatchEvent,

    // Members the agent cannot start: reported to the view as ended.
    /// A member to start whose job is not in the local copy.
    #[error("{job} is not in the agent's copy of the view")]
    JobNotInCopy {
        /// The job.
        job: JobId,
    },
    /// A member to start whose job has no placement.
    #[error("{job} has no placement")]
    NoPlacement {
        /// The job.
        job: JobId,
    },
    /// A member to start that its job's placement does not have.
    #[error("the placement of {job} has no member {member}")]
    NoMember {
        /// The job.
        job: JobId,
        /// The member's rank.
        member: usize,
    },
    /// A grant naming devices this server's model lacks.
    #[error(
        "placement names devices {} but server {server} has devices {}",
        tessera_view::mask::format_indices(*missing),
        tessera_view::mask::format_indices(*has)
    )]
    MissingDevices {
        /// This server.
        server: String,
        /// The devices it lacks.
        missing: u64,
        /// The devices it has.
        has: u64,
    },
    /// A grant naming cores this server's model lacks.
    #[error("placement names cores {} but server {server} has {has} cores", missing.format())]
    MissingCores {
        /// This server.
        server: String,
        /// The cores it lacks.
        missing: tessera_view::CoreMask,
        /// How many cores it has.
        has: u32,
    },

    // The task runner and its shim.
    /// A file operation failed.
    #[error("could not {action} {}", path.display())]
    Io {
        /// What was being done, e.g. "create the task directory".
        action: &'static str,
        /// The file or directory.
        path: PathBuf,
        /// The underlying error.
        source: io::Error,
    },
    /// A JSON file could not be written or read.
    #[error("could not {action} {}", path.display())]
    Json {
        /// What was being done.
        action: &'static str,
        /// The file.
        path: PathBuf,
        /// The underlying error.
        source: serde_json::Error,
    },
    /// A string is not a task id.
    #[error("`{0}` is not a task id (expected j<job>-p<proposal in hex>-m<member>)")]
    BadTaskId(String),
    /// The shim command given to [`crate::task::Runner::open`] is empty.
    #[error("the shim command is empty")]
    EmptyShim,
    /// The runner was used outside a tokio runtime.
    #[error("the task runner must be opened inside a tokio runtime")]
    NoRuntime,
    /// A task was given no command.
    #[error("task {0} has an empty command")]
    EmptyCommand(TaskId),
    /// A task with this id is running, or has finished and was not forgotten yet.
    #[error("task {0} already exists (running, or finished and not forgotten yet)")]
    Duplicate(TaskId),
    /// The task is not running (never started, or already ended).
    #[error("task {0} is not running")]
    NotRunning(TaskId),
    /// The task has not been forgotten because it still runs.
    #[error("task {0} is still running; stop it before forgetting it")]
    StillRunning(TaskId),
    /// The shim has not reported the task's pid yet, so it cannot be signalled: try again later.
    #[error("task {0} has not started its process yet")]
    NotStarted(TaskId),
    /// The shim could not be started.
    #[error("could not start the shim `{program}` for task {id}")]
    SpawnShim {
        /// The task.
        id: TaskId,
        /// The shim program.
        program: String,
        /// The underlying error.
        source: io::Error,
    },
    /// A signal could not be sent to a task's process group.
    #[error("could not send {signal} to task {id}")]
    Signal {
        /// The task.
        id: TaskId,
        /// The signal.
        signal: Signal,
        /// The underlying error.
        source: Errno,
    },
    /// The shim: the started task's pid does not fit a pid_t.
    #[error("the task's pid {0} is out of range")]
    PidOutOfRange(u32),
    /// The shim could not wait for the task it started.
    #[error("could not wait for the task (pid {pid})")]
    Wait {
        /// The task's pid.
        pid: i32,
        /// The underlying error.
        source: io::Error,
    },
    /// The shim: a cpu of the task's spec is beyond what a cpu set holds.
    #[error("cpu {cpu} is out of range")]
    CpuOutOfRange {
        /// The cpu.
        cpu: u32,
        /// The underlying error.
        source: Errno,
    },
    /// The shim could not pin itself (and so the task) to the task's cpus.
    #[error("could not pin to cpus {cpus:?}")]
    Pin {
        /// The cpus.
        cpus: Vec<u32>,
        /// The underlying error.
        source: Errno,
    },
    /// The shim: nothing is mounted where cgroups are expected, so no memory limit.
    #[error("nothing is mounted on {}", root.display())]
    NoCgroupMount {
        /// Where cgroups are expected (`/sys/fs/cgroup`).
        root: PathBuf,
    },
    /// The shim: the cgroup mount is not cgroup v2, so no memory limit.
    #[error("{} is not a cgroup v2 mount (it is {fstype})", root.display())]
    NotCgroupV2 {
        /// The mount point.
        root: PathBuf,
        /// Its file system type.
        fstype: String,
    },
    /// The shim: a memory limit whose byte count overflows.
    #[error("{mib} MiB is too large")]
    MemoryLimitTooLarge {
        /// The limit asked for.
        mib: u64,
    },
    /// The shim could not write a cgroup control file.
    #[error("could not write `{value}` to {}", path.display())]
    CgroupWrite {
        /// The file.
        path: PathBuf,
        /// What was written.
        value: String,
        /// The underlying error.
        source: io::Error,
    },
}

pub use tessera_proto::error::chain;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cause_is_printed_once() {
        let source = io::Error::new(io::ErrorKind::NotFound, "no such file");
        let e = AgentError::Io { action: "read", path: "/x/spec.json".into(), source };
        assert_eq!(e.to_string(), "could not read /x/spec.json");
        assert_eq!(chain(&e), "could not read /x/spec.json: no such file");
        let wrapped = AgentError::EmptyCommand(TaskId { job: 1, proposal: 2, member: 0 });
        assert_eq!(chain(&wrapped), wrapped.to_string());
    }
}
