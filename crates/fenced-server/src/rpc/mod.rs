//! The client-facing gRPC services: translate a request, forward it to the
//! leader when this node is not it, propose, answer. No decisions are made
//! here: they are the table's (fenced-core) and the proposer's.
//!
//! - [`context`]: what the services of one node share, proposing and the
//!   read index;
//! - [`forward`]: the leader, the forwarded request (one generic function
//!   over a table of the forwardable calls), the refusals that name
//!   the leader and the hints on every answer;
//! - [`lock`], [`cluster`], [`kv`]: one file per service;
//! - [`write`]: the one path of every write call, from permission to reply;
//! - [`reflection`]: gRPC server reflection, for authenticated callers;
//! - [`json`]: the same calls as JSON over HTTP, on the same port;
//! - [`watch`]: watch streams, each a cursor over the table's window;
//! - [`maintenance`]: the `Maintenance` service (snapshot save, repair
//!   answers).

pub mod cluster;
pub mod context;
pub mod forward;
pub mod json;
pub mod kv;
pub mod lock;
pub mod maintenance;
pub mod reflection;
pub mod watch;
pub mod write;

pub use cluster::{role_name, ClusterService};
pub use context::{CallPolicy, NodeContext, Replica};
pub(crate) use forward::not_leader;
pub use forward::FORWARDED;
pub use kv::{KvService, KV_MESSAGE_MAX_BYTES};
pub use lock::{LockService, WatchStream};
