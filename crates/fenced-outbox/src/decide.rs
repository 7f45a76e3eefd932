//! The dispatcher's decisions, as pure functions: what an HTTP status
//! means, how long to wait before the next attempt, what to record after an
//! attempt, and whether an operation was superseded. No clock, no I/O: the
//! caller passes the jitter and the facts.

use std::time::Duration;

/// The longest error text stored in `last_error`, in bytes.
pub const LAST_ERROR_MAX_BYTES: usize = 512;

/// How one delivery attempt ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// The destination answered with this status.
    Status(u16),
    /// No answer: the connection, TLS or the exchange failed.
    Transport(String),
    /// No answer within the request timeout.
    TimedOut,
}

/// What a status means for the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Class {
    /// 2xx: applied (or already applied under its idempotency key).
    Delivered,
    /// 5xx, 429, 408: the destination may take it later.
    Transient,
    /// Any other status (other 4xx, redirects, 1xx): resending the same
    /// request cannot succeed.
    Permanent,
}

/// The class of an HTTP status.
///
/// ```
/// use fenced_outbox::decide::{classify, Class};
/// assert_eq!(classify(201), Class::Delivered);
/// assert_eq!(classify(503), Class::Transient);
/// assert_eq!(classify(429), Class::Transient);
/// assert_eq!(classify(400), Class::Permanent);
/// ```
pub fn classify(status: u16) -> Class {
    match status {
        200..=299 => Class::Delivered,
        408 | 429 | 500..=599 => Class::Transient,
        _ => Class::Permanent,
    }
}

/// The retry schedule: the wait after attempt `n` is `base * 2^(n-1)`,
/// capped at `cap`, of which the upper half is jitter; after
/// `max_attempts` attempts (none: never) a transient failure is final.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    pub base: Duration,
    pub cap: Duration,
    pub max_attempts: Option<u32>,
}

impl Default for RetryPolicy {
    /// 500 ms, doubling to at most 5 minutes, without end.
    fn default() -> Self {
        RetryPolicy {
            base: Duration::from_millis(500),
            cap: Duration::from_secs(300),
            max_attempts: None,
        }
    }
}

/// The wait before the attempt after attempt `attempt` (1 for the first),
/// with `jitter` in `[0, 1]` (clamped) choosing within the upper half: the
/// wait is at least half the exponential step, so failures never spin.
///
/// ```
/// use std::time::Duration;
/// use fenced_outbox::decide::{backoff, RetryPolicy};
/// let p = RetryPolicy { base: Duration::from_millis(100), cap: Duration::from_secs(1), max_attempts: None };
/// assert_eq!(backoff(&p, 1, 0.0), Duration::from_millis(50));
/// assert_eq!(backoff(&p, 3, 1.0), Duration::from_millis(400));
/// assert_eq!(backoff(&p, 60, 1.0), Duration::from_secs(1));
/// ```
pub fn backoff(policy: &RetryPolicy, attempt: u32, jitter: f64) -> Duration {
    let doublings = attempt.saturating_sub(1).min(63);
    let base = u64::try_from(policy.base.as_millis()).unwrap_or(u64::MAX);
    let cap = u64::try_from(policy.cap.as_millis()).unwrap_or(u64::MAX);
    let step = 1u64
        .checked_shl(doublings)
        .and_then(|f| base.checked_mul(f))
        .unwrap_or(u64::MAX)
        .min(cap);
    let half = step / 2;
    let jitter = if jitter.is_nan() {
        0.0
    } else {
        jitter.clamp(0.0, 1.0)
    };
    // `half` fits in 53 bits for any cap below 285,000 years; the product
    // is at most `half`, so the sum stays within `step`.
    #[allow(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss
    )]
    let extra = ((step.saturating_sub(half)) as f64 * jitter) as u64;
    Duration::from_millis(half.saturating_add(extra).min(step))
}

