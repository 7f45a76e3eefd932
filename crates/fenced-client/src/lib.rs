//! A client for a fenced cluster.
//!
//! [`Client`] talks to any node of the cluster (nodes forward to the leader)
//! and retries transient failures on the next endpoint with backoff, within a
//! per-call deadline. Every answer names the leader, and the client sends its
//! next calls there (only ever to one of the endpoints it was given), so calls
//! are not forwarded once the leader is known, across leader changes too. Expected refusals (held, lost, not holder) come back as
//! values, not errors.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fenced_client::ClientError> {
//! use fenced_client::{Acquired, Client};
//! use std::time::Duration;
//!
//! let client = Client::new(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"])?;
//! match client.acquire("billing:2026-07", Duration::from_secs(30)).await? {
//!     Acquired::Granted(lease) => {
//!         println!("mine, token {}", lease.token());
//!         // ... work, passing lease.token() to every protected write ...
//!         lease.release().await?;
//!     }
//!     Acquired::Held { current_token, .. } => println!("held by token {current_token}"),
//! }
//! # Ok(()) }
//! ```

// The modules import one another in one direction (tests/module_graph.rs):
// `calls` (endpoints, retries, one method per RPC) at the bottom, over the
// leaves `clock`, `leader`, `tls` and `transport`; `session`, `lease` (the
// keeper) and `give_back` on `calls` (and the leaf `loss`); `client` on all
// of them; `kv` and `members` add methods to `Client`.
mod calls;
mod client;
mod clock;
mod give_back;
mod kv;
mod leader;
mod lease;
mod loss;
mod members;
mod session;
mod tls;
mod transport;

pub use calls::{
    wall_time, AcquireOutcome, ClientError, Dated, RenewItem, NO_CLUSTER_HINT, PERMISSION_HINT,
    TOKEN_HINT,
};
pub use client::{Acquired, Client, DEV_ENDPOINTS};
/// The core's own types, so a client's answers are the ones the cluster
/// decides with.
pub use fenced_core::{
    ClusterTime, KvRefusal, LostReason, OwnerId, ReleaseOutcome, RenewOutcome, Token,
};
pub use kv::{KvRead, KvWrite};
pub use lease::{KeeperStats, Lease, LeaseHandle, LeaseOptions};
pub use loss::LeaseLoss;
pub use tls::TlsOptions;
