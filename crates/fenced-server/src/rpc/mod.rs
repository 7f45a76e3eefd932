//! The client-facing gRPC services: translate a request, forward it to the
//! leader when this node is not it, propose, answer. No decisions are made
//! here: they are the table's (fenced-core) and the proposer's.
//!
//! - [`context`]: what the services of one node share, proposing and the
//!   read index;
//! - [`forward`]: the leader, the forwarded request, the refusals that name
//!   the leader and the hints on every answer;
//! - [`lock`], [`cluster`], [`kv`]: one file per service;
//! - [`reflection`]: gRPC server reflection, for authenticated callers.

pub mod cluster;
pub mod context;
pub mod forward;
pub mod kv;
pub mod lock;
pub mod reflection;

pub use cluster::{role_name, ClusterService};
pub use context::NodeContext;
pub(crate) use forward::not_leader;
pub use forward::FORWARDED;
pub use kv::{KvService, KV_MESSAGE_MAX_BYTES};
pub use lock::{LockService, WatchStream};