/// What to record after an attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mark {
    /// Delivered: final.
    Delivered,
    /// Try again after `delay`; `error` says what failed.
    Retry { delay: Duration, error: String },
    /// Failed for good; `reason` says why.
    Failed { reason: String },
    /// Not delivered: a newer owner's operation for the same resource was
    /// recorded earlier (its token is `newer`).
    Superseded { newer: u64 },
}

impl Mark {
    /// The state the row gets.
    pub fn state(&self) -> &'static str {
        match self {
            Mark::Delivered => "delivered",
            Mark::Retry { .. } => "pending",
            Mark::Failed { .. } => "failed",
            Mark::Superseded { .. } => "superseded",
        }
    }

    /// Whether the mark counts an attempt (a superseded operation was not
    /// attempted).
    pub fn counts_attempt(&self) -> bool {
        !matches!(self, Mark::Superseded { .. })
    }

    /// The text stored in `last_error` (none for a delivery), at most
    /// [`LAST_ERROR_MAX_BYTES`].
    pub fn error(&self) -> Option<String> {
        match self {
            Mark::Delivered => None,
            Mark::Retry { error, .. } => Some(truncate(error)),
            Mark::Failed { reason } => Some(truncate(reason)),
            Mark::Superseded { newer } => Some(format!(
                "superseded: an operation with the newer token {newer} was recorded earlier for this resource"
            )),
        }
    }
}

/// What to record after attempt number `attempt` (1 for the first) ended
/// with `outcome`.
///
/// ```
/// use std::time::Duration;
/// use fenced_outbox::decide::{after_attempt, Mark, Outcome, RetryPolicy};
/// let p = RetryPolicy::default();
/// assert_eq!(after_attempt(&Outcome::Status(204), 1, &p, 0.5), Mark::Delivered);
/// assert!(matches!(after_attempt(&Outcome::Status(400), 1, &p, 0.5), Mark::Failed { .. }));
/// assert!(matches!(after_attempt(&Outcome::TimedOut, 1, &p, 0.5), Mark::Retry { .. }));
/// ```
pub fn after_attempt(outcome: &Outcome, attempt: u32, policy: &RetryPolicy, jitter: f64) -> Mark {
    let error = match outcome {
        Outcome::Status(status) => match classify(*status) {
            Class::Delivered => return Mark::Delivered,
            Class::Permanent => {
                return Mark::Failed {
                    reason: format!("permanent failure: HTTP status {status}"),
                }
            }
            Class::Transient => format!("HTTP status {status}"),
        },
        Outcome::Transport(e) => format!("transport: {e}"),
        Outcome::TimedOut => "timed out".to_string(),
    };
    match policy.max_attempts {
        Some(max) if attempt >= max => Mark::Failed {
            reason: format!("gave up after {attempt} attempts; last: {error}"),
        },
        _ => Mark::Retry {
            delay: backoff(policy, attempt, jitter),
            error,
        },
    }
}

/// Whether an operation with `token` must not be delivered because an
/// operation of the same resource recorded before it (lower sequence)
/// carries a higher token, `earlier_max`: that owner superseded this one,
/// and delivering this now would put the older owner's effect after the
/// newer's. The newer token when superseded.
///
/// ```
/// use fenced_outbox::decide::superseded;
/// assert_eq!(superseded(5, Some(6)), Some(6));
/// assert_eq!(superseded(6, Some(6)), None);
/// assert_eq!(superseded(6, None), None);
/// ```
pub fn superseded(token: u64, earlier_max: Option<u64>) -> Option<u64> {
    earlier_max.filter(|&newer| newer > token)
}

