use serde::{Deserialize, Serialize};

use crate::{CapacityBound, ClusterTime, KvRefusal, OwnerId, ResourceName, SessionId, Token};

/// A lease granted to an owner.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    pub token: Token,
    /// Cluster time at which the lease ends unless renewed.
    pub expires_at: ClusterTime,
    pub ttl_ms: u64,
}

/// Why a renew or release by a non-holder changed nothing, or why an
/// acquire's attempt is over.
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

/// The result of applying one command. Refusals are normal concurrency, not
/// errors.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Outcome {
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
    Renewed {
        expires_at: ClusterTime,
        ttl_ms: u64,
    },
    /// A renew found the lease gone; or an acquire came from an owner id
    /// whose lease on the resource already ended (owner ids are single-use
    /// per attempt, so it is not granted a second lease).
    Lost(LostReason),
    Released,
    NotHolder(LostReason),
    /// The acquire would have added a live lease or a waiter beyond the
    /// table-wide bound it carried; nothing changed.
    CapacityReached {
        bound: CapacityBound,
        limit: u64,
    },
    /// A fenced put or delete was applied. `revision` is the store's
    /// revision after it; `existed` says whether the key had a value.
    KvApplied {
        revision: u64,
        existed: bool,
    },
    /// A fenced put or delete was not applied; nothing changed.
    KvRefused(KvRefusal),
    /// A batch renewal's answer: one [`Outcome::Renewed`] or
    /// [`Outcome::Lost`] per lease, in the order of its leases.
    Renewals(Vec<Outcome>),
    /// A session was opened or kept alive: it and every lease it holds run
    /// until `expires_at` unless kept alive again. `leases` is how many it
    /// holds (a client that counts more learns that some ended without it).
    SessionAlive {
        expires_at: ClusterTime,
        ttl_ms: u64,
        leases: u64,
    },
    /// A session was closed (or was not live): `leases` of its leases ended
    /// with it.
    SessionClosed {
        leases: u64,
    },
    /// A session command, or an acquire in a session, changed nothing.
    SessionRefused(SessionRefusal),
    /// A renew of a lease kept by its session changed nothing: the lease
    /// runs as long as its session, which a keep-alive extends.
    KeptBySession,
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

/// Something that happened while applying an entry without being the direct
/// answer to one of its commands.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Event {
    /// A queued owner was granted the resource.
    WaiterGranted {
        resource: ResourceName,
        owner: OwnerId,
        grant: Grant,
    },
    /// A queued owner's wait ran out; the resource is still held.
    WaitElapsed {
        resource: ResourceName,
        owner: OwnerId,
        current_token: Token,
        remaining_ms: u64,
    },
    /// A lease ran out without being renewed or released (also each lease
    /// of a session that lapsed).
    Expired {
        resource: ResourceName,
        owner: OwnerId,
        token: Token,
    },
    /// A session lapsed without a keep-alive; `leases` of its leases ended
    /// with it, each also reported as [`Event::Expired`].
    SessionExpired { session: SessionId, leases: u64 },
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
    /// The newest token issued for this resource, 0 if none is remembered.
    pub last_token: u64,
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
    pub token: u64,
    /// Milliseconds left at the `now` the list was made for.
    pub remaining_ms: u64,
    pub ttl_ms: u64,
    pub waiters: u32,
}

/// Live leases under a name prefix, in name order: the first rows, and how
/// many more match.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LeaseList {
    pub rows: Vec<LeaseView>,
    /// Live leases under the prefix beyond `rows`.
    pub more: usize,
}
