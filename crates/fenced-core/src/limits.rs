use serde::{Deserialize, Serialize};

use crate::{InvalidArgument, KvBounds};

/// The most clients that may wait for one resource at once. Part of the
/// replicated state machine's contract, so the same on every node.
pub const MAX_WAITERS_PER_RESOURCE: usize = 1024;

/// How many released or expired resources the table remembers (for
/// `Describe` and for telling a late renew *why* it lost); the oldest is
/// forgotten first. Tokens stay monotonic without them: they come from one
/// counter for the whole table.
pub const MAX_IDLE_RECORDS: usize = 100_000;

/// The highest fencing token the table's counter issues. A table whose
/// counter reached it refuses every new grant
/// ([`crate::AcquireOutcome::TokensExhausted`]) rather than wrap to 0; a
/// snapshot whose counter is above it is refused at load.
pub const MAX_TOKEN: u64 = 1 << 63;

/// The highest floor a restore or a recovery may raise the counter to
/// (`--token-floor`): 2^62 tokens of room stay above it, more than any
/// cluster grants (a million a second for 146,000 years).
pub const MAX_TOKEN_FLOOR: u64 = 1 << 62;

/// The highest watch revision a snapshot may carry: far below the end of
/// a u64 (the window stops numbering there rather than wrap; 2^63 more
/// changes away, out of reach).
pub const MAX_LOADED_REVISION: u64 = 1 << 62;

/// The most commands in one log entry.
pub const MAX_BATCH_COMMANDS: usize = 4096;

/// The most leases one batch renewal ([`crate::Command::RenewMany`]) carries.
pub const MAX_RENEW_BATCH: usize = 4096;

/// The most a batch renewal's leases weigh together (each: its resource name
/// plus 32 bytes): a full batch fits in the bytes one log entry may carry
/// (three largest fenced-store values), so a run of entries stays within a
/// peer message.
pub const MAX_RENEW_BATCH_BYTES: usize = 3 * crate::KV_VALUE_MAX_BYTES;

/// How much the whole table may hold: live leases and queued waiters in
/// total. Carried by every acquire ([`crate::Command::AcquireBounded`]), so
/// the table decides a refusal from the log alone and every replica decides
/// the same, whatever each node's own settings say.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Capacity {
    pub max_live_leases: u64,
    pub max_waiters: u64,
}

impl Capacity {
    /// No bound: what an acquire written by an older build gets.
    pub const UNBOUNDED: Capacity = Capacity {
        max_live_leases: u64::MAX,
        max_waiters: u64::MAX,
    };
}

/// How many sessions the table may hold: in all, and per identity. Carried
/// by every [`crate::Command::OpenSession`], like [`Capacity`] by an acquire,
/// so every replica refuses the same opens.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SessionBounds {
    pub max_sessions: u64,
    pub max_sessions_per_identity: u64,
}

/// How many live leases, and how many waiters, one identity may have: the
/// leader's settings, carried in each command made on an identity's behalf
/// ([`crate::Command::AsIdentity`]) and decided by the table, so a new
/// leader counts exactly what the old one did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdentityBounds {
    pub max_leases_per_identity: u64,
    pub max_waiters_per_identity: u64,
}

impl IdentityBounds {
    /// No bound: what a command from before the bounds applies under.
    pub const UNBOUNDED: IdentityBounds = IdentityBounds {
        max_leases_per_identity: u64::MAX,
        max_waiters_per_identity: u64::MAX,
    };
}

/// The longest identity a session or a lease records as its owner, in bytes.
pub const SESSION_IDENTITY_MAX_BYTES: usize = 256;

/// Which [`Capacity`] bound refused an acquire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum CapacityBound {
    LiveLeases,
    Waiters,
    /// [`IdentityBounds::max_leases_per_identity`] (last: outcomes of older
    /// builds still decode).
    LeasesPerIdentity,
    /// [`IdentityBounds::max_waiters_per_identity`].
    WaitersPerIdentity,
}

