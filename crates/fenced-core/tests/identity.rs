//! A lease belongs to the identity that acquired it: another identity that
//! presents its owner id and token is refused as a wrong owner id is, also
//! after a snapshot round trip and in a table loaded from a snapshot (a new
//! leader's); the per-identity bounds are the table's, so they hold there
//! too.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::streamed;
use fenced_core::*;
use serde_json::Value;

const TTL: u64 = 10_000;
const A: &str = "app-a";
const B: &str = "app-b";

fn name(s: &str) -> ResourceName {
    ResourceName::new(s).unwrap()
}

fn at(ms: u64) -> ClusterTime {
    ClusterTime::from_millis(ms)
}

fn one(table: &mut LeaseTable, ms: u64, command: Command) -> Outcome {
    let applied = table.apply(&Batch {
        stamp: at(ms),
        commands: vec![command],
    });
    table.check_invariants().unwrap();
    applied.outcomes.into_iter().next().unwrap()
}

fn bounds(leases: u64, waiters: u64) -> IdentityBounds {
    IdentityBounds {
        max_leases_per_identity: leases,
        max_waiters_per_identity: waiters,
    }
}

fn acquire_as(who: &str, res: &str, owner: OwnerId, wait_ms: u64, b: IdentityBounds) -> Command {
    Command::AcquireBounded {
        resource: name(res),
        owner_id: owner,
        ttl_ms: TTL,
        wait_ms,
        capacity: Capacity::UNBOUNDED,
    }
    .as_identity(who, b)
}

fn granted(outcome: Outcome) -> Grant {
    match outcome {
        Outcome::Acquire(AcquireOutcome::Granted(g)) => g,
        other => panic!("not granted: {other:?}"),
    }
}

fn renew_as(who: &str, res: &str, owner: OwnerId, token: Token) -> Command {
    Command::Renew {
        resource: name(res),
        owner_id: owner,
        token,
        ttl_ms: TTL,
    }
    .as_identity(who, IdentityBounds::UNBOUNDED)
}

fn release_as(who: &str, res: &str, owner: OwnerId, token: Token) -> Command {
    Command::Release {
        resource: name(res),
        owner_id: owner,
        token,
    }
    .as_identity(who, IdentityBounds::UNBOUNDED)
}

/// A table through its snapshot, both ways a node reads one: whole (a
/// self-describing format) and as a sequence (the node's codec).
fn reloaded(table: &LeaseTable) -> LeaseTable {
    let value = serde_json::to_value(table.snapshot()).unwrap();
    let whole = LeaseTable::from_snapshot(serde_json::from_value(value.clone()).unwrap()).unwrap();
    let streamed = streamed(&value, SNAPSHOT_FIELDS);
    assert!(whole.snapshot() == table.snapshot());
    assert!(streamed.snapshot() == table.snapshot());
    streamed
}

/// Identity B, with A's owner id and token, tries every lease command on
/// A's lease: each is refused exactly as a wrong owner id is, and A still
/// holds with its token.
fn b_is_refused_everything(table: &mut LeaseTable, ms: u64, owner: OwnerId, token: Token) {
    let stranger = OwnerId::random();
    let wrong_owner = one(table, ms, renew_as(B, "billing/run", stranger, token));
    assert_eq!(
        one(table, ms, renew_as(B, "billing/run", owner, token)),
        wrong_owner
    );
    assert!(matches!(wrong_owner, Outcome::Renew(RenewOutcome::Lost(_))));
    let many = Command::RenewMany {
        leases: RenewLeases::new(vec![RenewLease {
            resource: name("billing/run"),
            owner_id: owner,
            token,
            ttl_ms: TTL,
        }])
        .unwrap(),
    }
    .as_identity(B, IdentityBounds::UNBOUNDED);
    assert_eq!(
        one(table, ms, many),
        Outcome::RenewMany(vec![RenewOutcome::Lost(LostReason::Unknown)])
    );
    let wrong_owner = one(table, ms, release_as(B, "billing/run", stranger, token));
    assert_eq!(
        one(table, ms, release_as(B, "billing/run", owner, token)),
        wrong_owner
    );
    // An acquire with the holder's owner id is no retry of the holder's.
    assert!(matches!(
        one(
            table,
            ms,
            acquire_as(B, "billing/run", owner, 0, IdentityBounds::UNBOUNDED)
        ),
        Outcome::Acquire(AcquireOutcome::Held { .. })
    ));
    let put = Command::KvPut {
        key: KvKey::new("billing/state").unwrap(),
        value: KvValue::new(b"paid".to_vec()).unwrap(),
        resource: name("billing/run"),
        owner_id: owner,
        token,
        bounds: Limits::default().kv_bounds(),
    }
    .as_identity(B, IdentityBounds::UNBOUNDED);
    assert!(matches!(
        one(table, ms, put),
        Outcome::KvPut(KvPutOutcome::Refused(_))
    ));
    assert!(table.kv().get("billing/state").is_none());
    let (holder, grant) = table.holder("billing/run").unwrap();
    assert_eq!((holder, grant.token), (owner, token));
    assert!(table
        .check_holder_as("billing/run", owner, token, A, at(ms))
        .is_ok());
    assert!(table
        .check_holder_as("billing/run", owner, token, B, at(ms))
        .is_err());
}

