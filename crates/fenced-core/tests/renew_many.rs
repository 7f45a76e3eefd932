//! The batch renewal (`Command::RenewMany`): one command, one log entry, one
//! outcome per lease, each exactly what a `Renew` of its own would answer.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use fenced_core::*;
use proptest::prelude::*;

const TTL: u64 = 10_000;

fn name(s: &str) -> ResourceName {
    ResourceName::new(s).unwrap()
}

fn at(ms: u64) -> ClusterTime {
    ClusterTime::from_millis(ms)
}

fn lease(res: &str, owner: OwnerId, token: Token, ttl_ms: u64) -> RenewLease {
    RenewLease {
        resource: name(res),
        owner_id: owner,
        token,
        ttl_ms,
    }
}

fn renew_many(leases: Vec<RenewLease>) -> Command {
    Command::RenewMany {
        leases: RenewLeases::new(leases).unwrap(),
    }
}

fn apply(table: &mut LeaseTable, ms: u64, commands: Vec<Command>) -> Applied {
    let applied = table.apply(&Batch {
        stamp: at(ms),
        commands,
    });
    table.check_invariants().unwrap();
    applied
}

fn grant(table: &mut LeaseTable, ms: u64, res: &str, owner: OwnerId) -> Token {
    let out = apply(
        table,
        ms,
        vec![Command::Acquire {
            resource: name(res),
            owner_id: owner,
            ttl_ms: TTL,
            wait_ms: 0,
        }],
    );
    match out.outcomes[0] {
        Outcome::Acquire(AcquireOutcome::Granted(g)) => g.token,
        ref other => panic!("{res}: not granted: {other:?}"),
    }
}

#[test]
fn each_lease_gets_its_own_outcome_and_no_lost_lease_is_revived() {
    let mut t = LeaseTable::new();
    let (o, other) = (OwnerId::random(), OwnerId::random());
    let live = grant(&mut t, 0, "live", o);
    let released = grant(&mut t, 0, "released", o);
    let expired = grant(&mut t, 0, "expired", o);
    let superseded = grant(&mut t, 0, "superseded", o);
    apply(
        &mut t,
        100,
        vec![Command::Release {
            resource: name("released"),
            owner_id: o,
            token: released,
        }],
    );
    // Keep "live" and "superseded" going; "expired" runs out at 10 000.
    let keep = renew_many(vec![
        lease("live", o, live, TTL),
        lease("superseded", o, superseded, 2_000),
    ]);
    let out = apply(&mut t, 9_000, vec![keep]);
    assert_eq!(out.outcomes.len(), 1, "one command, one outcome");
    // "superseded" runs out at 11 000; another owner takes it and releases
    // it, so what is remembered last is the newer lease.
    let newer = grant(&mut t, 11_500, "superseded", other);
    apply(
        &mut t,
        11_600,
        vec![Command::Release {
            resource: name("superseded"),
            owner_id: other,
            token: newer,
        }],
    );

    let out = apply(
        &mut t,
        12_000,
        vec![renew_many(vec![
            lease("live", o, live, TTL),
            lease("released", o, released, TTL),
            lease("expired", o, expired, TTL),
            lease("superseded", o, superseded, TTL),
            lease("never-held", o, live, TTL),
            // Right resource, wrong owner id: never renews.
            lease("live", other, live, TTL),
        ])],
    );
    let Outcome::RenewMany(each) = &out.outcomes[0] else {
        panic!("not a batch answer: {:?}", out.outcomes[0]);
    };
    assert_eq!(
        each,
        &vec![
            RenewOutcome::Renewed {
                expires_at: at(22_000),
                ttl_ms: TTL
            },
            RenewOutcome::Lost(LostReason::Released),
            RenewOutcome::Lost(LostReason::Expired),
            RenewOutcome::Lost(LostReason::Superseded {
                current_token: newer
            }),
            RenewOutcome::Lost(LostReason::Unknown),
            RenewOutcome::Lost(LostReason::Unknown),
        ]
    );
    // Nothing lost came back; the renewed lease kept its token.
    assert_eq!(t.holder("live").unwrap().1.token, live);
    assert_eq!(t.holder("live").unwrap().0, o);
    assert!(t.holder("released").is_none());
    assert!(t.holder("expired").is_none());
    assert!(t.holder("superseded").is_none());
    assert_eq!(t.describe("superseded", at(12_000)).last_token, Some(newer));
    assert_eq!(t.resources(), 4, "a renew of an unknown resource adds none");
}

