//! Wall-clock times for people: the date and time of a grant, a renewal or
//! an end as the leader's wall clock read it, for audits and screens. Never
//! used to decide anything: leases run on cluster time.
//!
//! The leader records an anchor, a (cluster time, wall time) pair, in the
//! log whenever its wall clock and the anchors disagree by more than
//! [`WALL_ANCHOR_DRIFT_MS`] (always once in a new cluster). Any cluster time
//! maps to a wall time from the last anchor at or before it; anchors are
//! only ever appended at later cluster times, so a time once shown for an
//! event never changes, and every node shows the same.

use std::collections::VecDeque;

use serde::{Deserialize, Serialize};

use crate::{ClusterTime, InvalidArgument};

/// The latest wall time accepted: 9999-12-31T23:59:59.999Z, the last one
/// RFC 3339 can write.
pub const MAX_UNIX_MS: u64 = 253_402_300_799_999;

/// How far the leader's wall clock may drift from the anchors before it
/// records a new one: how exact a shown time is.
pub const WALL_ANCHOR_DRIFT_MS: u64 = 250;

/// The most anchors kept. A new one comes only with a leader change or a
/// clock correction of a quarter second, so this covers years; a time older
/// than the oldest anchor is counted back from it.
pub const MAX_WALL_ANCHORS: usize = 1024;

/// The leader's wall clock (milliseconds since the Unix epoch) at a cluster
/// time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct WallAnchor {
    pub at: ClusterTime,
    pub unix_ms: u64,
}

/// A wall time from a command: at most [`MAX_UNIX_MS`].
pub fn check_unix_ms(unix_ms: u64) -> Result<u64, InvalidArgument> {
    if unix_ms > MAX_UNIX_MS {
        return Err(InvalidArgument::new(
            "unix_ms",
            format!("must be at most {MAX_UNIX_MS} (the year 9999), got {unix_ms}"),
        ));
    }
    Ok(unix_ms)
}

/// The anchors, oldest first, in increasing cluster time.
///
/// ```
/// use fenced_core::{ClusterTime, WallClock};
/// let mut wall = WallClock::default();
/// assert_eq!(wall.unix_ms_at(ClusterTime::from_millis(10)), None);
/// wall.record(ClusterTime::from_millis(1_000), 1_800_000_000_000);
/// assert_eq!(wall.unix_ms_at(ClusterTime::from_millis(1_500)), Some(1_800_000_000_500));
/// ```
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WallClock {
    anchors: VecDeque<WallAnchor>,
}

impl WallClock {
    /// Records the leader's wall clock at `at`, the cluster time of the
    /// entry that carries it (never earlier than the last anchor's: the
    /// table's time only moves forward). A second anchor at the same time
    /// replaces the first.
    pub fn record(&mut self, at: ClusterTime, unix_ms: u64) {
        let unix_ms = unix_ms.min(MAX_UNIX_MS);
        if let Some(last) = self.anchors.back_mut() {
            if last.at >= at {
                last.unix_ms = unix_ms;
                return;
            }
        }
        self.anchors.push_back(WallAnchor { at, unix_ms });
        while self.anchors.len() > MAX_WALL_ANCHORS {
            self.anchors.pop_front();
        }
    }

    /// The wall time at cluster time `t`: from the last anchor at or before
    /// it, or counted back from the oldest anchor; `None` before any anchor.
    pub fn unix_ms_at(&self, t: ClusterTime) -> Option<u64> {
        let after = self.anchors.partition_point(|a| a.at <= t);
        match after.checked_sub(1).and_then(|i| self.anchors.get(i)) {
            Some(a) => Some(
                a.unix_ms
                    .saturating_add(t.millis_since(a.at))
                    .min(MAX_UNIX_MS),
            ),
            None => self
                .anchors
                .front()
                .map(|a| a.unix_ms.saturating_sub(a.at.millis_since(t))),
        }
    }

    /// Whether the leader, whose wall clock reads `unix_ms` at cluster time
    /// `at`, should record a new anchor.
    pub fn needs_anchor(&self, at: ClusterTime, unix_ms: u64) -> bool {
        self.unix_ms_at(at)
            .is_none_or(|shown| shown.abs_diff(unix_ms) > WALL_ANCHOR_DRIFT_MS)
    }

    /// The anchors, for a snapshot.
    pub fn anchors(&self) -> impl ExactSizeIterator<Item = &WallAnchor> {
        self.anchors.iter()
    }

