//! Every guarantee of docs/DESIGN.md §2 that the lease table alone can prove,
//! told as the article's scenarios.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use fenced_core::*;

const TTL: u64 = 30_000;

fn name(s: &str) -> ResourceName {
    ResourceName::new(s).unwrap()
}

fn at(ms: u64) -> ClusterTime {
    ClusterTime::from_millis(ms)
}

fn acquire(res: &str, owner: OwnerId) -> Command {
    Command::Acquire {
        resource: name(res),
        owner_id: owner,
        ttl_ms: TTL,
        wait_ms: 0,
    }
}

fn acquire_waiting(res: &str, owner: OwnerId, wait_ms: u64) -> Command {
    Command::Acquire {
        resource: name(res),
        owner_id: owner,
        ttl_ms: TTL,
        wait_ms,
    }
}

fn renew(res: &str, owner: OwnerId, token: Token) -> Command {
    Command::Renew {
        resource: name(res),
        owner_id: owner,
        token,
        ttl_ms: TTL,
    }
}

fn release(res: &str, owner: OwnerId, token: Token) -> Command {
    Command::Release {
        resource: name(res),
        owner_id: owner,
        token,
    }
}

fn one(table: &mut LeaseTable, ms: u64, command: Command) -> Outcome {
    let applied = table.apply(&Batch {
        stamp: at(ms),
        commands: vec![command],
    });
    table.check_invariants().unwrap();
    applied.outcomes.into_iter().next().unwrap()
}

fn granted(outcome: Outcome) -> Grant {
    match outcome {
        Outcome::Acquire(AcquireOutcome::Granted(g)) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

const RES: &str = "statement:account-1842:2026-07";

#[test]
fn tokens_strictly_increase_across_release_and_reacquire() {
    let mut t = LeaseTable::new();
    let mut last = 0;
    for i in 0..20 {
        let owner = OwnerId::random();
        let g = granted(one(&mut t, i * 10, acquire(RES, owner)));
        assert!(g.token.get() > last, "token {} after {last}", g.token);
        last = g.token.get();
        assert_eq!(
            one(&mut t, i * 10 + 1, release(RES, owner, g.token)),
            Outcome::Release(ReleaseOutcome::Released)
        );
    }
}

#[test]
fn tokens_strictly_increase_across_expiry() {
    let mut t = LeaseTable::new();
    let a = granted(one(&mut t, 0, acquire(RES, OwnerId::random())));
    let b = granted(one(&mut t, TTL, acquire(RES, OwnerId::random())));
    let c = granted(one(&mut t, 3 * TTL, acquire(RES, OwnerId::random())));
    assert!(a.token < b.token && b.token < c.token);
}

#[test]
fn first_grant_gets_token_one_or_more() {
    let mut t = LeaseTable::new();
    let g = granted(one(&mut t, 0, acquire(RES, OwnerId::random())));
    assert!(g.token.get() >= 1);
}

#[test]
fn tokens_continue_upward_after_a_snapshot_round_trip() {
    let mut t = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(&mut t, 0, acquire(RES, owner)));
    one(&mut t, 1, release(RES, owner, g.token));
    let mut restored = LeaseTable::from_snapshot(t.snapshot()).unwrap();
    assert_eq!(restored.snapshot(), t.snapshot());
    let next = granted(one(&mut restored, 2, acquire(RES, OwnerId::random())));
    assert!(next.token > g.token);
}

#[test]
fn a_forgotten_resource_still_gets_a_higher_token() {
    let mut t = LeaseTable::with_max_idle(2);
    let owner = OwnerId::random();
    let first = granted(one(&mut t, 0, acquire(RES, owner)));
    one(&mut t, 1, release(RES, owner, first.token));
    // Three more idle resources push RES out of memory.
    for (i, other) in ["a", "b", "c"].iter().enumerate() {
        let o = OwnerId::random();
        let g = granted(one(&mut t, 2 + i as u64, acquire(other, o)));
        one(&mut t, 2 + i as u64, release(other, o, g.token));
    }
    assert_eq!(t.resources(), 2, "the idle bound holds");
    assert_eq!(
        t.describe(RES, at(10)).last_token,
        None,
        "RES was forgotten"
    );
    let again = granted(one(&mut t, 10, acquire(RES, OwnerId::random())));
    assert!(again.token > first.token);
}

#[test]
fn idle_records_never_exceed_the_bound() {
    let mut t = LeaseTable::new();
    let mut commands = Vec::new();
    for i in 0..(MAX_IDLE_RECORDS + 50) {
        commands.push(acquire(&format!("r{i}"), OwnerId::random()));
    }
    t.apply(&Batch {
        stamp: at(0),
        commands,
    });
    assert_eq!(t.live_leases(), MAX_IDLE_RECORDS + 50);
    // Let them all expire: all become idle and the oldest are forgotten.
    t.apply(&Batch {
        stamp: at(TTL),
        commands: vec![],
    });
    assert_eq!(t.live_leases(), 0);
    assert_eq!(t.resources(), MAX_IDLE_RECORDS);
    t.check_invariants().unwrap();
}

#[test]
fn a_second_owner_is_refused_while_the_lease_runs() {
    let mut t = LeaseTable::new();
    let g = granted(one(&mut t, 0, acquire(RES, OwnerId::random())));
    let out = one(&mut t, TTL - 1, acquire(RES, OwnerId::random()));
    assert_eq!(
        out,
        Outcome::Acquire(AcquireOutcome::Held {
            current_token: g.token,
            remaining_ms: 1
        })
    );
}

#[test]
fn a_lease_ends_exactly_at_its_expiry() {
    let mut t = LeaseTable::new();
    granted(one(&mut t, 100, acquire(RES, OwnerId::random())));
    assert!(t.describe(RES, at(100 + TTL - 1)).held);
    assert!(!t.describe(RES, at(100 + TTL)).held);
    granted(one(&mut t, 100 + TTL, acquire(RES, OwnerId::random())));
}

#[test]
fn concurrent_first_time_acquisitions_grant_exactly_one() {
    let mut t = LeaseTable::new();
    let commands = (0..50).map(|_| acquire(RES, OwnerId::random())).collect();
    let applied = t.apply(&Batch {
        stamp: at(0),
        commands,
    });
    let grants = applied
        .outcomes
        .iter()
        .filter(|o| matches!(o, Outcome::Acquire(AcquireOutcome::Granted(_))))
        .count();
    assert_eq!(grants, 1);
    assert_eq!(t.resources(), 1);
}

#[test]
fn renew_keeps_the_token_and_extends_from_now() {
    let mut t = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(&mut t, 0, acquire(RES, owner)));
    for i in 1..10 {
        let now = i * (TTL / 2);
        let out = one(&mut t, now, renew(RES, owner, g.token));
        assert_eq!(
            out,
            Outcome::Renew(RenewOutcome::Renewed {
                expires_at: at(now + TTL),
                ttl_ms: TTL
            })
        );
        assert_eq!(t.holder(RES).unwrap().1.token, g.token);
    }
}

