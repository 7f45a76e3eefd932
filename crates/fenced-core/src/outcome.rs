use serde::{Deserialize, Serialize};

use crate::{
    CapacityBound, ClusterTime, KvBound, KvRefusal, OwnerId, ResourceName, SessionId, Token,
};

/// A lease granted to an owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub token: Token,
    /// Cluster time at which the lease ends unless renewed.
    pub expires_at: ClusterTime,
    pub ttl_ms: u64,
}

/// Why a lease is gone: the answer to a renew or release by a non-holder,
/// to a fenced write that does not hold its lease, or to an acquire whose
/// attempt is over. The one loss reason of the core, the server's
/// conversions and the clients.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum LostReason {
    /// The lease ran out before this request was applied.
    Expired,
    /// The lease was released.
    Released,
    /// A later owner was granted the resource; `current_token` is the newest
    /// token issued for it.
    Superseded { current_token: Token },
    /// No such lease is known: wrong owner id or token, or forgotten.
    Unknown,
}

impl LostReason {
    /// The reason as one word: `expired`, `released`, `superseded`, `unknown`.
    pub fn as_str(&self) -> &'static str {
        match self {
            LostReason::Expired => "expired",
            LostReason::Released => "released",
            LostReason::Superseded { .. } => "superseded",
            LostReason::Unknown => "unknown",
        }
    }
}

/// What an acquire ([`crate::Command::Acquire`] or
/// [`crate::Command::AcquireBounded`]) produced. Refusals are normal
/// concurrency, not errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AcquireOutcome {
    Granted(Grant),
    /// Another owner holds the resource.
    Held {
        current_token: Token,
        remaining_ms: u64,
    },
    /// The owner is queued (`position` 1 is next); an [`Event`] answers it
    /// later with a grant or with the end of its wait.
    Waiting {
        position: u32,
    },
    /// The resource already has the maximum number of waiters.
    WaitQueueFull {
        max_waiters: u32,
    },
    /// The owner id's lease on the resource already ended (owner ids are
    /// single-use per attempt, so it is not granted a second lease).
    Ended(LostReason),
    /// The acquire would have added a live lease or a waiter beyond the
    /// table-wide bound it carried; nothing changed.
    CapacityReached {
        bound: CapacityBound,
        limit: u64,
    },
    /// The table's token counter reached `limit` ([`crate::MAX_TOKEN`]): no
    /// grant can get a token higher than every one before, so none is
    /// made, ever again on this table; nothing changed. (Last: outcomes
    /// are encoded by position.)
    TokensExhausted {
        limit: u64,
    },
}

/// What a renew ([`crate::Command::Renew`], or one lease of a
/// [`crate::Command::RenewMany`]) produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RenewOutcome {
    Renewed {
        expires_at: ClusterTime,
        ttl_ms: u64,
    },
    /// The lease is gone; it is never revived.
    Lost(LostReason),
    /// Nothing changed: the lease is kept by its session and runs as long
    /// as the session, which a keep-alive extends.
    KeptBySession,
}

/// What a release ([`crate::Command::Release`]) produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReleaseOutcome {
    /// Released now, or by an earlier copy of the same request.
    Released,
    NotHolder(LostReason),
}

/// What a fenced put ([`crate::Command::KvPut`]) produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvPutOutcome {
    /// Applied. `revision` is the store's revision after it; `existed`
    /// says whether the key had a value.
    Applied { revision: u64, existed: bool },
    /// Not applied by the fencing rule; nothing changed.
    Refused(KvRefusal),
    /// The store is full; nothing changed.
    BoundReached { bound: KvBound, limit: u64 },
}

/// What a fenced delete ([`crate::Command::KvDelete`]) produced.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvDeleteOutcome {
    /// Applied. `revision` is the store's revision after it; `existed`
    /// says whether the key had a value.
    Applied { revision: u64, existed: bool },
    /// Not applied by the fencing rule; nothing changed.
    Refused(KvRefusal),
    /// The store's revision counter is at its end; nothing changed.
    BoundReached { bound: KvBound, limit: u64 },
}

/// What opening a session ([`crate::Command::OpenSession`]) or keeping it
/// alive ([`crate::Command::KeepAlive`]) produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionOutcome {
    /// The session and every lease it holds run until `expires_at` unless
    /// kept alive again. `leases` is how many it holds (a client that counts
    /// more learns that some ended without it).
    Alive {
        expires_at: ClusterTime,
        ttl_ms: u64,
        leases: u64,
    },
    /// Nothing changed.
    Refused(SessionRefusal),
}

/// What closing a session ([`crate::Command::CloseSession`]) produced.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CloseSessionOutcome {
    /// Closed (or was not live): `leases` of its leases ended with it.
    Closed { leases: u64 },
    /// The session belongs to another identity; nothing changed.
    NotOwner,
}

/// What an acquire in a session ([`crate::Command::AcquireInSession`])
/// produced: an acquire's answer (it never waits), or the session's refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum AcquireInSessionOutcome {
    Acquire(AcquireOutcome),
    /// The session is not live or not the caller's; nothing changed.
    SessionRefused(SessionRefusal),
}

/// Why a session command changed nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionRefusal {
    /// No such session is live: it lapsed, was closed, or never was opened.
    /// Every lease it held has ended.
    Gone,
    /// The session belongs to another identity.
    NotOwner,
    /// Opening it would exceed a [`crate::SessionBounds`] bound.
    Bound { bound: SessionBound, limit: u64 },
}

