use serde::{Deserialize, Serialize};

use crate::InvalidArgument;

/// The most clients that may wait for one resource at once. Part of the
/// replicated state machine's contract, so the same on every node.
pub const MAX_WAITERS_PER_RESOURCE: usize = 1024;

/// How many released or expired resources the table remembers (for
/// `Describe` and for telling a late renew *why* it lost); the oldest is
/// forgotten first. Tokens stay monotonic without them: they come from one
/// counter for the whole table.
pub const MAX_IDLE_RECORDS: usize = 100_000;

/// The most commands in one log entry.
pub const MAX_BATCH_COMMANDS: usize = 4096;

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
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            ttl_min_ms: 1_000,
            ttl_max_ms: 3_600_000,
            wait_max_ms: 3_600_000,
        }
    }
}

impl Limits {
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