#[test]
fn renewing_an_expired_lease_fails_and_does_not_revive_it() {
    let mut t = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(&mut t, 0, acquire(RES, owner)));
    assert_eq!(
        one(&mut t, TTL, renew(RES, owner, g.token)),
        Outcome::Renew(RenewOutcome::Lost(LostReason::Expired))
    );
    assert!(!t.describe(RES, at(TTL)).held);
    // Still not revived by a second try.
    assert_eq!(
        one(&mut t, TTL + 1, renew(RES, owner, g.token)),
        Outcome::Renew(RenewOutcome::Lost(LostReason::Expired))
    );
    granted(one(&mut t, TTL + 2, acquire(RES, OwnerId::random())));
}

#[test]
fn renewing_a_released_lease_fails() {
    let mut t = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(&mut t, 0, acquire(RES, owner)));
    one(&mut t, 1, release(RES, owner, g.token));
    assert_eq!(
        one(&mut t, 2, renew(RES, owner, g.token)),
        Outcome::Renew(RenewOutcome::Lost(LostReason::Released))
    );
    assert!(!t.describe(RES, at(2)).held);
}

#[test]
fn a_superseded_owner_cannot_renew_and_learns_the_current_token() {
    let mut t = LeaseTable::new();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let ga = granted(one(&mut t, 0, acquire(RES, a)));
    let gb = granted(one(&mut t, TTL, acquire(RES, b)));
    // A's lease ended by expiry, which is what it is told first.
    assert_eq!(
        one(&mut t, TTL + 1, renew(RES, a, ga.token)),
        Outcome::Renew(RenewOutcome::Lost(LostReason::Expired))
    );
    // After B's lease also ends, A is told the newer token exists.
    one(&mut t, TTL + 2, release(RES, b, gb.token));
    assert_eq!(
        one(&mut t, TTL + 3, renew(RES, a, ga.token)),
        Outcome::Renew(RenewOutcome::Lost(LostReason::Superseded {
            current_token: gb.token
        }))
    );
}

