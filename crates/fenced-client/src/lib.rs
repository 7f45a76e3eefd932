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

mod client;
mod clock;
mod kv;
mod leader;
mod lease;
mod members;
mod session;
mod tls;
mod transport;

pub use client::*;
/// The core's own types, so a client's answers are the ones the cluster
/// decides with.
pub use fenced_core::{
    ClusterTime, KvRefusal, LostReason, OwnerId, ReleaseOutcome, RenewOutcome, Token,
};
pub use kv::{KvRead, KvWrite};
pub use lease::{Acquired, KeeperStats, Lease, LeaseHandle, LeaseLoss, LeaseOptions};
pub use tls::TlsOptions;
