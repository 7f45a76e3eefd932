//! The fenced lease table as a pure state machine.
//!
//! Everything that decides who holds a lease and which token they get lives
//! here, with no clock, no I/O and no async runtime: the server feeds
//! [`Batch`]es stamped with cluster time into [`LeaseTable::apply`] in log
//! order, and every replica reaches the same state.
//!
//! Guarantees proven here (docs/DESIGN.md §2): tokens strictly increase per
//! resource across grants; a grant and its token are one step; at most one
//! unexpired lease per resource; renewal keeps the token and never revives an
//! ended lease; only owner id AND token, from the lease's own identity
//! ([`Command::AsIdentity`]), renew or release; acquire is
//! idempotent per owner id; expiry follows the stamped cluster time only.
//! A fenced put ([`Command::KvPut`]) is applied only with the current
//! holder's owner id and token, decided in the same log order ([`KvStore`]).

pub mod canary;
mod command;
mod error;
mod ids;
mod kv;
mod label;
mod limits;
mod name;
mod observe;
mod outcome;
mod session;
mod table;
mod time;
mod wall;

pub use command::{Batch, Command, RenewLease, RenewLeases};
pub use error::InvalidArgument;
pub use ids::{OwnerId, SessionId, Token};
pub use kv::{
    KvBound, KvBounds, KvEntry, KvKey, KvRefusal, KvSnapshot, KvStore, KvTombstone, KvValue,
    KV_KEY_MAX_BYTES, KV_SNAPSHOT_FORMAT_VERSION, KV_VALUE_MAX_BYTES,
};
pub use label::{JobLabel, JOB_LABEL_MAX_BYTES};
pub use limits::{
    Capacity, CapacityBound, IdentityBounds, Limits, SessionBounds, MAX_BATCH_COMMANDS,
    MAX_IDLE_RECORDS, MAX_LOADED_REVISION, MAX_RENEW_BATCH, MAX_RENEW_BATCH_BYTES, MAX_TOKEN,
    MAX_TOKEN_FLOOR, MAX_WAITERS_PER_RESOURCE, SESSION_IDENTITY_MAX_BYTES,
};
pub use name::{ResourceName, RESOURCE_NAME_MAX_BYTES};
pub use observe::{
    watch_prefix, Change, ChangeKind, ChangesAfter, Compacted, DatedHistoryEntry, HistoryEntry,
    LeaseEnd, TokenState, Validation, DEFAULT_HISTORY_PER_RESOURCE, MAX_HISTORY_PER_RESOURCE,
    MAX_VALIDATE_BATCH, WATCH_WINDOW,
};
pub use outcome::{
    AcquireInSessionOutcome, AcquireOutcome, Applied, CloseSessionOutcome, CommandOutcome,
    Description, Event, Grant, KvDeleteOutcome, KvPutOutcome, LeaseList, LeaseView, LostReason,
    Outcome, ReleaseOutcome, RenewOutcome, SessionBound, SessionOutcome, SessionRefusal,
};
pub use table::{
    LeaseTable, SnapshotError, TableSeed, TableSnapshot, TableSnapshotRef, TokenFloorError,
    SNAPSHOT_FIELDS, SNAPSHOT_FORMAT_VERSION,
};
pub use time::{ClusterTime, LeaderClock};
pub use wall::{
    check_unix_ms, WallAnchor, WallClock, MAX_UNIX_MS, MAX_WALL_ANCHORS, WALL_ANCHOR_DRIFT_MS,
};
