//! Cluster time, in one place: [`ClusterClock`] owns the leader clock of
//! the term this node leads (`fenced_core::LeaderClock`), the floor it
//! starts from ([`floor`], the highest leader time this node knows, carried
//! on every Raft message and made durable before a read reveals it), and
//! reads the applied entries' time through [`AppliedTime`]. Its one stamp,
//! [`ClusterClock::stamp`] (term, now), is what commands, ticks and reads
//! are stamped with.

pub mod floor;

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

// tokio's clock: the simulation runs it paused, and the real one otherwise.
use tokio::time::Instant;

use fenced_core::{ClusterTime, LeaderClock};

use floor::{LeaderTime, TimeFloor};

/// This node's cluster time: the leader clock of the term it leads, the
/// floor (the highest leader time it knows, durable when revealed), and the
/// time of the last applied entry. Every stamp a node gives comes from here.
pub struct ClusterClock {
    started: Instant,
    clock: Mutex<Option<(u64, LeaderClock)>>,
    /// The term this node was last seen becoming leader in, and when.
    became: Mutex<Option<(u64, Duration)>>,
    skew_ppm: i64,
    /// The highest leader time this node knows of: where the clock of its
    /// next term starts.
    floor: Arc<TimeFloor>,
    /// The cluster time of the last applied entry.
    applied: Arc<dyn AppliedTime>,
}

/// The cluster time of the last entry applied to this node's state machine
/// (kept by the state machine; the clock only reads it).
pub trait AppliedTime: Send + Sync + 'static {
    fn applied_time(&self) -> ClusterTime;
}

impl ClusterClock {
    pub fn new(skew_ppm: i64, floor: Arc<TimeFloor>, applied: Arc<dyn AppliedTime>) -> Self {
        Self {
            started: Instant::now(),
            clock: Mutex::new(None),
            became: Mutex::new(None),
            skew_ppm,
            floor,
            applied,
        }
    }

    /// The cluster time of the last applied entry: what a read on this
    /// node sees at least.
    pub fn applied(&self) -> ClusterTime {
        self.applied.applied_time()
    }

    pub fn floor(&self) -> &Arc<TimeFloor> {
        &self.floor
    }

    fn mono(&self) -> Duration {
        // CANARY (planted in a `canaries` build, `canary::on`): leases run on
        // the wall clock, so a clock step ends them early.
        if fenced_core::canary::on(fenced_core::canary::Canary::WallClockExpiry) {
            return std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap_or_default();
        }
        self.started.elapsed()
    }

    /// The stamp of term `term`: cluster time now, never below the last
    /// applied entry's, if this node's clock is running for `term`. Every
    /// command, tick and leader read is stamped here.
    pub fn stamp(&self, term: u64) -> Option<ClusterTime> {
        let applied = self.applied();
        let mut guard = self.clock.lock().unwrap_or_else(PoisonError::into_inner);
        let (t, clock) = guard.as_mut()?;
        if *t != term {
            return None;
        }
        clock.observe(applied);
        let now = clock.now(self.mono());
        self.floor.raise(LeaderTime::new(term, now));
        Some(now)
    }

    /// Cluster time now if this node's clock runs for `term`, else the
    /// highest leader time it knows: what a Raft message it sends carries.
    pub fn for_message(&self, term: u64) -> LeaderTime {
        let mut guard = self.clock.lock().unwrap_or_else(PoisonError::into_inner);
        match guard.as_mut() {
            Some((t, clock)) if *t == term => {
                let now = LeaderTime::new(term, clock.now(self.mono()));
                self.floor.raise(now);
                now
            }
            _ => self.floor.leader_time(),
        }
    }

    /// [`ClusterClock::stamp`] for `term`, or, while this node's clock does
    /// not run (it is not leader, or its clock starts), the latest time it
    /// knows. Never below a time this node revealed before.
    pub fn stamp_or_floor(&self, term: u64) -> ClusterTime {
        self.for_read(term).0
    }

    /// [`ClusterClock::stamp_or_floor`], and the leader time to make
    /// durable before a read reveals it (an applied stamp needs none: every
    /// later leader applies its entry before its clock starts).
    pub fn for_read(&self, term: u64) -> (ClusterTime, LeaderTime) {
        match self.stamp(term) {
            Some(now) => (now, LeaderTime::new(term, now)),
            None => {
                let floor = self.floor.leader_time();
                (self.applied().max(floor.at), floor)
            }
        }
    }

    /// Notes the moment this node became leader for `term` (the first time
    /// it is told, per term).
    pub(crate) fn became_leader(&self, term: u64) {
        let mut became = self.became.lock().unwrap_or_else(PoisonError::into_inner);
        if became.map(|(t, _)| t) != Some(term) {
            *became = Some((term, self.mono()));
        }
    }