#[test]
fn the_right_token_with_the_wrong_owner_changes_nothing() {
    let mut t = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(&mut t, 0, acquire(RES, owner)));
    let before = t.snapshot();
    let thief = OwnerId::random();
    assert_eq!(
        one(&mut t, 0, renew(RES, thief, g.token)),
        Outcome::Renew(RenewOutcome::Lost(LostReason::Unknown))
    );
    assert_eq!(
        one(&mut t, 0, release(RES, thief, g.token)),
        Outcome::Release(ReleaseOutcome::NotHolder(LostReason::Unknown))
    );
    assert_eq!(t.snapshot(), before);
}

#[test]
fn the_right_owner_with_the_wrong_token_changes_nothing() {
    let mut t = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(&mut t, 0, acquire(RES, owner)));
    let before = t.snapshot();
    let wrong = Token::new(g.token.get() + 1).unwrap();
    assert_eq!(
        one(&mut t, 0, renew(RES, owner, wrong)),
        Outcome::Renew(RenewOutcome::Lost(LostReason::Unknown))
    );
    assert_eq!(
        one(&mut t, 0, release(RES, owner, wrong)),
        Outcome::Release(ReleaseOutcome::NotHolder(LostReason::Unknown))
    );
    assert_eq!(t.snapshot(), before);
}

#[test]
fn an_old_owner_cannot_release_a_later_lease() {
    let mut t = LeaseTable::new();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let ga = granted(one(&mut t, 0, acquire(RES, a)));
    let gb = granted(one(&mut t, TTL, acquire(RES, b)));
    let before = t.snapshot();
    assert_eq!(
        one(&mut t, TTL, release(RES, a, ga.token)),
        Outcome::Release(ReleaseOutcome::NotHolder(LostReason::Expired))
    );
    assert_eq!(t.snapshot(), before);
    assert_eq!(t.holder(RES), Some((b, gb)));
}

#[test]
fn a_retried_release_after_a_lost_reply_says_released() {
    let mut t = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(&mut t, 0, acquire(RES, owner)));
    assert_eq!(
        one(&mut t, 1, release(RES, owner, g.token)),
        Outcome::Release(ReleaseOutcome::Released)
    );
    assert_eq!(
        one(&mut t, 2, release(RES, owner, g.token)),
        Outcome::Release(ReleaseOutcome::Released)
    );
}

#[test]
fn acquire_retried_with_the_same_owner_returns_the_same_grant() {
    let mut t = LeaseTable::new();
    let owner = OwnerId::random();
    let first = granted(one(&mut t, 0, acquire(RES, owner)));
    let retry = granted(one(&mut t, 500, acquire(RES, owner)));
    assert_eq!(retry.token, first.token);
    // The lease runs at least a full TTL from the retry.
    assert_eq!(retry.expires_at, at(500 + TTL));
    assert_eq!(t.last_token(), Some(first.token), "no second token issued");
}

#[test]
fn an_acquire_after_its_own_release_is_answered_released_not_granted() {
    // The scenario of a request held up on the way (a paused node, a slow
    // retry): the caller acquired with the same owner id elsewhere, worked
    // and released; the stale copy must not grant a lease to nobody.
    let mut t = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(&mut t, 0, acquire(RES, owner)));
    assert_eq!(
        one(&mut t, 10, release(RES, owner, g.token)),
        Outcome::Release(ReleaseOutcome::Released)
    );
    assert_eq!(
        one(&mut t, 20, acquire(RES, owner)),
        Outcome::Acquire(AcquireOutcome::Ended(LostReason::Released))
    );
    assert!(!t.describe(RES, at(20)).held, "the resource stays free");
    assert_eq!(t.last_token(), Some(g.token), "no second token issued");
    // A waiting acquire is not queued either.
    assert_eq!(
        one(&mut t, 30, acquire_waiting(RES, owner, 5_000)),
        Outcome::Acquire(AcquireOutcome::Ended(LostReason::Released))
    );
    // Another owner is granted at once.
    let next = granted(one(&mut t, 40, acquire(RES, OwnerId::random())));
    assert!(next.token > g.token);
}

#[test]
fn an_acquire_after_its_own_lease_expired_is_answered_expired() {
    let mut t = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(&mut t, 0, acquire(RES, owner)));
    assert_eq!(
        one(&mut t, TTL, acquire(RES, owner)),
        Outcome::Acquire(AcquireOutcome::Ended(LostReason::Expired))
    );
    assert!(!t.describe(RES, at(TTL)).held);
    assert_eq!(t.last_token(), Some(g.token));
}

