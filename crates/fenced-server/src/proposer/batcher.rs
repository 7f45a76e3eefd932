//! What goes into the next log entry, decided without a runtime, a clock or
//! I/O: the proposer's loop (`super::run`) only moves proposals to and from
//! here.
//!
//! Architecture invariant: every proposal handed to [`Batcher::fill`] comes
//! back exactly once, in arrival order, in a batch or as the one carried to
//! the next.

use std::time::Instant;

use fenced_core::Command;

/// What the batcher reads of a queued proposal.
pub(crate) trait Queued {
    /// Bytes of fenced-store keys and values it adds to an entry.
    fn kv_bytes(&self) -> usize;
    /// When its caller stops waiting; `None` for the leader's own.
    fn deadline(&self) -> Option<Instant>;
}

/// How big one entry may grow.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// Most proposals in one entry (0 counts as 1).
    pub max_batch: usize,
    /// Most fenced-store bytes in one entry; one proposal above it still
    /// goes alone (the largest put always fits).
    pub max_kv_bytes: usize,
}

/// Cuts the queue into entries.
pub(crate) struct Batcher<P> {
    limits: Limits,
    /// The proposal that would have taken the last batch past
    /// `max_kv_bytes`: it opens the next one.
    carried: Option<P>,
}

impl<P: Queued> Batcher<P> {
    pub(crate) fn new(limits: Limits) -> Batcher<P> {
        Batcher {
            limits,
            carried: None,
        }
    }

    /// The proposal carried over from the last batch, if any: it opens the
    /// next batch, before anything still queued.
    pub(crate) fn take_carried(&mut self) -> Option<P> {
        self.carried.take()
    }

    /// The next batch: `first`, then what `more` hands over without waiting,
    /// while it fits. The first proposal that does not fit by its bytes is
    /// kept for the next batch ([`Batcher::take_carried`]); `more` is not
    /// asked again after it.
    pub(crate) fn fill(&mut self, first: P, mut more: impl FnMut() -> Option<P>) -> Vec<P> {
        debug_assert!(self.carried.is_none(), "the carried proposal goes first");
        let max_batch = self.limits.max_batch.max(1);
        let mut kv_bytes = first.kv_bytes();
        let mut batch = vec![first];
        while batch.len() < max_batch {
            let Some(p) = more() else {
                break;
            };
            let with = kv_bytes.saturating_add(p.kv_bytes());
            if with > self.limits.max_kv_bytes {
                self.carried = Some(p);
                break;
            }
            kv_bytes = with;
            batch.push(p);
        }
        batch
    }
}

/// Splits off the proposals whose callers stopped waiting by `now` (a
/// deadline at `now` has passed): a caller that gave up may have retried
/// elsewhere, and proposing its command could grant a lease nobody uses.
/// Returns (expired, to propose), each in arrival order.
pub(crate) fn split_expired<P: Queued>(batch: Vec<P>, now: Instant) -> (Vec<P>, Vec<P>) {
    batch
        .into_iter()
        .partition(|p| p.deadline().is_some_and(|d| d <= now))
}

/// Sets every wall-clock anchor of an entry to `unix_ms`, the leader's wall
/// clock read at the entry's stamp, not when the anchor was queued.
pub(crate) fn stamp_wall_anchors(commands: &mut [Command], unix_ms: u64) {
    for c in commands {
        if let Command::WallClock { unix_ms: at } = c {
            *at = unix_ms;
        }
    }
}

/// Puts a wall-clock anchor first in an entry that carries a client's
/// command when the table has no anchor near the leader's clock
/// (`needs_anchor`) and the entry none of its own: the first grants of a
/// new cluster are dated like every later one instead of waiting for the
/// ticker's anchor. Returns whether it did (the caller's replies shift).
pub(crate) fn anchor_first(commands: &mut Vec<Command>, needs_anchor: bool, unix_ms: u64) -> bool {
    let has_anchor = commands.iter().any(Command::is_leaders_own);
    let from_a_client = commands.iter().any(|c| !c.is_leaders_own());
    if !needs_anchor || has_anchor || !from_a_client {
        return false;
    }
    commands.insert(0, Command::WallClock { unix_ms });
    true
}

