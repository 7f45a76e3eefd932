//! A client for a fenced cluster.
//!
//! [`Client`] talks to any node of the cluster (nodes forward to the leader)
//! and retries transient failures on the next endpoint with backoff, within a
//! per-call deadline. Expected refusals (held, lost, not holder) come back as
//! values, not errors.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fenced_client::ClientError> {
//! use fenced_client::{Client, AcquireOutcome};
//! use fenced_core::OwnerId;
//! use std::time::Duration;
//!
//! let client = Client::new(["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"])?;
//! let owner = OwnerId::random();
//! match client.acquire("billing:2026-07", owner, Duration::from_secs(30), Duration::ZERO).await? {
//!     AcquireOutcome::Granted { token, .. } => println!("mine, token {token}"),
//!     AcquireOutcome::Held { current_token, .. } => println!("held by token {current_token}"),
//! }
//! # Ok(()) }
//! ```

mod client;

pub use client::*;