/// Which [`crate::SessionBounds`] bound refused an open.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum SessionBound {
    Sessions,
    SessionsPerIdentity,
}

impl SessionBound {
    /// The setting's name, as spelled in the server's configuration.
    pub fn setting(self) -> &'static str {
        match self {
            SessionBound::Sessions => "max_sessions",
            SessionBound::SessionsPerIdentity => "max_sessions_per_identity",
        }
    }
}

/// The result of applying one command: its command's own outcome type, so
/// a reply is built from exactly the cases its command can produce.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
    Acquire(AcquireOutcome),
    Renew(RenewOutcome),
    Release(ReleaseOutcome),
    KvPut(KvPutOutcome),
    KvDelete(KvDeleteOutcome),
    /// One outcome per lease of a [`crate::Command::RenewMany`], in the
    /// order of its leases.
    RenewMany(Vec<RenewOutcome>),
    /// A [`crate::Command::OpenSession`] or [`crate::Command::KeepAlive`].
    Session(SessionOutcome),
    CloseSession(CloseSessionOutcome),
    AcquireInSession(AcquireInSessionOutcome),
    /// A [`crate::Command::WallClock`]: recorded.
    WallClockNoted,
}

/// A command's own outcome type, taken out of the [`Outcome`] that
/// [`crate::LeaseTable::apply`] returned for that command. `apply` answers
/// every command with its own variant (test
/// `every_command_is_answered_with_its_own_outcome_type`), so this fails
/// only when given the outcome of another command.
pub trait CommandOutcome: Sized {
    fn from_outcome(outcome: Outcome) -> Result<Self, Outcome>;
}

/// `CommandOutcome` for each command's type: the variant of [`Outcome`]
/// that holds it.
macro_rules! command_outcome {
    ($($outcome:ty => $variant:ident),* $(,)?) => {$(
        impl CommandOutcome for $outcome {
            fn from_outcome(outcome: Outcome) -> Result<Self, Outcome> {
                match outcome {
                    Outcome::$variant(o) => Ok(o),
                    other => Err(other),
                }
            }
        }
    )*};
}

command_outcome!(
    AcquireOutcome => Acquire,
    RenewOutcome => Renew,
    ReleaseOutcome => Release,
    KvPutOutcome => KvPut,
    KvDeleteOutcome => KvDelete,
    // A `RenewMany`'s outcomes, one per lease.
    Vec<RenewOutcome> => RenewMany,
    // An `OpenSession`'s or a `KeepAlive`'s.
    SessionOutcome => Session,
    CloseSessionOutcome => CloseSession,
    AcquireInSessionOutcome => AcquireInSession,
);

/// Something that happened while applying an entry without being the direct
/// answer to one of its commands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A queued owner was granted the resource.
    WaiterGranted {
        resource: ResourceName,
        owner_id: OwnerId,
        grant: Grant,
    },
    /// A queued owner's wait ran out; the resource is still held.
    WaitElapsed {
        resource: ResourceName,
        owner_id: OwnerId,
        current_token: Token,
        remaining_ms: u64,
    },
    /// A lease ran out without being renewed or released (also each lease
    /// of a session that lapsed).
    Expired {
        resource: ResourceName,
        owner_id: OwnerId,
        token: Token,
    },
    /// A session lapsed without a keep-alive; `leases` of its leases ended
    /// with it, each also reported as [`Event::Expired`].
    SessionExpired { session: SessionId, leases: u64 },
    /// A queued owner's wait ended without a grant: the resource came free
    /// but the token counter reached `limit` ([`crate::MAX_TOKEN`]).
    TokensExhausted {
        resource: ResourceName,
        owner_id: OwnerId,
        limit: u64,
    },
    /// `identity` presented the owner id and token of a lease that another
    /// identity holds, and was refused as a wrong owner id is.
    OtherIdentity {
        resource: ResourceName,
        token: Token,
        identity: String,
    },
}

/// Everything one applied batch produced.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Applied {
    /// One outcome per command, in order.
    pub outcomes: Vec<Outcome>,
    pub events: Vec<Event>,
}

/// What [`crate::LeaseTable::describe`] reports about a resource.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Description {
    /// The newest token issued for this resource, `None` if none is
    /// remembered.
    pub last_token: Option<Token>,
    pub held: bool,
    /// Milliseconds of the current lease left, 0 when not held.
    pub remaining_ms: u64,
    pub waiters: u32,
}

/// One live lease as [`crate::LeaseTable::leases`] lists it. The owner id is
/// left out on purpose: with the token it is the capability to renew or
/// release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    pub resource: crate::ResourceName,
    pub token: Token,
    /// Milliseconds left at the `now` the list was made for.
    pub remaining_ms: u64,
    pub ttl_ms: u64,
    pub waiters: u32,
    /// The identity the lease belongs to (empty with auth off), never its
    /// owner id.
    pub identity: String,
    /// When it was granted, if the table remembers (see
    /// [`crate::LeaseTable::history`]).
    pub granted_at: Option<crate::ClusterTime>,
    /// The leader's wall clock then (ms since the Unix epoch), if known.
    pub granted_at_unix_ms: Option<u64>,
    /// The job label its acquire gave, if any.
    pub label: Option<crate::JobLabel>,
}

/// Live leases under a name prefix, in name order: the first rows, and how
/// many more match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseList {
    pub rows: Vec<LeaseView>,
    /// Live leases under the prefix beyond `rows`.
    pub more: usize,
}
