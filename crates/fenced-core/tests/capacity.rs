//! The table-wide bounds on live leases and waiters: refused beyond them,
//! decided by the table alone, and nothing already held is ever lost.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use fenced_core::*;

const TTL: u64 = 30_000;

fn at(ms: u64) -> ClusterTime {
    ClusterTime::from_millis(ms)
}

fn bounded(res: &str, owner: OwnerId, wait_ms: u64, leases: u64, waiters: u64) -> Command {
    Command::AcquireBounded {
        resource: ResourceName::new(res).unwrap(),
        owner_id: owner,
        ttl_ms: TTL,
        wait_ms,
        capacity: Capacity {
            max_live_leases: leases,
            max_waiters: waiters,
        },
    }
}

fn apply_one(table: &mut LeaseTable, ms: u64, command: Command) -> Outcome {
    let out = table.apply(&Batch {
        stamp: at(ms),
        commands: vec![command],
    });
    out.outcomes.into_iter().next().expect("one outcome")
}

fn granted(outcome: Outcome) -> Grant {
    match outcome {
        Outcome::Acquire(AcquireOutcome::Granted(g)) => g,
        other => panic!("expected a grant, got {other:?}"),
    }
}

#[test]
fn live_leases_beyond_the_bound_are_refused_and_holders_keep_theirs() {
    let mut table = LeaseTable::new();
    let owners: Vec<OwnerId> = (0..3).map(|_| OwnerId::random()).collect();
    let grants: Vec<Grant> = owners
        .iter()
        .enumerate()
        .map(|(i, o)| {
            granted(apply_one(
                &mut table,
                0,
                bounded(&format!("r{i}"), *o, 0, 3, 10),
            ))
        })
        .collect();
    assert_eq!(table.live_leases(), 3);

    // A fourth lease: refused, nothing changed.
    let late = OwnerId::random();
    assert_eq!(
        apply_one(&mut table, 1, bounded("r3", late, 0, 3, 10)),
        Outcome::Acquire(AcquireOutcome::CapacityReached {
            bound: CapacityBound::LiveLeases,
            limit: 3
        })
    );
    assert_eq!(table.live_leases(), 3);
    assert_eq!(table.describe("r3", at(1)).last_token, None);

    // A holder asking again, renewing and releasing all still work.
    assert_eq!(
        granted(apply_one(&mut table, 2, bounded("r0", owners[0], 0, 3, 10))).token,
        grants[0].token
    );
    let renewed = apply_one(
        &mut table,
        3,
        Command::Renew {
            resource: ResourceName::new("r1").unwrap(),
            owner_id: owners[1],
            token: grants[1].token,
            ttl_ms: TTL,
        },
    );
    assert!(
        matches!(renewed, Outcome::Renew(RenewOutcome::Renewed { .. })),
        "{renewed:?}"
    );
    let released = apply_one(
        &mut table,
        4,
        Command::Release {
            resource: ResourceName::new("r2").unwrap(),
            owner_id: owners[2],
            token: grants[2].token,
        },
    );
    assert_eq!(released, Outcome::Release(ReleaseOutcome::Released));

    // With room again, the late owner is granted.
    granted(apply_one(&mut table, 5, bounded("r3", late, 0, 3, 10)));
    table.check_invariants().unwrap();
}

#[test]
fn waiters_beyond_the_bound_are_refused_and_queued_ones_keep_their_place() {
    let mut table = LeaseTable::new();
    let holder = OwnerId::random();
    granted(apply_one(&mut table, 0, bounded("r", holder, 0, 10, 2)));
    let (w1, w2, w3) = (OwnerId::random(), OwnerId::random(), OwnerId::random());
    assert_eq!(
        apply_one(&mut table, 1, bounded("r", w1, 60_000, 10, 2)),
        Outcome::Acquire(AcquireOutcome::Waiting { position: 1 })
    );
    assert_eq!(
        apply_one(&mut table, 1, bounded("r", w2, 60_000, 10, 2)),
        Outcome::Acquire(AcquireOutcome::Waiting { position: 2 })
    );
    assert_eq!(
        apply_one(&mut table, 2, bounded("r", w3, 60_000, 10, 2)),
        Outcome::Acquire(AcquireOutcome::CapacityReached {
            bound: CapacityBound::Waiters,
            limit: 2
        })
    );
    // A queued waiter asking again keeps its place; one without a wait is
    // told the resource is held, as always.
    assert_eq!(
        apply_one(&mut table, 3, bounded("r", w1, 60_000, 10, 2)),
        Outcome::Acquire(AcquireOutcome::Waiting { position: 1 })
    );
    assert!(matches!(
        apply_one(&mut table, 3, bounded("r", w3, 0, 10, 2)),
        Outcome::Acquire(AcquireOutcome::Held { .. })
    ));
    assert_eq!(table.describe("r", at(3)).waiters, 2);
}

#[test]
fn a_hand_off_to_a_waiter_is_not_refused_at_the_lease_bound() {
    let mut table = LeaseTable::new();
    let (holder, waiter) = (OwnerId::random(), OwnerId::random());
    let g = granted(apply_one(&mut table, 0, bounded("r", holder, 0, 1, 10)));
    assert_eq!(
        apply_one(&mut table, 1, bounded("r", waiter, 60_000, 1, 10)),
        Outcome::Acquire(AcquireOutcome::Waiting { position: 1 })
    );
    let out = table.apply(&Batch {
        stamp: at(2),
        commands: vec![Command::Release {
            resource: ResourceName::new("r").unwrap(),
            owner_id: holder,
            token: g.token,
        }],
    });
    assert!(
        matches!(&out.events[..], [Event::WaiterGranted { owner_id: owner, .. }] if *owner == waiter),
        "{:?}",
        out.events
    );
    assert_eq!(table.live_leases(), 1);
}

#[test]
fn an_acquire_from_an_older_log_is_unbounded() {
    let mut table = LeaseTable::new();
    for i in 0..5 {
        let outcome = apply_one(
            &mut table,
            0,
            Command::Acquire {
                resource: ResourceName::new(&format!("r{i}")).unwrap(),
                owner_id: OwnerId::random(),
                ttl_ms: TTL,
                wait_ms: 0,
            },
        );
        granted(outcome);
    }
    assert_eq!(table.live_leases(), 5);
}

#[test]
fn limits_carry_their_capacity_into_the_command() {
    let limits = Limits {
        max_live_leases: 7,
        max_waiters: 9,
        ..Limits::default()
    };
    assert_eq!(
        limits.capacity(),
        Capacity {
            max_live_leases: 7,
            max_waiters: 9
        }
    );
    assert_eq!(CapacityBound::LiveLeases.setting(), "max_live_leases");
    assert_eq!(CapacityBound::Waiters.setting(), "max_waiters");
}