#[test]
fn another_identity_with_the_owner_id_and_token_is_refused() {
    let mut table = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(
        &mut table,
        0,
        acquire_as(A, "billing/run", owner, 0, IdentityBounds::UNBOUNDED),
    ));
    b_is_refused_everything(&mut table, 10, owner, g.token);
    // A itself renews and releases.
    assert!(matches!(
        one(&mut table, 20, renew_as(A, "billing/run", owner, g.token)),
        Outcome::Renew(RenewOutcome::Renewed { .. })
    ));
    assert_eq!(
        one(&mut table, 30, release_as(A, "billing/run", owner, g.token)),
        Outcome::Release(ReleaseOutcome::Released)
    );
}

/// Refusals are reported for the server to log (without the owner id).
#[test]
fn a_refusal_for_another_identity_is_an_event() {
    let mut table = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(
        &mut table,
        0,
        acquire_as(A, "billing/run", owner, 0, IdentityBounds::UNBOUNDED),
    ));
    let applied = table.apply(&Batch {
        stamp: at(5),
        commands: vec![renew_as(B, "billing/run", owner, g.token)],
    });
    assert_eq!(
        applied.events,
        vec![Event::OtherIdentity {
            resource: name("billing/run"),
            token: g.token,
            identity: B.into(),
        }]
    );
}

#[test]
fn the_lease_stays_its_identitys_through_a_snapshot_and_a_new_leader() {
    let mut table = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(
        &mut table,
        0,
        acquire_as(A, "billing/run", owner, 0, IdentityBounds::UNBOUNDED),
    ));
    // A waiter of B's, handed the lease after the reload.
    let waiter = OwnerId::random();
    assert!(matches!(
        one(
            &mut table,
            1,
            acquire_as(B, "billing/run", waiter, TTL, IdentityBounds::UNBOUNDED)
        ),
        Outcome::Acquire(AcquireOutcome::Waiting { position: 1 })
    ));
    assert_eq!(table.snapshot().format_version(), SNAPSHOT_FORMAT_VERSION);
    let mut new_leader = reloaded(&table);
    b_is_refused_everything(&mut new_leader, 10, owner, g.token);
    // A's wait with B's waiting owner id is no retry of B's wait.
    let a_waits_as = |t: &mut LeaseTable, ms, owner| {
        one(
            t,
            ms,
            acquire_as(A, "billing/run", owner, TTL, IdentityBounds::UNBOUNDED),
        )
    };
    assert!(matches!(
        a_waits_as(&mut new_leader, 15, waiter),
        Outcome::Acquire(AcquireOutcome::Held { .. })
    ));
    assert_eq!(new_leader.waiters(), 1);
    assert_eq!(
        one(
            &mut new_leader,
            20,
            release_as(A, "billing/run", owner, g.token)
        ),
        Outcome::Release(ReleaseOutcome::Released)
    );
    // B's waiter holds now, as B: A cannot release it, nor wait with its
    // owner id (it would be granted that owner id a second time).
    let (holder, next) = new_leader.holder("billing/run").unwrap();
    assert_eq!(holder, waiter);
    assert!(matches!(
        a_waits_as(&mut new_leader, 25, waiter),
        Outcome::Acquire(AcquireOutcome::Held { .. })
    ));
    assert_eq!(new_leader.waiters(), 0);
    let mut again = reloaded(&new_leader);
    assert!(matches!(
        one(
            &mut again,
            30,
            release_as(A, "billing/run", waiter, next.token)
        ),
        Outcome::Release(ReleaseOutcome::NotHolder(_))
    ));
    assert_eq!(
        one(
            &mut again,
            30,
            release_as(B, "billing/run", waiter, next.token)
        ),
        Outcome::Release(ReleaseOutcome::Released)
    );
}

