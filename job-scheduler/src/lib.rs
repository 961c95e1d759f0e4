//! # tessera-scheduler: the per-job scheduler SDK
//!
//! A per-job scheduler reads a (possibly stale) copy of the cluster view, searches for a gang
//! placement that suits its job, and proposes it to the approver. This crate holds the parts of
//! that loop that do no I/O:
//!
//! | module | what it holds |
//! |---|---|
//! | [`local_view`] | [`LocalView`]: a scheduler's copy of the view, kept current from deltas, with a free-capacity index over servers |
//! | [`search`] | [`search::find_placement`]: topology-aware gang placement at the tightest feasible level within tolerance, via bit operations |
//! | [`policy`] | [`Policy`]: load-adaptive choice between spreading and packing |
//! | [`trace`] | job-size and duration samplers from the Philly trace (file or built-in histogram) |
//! | [`bench`] | the placement benchmark behind `tessera bench placement` |
//! | [`sim`] | the trace-driven simulator behind `tessera sim`: trace loaders, speed model, policies, event loop |
//!
//! The search builds members with the same fit helpers the approver checks them with
//! ([`tessera_view::fit`]), so a proposal made from a current view is never refused for a
//! disagreement about what fits — only for state that changed since.

pub mod bench;
pub mod local_view;
pub mod policy;
pub mod search;
pub mod sim;
pub mod trace;

pub use local_view::{LocalView, Overlay};
pub use policy::Policy;
pub use search::{SearchError, find_placement};