/// Clients' commands in an entry, the leader's own anchors aside: the
/// batch-size histogram counts these.
pub(crate) fn from_clients(commands: &[Command]) -> usize {
    commands.iter().filter(|c| !c.is_leaders_own()).count()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::time::Duration;

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone, PartialEq)]
    struct P {
        id: usize,
        kv: usize,
        deadline_ms: Option<u64>,
    }

    fn base() -> Instant {
        // One fixed instant for a whole test; only differences matter.
        thread_local!(static BASE: Instant = Instant::now());
        BASE.with(|b| *b)
    }

    impl Queued for P {
        fn kv_bytes(&self) -> usize {
            self.kv
        }
        fn deadline(&self) -> Option<Instant> {
            self.deadline_ms
                .map(|ms| base() + Duration::from_millis(ms))
        }
    }

    fn p(id: usize, kv: usize) -> P {
        P {
            id,
            kv,
            deadline_ms: None,
        }
    }

    /// Runs the batcher as the proposer's loop does, over a queue that is
    /// all there at once.
    fn batches(limits: Limits, queue: Vec<P>) -> Vec<Vec<P>> {
        let mut batcher = Batcher::new(limits);
        let mut queue = queue.into_iter();
        let mut out = Vec::new();
        loop {
            let Some(first) = batcher.take_carried().or_else(|| queue.next()) else {
                return out;
            };
            out.push(batcher.fill(first, || queue.next()));
        }
    }

    const LIMITS: Limits = Limits {
        max_batch: 3,
        max_kv_bytes: 100,
    };

    #[test]
    fn a_batch_stops_at_max_batch_and_the_rest_waits_in_order() {
        let got = batches(LIMITS, (0..7).map(|i| p(i, 0)).collect());
        let ids: Vec<Vec<usize>> = got
            .iter()
            .map(|b| b.iter().map(|p| p.id).collect())
            .collect();
        assert_eq!(ids, vec![vec![0, 1, 2], vec![3, 4, 5], vec![6]]);
    }

    #[test]
    fn a_proposal_past_the_byte_bound_opens_the_next_batch() {
        let got = batches(LIMITS, vec![p(0, 60), p(1, 41), p(2, 10)]);
        let ids: Vec<Vec<usize>> = got
            .iter()
            .map(|b| b.iter().map(|p| p.id).collect())
            .collect();
        assert_eq!(ids, vec![vec![0], vec![1, 2]]);
    }

    #[test]
    fn one_proposal_above_the_byte_bound_goes_alone() {
        let got = batches(LIMITS, vec![p(0, 500), p(1, 1)]);
        assert_eq!(got, vec![vec![p(0, 500)], vec![p(1, 1)]]);
    }

    #[test]
    fn max_batch_zero_still_moves_one_at_a_time() {
        let limits = Limits {
            max_batch: 0,
            max_kv_bytes: 100,
        };
        assert_eq!(batches(limits, vec![p(0, 0), p(1, 0)]).len(), 2);
    }

    #[test]
    fn bytes_at_the_bound_fit() {
        let got = batches(LIMITS, vec![p(0, 50), p(1, 50)]);
        assert_eq!(got.len(), 1);
    }

    #[test]
    fn a_deadline_at_now_has_passed() {
        let at = |ms| P {
            id: ms as usize,
            kv: 0,
            deadline_ms: Some(ms),
        };
        let batch = vec![at(5), p(99, 0), at(10), at(11)];
        let (expired, live) = split_expired(batch, base() + Duration::from_millis(10));
        assert_eq!(expired, vec![at(5), at(10)]);
        assert_eq!(live, vec![p(99, 0), at(11)]);
    }

    #[test]
    fn anchors_are_stamped_and_not_counted_as_clients() {
        let mut commands = vec![
            Command::WallClock { unix_ms: 1 },
            Command::WallClock { unix_ms: 2 },
        ];
        stamp_wall_anchors(&mut commands, 1_700_000_000_000);
        assert!(commands
            .iter()
            .all(|c| matches!(c, Command::WallClock { unix_ms } if *unix_ms == 1_700_000_000_000)));
        assert_eq!(from_clients(&commands), 0);
    }

    fn release() -> Command {
        Command::Release {
            resource: fenced_core::ResourceName::new("statement:1").unwrap(),
            owner_id: fenced_core::OwnerId::random(),
            token: fenced_core::Token::new(1).unwrap(),
        }
    }

    #[test]
    fn a_clients_entry_gets_an_anchor_first_only_when_the_table_needs_one() {
        let mut commands = vec![release()];
        assert!(anchor_first(&mut commands, true, 7));
        assert_eq!(commands[0], Command::WallClock { unix_ms: 7 });
        assert_eq!(commands.len(), 2);
        assert_eq!(from_clients(&commands), 1);

        let mut not_needed = vec![release()];
        assert!(!anchor_first(&mut not_needed, false, 7));
        assert_eq!(not_needed.len(), 1);

        let mut own_anchor = vec![release(), Command::WallClock { unix_ms: 1 }];
        assert!(
            !anchor_first(&mut own_anchor, true, 7),
            "one anchor an entry"
        );
        let mut only_anchor = vec![Command::WallClock { unix_ms: 1 }];
        assert!(!anchor_first(&mut only_anchor, true, 7));
        let mut empty = Vec::new();
        assert!(!anchor_first(&mut empty, true, 7), "a tick stays a tick");
    }

    proptest! {
        /// Every proposal comes out once, in order; no batch is over either
        /// bound (one oversized proposal alone aside); and a batch is cut
        /// only when the next proposal would not fit.
        #[test]
        fn batches_keep_order_respect_bounds_and_are_full(
            kvs in proptest::collection::vec(0usize..80, 0..60),
            max_batch in 0usize..6,
            max_kv_bytes in 1usize..150,
        ) {
            let limits = Limits { max_batch, max_kv_bytes };
            let queue: Vec<P> = kvs.iter().enumerate().map(|(i, kv)| p(i, *kv)).collect();
            let got = batches(limits, queue.clone());
            let flat: Vec<P> = got.iter().flatten().cloned().collect();
            prop_assert_eq!(&flat, &queue);
            let cap = max_batch.max(1);
            for (i, b) in got.iter().enumerate() {
                prop_assert!(!b.is_empty());
                prop_assert!(b.len() <= cap);
                let bytes: usize = b.iter().map(|p| p.kv).sum();
                prop_assert!(bytes <= max_kv_bytes || b.len() == 1, "{:?}", b);
                if let Some(next) = got.get(i + 1) {
                    prop_assert!(
                        b.len() == cap || bytes + next[0].kv > max_kv_bytes,
                        "cut early: {:?} then {:?}", b, next
                    );
                }
            }
        }
    }
}