    /// Anchors read from a snapshot: at most [`MAX_WALL_ANCHORS`], in
    /// strictly increasing cluster time, each at most [`MAX_UNIX_MS`].
    pub fn from_stored(anchors: Vec<WallAnchor>) -> Result<Self, String> {
        if anchors.len() > MAX_WALL_ANCHORS {
            return Err(format!(
                "{} wall-clock anchors, bound {MAX_WALL_ANCHORS}",
                anchors.len()
            ));
        }
        if anchors.windows(2).any(|w| w[0].at >= w[1].at) {
            return Err("wall-clock anchors out of order".into());
        }
        if let Some(a) = anchors.iter().find(|a| a.unix_ms > MAX_UNIX_MS) {
            return Err(format!(
                "wall-clock anchor {} above the bound {MAX_UNIX_MS}",
                a.unix_ms
            ));
        }
        Ok(Self {
            anchors: anchors.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn t(ms: u64) -> ClusterTime {
        ClusterTime::from_millis(ms)
    }

    #[test]
    fn a_time_once_shown_does_not_change_when_a_later_anchor_comes() {
        let mut wall = WallClock::default();
        wall.record(t(1_000), 1_000_000);
        let before = wall.unix_ms_at(t(5_000));
        // The leader's clock was stepped back two seconds at 9 s.
        wall.record(t(9_000), 1_006_000);
        assert_eq!(wall.unix_ms_at(t(5_000)), before);
        assert_eq!(wall.unix_ms_at(t(5_000)), Some(1_004_000));
        assert_eq!(wall.unix_ms_at(t(9_500)), Some(1_006_500));
    }

    #[test]
    fn a_time_before_the_first_anchor_counts_back_from_it() {
        let mut wall = WallClock::default();
        wall.record(t(10_000), 1_000_000);
        assert_eq!(wall.unix_ms_at(t(4_000)), Some(994_000));
        let mut early = WallClock::default();
        early.record(t(10_000), 3);
        assert_eq!(early.unix_ms_at(t(0)), Some(0), "saturates at the epoch");
    }

    #[test]
    fn an_anchor_is_needed_first_and_then_only_past_the_drift() {
        let mut wall = WallClock::default();
        assert!(wall.needs_anchor(t(0), 5));
        wall.record(t(0), 1_000_000);
        assert!(!wall.needs_anchor(t(60_000), 1_060_000 + WALL_ANCHOR_DRIFT_MS));
        assert!(!wall.needs_anchor(t(60_000), 1_060_000 - WALL_ANCHOR_DRIFT_MS));
        assert!(wall.needs_anchor(t(60_000), 1_060_000 + WALL_ANCHOR_DRIFT_MS + 1));
        assert!(wall.needs_anchor(t(60_000), 1_059_000));
    }

    #[test]
    fn anchors_are_bounded_and_same_time_anchors_replace() {
        let mut wall = WallClock::default();
        wall.record(t(5), 100);
        wall.record(t(5), 200);
        assert_eq!(wall.anchors().len(), 1);
        assert_eq!(wall.unix_ms_at(t(5)), Some(200));
        for i in 0..(MAX_WALL_ANCHORS as u64 + 10) {
            wall.record(t(10 + i), 1_000 + i * 1_000);
        }
        assert_eq!(wall.anchors().len(), MAX_WALL_ANCHORS);
        assert_eq!(wall.anchors().next().unwrap().at, t(20));
    }

    #[test]
    fn stored_anchors_are_checked() {
        let a = |at, unix_ms| WallAnchor { at: t(at), unix_ms };
        assert!(WallClock::from_stored(vec![a(1, 5), a(2, 6)]).is_ok());
        assert!(WallClock::from_stored(vec![a(2, 5), a(2, 6)])
            .unwrap_err()
            .contains("out of order"));
        assert!(WallClock::from_stored(vec![a(1, MAX_UNIX_MS + 1)])
            .unwrap_err()
            .contains("bound"));
        let many = (0..=MAX_WALL_ANCHORS as u64).map(|i| a(i, i)).collect();
        assert!(WallClock::from_stored(many).unwrap_err().contains("bound"));
        assert_eq!(check_unix_ms(MAX_UNIX_MS), Ok(MAX_UNIX_MS));
        assert!(check_unix_ms(MAX_UNIX_MS + 1)
            .unwrap_err()
            .to_string()
            .contains("unix_ms"));
    }

    #[test]
    fn a_wall_time_never_passes_the_bound() {
        let mut wall = WallClock::default();
        wall.record(t(0), MAX_UNIX_MS - 1);
        assert_eq!(wall.unix_ms_at(t(1_000)), Some(MAX_UNIX_MS));
    }
}