#[test]
fn leases_renewed_together_lapse_together_at_one_cluster_time() {
    let mut t = LeaseTable::new();
    let o = OwnerId::random();
    let names: Vec<String> = (0..50).map(|i| format!("s/{i}")).collect();
    let leases: Vec<RenewLease> = names
        .iter()
        .enumerate()
        .map(|(i, n)| lease(n, o, grant(&mut t, i as u64 * 10, n, o), TTL))
        .collect();
    // Granted at different times; one keep-alive aligns them.
    let out = apply(&mut t, 5_000, vec![renew_many(leases)]);
    let Outcome::RenewMany(each) = &out.outcomes[0] else {
        panic!("{:?}", out.outcomes[0]);
    };
    assert!(each.iter().all(|o| *o
        == RenewOutcome::Renewed {
            expires_at: at(15_000),
            ttl_ms: TTL
        }));
    // The session stops: one ms before, every lease runs; at the expiry, the
    // same entry ends them all.
    assert!(apply(&mut t, 14_999, vec![]).events.is_empty());
    assert_eq!(t.live_leases(), 50);
    let ended = apply(&mut t, 15_000, vec![]).events;
    assert_eq!(ended.len(), 50);
    assert!(ended.iter().all(|e| matches!(e, Event::Expired { .. })));
    assert_eq!(t.live_leases(), 0);
}

#[test]
fn a_retried_batch_renews_again_and_changes_nothing_else() {
    let mut t = LeaseTable::new();
    let o = OwnerId::random();
    let a = grant(&mut t, 0, "a", o);
    let cmd = renew_many(vec![lease("a", o, a, TTL)]);
    apply(&mut t, 1_000, vec![cmd.clone()]);
    let revision = t.revision();
    // The same batch again (a retry after a lost reply): renewed, same token,
    // no new change recorded.
    let out = apply(&mut t, 1_500, vec![cmd]);
    assert_eq!(
        out.outcomes[0],
        Outcome::RenewMany(vec![RenewOutcome::Renewed {
            expires_at: at(11_500),
            ttl_ms: TTL
        }])
    );
    assert_eq!(t.revision(), revision);
    assert_eq!(t.holder("a").unwrap().1.token, a);
}

#[test]
fn bounds_name_the_field_and_the_bound() {
    let o = OwnerId::random();
    let tok = Token::new(1).unwrap();
    let err = RenewLeases::new(vec![]).unwrap_err();
    assert_eq!(err.field(), "leases");
    assert!(err.to_string().contains("1 to 4096"), "{err}");

    let err = RenewLeases::new(vec![lease("a", o, tok, TTL); MAX_RENEW_BATCH + 1]).unwrap_err();
    assert_eq!(err.field(), "leases");
    assert!(err.to_string().contains("got 4097"), "{err}");
    assert!(RenewLeases::new(vec![lease("a", o, tok, TTL); MAX_RENEW_BATCH]).is_ok());

    // 1 000 names of 200 bytes weigh 232 000 bytes: over the entry's share.
    let long = "x".repeat(RESOURCE_NAME_MAX_BYTES);
    let err = RenewLeases::new(vec![lease(&long, o, tok, TTL); 1_000]).unwrap_err();
    assert_eq!(err.field(), "leases");
    assert!(
        err.to_string()
            .contains(&format!("at most {MAX_RENEW_BATCH_BYTES} bytes")),
        "{err}"
    );

    let cmd = renew_many(vec![lease("a", o, tok, TTL), lease("b", o, tok, 10)]);
    let err = cmd.validate(&Limits::default()).unwrap_err();
    assert_eq!(err.field(), "leases");
    assert!(err.to_string().contains("leases[1].ttl_ms"), "{err}");
    assert!(renew_many(vec![lease("a", o, tok, TTL)])
        .validate(&Limits::default())
        .is_ok());
}