    /// Starts the clock for `term` from the highest of the last applied
    /// cluster time and the floor (`LeaderClock::take_over`), as of the
    /// moment this node became leader: time spent applying the previous
    /// term's entries counts, so no lease is lengthened by more than the
    /// last heartbeat interval and the election. Returns the start and the
    /// applied time it started from.
    ///
    /// A clock already running for `term` is left as it runs: several
    /// callers may start the clock of a new term at once (the leader watch,
    /// the proposer, a read), and a second start would begin again from a
    /// floor the first clock's stamps raised, counting the time since the
    /// node became leader twice and running cluster time ahead.
    pub(crate) fn start(&self, term: u64) -> (ClusterTime, ClusterTime) {
        let applied = self.applied();
        let mut running = self.clock.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((t, clock)) = running.as_mut() {
            if *t == term {
                clock.observe(applied);
                return (clock.now(self.mono()), applied);
            }
        }
        let became = *self.became.lock().unwrap_or_else(PoisonError::into_inner);
        let started = match became {
            Some((t, at)) if t == term => at,
            _ => self.mono(),
        };
        // CANARY (planted in a `canaries` build, `canary::on`): the clock
        // starts from the last entry's stamp alone, so an idle cluster's time
        // runs back at a leader change.
        let seen = if fenced_core::canary::on(fenced_core::canary::Canary::ClockFromLastStamp) {
            ClusterTime::ZERO
        } else {
            self.floor.get()
        };
        let mut clock = LeaderClock::take_over(applied, seen, started).with_skew_ppm(self.skew_ppm);
        let base = clock.now(started);
        *running = Some((term, clock));
        (base, applied)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicU64, Ordering};

    use super::*;

    /// An applied time a test sets.
    #[derive(Default)]
    struct Applied(AtomicU64);

    impl AppliedTime for Applied {
        fn applied_time(&self) -> ClusterTime {
            ClusterTime::from_millis(self.0.load(Ordering::SeqCst))
        }
    }

    fn clock() -> (ClusterClock, Arc<Applied>) {
        let applied = Arc::new(Applied::default());
        let floor = Arc::new(TimeFloor::in_memory());
        let c = ClusterClock::new(0, floor, Arc::clone(&applied) as Arc<dyn AppliedTime>);
        (c, applied)
    }

    #[test]
    fn only_the_term_whose_clock_started_is_stamped() {
        let (c, applied) = clock();
        applied.0.store(5_000, Ordering::SeqCst);
        assert_eq!(c.stamp(3), None, "no clock yet");
        assert_eq!(
            c.stamp_or_floor(3),
            ClusterTime::from_millis(5_000),
            "the applied time while no clock runs"
        );
        c.became_leader(3);
        let (base, from) = c.start(3);
        assert_eq!(from, ClusterTime::from_millis(5_000));
        assert!(base >= from, "starts at or above the applied time");
        let stamp = c.stamp(3).unwrap_or(ClusterTime::ZERO);
        assert!(stamp >= base);
        assert_eq!(c.stamp(4), None, "another term");
        assert!(c.floor().get() >= stamp, "every stamp raises the floor");
        assert_eq!(c.for_message(4), c.floor().leader_time());
        assert_eq!(c.for_message(3).term, 3);
    }

    #[test]
    fn a_stamp_never_falls_below_the_applied_time_nor_a_stamp_before_it() {
        let (c, applied) = clock();
        c.start(1);
        let first = c.stamp(1).unwrap_or(ClusterTime::ZERO);
        applied
            .0
            .store(first.as_millis() + 60_000, Ordering::SeqCst);
        let second = c.stamp(1).unwrap_or(ClusterTime::ZERO);
        assert!(
            second.as_millis() >= first.as_millis() + 60_000,
            "{second:?}"
        );
        applied.0.store(0, Ordering::SeqCst);
        assert!(c.stamp(1).unwrap_or(ClusterTime::ZERO) >= second);
    }

    #[test]
    fn a_clock_starts_from_the_floor_when_it_is_ahead() {
        let (c, _) = clock();
        c.floor()
            .raise(LeaderTime::new(1, ClusterTime::from_millis(90_000)));
        let (base, from) = c.start(2);
        assert_eq!(from, ClusterTime::ZERO);
        assert!(base >= ClusterTime::from_millis(90_000), "{base:?}");
    }

    /// Found by the simulation (fenced-sim seed 24): the leader watch and
    /// a read both started the clock of a new term; the second start took
    /// the floor the first clock's stamps had raised and added the time
    /// since the node became leader again, so cluster time jumped ahead.
    #[tokio::test(start_paused = true)]
    async fn starting_a_running_terms_clock_again_leaves_it_running() {
        let (c, _) = clock();
        c.became_leader(7);
        c.start(7);
        tokio::time::advance(Duration::from_millis(500)).await;
        let before = c.stamp(7).unwrap_or(ClusterTime::ZERO);
        let (again, _) = c.start(7);
        let after = c.stamp(7).unwrap_or(ClusterTime::ZERO);
        assert!(again >= before, "{again:?} < {before:?}");
        assert!(
            after.as_millis() <= before.as_millis() + 2,
            "the second start moved the clock from {before:?} to {after:?}"
        );
    }

    /// The floor holds a later time of term 1 (its leader paused past the
    /// election and woke with its clock run on) and the time of term 2's
    /// leader: the next clock starts from term 2's.
    #[test]
    fn a_clock_starts_from_the_newest_terms_time_not_an_older_terms_later_one() {
        let (c, _) = clock();
        c.floor()
            .raise(LeaderTime::new(2, ClusterTime::from_millis(5_000)));
        c.floor()
            .raise(LeaderTime::new(1, ClusterTime::from_millis(9_000)));
        let (base, _) = c.start(3);
        assert!(base >= ClusterTime::from_millis(5_000), "{base:?}");
        assert!(base < ClusterTime::from_millis(9_000), "{base:?}");
    }
}
