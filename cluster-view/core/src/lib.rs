//! # tessera-view: the compact cluster view and its approver
//!
//! This crate is the pure core of Tessera. It performs no I/O beyond reading spec files on
//! request, owns no threads and reads no clock, so the same code runs inside a Raft replica, in
//! the trace-driven simulator and in deterministic fault tests.
//!
//! Map of the crate, in the order data flows through it:
//!
//! | module | what it holds |
//! |---|---|
//! | [`locality`] | [`LocalityLevel`]: `pcie-switch < socket < server < rack < ib-domain < any` |
//! | [`mask`] | GPU masks (`u64`) and [`CoreMask`] (128 cores) bit helpers |
//! | [`topology`] | [`Topology`]: one server model as nested masks, parsed from a preset file |
//! | [`cluster_spec`] | [`ClusterSpec`]: racks × topologies × counts, IB domains, quotas (TOML) |
//! | [`config_set`] | [`ConfigSet`]: a homogeneous group of servers (topology + network position) |
//! | [`server`] | [`ServerRecord`]: the 32-byte hot state of one server; [`Cordon`], [`HealthChange`] |
//! | [`cordon`] | node operations: cordon, drain, uncordon, eviction, health history |
//! | [`drain`] | a drain's early moves: gangs off a drained server to no looser placements |
//! | [`layout`] | configuration sets and servers added and removed on a running view |
//! | [`job`] | [`JobSpec`] (TOML), [`Job`], [`JobState`], CPU and memory demand |
//! | [`placement`] | [`Proposal`], [`MemberPlacement`], [`Decision`], [`Rejection`] |
//! | [`priority`] | [`Priorities`]: priority classes and the preemption bound (cluster spec) |
//! | [`fit`] | the one fit function shared by the approver and every scheduler's search |
//! | [`view`] | [`ClusterView`]: the state machine (commands, versions, deltas, snapshots, hash) |
//! | [`approver`] | atomic gang validation and apply, idempotent on the proposal id |
//! | [`preemption`] | [`Preemption`], the approver's atomic take-over of lower-priority gangs, and the pure victim choice |
//! | [`migration_planner`] | the migration planner: fewest moves of small jobs that free a group (the scheduler hosts' migration task and the simulator execute its plans) |
//! | [`migration_check`] | whether a host's moves help the pending job they are for (the leader's check before a `Migrate`) |
//! | [`speed_model`] | [`SpeedModel`]: how fast a job runs where it is placed (the simulator), and the locality losses a spec that names its `model` is admitted with |
//! | [`usage`] | accounting: the view's clock, jobs' wall-clock times, GPU and core time per tenant and user |
//! | [`invariants`] | an independent checker of the view's invariants |
//!
//! Invariants, asserted in code and checked by `tests/`: a device or core is never allocated to
//! two jobs; a gang is placed whole or not at all; replaying the same commands gives the same
//! state hash.

pub mod approver;
pub mod attained;
pub mod cluster_spec;
pub mod config_set;
pub mod cordon;
pub mod dependency;
pub mod drain;
pub mod error;
pub mod fit;
pub mod hash;
pub mod ids;
pub mod invariants;
pub mod job;
pub mod layout;
pub mod locality;
pub mod mask;
pub mod migration_check;
pub mod migration_planner;
pub mod placement;
pub mod policy;
pub mod preemption;
pub mod priority;
pub mod revocation;
pub mod server;
pub mod speed_model;
pub mod topology;
pub mod trace;
pub mod usage;
pub mod view;
pub mod wait;

pub use cluster_spec::{Accounting, ClusterSpec};
pub use config_set::ConfigSet;
pub use error::{FieldError, SpecError, ViewError};
pub use ids::{ConfigSetId, JobId, ProposalId, RequestId, ServerId, ViewVersion};
pub use job::{
    CpuDemand, DEFAULT_TENANT, Job, JobFile, JobSpec, JobState, MAX_ARRAY, MAX_DEPENDENCIES, Predictor, RestartPolicy,
    TaskEvent, TaskState,
};
pub use layout::LayoutChange;
pub use locality::LocalityLevel;
pub use mask::CoreMask;
pub use placement::{Decision, MemberPlacement, Proposal, Rejection};
pub use preemption::Preemption;
pub use priority::Priorities;
pub use revocation::Revocation;
pub use server::{Cordon, Health, HealthChange, ServerRecord};
pub use speed_model::SpeedModel;
pub use topology::Topology;
pub use trace::JobTrace;
pub use usage::{HeldSpan, JobTimes, Ledger, Usage, UsageBy, UsageKey, UsageReport, UsageRow};
pub use view::{ClusterView, Command, Outcome, ViewDelta, ViewSnapshot};
pub use wait::{Explainer, WaitExplanation, Waiting};
