use std::{fmt, time::Duration};

use serde::{Deserialize, Serialize};

/// Milliseconds on the cluster's clock, which only the Raft leader advances.
///
/// The state machine never reads a clock: the leader stamps each log entry
/// with a `ClusterTime` and applying the entry uses only that stamp.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct ClusterTime(u64);

impl ClusterTime {
    pub const ZERO: ClusterTime = ClusterTime(0);

    pub fn from_millis(ms: u64) -> Self {
        Self(ms)
    }

    pub fn as_millis(self) -> u64 {
        self.0
    }

    /// `self + ms`, saturating instead of wrapping.
    pub fn plus_millis(self, ms: u64) -> Self {
        Self(self.0.saturating_add(ms))
    }

    /// Milliseconds from `earlier` to `self`, 0 if `earlier` is later.
    pub fn millis_since(self, earlier: ClusterTime) -> u64 {
        self.0.saturating_sub(earlier.0)
    }
}

impl fmt::Debug for ClusterTime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}ms", self.0)
    }
}

/// The leader's cluster clock (DESIGN.md §4), fed with monotonic readings.
///
/// cluster time = (cluster time of the last applied entry when this node
/// became leader) + (monotonic time elapsed since then), clamped so it never
/// goes backwards. The caller supplies the monotonic reading, so this type has
/// no clock of its own and is tested with plain numbers.
///
/// ```
/// use std::time::Duration;
/// use fenced_core::{ClusterTime, LeaderClock};
/// let mut clock = LeaderClock::new(ClusterTime::from_millis(5_000), Duration::from_secs(100));
/// assert_eq!(clock.now(Duration::from_secs(101)).as_millis(), 6_000);
/// // A reading from the past never moves cluster time backwards.
/// assert_eq!(clock.now(Duration::from_secs(90)).as_millis(), 6_000);
/// ```
#[derive(Debug, Clone)]
pub struct LeaderClock {
    base: ClusterTime,
    started: Duration,
    last: ClusterTime,
    /// Parts per million added to (or taken from) the elapsed time; 0 in
    /// production. Fault-injection tests use it to model clock-rate skew.
    skew_ppm: i64,
}

impl LeaderClock {
    /// Starts the clock when this node becomes leader: `base` is the cluster
    /// time of the last entry it applied, `mono_now` the monotonic reading now.
    pub fn new(base: ClusterTime, mono_now: Duration) -> Self {
        Self {
            base,
            started: mono_now,
            last: base,
            skew_ppm: 0,
        }
    }

    /// The same clock running `skew_ppm` parts per million fast (or slow).
    pub fn with_skew_ppm(mut self, skew_ppm: i64) -> Self {
        self.skew_ppm = skew_ppm.clamp(-999_999, 999_999);
        self
    }

    /// Cluster time at the monotonic reading `mono_now`; never decreases.
    pub fn now(&mut self, mono_now: Duration) -> ClusterTime {
        let elapsed_ms = mono_now.saturating_sub(self.started).as_millis();
        let elapsed_ms = u64::try_from(elapsed_ms).unwrap_or(u64::MAX);
        let skewed = i128::from(elapsed_ms) * i128::from(1_000_000 + self.skew_ppm) / 1_000_000;
        let skewed = u64::try_from(skewed.max(0)).unwrap_or(u64::MAX);
        let t = self.base.plus_millis(skewed);
        if t > self.last {
            self.last = t;
        }
        self.last
    }

    /// Makes sure the clock is at least `t` (an entry applied with a later stamp).
    pub fn observe(&mut self, t: ClusterTime) {
        if t > self.last {
            self.last = t;
        }
    }
}