#[test]
fn a_batch_read_back_is_checked_like_one_built() {
    let o = OwnerId::random();
    let tok = Token::new(3).unwrap();
    let cmd = renew_many(vec![lease("a", o, tok, TTL), lease("b", o, tok, TTL)]);
    let json = serde_json::to_string(&cmd).unwrap();
    assert_eq!(serde_json::from_str::<Command>(&json).unwrap(), cmd);
    // An empty list never decodes into a command.
    let empty = r#"{"RenewMany":{"leases":[]}}"#;
    assert!(serde_json::from_str::<Command>(empty).is_err());
    assert_eq!(
        cmd.resources()
            .map(ResourceName::as_str)
            .collect::<Vec<_>>(),
        ["a", "b"]
    );
    assert_eq!(cmd.kv_bytes(), 2 * 33);
}

#[derive(Debug, Clone)]
enum Op {
    Acquire(usize, usize),
    Release(usize, usize),
    Tick,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..6usize, 0..3usize).prop_map(|(r, o)| Op::Acquire(r, o)),
        (0..6usize, 0..3usize).prop_map(|(r, o)| Op::Release(r, o)),
        Just(Op::Tick),
    ]
}

proptest! {
    /// Whatever the table holds, one `RenewMany` decides every lease and
    /// leaves the table exactly as the same renewals, one `Renew` each, in
    /// one entry would.
    #[test]
    fn renew_many_is_the_renews_it_carries(
        ops in prop::collection::vec(op(), 0..40),
        picks in prop::collection::vec((0..6usize, 0..3usize, 0..4u64, 1_000..20_000u64), 1..12),
        gap in 0..15_000u64,
    ) {
        let owners = [OwnerId::random(), OwnerId::random(), OwnerId::random()];
        let res = |r: usize| name(&format!("r{r}"));
        let mut t = LeaseTable::new();
        let mut ms = 0;
        for op in ops {
            ms += 700;
            let commands = match op {
                Op::Acquire(r, o) => vec![Command::Acquire {
                    resource: res(r), owner_id: owners[o], ttl_ms: TTL, wait_ms: 0,
                }],
                Op::Release(r, o) => match t.holder(res(r).as_str()) {
                    Some((_, g)) => vec![Command::Release {
                        resource: res(r), owner_id: owners[o], token: g.token,
                    }],
                    None => vec![],
                },
                Op::Tick => vec![],
            };
            apply(&mut t, ms, commands);
        }
        let last = t.last_token().map_or(1, Token::get);
        let leases: Vec<RenewLease> = picks
            .iter()
            .map(|&(r, o, back, ttl_ms)| RenewLease {
                resource: res(r),
                owner_id: owners[o],
                token: Token::new(last.saturating_sub(back).max(1)).unwrap(),
                ttl_ms,
            })
            .collect();
        let singles: Vec<Command> = leases
            .iter()
            .map(|l| Command::Renew {
                resource: l.resource.clone(), owner_id: l.owner_id, token: l.token, ttl_ms: l.ttl_ms,
            })
            .collect();
        let mut one = t.clone();
        let mut each = t;
        let batched = apply(&mut one, ms + gap, vec![renew_many(leases)]);
        let separate = apply(&mut each, ms + gap, singles);
        let renewed_singly: Vec<RenewOutcome> = separate
            .outcomes
            .into_iter()
            .map(RenewOutcome::from_outcome)
            .collect::<Result<_, _>>()
            .map_err(|o| TestCaseError::fail(format!("a renew answered with {o:?}")))?;
        prop_assert_eq!(&batched.outcomes, &vec![Outcome::RenewMany(renewed_singly)]);
        prop_assert_eq!(batched.events, separate.events);
        prop_assert_eq!(one.snapshot(), each.snapshot());
    }
}
