//! The token counter at its bound: a table loaded near [`MAX_TOKEN`]
//! refuses grants cleanly once it is reached, never issues 0 or a token at
//! or below one before, never panics (release builds have no overflow
//! checks: run these with `--release` too), and a snapshot or a floor past
//! the bounds is refused.
#![allow(clippy::unwrap_used)]

use proptest::prelude::*;

use super::*;

fn at(ms: u64) -> ClusterTime {
    ClusterTime::from_millis(ms)
}

fn name(s: &str) -> ResourceName {
    ResourceName::new(s).unwrap()
}

/// An empty table whose counter was loaded at `last_token`.
fn loaded_at(last_token: u64) -> Result<LeaseTable, SnapshotError> {
    let mut snapshot = LeaseTable::new().snapshot();
    snapshot.last_token = last_token;
    LeaseTable::from_snapshot(snapshot)
}

fn acquire(
    table: &mut LeaseTable,
    resource: &str,
    owner: OwnerId,
    now: u64,
    wait_ms: u64,
) -> Applied {
    table.apply(&Batch {
        stamp: at(now),
        commands: vec![Command::Acquire {
            resource: name(resource),
            owner_id: owner,
            ttl_ms: 1_000,
            wait_ms,
        }],
    })
}

fn outcome(applied: &Applied) -> AcquireOutcome {
    match &applied.outcomes[0] {
        Outcome::Acquire(o) => *o,
        other => panic!("not an acquire's outcome: {other:?}"),
    }
}

fn granted(applied: &Applied) -> u64 {
    match outcome(applied) {
        AcquireOutcome::Granted(g) => g.token.get(),
        other => panic!("not granted: {other:?}"),
    }
}

/// Any token, 0 too, as a decoded snapshot may hold it.
fn raw_token(n: u64) -> Token {
    serde_json::from_str(&n.to_string()).unwrap()
}

const EXHAUSTED: AcquireOutcome = AcquireOutcome::TokensExhausted { limit: MAX_TOKEN };

#[test]
fn a_table_loaded_near_the_bound_grants_up_to_it_then_refuses() {
    let mut table = loaded_at(MAX_TOKEN - 2).unwrap();
    let a = OwnerId::random();
    assert_eq!(granted(&acquire(&mut table, "a", a, 1, 0)), MAX_TOKEN - 1);
    assert_eq!(
        granted(&acquire(&mut table, "b", OwnerId::random(), 1, 0)),
        MAX_TOKEN
    );
    // A new resource, and a known one come free: refused, nothing changed.
    let before = table.snapshot();
    assert_eq!(
        outcome(&acquire(&mut table, "c", OwnerId::random(), 1, 0)),
        EXHAUSTED
    );
    assert!(table.snapshot() == before);
    table.apply(&Batch {
        stamp: at(2),
        commands: vec![Command::Release {
            resource: name("a"),
            owner_id: a,
            token: Token::new(MAX_TOKEN - 1).unwrap(),
        }],
    });
    assert_eq!(
        outcome(&acquire(&mut table, "a", OwnerId::random(), 3, 0)),
        EXHAUSTED
    );
    // The holder of "b" asking again still gets its own grant back.
    assert_eq!(table.last_token().unwrap().get(), MAX_TOKEN);
    let d = table.describe("a", at(3));
    assert_eq!(
        (d.held, d.last_token.unwrap().get()),
        (false, MAX_TOKEN - 1)
    );
    table.check_invariants().unwrap();
    // Its snapshot still loads, and still refuses.
    let mut again = LeaseTable::from_snapshot(table.snapshot()).unwrap();
    assert_eq!(
        outcome(&acquire(&mut again, "z", OwnerId::random(), 4, 0)),
        EXHAUSTED
    );
}

#[test]
fn the_holder_asking_again_at_the_bound_gets_its_grant() {
    let mut table = loaded_at(MAX_TOKEN - 1).unwrap();
    let owner = OwnerId::random();
    assert_eq!(granted(&acquire(&mut table, "a", owner, 1, 0)), MAX_TOKEN);
    assert_eq!(granted(&acquire(&mut table, "a", owner, 2, 0)), MAX_TOKEN);
}

#[test]
fn waiters_of_an_exhausted_table_are_answered_and_none_is_queued() {
    let mut table = loaded_at(MAX_TOKEN - 2).unwrap();
    let (a, w1, w2) = (OwnerId::random(), OwnerId::random(), OwnerId::random());
    assert_eq!(granted(&acquire(&mut table, "r", a, 1, 0)), MAX_TOKEN - 1);
    for w in [w1, w2] {
        assert!(matches!(
            outcome(&acquire(&mut table, "r", w, 1, 10_000)),
            AcquireOutcome::Waiting { .. }
        ));
    }
    assert_eq!(
        granted(&acquire(&mut table, "s", OwnerId::random(), 1, 0)),
        MAX_TOKEN
    );
    // A new waiter could never be granted: refused at once.
    assert_eq!(
        outcome(&acquire(&mut table, "s", OwnerId::random(), 1, 10_000)),
        EXHAUSTED
    );
    // "r"'s lease runs out: both its waiters are told, none is granted.
    let applied = table.apply(&Batch {
        stamp: at(5_000),
        commands: vec![],
    });
    let told: Vec<OwnerId> = applied
        .events
        .iter()
        .filter_map(|e| match e {
            Event::TokensExhausted {
                owner_id, limit, ..
            } if *limit == MAX_TOKEN => Some(*owner_id),
            Event::WaiterGranted { .. } => panic!("granted past the bound: {e:?}"),
            _ => None,
        })
        .collect();
    assert_eq!(told, vec![w1, w2]);
    assert_eq!(table.describe("r", at(5_000)).waiters, 0);
    table.check_invariants().unwrap();
}

