//! # tessera-proto: Tessera's wire types
//!
//! Protobuf messages (compiled with prost from `proto/tessera/v1/view.proto`) for the cluster
//! view of [`tessera_view`], the gRPC services (`View` for clients, `Raft` between replicas,
//! compiled with tonic from `proto/tessera/v1/service.proto`), and conversions between the
//! wire and core types.
//!
//! | module | what it holds |
//! |---|---|
//! | [`v1`] | the generated messages of package `tessera.v1`; `v1::view_server`/`v1::view_client` and `v1::raft_server`/`v1::raft_client` for the services |
//! | [`convert`] | core to wire (`From`, infallible), wire to core (`TryFrom`, validating), [`RemoteDecision`] |
//! | [`validate`] | checks restoring the core types' guarantees on outside values (topologies, specs, snapshots) |
//! | [`client`] | [`ViewClient`]: the leader-following, retrying gRPC client every Tessera program uses (SDK, agents, CLI) |
//! | [`backoff`] | [`Backoff`]: the one bounded, jittered retry delay every retrying loop of the workspace uses |
//! | [`error`] | [`WireError`]: which message and field a conversion refused, and why |
//! | [`tls`] | mutual TLS on every connection: the cluster CA and certificates, reloading TLS directories, callers' identities, bearer tokens |
//! | [`prom`] | Prometheus metrics: the recorder every process counts into, the scrape listener of agents and scheduler hosts |
//! | [`api`] | the JSON shapes of the view's HTTP API, also printed by the CLI's `--json` (with their OpenAPI schemas) |
//!
//! Decoding untrusted bytes is two steps, neither of which panics:
//!
//! ```
//! use tessera_proto::{prost::Message, v1};
//! use tessera_view::ServerRecord;
//!
//! let bytes = v1::ServerRecord { health: 99, ..Default::default() }.encode_to_vec();
//! let wire = v1::ServerRecord::decode(bytes.as_slice()).expect("well-formed protobuf");
//! assert!(ServerRecord::try_from(wire).is_err()); // 99 is not a Health
//! ```

#![warn(missing_docs)]

pub mod api;
pub mod backoff;
pub mod client;
pub mod convert;
pub mod error;
pub mod prom;
pub mod tls;
pub mod trace;
pub mod validate;

/// Generated messages of protobuf package `tessera.v1`.
#[allow(missing_docs, clippy::all, clippy::pedantic, clippy::nursery)]
pub mod v1 {
    include!(concat!(env!("OUT_DIR"), "/tessera.v1.rs"));
}

pub use backoff::Backoff;
pub use client::{ClientError, ViewClient};
pub use convert::{RemoteDecision, RemoteRejection, remote};
pub use error::WireError;
/// The response metadata key in which a follower names the leader's client address.
pub const LEADER_KEY: &str = "tessera-leader";

/// The protobuf runtime, re-exported for `Message::encode` / `decode`.
pub use prost;
/// The gRPC runtime the services are generated for.
pub use tonic;
