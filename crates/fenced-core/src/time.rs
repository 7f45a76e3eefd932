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
    /// The latest time there is: no stamp reaches it.
    pub const MAX: ClusterTime = ClusterTime(u64::MAX);

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

/// The leader's cluster clock (docs/DESIGN.md §4), fed with monotonic readings.
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

    /// Starts a new leader's clock (a leader change, docs/DESIGN.md §4).
    ///
    /// `last_applied` is the stamp of the last entry this node applied once
    /// everything committed before its term was applied; `highest_seen` is
    /// the highest leader time this node accepted from a leader, issued
    /// itself, or learned from the voters that elected it (their own highest,
    /// as of their vote). Every time a previous leader revealed (a describe
    /// confirmed by a quorum, a heartbeat) reached a quorum first, and that
    /// quorum meets the voters, so the clock starts at or above it: time
    /// never runs backwards across the change. Every value was issued by a
    /// leader before this node won, so the clock never runs ahead of the old
    /// leader's either; it lags it by the time from the last heartbeat the
    /// voters accepted to this election, which only lengthens leases.
    pub fn take_over(
        last_applied: ClusterTime,
        highest_seen: ClusterTime,
        became_leader_at: Duration,
    ) -> Self {
        Self::new(last_applied.max(highest_seen), became_leader_at)
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

#[cfg(test)]
mod tests {
    use super::*;

    const HEARTBEAT_MS: u64 = 100;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// An idle cluster: the old leader's last entry is stamped at 1 s, then
    /// nothing is written for `idle_ms` while heartbeats carry its time to a
    /// voter. The old leader dies, and `election_ms` later the voter leads.
    fn hand_over(idle_ms: u64, election_ms: u64) -> (LeaderClock, LeaderClock, u64) {
        let mut old = LeaderClock::new(ClusterTime::from_millis(1_000), ms(0));
        let last_stamp = old.now(ms(0));
        let mut highest_seen = ClusterTime::ZERO;
        let mut at = 0;
        while at <= idle_ms {
            highest_seen = highest_seen.max(old.now(ms(at)));
            at += HEARTBEAT_MS;
        }
        let died = idle_ms + HEARTBEAT_MS / 2;
        let became = died + election_ms;
        let new = LeaderClock::take_over(last_stamp, highest_seen, ms(became));
        (old, new, became)
    }

    #[test]
    fn a_new_leader_starts_at_the_highest_time_its_voters_saw() {
        let (mut old, mut new, became) = hand_over(5_000, 700);
        // Time the old leader revealed before it died is never undone.
        let revealed = old.now(ms(5_000));
        assert!(new.now(ms(became)) >= revealed);
        for t in (became..became + 10_000).step_by(37) {
            let (o, n) = (old.now(ms(t)), new.now(ms(t)));
            // Never ahead of the old leader: no lease ends sooner than the
            // old leader would have ended it.
            assert!(n <= o, "at {t} ms the new clock {n:?} ran ahead of {o:?}");
            // Behind by at most one heartbeat and the election.
            assert!(
                o.millis_since(n) <= HEARTBEAT_MS + 700,
                "at {t} ms the new clock {n:?} lags {o:?} by more than a heartbeat and the election"
            );
        }
    }

    #[test]
    fn starting_from_the_last_stamp_alone_loses_the_idle_time() {
        // What the bound above rules out: the last entry's stamp is 5 s old.
        let (mut old, _, became) = hand_over(5_000, 700);
        let mut from_stamp = LeaderClock::new(ClusterTime::from_millis(1_000), ms(became));
        let lag = old.now(ms(became)).millis_since(from_stamp.now(ms(became)));
        assert!(lag >= 5_000, "lag {lag} ms");
    }

    #[test]
    fn the_last_applied_stamp_wins_when_it_is_higher() {
        let clock = LeaderClock::take_over(
            ClusterTime::from_millis(9_000),
            ClusterTime::from_millis(8_000),
            ms(3),
        );
        let mut clock = clock;
        assert_eq!(clock.now(ms(3)).as_millis(), 9_000);
        assert_eq!(clock.now(ms(13)).as_millis(), 9_010);
    }
}