#[test]
fn an_acquire_after_its_lease_was_superseded_names_the_current_token() {
    let mut t = LeaseTable::new();
    let a = OwnerId::random();
    granted(one(&mut t, 0, acquire(RES, a)));
    let b = granted(one(&mut t, TTL, acquire(RES, OwnerId::random())));
    assert_eq!(
        one(&mut t, TTL + 1, acquire_waiting(RES, a, 5_000)),
        Outcome::Acquire(AcquireOutcome::Ended(LostReason::Superseded {
            current_token: b.token
        }))
    );
    assert_eq!(t.describe(RES, at(TTL + 1)).waiters, 0, "not queued");
}

#[test]
fn a_spent_owner_id_stays_spent_across_a_snapshot_round_trip() {
    let mut t = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(&mut t, 0, acquire(RES, owner)));
    one(&mut t, 10, release(RES, owner, g.token));
    let mut t = LeaseTable::from_snapshot(t.snapshot()).unwrap();
    assert_eq!(
        one(&mut t, 20, acquire(RES, owner)),
        Outcome::Acquire(AcquireOutcome::Ended(LostReason::Released))
    );
}

#[test]
fn a_spent_owner_id_may_acquire_another_resource() {
    let mut t = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(&mut t, 0, acquire(RES, owner)));
    one(&mut t, 10, release(RES, owner, g.token));
    granted(one(&mut t, 20, acquire("billing:run", owner)));
}

#[test]
fn expiry_follows_only_the_stamps_and_time_never_goes_back() {
    let mut t = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(&mut t, 10_000, acquire(RES, owner)));
    // An entry stamped earlier (a new leader with a lagging clock) does not
    // move time back: the lease is neither shortened nor lengthened by it.
    one(&mut t, 5_000, acquire("other", OwnerId::random()));
    assert_eq!(t.now(), at(10_000));
    assert_eq!(t.holder(RES).unwrap().1.expires_at, g.expires_at);
    // Only a stamp at the expiry ends the lease.
    assert!(matches!(
        one(&mut t, 10_000 + TTL - 1, acquire(RES, OwnerId::random())),
        Outcome::Acquire(AcquireOutcome::Held { .. })
    ));
    granted(one(&mut t, 10_000 + TTL, acquire(RES, OwnerId::random())));
}

#[test]
fn the_leader_clock_starts_at_the_last_applied_stamp_and_never_goes_back() {
    use std::time::Duration;
    let mut clock = LeaderClock::new(at(42_000), Duration::from_secs(7));
    assert_eq!(clock.now(Duration::from_secs(7)), at(42_000));
    assert_eq!(clock.now(Duration::from_millis(7_250)), at(42_250));
    assert_eq!(clock.now(Duration::from_secs(1)), at(42_250));
    clock.observe(at(50_000));
    assert_eq!(clock.now(Duration::from_millis(7_300)), at(50_000));
    let mut fast = LeaderClock::new(at(0), Duration::ZERO).with_skew_ppm(20_000);
    assert_eq!(fast.now(Duration::from_secs(100)), at(102_000));
}

#[test]
fn waiters_are_granted_in_arrival_order_in_the_same_step_as_the_release() {
    let mut t = LeaseTable::new();
    let holder = OwnerId::random();
    let mut g = granted(one(&mut t, 0, acquire(RES, holder)));
    let waiters: Vec<OwnerId> = (0..5).map(|_| OwnerId::random()).collect();
    for (i, w) in waiters.iter().enumerate() {
        assert_eq!(
            one(&mut t, 1, acquire_waiting(RES, *w, 60_000)),
            Outcome::Acquire(AcquireOutcome::Waiting {
                position: i as u32 + 1
            })
        );
    }
    let mut current = holder;
    for w in &waiters {
        let applied = t.apply(&Batch {
            stamp: at(2),
            commands: vec![release(RES, current, g.token)],
        });
        assert_eq!(
            applied.outcomes,
            vec![Outcome::Release(ReleaseOutcome::Released)]
        );
        let [Event::WaiterGranted {
            owner_id: owner,
            grant,
            ..
        }] = applied.events.as_slice()
        else {
            panic!("expected one hand-off, got {:?}", applied.events);
        };
        assert_eq!(owner, w);
        assert!(grant.token > g.token);
        current = *w;
        g = *grant;
    }
}