#[test]
fn a_snapshot_whose_counter_is_past_the_bound_is_refused() {
    assert!(loaded_at(MAX_TOKEN).is_ok());
    for bad in [MAX_TOKEN + 1, u64::MAX - 1, u64::MAX] {
        let e = loaded_at(bad).unwrap_err().to_string();
        assert!(e.contains("token counter") && e.contains("2^63"), "{e}");
    }
    let mut snapshot = LeaseTable::new().snapshot();
    snapshot.revision = u64::MAX;
    let e = LeaseTable::from_snapshot(snapshot).unwrap_err().to_string();
    assert!(e.contains("watch revision") && e.contains("2^62"), "{e}");
}

#[test]
fn a_snapshot_with_a_token_above_its_counter_or_token_0_is_refused() {
    let mut table = LeaseTable::new();
    acquire(&mut table, "a", OwnerId::random(), 1, 0);
    let mut zero = table.snapshot();
    zero.records[0].1.last_token = raw_token(0);
    zero.records[0].1.holder = None;
    zero.history.clear();
    let e = LeaseTable::from_snapshot(zero).unwrap_err().to_string();
    assert!(e.contains("token 0"), "{e}");
    // The change window names a token the counter never issued.
    let mut ahead = table.snapshot();
    ahead.changes[0].token = raw_token(5);
    let e = LeaseTable::from_snapshot(ahead).unwrap_err().to_string();
    assert!(e.contains("above the table's counter"), "{e}");
}

#[test]
fn a_floor_above_its_bound_is_refused_and_changes_nothing() {
    let mut table = LeaseTable::new();
    table.raise_token_floor(MAX_TOKEN_FLOOR).unwrap();
    assert_eq!(table.last_token().unwrap().get(), MAX_TOKEN_FLOOR);
    for bad in [MAX_TOKEN_FLOOR + 1, u64::MAX - 1, u64::MAX] {
        let e = table.raise_token_floor(bad).unwrap_err();
        assert_eq!((e.floor, e.max), (bad, MAX_TOKEN_FLOOR));
        assert!(e.to_string().contains("2^62"), "{e}");
    }
    assert_eq!(table.last_token().unwrap().get(), MAX_TOKEN_FLOOR);
    assert_eq!(
        granted(&acquire(&mut table, "a", OwnerId::random(), 1, 0)),
        MAX_TOKEN_FLOOR + 1
    );
}

proptest! {
    /// From any counter near the bound, any mix of acquires (waiting or
    /// not), releases and expiries: every grant's token is above every one
    /// before and at most the bound, never 0; once the bound is reached
    /// every new grant is refused; the table stays consistent.
    #[test]
    fn near_the_bound_tokens_only_rise_and_then_grants_are_refused(
        start in (MAX_TOKEN - 8)..=MAX_TOKEN,
        steps in prop::collection::vec((0..3usize, 0..4usize, 0..3u8, 0..400u64), 1..60),
    ) {
        let mut table = loaded_at(start).unwrap();
        let owners: Vec<OwnerId> = (0..4).map(|_| OwnerId::random()).collect();
        let mut highest = start;
        let mut now = 1;
        for (res, who, op, dt) in steps {
            now += dt;
            let resource = ["a", "b", "c"][res];
            let owner = owners[who];
            let command = match op {
                0 => Command::Acquire { resource: name(resource), owner_id: owner, ttl_ms: 300, wait_ms: 0 },
                1 => Command::Acquire { resource: name(resource), owner_id: owner, ttl_ms: 300, wait_ms: 500 },
                _ => Command::Release {
                    resource: name(resource),
                    owner_id: owner,
                    token: table.describe(resource, at(now)).last_token.unwrap_or(raw_token(1)),
                },
            };
            let applied = table.apply(&Batch { stamp: at(now), commands: vec![command] });
            let mut grants = Vec::new();
            let mut refused = false;
            if let Outcome::Acquire(o) = &applied.outcomes[0] {
                match o {
                    AcquireOutcome::Granted(g) => grants.push(g.token.get()),
                    AcquireOutcome::TokensExhausted { limit } => {
                        prop_assert_eq!(*limit, MAX_TOKEN);
                        refused = true;
                    }
                    _ => {}
                }
            }
            for e in &applied.events {
                if let Event::WaiterGranted { grant, .. } = e {
                    grants.push(grant.token.get());
                }
            }
            // The sweep's hand-offs come before the command's grant.
            grants.sort_unstable();
            for t in grants {
                // A holder asking again gets its own token back.
                prop_assert!(t != 0 && t <= MAX_TOKEN, "token {}", t);
                if t > highest {
                    prop_assert_eq!(t, highest + 1);
                    highest = t;
                }
            }
            prop_assert!(!refused || highest == MAX_TOKEN, "refused below the bound");
            prop_assert_eq!(table.last_token().map(Token::get), Some(highest));
            prop_assert_eq!(table.check_invariants(), Ok(()));
        }
    }
}
