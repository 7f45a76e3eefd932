//! A fenced outbox with one dispatcher.
//!
//! A worker holding a fenced lease often has to cause an effect where no
//! token can be checked: a third-party API that takes an unconditional
//! `POST`. Instead of calling it, the worker **records** the request in its
//! own database, in the same transaction as its business write, behind the
//! fenced-sql guard ([`sqlite::record`], [`postgres::record`]): a superseded
//! token records nothing, and a retried record with the same idempotency
//! key is recorded once. A single **dispatcher** ([`Dispatcher`]), itself
//! holding a fenced lease, delivers the recorded requests in sequence order,
//! at least once each, with an `Idempotency-Key` header, and records every
//! outcome under its own token so that a dispatcher that lost its lease
//! cannot mark anything once a newer one took over.
//!
//! 1. Migrate: fenced-sql's migration, then [`sqlite::MIGRATION`] or
//!    [`postgres::MIGRATION`] ([`Store::migrate`] runs both).
//! 2. Record inside your transaction:
//!
//! ```
//! # fn main() -> Result<(), fenced_outbox::OutboxError> {
//! use fenced_outbox::{Operation, Recorded};
//! use fenced_sql::{Contract, Fence};
//! use rusqlite::TransactionBehavior;
//! let mut conn = rusqlite::Connection::open_in_memory()?;
//! fenced_outbox::sqlite::migrate(&mut conn)?;
//! let fence = Fence { resource: "invoice:1842", token: 42, owner_id: "worker-a",
//!                     operation_id: None, contract: Contract::AtLeast };
//! let op = Operation::post("https://api.example.com/v1/charges", br#"{"amount":1842}"#, "charge-1842");
//! let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
//! match fenced_outbox::sqlite::record(&tx, &fence, &op)? {
//!     Recorded::New { sequence } => {
//!         // ... the business write, in the same transaction ...
//!         tx.commit()?;
//!         assert_eq!(sequence, 1);
//!     }
//!     Recorded::Duplicate => {} // recorded before under this key
//!     Recorded::Stale { highest } => eprintln!("superseded by token {highest}: write nothing"),
//! }
//! # Ok(()) }
//! ```
//!
//! 3. Run `fenced-outbox dispatch` (or [`Dispatcher::run`]) on one or more
//!    hosts: one is active, the others wait for its lease.
//!
//! The decisions (status classes, backoff, supersession) are pure functions
//! in [`decide`]; [`Store`], [`HttpDelivery`], [`Dispatcher`] and
//! [`metrics`] are the shell around them.

pub mod decide;
mod deliver;
mod dispatcher;
pub mod metrics;
mod operation;
pub mod postgres;
pub mod sqlite;
mod store;

pub use deliver::{Deliver, HttpDelivery};
pub use dispatcher::{DispatchError, Dispatcher, Settings};
pub use operation::{
    Method, Operation, CONTENT_TYPE_MAX_BYTES, DEFAULT_CONTENT_TYPE, DESTINATION_MAX_BYTES,
    IDEMPOTENCY_KEY_MAX_BYTES, PAYLOAD_MAX_BYTES,
};
pub use store::{Backlog, DispatcherFence, Entry, MarkOutcome, Pending, Store};

use fenced_sql::{Fence, GuardError};

/// What [`sqlite::record`] and [`postgres::record`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Recorded {
    /// Recorded with this sequence number: do the business write, then
    /// commit.
    New { sequence: u64 },
    /// This idempotency key was recorded before for the resource: nothing
    /// new (committing or rolling back changes nothing).
    Duplicate,
    /// The token is superseded: a newer owner (token `highest`) wrote.
    /// Nothing was recorded; roll back and do not retry with this token.
    Stale { highest: u64 },
}

/// Why an outbox call failed. A transaction it ran in should be rolled
/// back.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum OutboxError {
    /// A field is out of its bound; nothing was sent to the database.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field, as named in [`Operation`], `Fence` or the command line.
        field: &'static str,
        /// The bound and the value presented.
        reason: String,
    },
    /// The fenced-sql guard refused the fence's fields or failed.
    #[error(transparent)]
    Guard(#[from] GuardError),
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
    #[error("postgresql: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// The outbox table holds something this crate never writes.
    #[error("the outbox table is inconsistent: {0}")]
    Corrupt(String),
    /// A worker task of the store failed.
    #[error("{0}")]
    Internal(String),
}

impl OutboxError {
    pub(crate) fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        OutboxError::Invalid {
            field,
            reason: reason.into(),
        }
    }
}

/// The fence the guard gets for recording `op`: the caller's, with the
/// idempotency key as its operation id. Checks `op` first.
fn recording_fence<'a>(fence: &Fence<'a>, op: &Operation<'a>) -> Result<Fence<'a>, OutboxError> {
    op.validate()?;
    match fence.operation_id {
        Some(id) if id != op.idempotency_key => Err(OutboxError::invalid(
            "operation_id",
            "must be None or the operation's idempotency_key (the key is the guard's operation id)",
        )),
        _ => Ok(Fence {
            operation_id: Some(op.idempotency_key),
            ..*fence
        }),
    }
}

/// The guard's verdict as the record's outcome; `insert` runs on accept.
fn recorded(verdict: fenced_sql::Verdict, sequence: Option<i64>) -> Result<Recorded, OutboxError> {
    use fenced_sql::Verdict;
    match (verdict, sequence) {
        (Verdict::Accepted, Some(seq)) => u64::try_from(seq)
            .map(|sequence| Recorded::New { sequence })
            .map_err(|_| OutboxError::Corrupt(format!("negative sequence {seq}"))),
        (Verdict::Accepted, None) => Err(OutboxError::Internal(
            "accepted but nothing inserted".into(),
        )),
        (Verdict::Duplicate, _) => Ok(Recorded::Duplicate),
        (Verdict::Stale { highest }, _) => Ok(Recorded::Stale { highest }),
    }
}