#[test]
fn a_session_lease_is_its_sessions_identitys() {
    let mut table = LeaseTable::new();
    let session = SessionId::random();
    one(
        &mut table,
        0,
        Command::OpenSession {
            session,
            identity: A.into(),
            ttl_ms: TTL,
            bounds: Limits::default().session_bounds(),
        },
    );
    let owner = OwnerId::random();
    let acquire = Command::AcquireInSession {
        resource: name("billing/run"),
        owner_id: owner,
        session,
        identity: A.into(),
        capacity: Capacity::UNBOUNDED,
    }
    .as_identity(A, IdentityBounds::UNBOUNDED);
    let Outcome::AcquireInSession(AcquireInSessionOutcome::Acquire(AcquireOutcome::Granted(g))) =
        one(&mut table, 1, acquire)
    else {
        panic!("not granted");
    };
    let mut reloaded = reloaded(&table);
    for t in [&mut table, &mut reloaded] {
        assert!(matches!(
            one(t, 5, release_as(B, "billing/run", owner, g.token)),
            Outcome::Release(ReleaseOutcome::NotHolder(_))
        ));
        assert_eq!(
            one(t, 5, renew_as(B, "billing/run", owner, g.token)),
            Outcome::Renew(RenewOutcome::Lost(LostReason::Unknown))
        );
        assert_eq!(
            one(t, 5, renew_as(A, "billing/run", owner, g.token)),
            Outcome::Renew(RenewOutcome::KeptBySession)
        );
    }
}

#[test]
fn per_identity_limits_hold_in_the_table_and_after_a_reload() {
    let mut table = LeaseTable::new();
    let b = bounds(2, 1);
    for (i, res) in ["r1", "r2"].into_iter().enumerate() {
        granted(one(
            &mut table,
            i as u64,
            acquire_as(A, res, OwnerId::random(), 0, b),
        ));
    }
    let third = |t: &mut LeaseTable, ms| one(t, ms, acquire_as(A, "r4", OwnerId::random(), 0, b));
    let refused = Outcome::Acquire(AcquireOutcome::CapacityReached {
        bound: CapacityBound::LeasesPerIdentity,
        limit: 2,
    });
    assert_eq!(third(&mut table, 5), refused);
    // Another identity is not affected.
    granted(one(
        &mut table,
        5,
        acquire_as(B, "r3", OwnerId::random(), 0, b),
    ));
    // One wait of A's; a second is refused.
    assert!(matches!(
        one(
            &mut table,
            6,
            acquire_as(A, "r3", OwnerId::random(), TTL, bounds(9, 1))
        ),
        Outcome::Acquire(AcquireOutcome::Waiting { .. })
    ));
    let second_wait = one(
        &mut table,
        7,
        acquire_as(A, "r3", OwnerId::random(), TTL, bounds(9, 1)),
    );
    let wait_refused = Outcome::Acquire(AcquireOutcome::CapacityReached {
        bound: CapacityBound::WaitersPerIdentity,
        limit: 1,
    });
    assert_eq!(second_wait, wait_refused);
    // A new leader counts what the old one did.
    let mut new_leader = reloaded(&table);
    assert_eq!(third(&mut new_leader, 8), refused);
    assert_eq!(
        one(
            &mut new_leader,
            8,
            acquire_as(A, "r2", OwnerId::random(), TTL, bounds(9, 1))
        ),
        wait_refused
    );
    // Ended leases count no more: after A's expire, A is granted again.
    granted(third(&mut new_leader, TTL + 10));
}

