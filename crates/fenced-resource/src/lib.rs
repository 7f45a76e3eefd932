//! The protected resource: the place where a side effect lands, which keeps
//! the highest fencing token it accepted and refuses older ones.
//!
//! A lease from fenced tells a worker it may start; it cannot stop a worker
//! that paused past its lease from writing when it wakes up. The component
//! that applies the write must compare the worker's token with the highest
//! one it has accepted, atomically with the write. This crate is that
//! component, three ways:
//!
//! - [`FenceStore`]: an embedded store (sled) holding per key the highest
//!   accepted token, the guarded value and the lock resource whose tokens
//!   guard it. Compare and write are one step, durable before the answer.
//! - the `fenced-resource serve` service ([`service`]): the same store behind
//!   gRPC (`fenced.v1.FencedResource`), for writes that cross a network.
//! - `postgres` (feature `postgres`): the same contract in one SQL statement
//!   on a PostgreSQL table.
//!
//! Plus the versioned-object pattern ([`FenceStore::put_version`],
//! [`FenceStore::publish`]): immutable versions and a fenced pointer.
//!
//! ```
//! use fenced_core::{OwnerId, ResourceName, Token};
//! use fenced_resource::{FenceStore, Write, WriteOutcome};
//! let dir = tempfile::tempdir()?;
//! let store = FenceStore::open(dir.path())?;
//! let resource = ResourceName::new("statement:account-1842:2026-07")?;
//! let owner = OwnerId::random(); // the owner id of the lease, token 7
//! let write = Write::for_resource(resource, Token::new(7)?, owner, "statement body");
//! match store.write(&write)? {
//!     WriteOutcome::Accepted { token, version } => println!("stored, token {token}, version {version}"),
//!     WriteOutcome::AlreadyApplied { .. } => println!("this acquisition already wrote"),
//!     WriteOutcome::Rejected(r) => eprintln!("{r}"), // final: stop the work
//! }
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```

pub mod current;
mod decide;
mod limits;
#[cfg(feature = "postgres")]
pub mod postgres;
mod record;
pub mod service;
mod store;
mod versioned;
mod write;

pub use limits::{
    IDEMPOTENCY_KEY_MAX_BYTES, IDEMPOTENCY_RECORDS_PER_KEY, KEY_MAX_BYTES, OPERATION_ID_MAX_BYTES,
    VALUE_MAX_BYTES,
};
pub use store::FenceStore;
pub use versioned::VersionId;
pub use write::{Current, Mode, RejectReason, Rejection, StoreError, Write, WriteOutcome};
