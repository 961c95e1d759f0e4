//! # tessera-scheduler: the per-job scheduler SDK
//!
//! A per-job scheduler reads a (possibly stale) copy of the cluster view, searches for a gang
//! placement that suits its job, and proposes it to the approver. Writing one means
//! implementing [`Scheduler`] (a pure function: job + view in, proposal or wait out) and
//! running it in a [`host`]; docs/SDK.md is the tutorial.
//!
//! | module | what it holds |
//! |---|---|
//! | [`scheduler`] | the [`Scheduler`] trait, [`Verdict`], and the built-in schedulers (`locality-tolerant`, `cpu-aware`, `optimus`) |
//! | [`runtime`] | [`PlaceMachine`]: propose, learn from rejections, retry with jittered backoff, relax locality, give up — a pure state machine over a clock; [`place_job`] is its async shell |
//! | [`host`] | [`run_host`]: the scheduler host, one task per adopted job, jobs held under a lease |
//! | [`migration_task`] | [`MigrationConfig`]: the host's live migration task, executing the planner's moves for a blocked job |
//! | [`metrics`] | [`HostMetrics`](metrics::HostMetrics): what a host counts for Prometheus (adoption, proposals and their round trips, placements by level, migrations) |
//! | [`cache`] | [`ViewCache`]: a live copy of the view from a snapshot plus the `Watch` stream, following leader changes |
//! | [`local_view`] | [`LocalView`]: a scheduler's copy of the view, kept current from deltas, with a free-capacity index over servers |
//! | [`search`] | [`search::find_placement`]: topology-aware gang placement at the tightest feasible level within tolerance, via bit operations |
//! | [`locality_cost`] | [`locality_cost::decide`]: start a job now at a looser level, or wait for a tighter one, by expected completion time (the job's declared `slowdown`, observed release rates) |
//! | [`placement_policy`] | [`Policy`]: load-adaptive choice between spreading and packing |
//! | [`preemption`] | [`preemption::choose_victims`]: which lower-ranked gangs a waiting job displaces (fewest gangs, lowest rank, least work lost) |
//! | [`reservation`] | [`reservation::Reservations`]: bounded reservations: servers withheld for a starved gang of whole servers while the waiting that costs the jobs held back stays below what the gang is expected to gain |
//! | [`philly_sampler`] | [`PhillySampler`](philly_sampler::PhillySampler): job sizes and durations drawn from the Philly trace (file or built-in histogram) |
//! | [`error`] | [`SchedulerError`], the crate's one error type (settings, trace files, calls the view refused, the simulator, self-checks) |
//! | [`bench`] | the placement benchmark behind `tessera bench placement` |
//! | [`sim`] | the trace-driven simulator behind `tessera sim`: trace loaders, speed model, policies, event loop |
//!
//! The search builds members with the same fit helpers the approver checks them with
//! ([`tessera_view::fit`]), so a proposal made from a current view is never refused for a
//! disagreement about what fits — only for state that changed since.

#![deny(missing_docs)]

pub mod bench;
pub mod cache;
pub mod error;
pub mod host;
pub mod local_view;
pub mod locality_cost;
pub mod metrics;
pub mod migration_task;
pub mod philly_sampler;
pub mod placement_policy;
pub mod preemption;
pub mod reservation;
pub mod runtime;
pub mod scheduler;
pub mod search;
pub mod sim;

pub use cache::ViewCache;
pub use error::SchedulerError;
pub use host::{HostConfig, Registry, run_host};
pub use local_view::{LocalView, Overlay};
pub use migration_task::MigrationConfig;
pub use placement_policy::Policy;
pub use runtime::{PlaceMachine, Placed, RuntimeOptions, place_job};
pub use scheduler::{
    Attempt, Context, CpuAware, FifoFirstFit, Gandiva, Hived, LocalityTolerant, Optimus, RunningIndex, Scheduler,
    Verdict,
};
pub use search::{NoPlacement, find_placement};
/// Transport security and identities, for a host's [`HostConfig::security`].
pub use tessera_proto::tls;