#[test]
fn a_waiter_is_granted_when_the_lease_expires() {
    let mut t = LeaseTable::new();
    let g = granted(one(&mut t, 0, acquire(RES, OwnerId::random())));
    let w = OwnerId::random();
    one(&mut t, 1, acquire_waiting(RES, w, 2 * TTL));
    assert_eq!(t.next_wakeup(), Some(at(TTL)));
    let applied = t.apply(&Batch {
        stamp: at(TTL),
        commands: vec![],
    });
    assert!(matches!(
        applied.events.as_slice(),
        [Event::Expired { .. }, Event::WaiterGranted { owner_id: owner, grant, .. }]
            if *owner == w && grant.token > g.token
    ));
}

#[test]
fn a_wait_that_elapses_leaves_no_trace() {
    let mut t = LeaseTable::new();
    let g = granted(one(&mut t, 0, acquire(RES, OwnerId::random())));
    let w = OwnerId::random();
    one(&mut t, 0, acquire_waiting(RES, w, 1_000));
    assert_eq!(t.describe(RES, at(0)).waiters, 1);
    let applied = t.apply(&Batch {
        stamp: at(1_000),
        commands: vec![],
    });
    assert_eq!(
        applied.events,
        vec![Event::WaitElapsed {
            resource: name(RES),
            owner_id: w,
            current_token: g.token,
            remaining_ms: TTL - 1_000
        }]
    );
    assert_eq!(t.describe(RES, at(1_000)).waiters, 0);
    assert_eq!(t.next_wakeup(), None);
    t.check_invariants().unwrap();
}

#[test]
fn a_waiter_asking_again_keeps_its_place() {
    let mut t = LeaseTable::new();
    granted(one(&mut t, 0, acquire(RES, OwnerId::random())));
    let (w1, w2) = (OwnerId::random(), OwnerId::random());
    one(&mut t, 0, acquire_waiting(RES, w1, 5_000));
    one(&mut t, 0, acquire_waiting(RES, w2, 5_000));
    assert_eq!(
        one(&mut t, 1, acquire_waiting(RES, w1, 5_000)),
        Outcome::Acquire(AcquireOutcome::Waiting { position: 1 })
    );
    assert_eq!(t.describe(RES, at(1)).waiters, 2);
}

#[test]
fn the_waiter_queue_is_bounded() {
    let mut t = LeaseTable::new();
    granted(one(&mut t, 0, acquire(RES, OwnerId::random())));
    let commands = (0..MAX_WAITERS_PER_RESOURCE)
        .map(|_| acquire_waiting(RES, OwnerId::random(), 10_000))
        .collect();
    let applied = t.apply(&Batch {
        stamp: at(1),
        commands,
    });
    assert!(applied
        .outcomes
        .iter()
        .all(|o| matches!(o, Outcome::Acquire(AcquireOutcome::Waiting { .. }))));
    assert_eq!(
        one(&mut t, 2, acquire_waiting(RES, OwnerId::random(), 10_000)),
        Outcome::Acquire(AcquireOutcome::WaitQueueFull {
            max_waiters: MAX_WAITERS_PER_RESOURCE as u32
        })
    );
    assert_eq!(
        t.describe(RES, at(2)).waiters as usize,
        MAX_WAITERS_PER_RESOURCE
    );
}

#[test]
fn describe_reports_the_holder_without_its_owner() {
    let mut t = LeaseTable::new();
    assert_eq!(
        t.describe(RES, at(0)),
        Description {
            last_token: None,
            held: false,
            remaining_ms: 0,
            waiters: 0
        }
    );
    let g = granted(one(&mut t, 0, acquire(RES, OwnerId::random())));
    assert_eq!(
        t.describe(RES, at(1_000)),
        Description {
            last_token: Some(g.token),
            held: true,
            remaining_ms: TTL - 1_000,
            waiters: 0
        }
    );
}

#[test]
fn a_snapshot_of_another_format_version_is_refused() {
    let mut value = serde_json::to_value(LeaseTable::new().snapshot()).unwrap();
    value["format_version"] = 99.into();
    let snap: TableSnapshot = serde_json::from_value(value).unwrap();
    assert_eq!(
        LeaseTable::from_snapshot(snap).unwrap_err(),
        SnapshotError::Version {
            found: 99,
            supported: SNAPSHOT_FORMAT_VERSION
        }
    );
}

#[test]
fn a_snapshot_that_breaks_an_invariant_is_refused() {
    let mut t = LeaseTable::new();
    granted(one(&mut t, 0, acquire(RES, OwnerId::random())));
    let mut value = serde_json::to_value(t.snapshot()).unwrap();
    // A token above the counter would let the counter hand it out again.
    value["last_token"] = 0.into();
    let snap: TableSnapshot = serde_json::from_value(value).unwrap();
    assert!(matches!(
        LeaseTable::from_snapshot(snap),
        Err(SnapshotError::Invariant(_))
    ));
}
