//! `LeaseTable::leases`: the live leases under a prefix, bounded, for the
//! node's status page.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use fenced_core::*;

fn at(ms: u64) -> ClusterTime {
    ClusterTime::from_millis(ms)
}

fn acquire(res: &str, owner: OwnerId, ttl_ms: u64, wait_ms: u64) -> Command {
    Command::Acquire {
        resource: ResourceName::new(res).unwrap(),
        owner_id: owner,
        ttl_ms,
        wait_ms,
    }
}

fn names(list: &LeaseList) -> Vec<&str> {
    list.rows.iter().map(|r| r.resource.as_str()).collect()
}

#[test]
fn lists_live_leases_under_the_prefix_in_name_order_with_a_count_of_the_rest() {
    let mut table = LeaseTable::new();
    let mut commands: Vec<Command> = ["orders/3", "orders/1", "jobs/1", "orders/2", "ordersx"]
        .iter()
        .map(|r| acquire(r, OwnerId::random(), 10_000, 0))
        .collect();
    // A waiter behind orders/1.
    commands.push(acquire("orders/1", OwnerId::random(), 10_000, 5_000));
    table.apply(&Batch {
        stamp: at(0),
        commands,
    });

    let all = table.leases("orders/", at(4_000), 10);
    assert_eq!(names(&all), ["orders/1", "orders/2", "orders/3"]);
    assert_eq!(all.more, 0);
    let first = &all.rows[0];
    assert_eq!(
        (first.remaining_ms, first.ttl_ms, first.waiters),
        (6_000, 10_000, 1)
    );
    assert_eq!(all.rows[1].waiters, 0);
    // Tokens are the ones granted: one counter, in command order.
    assert_eq!(first.token.get(), 2);

    let bounded = table.leases("orders/", at(4_000), 2);
    assert_eq!(names(&bounded), ["orders/1", "orders/2"]);
    assert_eq!(bounded.more, 1);

    let none = table.leases("orders/", at(0), 0);
    assert!(none.rows.is_empty());
    assert_eq!(none.more, 3);

    // The empty prefix lists everything.
    assert_eq!(table.leases("", at(0), 100).rows.len(), 5);
    assert_eq!(table.leases("zzz", at(0), 100), LeaseList::default());
}

#[test]
fn expired_and_released_leases_are_not_listed() {
    let mut table = LeaseTable::new();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let out = table.apply(&Batch {
        stamp: at(0),
        commands: vec![acquire("a", a, 1_000, 0), acquire("b", b, 5_000, 0)],
    });
    let Outcome::Acquire(AcquireOutcome::Granted(grant_b)) = out.outcomes[1] else {
        panic!("{out:?}")
    };
    // Expired by `now` although no batch has ended it yet.
    assert_eq!(names(&table.leases("", at(1_000), 10)), ["b"]);
    assert_eq!(names(&table.leases("", at(999), 10)), ["a", "b"]);
    // A `now` earlier than the table's own is raised to it.
    table.apply(&Batch {
        stamp: at(2_000),
        commands: vec![Command::Release {
            resource: ResourceName::new("b").unwrap(),
            owner_id: b,
            token: grant_b.token,
        }],
    });
    assert!(table.leases("", at(0), 10).rows.is_empty());
}