/// `text` cut to [`LAST_ERROR_MAX_BYTES`] at a character boundary.
fn truncate(text: &str) -> String {
    if text.len() <= LAST_ERROR_MAX_BYTES {
        return text.to_string();
    }
    let mut end = LAST_ERROR_MAX_BYTES;
    while !text.is_char_boundary(end) {
        end = end.saturating_sub(1);
    }
    text.get(..end).unwrap_or_default().to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    const P: RetryPolicy = RetryPolicy {
        base: Duration::from_millis(200),
        cap: Duration::from_secs(10),
        max_attempts: None,
    };

    #[test]
    fn statuses() {
        for s in [200, 201, 202, 204, 299] {
            assert_eq!(classify(s), Class::Delivered, "{s}");
        }
        for s in [408, 429, 500, 502, 503, 504, 599] {
            assert_eq!(classify(s), Class::Transient, "{s}");
        }
        for s in [
            100, 301, 302, 304, 400, 401, 403, 404, 409, 410, 422, 600, 0,
        ] {
            assert_eq!(classify(s), Class::Permanent, "{s}");
        }
    }

    #[test]
    fn backoff_doubles_within_bounds_and_caps() {
        let mut previous_floor = Duration::ZERO;
        for attempt in 1..=10 {
            let step = (P.base * 2u32.pow(attempt - 1)).min(P.cap);
            let low = backoff(&P, attempt, 0.0);
            let high = backoff(&P, attempt, 1.0);
            assert_eq!(low, step / 2, "attempt {attempt}");
            assert_eq!(high, step, "attempt {attempt}");
            let mid = backoff(&P, attempt, 0.5);
            assert!(low <= mid && mid <= high);
            assert!(low >= previous_floor, "the floor never shrinks");
            previous_floor = low;
        }
        assert_eq!(backoff(&P, 10, 1.0), P.cap);
    }

    #[test]
    fn backoff_never_overflows_or_spins() {
        let huge = RetryPolicy {
            base: Duration::from_secs(u64::MAX / 4),
            cap: Duration::MAX,
            max_attempts: None,
        };
        assert!(backoff(&huge, u32::MAX, 1.0) >= Duration::from_secs(u64::MAX / 1000));
        assert_eq!(backoff(&P, 0, 0.0), Duration::from_millis(100));
        assert_eq!(backoff(&P, 1, f64::NAN), Duration::from_millis(100));
        assert_eq!(backoff(&P, 1, -3.0), Duration::from_millis(100));
        assert_eq!(backoff(&P, 1, 7.0), Duration::from_millis(200));
    }

    #[test]
    fn after_an_attempt() {
        assert_eq!(
            after_attempt(&Outcome::Status(200), 9, &P, 0.0),
            Mark::Delivered
        );
        assert_eq!(
            after_attempt(&Outcome::Status(400), 1, &P, 0.0),
            Mark::Failed {
                reason: "permanent failure: HTTP status 400".into()
            }
        );
        assert_eq!(
            after_attempt(&Outcome::Status(503), 2, &P, 0.0),
            Mark::Retry {
                delay: Duration::from_millis(200),
                error: "HTTP status 503".into()
            }
        );
        assert_eq!(
            after_attempt(&Outcome::Transport("connection refused".into()), 1, &P, 1.0),
            Mark::Retry {
                delay: Duration::from_millis(200),
                error: "transport: connection refused".into()
            }
        );
        let limited = RetryPolicy {
            max_attempts: Some(3),
            ..P
        };
        assert!(matches!(
            after_attempt(&Outcome::TimedOut, 2, &limited, 0.0),
            Mark::Retry { .. }
        ));
        assert_eq!(
            after_attempt(&Outcome::TimedOut, 3, &limited, 0.0),
            Mark::Failed {
                reason: "gave up after 3 attempts; last: timed out".into()
            }
        );
    }

    #[test]
    fn supersession() {
        assert_eq!(superseded(1, None), None);
        assert_eq!(superseded(7, Some(3)), None);
        assert_eq!(superseded(7, Some(7)), None);
        assert_eq!(superseded(7, Some(8)), Some(8));
    }

    #[test]
    fn marks() {
        assert_eq!(Mark::Delivered.state(), "delivered");
        assert_eq!(Mark::Delivered.error(), None);
        assert!(!Mark::Superseded { newer: 2 }.counts_attempt());
        let long = "é".repeat(LAST_ERROR_MAX_BYTES);
        let stored = Mark::Failed { reason: long }.error().unwrap_or_default();
        assert!(stored.len() <= LAST_ERROR_MAX_BYTES && !stored.is_empty());
    }
}
