//! The clock leases are timed with.
//!
//! `CLOCK_BOOTTIME`, not `CLOCK_MONOTONIC` (what `std::time::Instant` uses on
//! Linux): monotonic time stops while the host or VM is suspended, but the
//! cluster's time does not, so a lease timed with it would look valid after a
//! suspend longer than the lease. Boot time keeps counting through suspends.

use std::time::Duration;

use nix::time::{clock_gettime, ClockId};

/// A reading of the lease clock.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct Moment(Duration);

impl Moment {
    /// Now. Falls back to the monotonic clock if boot time is unavailable.
    pub fn now() -> Moment {
        let ts = clock_gettime(ClockId::CLOCK_BOOTTIME)
            .or_else(|_| clock_gettime(ClockId::CLOCK_MONOTONIC))
            .map(|ts| {
                Duration::new(
                    ts.tv_sec().max(0) as u64,
                    ts.tv_nsec().clamp(0, 999_999_999) as u32,
                )
            })
            .unwrap_or_default();
        Moment(ts)
    }

    pub fn plus(self, d: Duration) -> Moment {
        Moment(self.0.saturating_add(d))
    }

    pub fn minus(self, d: Duration) -> Moment {
        Moment(self.0.saturating_sub(d))
    }

    /// Time from now until `self`; zero if it has passed.
    pub fn remaining(self) -> Duration {
        self.0.saturating_sub(Moment::now().0)
    }

    /// The sub-second part, in ns: varies enough between calls for jitter.
    pub fn subsec_nanos(self) -> u32 {
        self.0.subsec_nanos()
    }

    pub fn has_passed(self) -> bool {
        Moment::now() >= self
    }
}