impl CapacityBound {
    /// The setting's name, as spelled in the server's configuration.
    pub fn setting(self) -> &'static str {
        match self {
            CapacityBound::LiveLeases => "max_live_leases",
            CapacityBound::Waiters => "max_waiters",
            CapacityBound::LeasesPerIdentity => "max_leases_per_identity",
            CapacityBound::WaitersPerIdentity => "max_waiters_per_identity",
        }
    }
}

/// Bounds a server enforces on requests before they reach the log.
///
/// ```
/// use fenced_core::Limits;
/// let limits = Limits::default();
/// assert!(limits.check_ttl_ms(30_000).is_ok());
/// let err = limits.check_ttl_ms(10).unwrap_err();
/// assert_eq!(err.to_string(), "ttl_ms: must be between 1000 and 3600000 ms, got 10");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Limits {
    pub ttl_min_ms: u64,
    pub ttl_max_ms: u64,
    /// The longest a blocking acquire may wait on the server.
    pub wait_max_ms: u64,
    /// Live leases in the whole table (see [`Capacity`]).
    pub max_live_leases: u64,
    /// Queued waiters in the whole table (see [`Capacity`]).
    pub max_waiters: u64,
    /// Keys in the fenced store (see [`KvBounds`]).
    pub kv_max_keys: u64,
    /// Bytes of keys plus values in the fenced store (see [`KvBounds`]).
    pub kv_max_total_bytes: u64,
    /// Open sessions in the whole table (see [`SessionBounds`]).
    pub max_sessions: u64,
    /// Open sessions of one identity (see [`SessionBounds`]).
    pub max_sessions_per_identity: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            ttl_min_ms: 1_000,
            ttl_max_ms: 3_600_000,
            wait_max_ms: 3_600_000,
            max_live_leases: 100_000,
            max_waiters: 100_000,
            kv_max_keys: 100_000,
            kv_max_total_bytes: 64 * 1024 * 1024,
            max_sessions: 10_000,
            max_sessions_per_identity: 1_000,
        }
    }
}

impl Limits {
    /// The table-wide bounds every acquire carries.
    pub fn capacity(&self) -> Capacity {
        Capacity {
            max_live_leases: self.max_live_leases,
            max_waiters: self.max_waiters,
        }
    }

    /// The fenced store's bounds every put carries.
    pub fn kv_bounds(&self) -> KvBounds {
        KvBounds {
            max_keys: self.kv_max_keys,
            max_total_bytes: self.kv_max_total_bytes,
        }
    }

    /// The session bounds every open carries.
    pub fn session_bounds(&self) -> SessionBounds {
        SessionBounds {
            max_sessions: self.max_sessions,
            max_sessions_per_identity: self.max_sessions_per_identity,
        }
    }

    /// Checks that the bounds themselves make sense (for server settings).
    pub fn validate(&self) -> Result<(), InvalidArgument> {
        if self.ttl_min_ms == 0 || self.ttl_min_ms > self.ttl_max_ms {
            return Err(InvalidArgument::new(
                "ttl_min_ms",
                format!(
                    "must be at least 1 and at most ttl_max_ms ({}), got {}",
                    self.ttl_max_ms, self.ttl_min_ms
                ),
            ));
        }
        Ok(())
    }

    pub fn check_ttl_ms(&self, ttl_ms: u64) -> Result<u64, InvalidArgument> {
        if ttl_ms < self.ttl_min_ms || ttl_ms > self.ttl_max_ms {
            return Err(InvalidArgument::new(
                "ttl_ms",
                format!(
                    "must be between {} and {} ms, got {ttl_ms}",
                    self.ttl_min_ms, self.ttl_max_ms
                ),
            ));
        }
        Ok(ttl_ms)
    }

    pub fn check_wait_ms(&self, wait_ms: u64) -> Result<u64, InvalidArgument> {
        if wait_ms > self.wait_max_ms {
            return Err(InvalidArgument::new(
                "wait_ms",
                format!("must be at most {} ms, got {wait_ms}", self.wait_max_ms),
            ));
        }
        Ok(wait_ms)
    }
}