/// A table holding one lease granted by a command logged before leases
/// had an identity.
fn with_an_older_lease() -> (LeaseTable, OwnerId, Grant) {
    let mut table = LeaseTable::new();
    let owner = OwnerId::random();
    let g = granted(one(
        &mut table,
        0,
        Command::Acquire {
            resource: name("billing/run"),
            owner_id: owner,
            ttl_ms: TTL,
            wait_ms: 0,
        },
    ));
    (table, owner, g)
}

/// Commands logged before leases had an identity apply as they did: a
/// lease of the empty identity, renewed and released by owner id and
/// token alone, unbounded.
#[test]
fn commands_from_an_older_log_apply_as_before() {
    let (mut table, owner, g) = with_an_older_lease();
    // The empty identity is the one such a lease belongs to.
    assert!(table
        .check_holder_as("billing/run", owner, g.token, "", at(1))
        .is_ok());
    assert!(matches!(
        one(&mut table, 2, renew_as(A, "billing/run", owner, g.token)),
        Outcome::Renew(RenewOutcome::Lost(_))
    ));
    let mut reloaded = reloaded(&table);
    assert_eq!(
        one(
            &mut reloaded,
            3,
            Command::Release {
                resource: name("billing/run"),
                owner_id: owner,
                token: g.token,
            }
        ),
        Outcome::Release(ReleaseOutcome::Released)
    );
    // An older release of an identity's lease releases it, as it did when
    // it was logged: every node, upgraded or not, reaches the same table.
    let owner = OwnerId::random();
    let g = granted(one(
        &mut reloaded,
        4,
        acquire_as(A, "billing/run", owner, 0, IdentityBounds::UNBOUNDED),
    ));
    let older_release = Command::Release {
        resource: name("billing/run"),
        owner_id: owner,
        token: g.token,
    };
    assert_eq!(
        one(&mut reloaded, 5, older_release),
        Outcome::Release(ReleaseOutcome::Released)
    );
}

/// A snapshot of the previous version (3, before identities) loads, its
/// leases the empty identity's.
#[test]
fn a_version_3_snapshot_loads_with_every_lease_the_empty_identitys() {
    let (table, owner, g) = with_an_older_lease();
    let mut value = serde_json::to_value(table.snapshot()).unwrap();
    let map = value.as_object_mut().unwrap();
    map.remove("identities");
    map.insert("format_version".into(), Value::from(3));
    let v3: TableSnapshot = serde_json::from_value(value.clone()).unwrap();
    assert_eq!(v3.format_version(), 3);
    let loaded = LeaseTable::from_snapshot(v3).unwrap();
    assert!(loaded
        .check_holder_as("billing/run", owner, g.token, "", at(1))
        .is_ok());
    assert!(loaded.snapshot() == table.snapshot());
    // Through the sequence path too: nine fields, no tenth.
    let streamed = streamed(&value, &SNAPSHOT_FIELDS[..9]);
    assert!(streamed.snapshot() == table.snapshot());
}

/// A snapshot whose identities name no lease, or an identity it does not
/// list, is refused.
#[test]
fn identities_of_a_snapshot_are_checked() {
    let mut table = LeaseTable::new();
    granted(one(
        &mut table,
        0,
        acquire_as(
            A,
            "billing/run",
            OwnerId::random(),
            0,
            IdentityBounds::UNBOUNDED,
        ),
    ));
    let value = serde_json::to_value(table.snapshot()).unwrap();
    assert_eq!(value["identities"]["names"], serde_json::json!([A]));
    let load = |v: Value| LeaseTable::from_snapshot(serde_json::from_value(v).unwrap());
    let mut unknown = value.clone();
    unknown["identities"]["holders"][0][1] = Value::from(7);
    assert!(matches!(load(unknown), Err(SnapshotError::Invariant(e)) if e.contains("names")));
    let mut nowhere = value.clone();
    nowhere["identities"]["holders"][0][0] = Value::from("zz");
    assert!(matches!(load(nowhere), Err(SnapshotError::Invariant(e)) if e.contains("zz")));
    let mut twice = value;
    let holders = twice["identities"]["holders"].as_array_mut().unwrap();
    let first = holders[0].clone();
    holders.push(first);
    assert!(matches!(load(twice), Err(SnapshotError::Invariant(e)) if e.contains("twice")));
}
