//! Fenced writes: a put is applied only with the resource's current,
//! unexpired holder's owner id and token at the entry's cluster time, a
//! key's tokens never go backwards, and the store's bounds hold.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use fenced_core::*;
use proptest::prelude::*;

const TTL: u64 = 10_000;
const WIDE: KvBounds = KvBounds {
    max_keys: u64::MAX,
    max_total_bytes: u64::MAX,
};

fn at(ms: u64) -> ClusterTime {
    ClusterTime::from_millis(ms)
}

fn name(s: &str) -> ResourceName {
    ResourceName::new(s).unwrap()
}

fn acquire(res: &str, owner: OwnerId) -> Command {
    Command::Acquire {
        resource: name(res),
        owner_id: owner,
        ttl_ms: TTL,
        wait_ms: 0,
    }
}

fn put_within(
    key: &str,
    value: &[u8],
    res: &str,
    owner: OwnerId,
    token: Token,
    bounds: KvBounds,
) -> Command {
    Command::KvPut {
        key: KvKey::new(key).unwrap(),
        value: KvValue::new(value.to_vec()).unwrap(),
        resource: name(res),
        owner_id: owner,
        token,
        bounds,
    }
}

fn put(key: &str, value: &[u8], res: &str, owner: OwnerId, token: Token) -> Command {
    put_within(key, value, res, owner, token, WIDE)
}

fn apply_one(table: &mut LeaseTable, ms: u64, command: Command) -> Outcome {
    let out = table.apply(&Batch {
        stamp: at(ms),
        commands: vec![command],
    });
    table.check_invariants().unwrap();
    out.outcomes.into_iter().next().expect("one outcome")
}

fn grant(table: &mut LeaseTable, ms: u64, res: &str, owner: OwnerId) -> Token {
    match apply_one(table, ms, acquire(res, owner)) {
        Outcome::Acquire(AcquireOutcome::Granted(g)) => g.token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn refused(outcome: Outcome) -> KvRefusal {
    match outcome {
        Outcome::KvPut(KvPutOutcome::Refused(r))
        | Outcome::KvDelete(KvDeleteOutcome::Refused(r)) => r,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn the_holders_put_is_applied_and_read_back_with_its_token() {
    let mut table = LeaseTable::new();
    let a = OwnerId::random();
    let token = grant(&mut table, 0, "job", a);
    let out = apply_one(
        &mut table,
        100,
        put("job/state", b"step-1", "job", a, token),
    );
    assert_eq!(
        out,
        Outcome::KvPut(KvPutOutcome::Applied {
            revision: 1,
            existed: false
        })
    );
    let out = apply_one(
        &mut table,
        200,
        put("job/state", b"step-2", "job", a, token),
    );
    assert_eq!(
        out,
        Outcome::KvPut(KvPutOutcome::Applied {
            revision: 2,
            existed: true
        })
    );
    let entry = table.kv().get("job/state").expect("written");
    assert_eq!(entry.value.as_bytes(), b"step-2");
    assert_eq!(
        (entry.resource.as_str(), entry.token, entry.revision),
        ("job", token, 2)
    );
    assert_eq!(table.kv().total_bytes(), ("job/state".len() + 6) as u64);
}

#[test]
fn a_superseded_token_is_refused_with_the_current_token() {
    let mut table = LeaseTable::new();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let old = grant(&mut table, 0, "job", a);
    // A's lease runs out and B is granted: A's put is refused, B's applies.
    let new = grant(&mut table, TTL, "job", b);
    assert_eq!(
        refused(apply_one(
            &mut table,
            TTL + 1,
            put("k", b"a", "job", a, old)
        )),
        KvRefusal::Lease(LostReason::Superseded { current_token: new })
    );
    assert!(matches!(
        apply_one(&mut table, TTL + 2, put("k", b"b", "job", b, new)),
        Outcome::KvPut(KvPutOutcome::Applied { .. })
    ));
    assert_eq!(table.kv().get("k").unwrap().token, new);
}

#[test]
fn an_expired_or_released_lease_writes_nothing() {
    let mut table = LeaseTable::new();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let ta = grant(&mut table, 0, "r1", a);
    // At exactly the expiry the lease is over.
    assert_eq!(
        refused(apply_one(&mut table, TTL, put("k1", b"x", "r1", a, ta))),
        KvRefusal::Lease(LostReason::Expired)
    );
    let tb = grant(&mut table, TTL, "r2", b);
    apply_one(
        &mut table,
        TTL + 1,
        Command::Release {
            resource: name("r2"),
            owner_id: b,
            token: tb,
        },
    );
    assert_eq!(
        refused(apply_one(&mut table, TTL + 2, put("k2", b"x", "r2", b, tb))),
        KvRefusal::Lease(LostReason::Released)
    );
    assert!(table.kv().is_empty());
    assert_eq!(table.kv().revision(), 0);
}

#[test]
fn a_wrong_owner_or_an_unknown_resource_is_refused_as_unknown() {
    let mut table = LeaseTable::new();
    let a = OwnerId::random();
    let token = grant(&mut table, 0, "job", a);
    // The token alone is not the capability: the owner id must match too.
    assert_eq!(
        refused(apply_one(
            &mut table,
            1,
            put("k", b"x", "job", OwnerId::random(), token)
        )),
        KvRefusal::Lease(LostReason::Unknown)
    );
    assert_eq!(
        refused(apply_one(&mut table, 1, put("k", b"x", "other", a, token))),
        KvRefusal::Lease(LostReason::Unknown)
    );
    let future = Token::new(token.get() + 5).unwrap();
    assert_eq!(
        refused(apply_one(&mut table, 1, put("k", b"x", "job", a, future))),
        KvRefusal::Lease(LostReason::Unknown)
    );
}

#[test]
fn puts_are_ordered_with_grants_inside_one_entry() {
    let mut table = LeaseTable::new();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let ta = grant(&mut table, 0, "job", a);
    // Release then put in one entry: the put sees the release.
    let out = table.apply(&Batch {
        stamp: at(1),
        commands: vec![
            Command::Release {
                resource: name("job"),
                owner_id: a,
                token: ta,
            },
            put("k", b"late", "job", a, ta),
            acquire("job", b),
            put("k", b"b", "job", b, Token::new(ta.get() + 1).unwrap()),
        ],
    });
    assert_eq!(out.outcomes[0], Outcome::Release(ReleaseOutcome::Released));
    assert!(matches!(
        out.outcomes[1],
        Outcome::KvPut(KvPutOutcome::Refused(_))
    ));
    assert!(matches!(
        out.outcomes[2],
        Outcome::Acquire(AcquireOutcome::Granted(_))
    ));
    assert!(matches!(
        out.outcomes[3],
        Outcome::KvPut(KvPutOutcome::Applied { .. })
    ));
    assert_eq!(table.kv().get("k").unwrap().value.as_bytes(), b"b");
}

#[test]
fn a_keys_tokens_never_go_backwards_across_resources() {
    let mut table = LeaseTable::new();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let ta = grant(&mut table, 0, "r1", a);
    let tb = grant(&mut table, 0, "r2", b);
    assert!(tb > ta);
    apply_one(&mut table, 1, put("shared", b"b", "r2", b, tb));
    // A still holds r1, but its token is older than the key's.
    assert_eq!(
        refused(apply_one(&mut table, 2, put("shared", b"a", "r1", a, ta))),
        KvRefusal::KeyHasNewerToken { key_token: tb }
    );
    assert_eq!(
        refused(apply_one(
            &mut table,
            2,
            Command::KvDelete {
                key: KvKey::new("shared").unwrap(),
                resource: name("r1"),
                owner_id: a,
                token: ta,
            }
        )),
        KvRefusal::KeyHasNewerToken { key_token: tb }
    );
    assert_eq!(table.kv().get("shared").unwrap().value.as_bytes(), b"b");
}

#[test]
fn a_delete_is_fenced_like_a_put() {
    let mut table = LeaseTable::new();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let ta = grant(&mut table, 0, "job", a);
    apply_one(&mut table, 1, put("k", b"v", "job", a, ta));
    let tb = grant(&mut table, TTL + 1, "job", b);
    let delete = |owner, token| Command::KvDelete {
        key: KvKey::new("k").unwrap(),
        resource: name("job"),
        owner_id: owner,
        token,
    };
    assert_eq!(
        refused(apply_one(&mut table, TTL + 2, delete(a, ta))),
        KvRefusal::Lease(LostReason::Superseded { current_token: tb })
    );
    assert_eq!(
        apply_one(&mut table, TTL + 3, delete(b, tb)),
        Outcome::KvDelete(KvDeleteOutcome::Applied {
            revision: 2,
            existed: true
        })
    );
    assert_eq!(
        apply_one(&mut table, TTL + 4, delete(b, tb)),
        Outcome::KvDelete(KvDeleteOutcome::Applied {
            revision: 2,
            existed: false
        })
    );
    assert!(table.kv().is_empty());
    assert_eq!(table.kv().total_bytes(), 0);
}

#[test]
fn the_store_bounds_refuse_and_name_their_setting() {
    let mut table = LeaseTable::new();
    let a = OwnerId::random();
    let t = grant(&mut table, 0, "job", a);
    let bounds = KvBounds {
        max_keys: 2,
        max_total_bytes: 20,
    };
    let p = |key: &str, value: &[u8]| put_within(key, value, "job", a, t, bounds);
    assert!(matches!(
        apply_one(&mut table, 1, p("k1", b"12345")),
        Outcome::KvPut(KvPutOutcome::Applied { .. })
    ));
    assert!(matches!(
        apply_one(&mut table, 1, p("k2", b"12345")),
        Outcome::KvPut(KvPutOutcome::Applied { .. })
    ));
    let full = apply_one(&mut table, 1, p("k3", b""));
    assert_eq!(
        full,
        Outcome::KvPut(KvPutOutcome::BoundReached {
            bound: KvBound::Keys,
            limit: 2
        })
    );
    // Replacing a value counts the new size in place of the old one.
    assert!(matches!(
        apply_one(&mut table, 1, p("k1", b"1234567890")),
        Outcome::KvPut(KvPutOutcome::Applied { .. })
    ));
    let too_big = apply_one(&mut table, 1, p("k1", b"12345678901234"));
    let Outcome::KvPut(KvPutOutcome::BoundReached { bound, limit }) = too_big else {
        panic!("expected a bound, got {too_big:?}");
    };
    assert_eq!((bound.setting(), limit), ("kv_max_total_bytes", 20));
    assert_eq!(KvBound::Keys.setting(), "kv_max_keys");
    assert_eq!(table.kv().total_bytes(), 2 + 10 + 2 + 5);
    assert_eq!(
        table.kv().get("k1").unwrap().value.as_bytes(),
        b"1234567890"
    );
}

#[test]
fn keys_and_values_outside_their_bounds_name_the_field() {
    let long = "k".repeat(KV_KEY_MAX_BYTES + 1);
    let err = KvKey::new(&long).unwrap_err();
    assert_eq!(err.field(), "key");
    assert!(err.to_string().contains("1 to 512 bytes"), "{err}");
    assert!(KvKey::new(&long[..KV_KEY_MAX_BYTES]).is_ok());
    assert_eq!(KvKey::new("a\u{7}b").unwrap_err().field(), "key");
    assert_eq!(KvKey::from_bytes(&[0xff, 0xfe]).unwrap_err().field(), "key");
    let err = KvValue::new(vec![1; KV_VALUE_MAX_BYTES + 1]).unwrap_err();
    assert_eq!(err.field(), "value");
    assert!(err.to_string().contains("65536"), "{err}");
    assert_eq!(
        KvValue::new(vec![1; KV_VALUE_MAX_BYTES]).unwrap().len(),
        KV_VALUE_MAX_BYTES
    );
    assert!(KvValue::new(Vec::new()).unwrap().is_empty());
}

#[test]
fn an_oversized_value_or_a_bad_key_is_refused_when_decoded() {
    // A log entry or snapshot is checked, not trusted.
    let big = serde_json::to_string(&vec![0u8; KV_VALUE_MAX_BYTES + 1]).unwrap();
    assert!(serde_json::from_str::<KvValue>(&big).is_err());
    let ok = serde_json::to_string(&KvValue::new(b"abc".to_vec()).unwrap()).unwrap();
    assert_eq!(
        serde_json::from_str::<KvValue>(&ok).unwrap().as_bytes(),
        b"abc"
    );
    assert!(serde_json::from_str::<KvKey>("\"\"").is_err());
}

#[test]
fn the_store_round_trips_through_its_snapshot() {
    let mut table = LeaseTable::new();
    let a = OwnerId::random();
    let t = grant(&mut table, 0, "job", a);
    for i in 0..5 {
        apply_one(&mut table, 1, put(&format!("k{i}"), &[i; 100], "job", a, t));
    }
    let kv = serde_json::to_string(&table.kv_snapshot()).unwrap();
    let mut restored = LeaseTable::from_snapshot(table.snapshot()).unwrap();
    restored
        .restore_kv(serde_json::from_str(&kv).unwrap())
        .unwrap();
    assert_eq!(restored.kv(), table.kv());
    restored.check_invariants().unwrap();
    // And keeps deciding the same: the next revision follows on.
    assert_eq!(
        apply_one(&mut restored, 2, put("k9", b"x", "job", a, t)),
        Outcome::KvPut(KvPutOutcome::Applied {
            revision: 6,
            existed: false
        })
    );
    // A table from before the store existed loads with an empty one.
    let mut old = LeaseTable::from_snapshot(table.snapshot()).unwrap();
    old.restore_kv(KvSnapshot::default()).unwrap();
    assert!(old.kv().is_empty());
}

#[test]
fn a_kv_snapshot_of_another_version_or_breaking_an_invariant_is_refused() {
    let mut table = LeaseTable::new();
    let a = OwnerId::random();
    let t = grant(&mut table, 0, "job", a);
    apply_one(&mut table, 1, put("k", b"v", "job", a, t));
    let mut json: serde_json::Value = serde_json::to_value(table.kv_snapshot()).unwrap();
    json["format_version"] = 9.into();
    let err = KvStore::from_snapshot(serde_json::from_value(json.clone()).unwrap()).unwrap_err();
    assert!(matches!(err, SnapshotError::Version { found: 9, .. }));
    json["format_version"] = 1.into();
    json["revision"] = 0.into();
    let err = KvStore::from_snapshot(serde_json::from_value(json).unwrap()).unwrap_err();
    assert!(matches!(err, SnapshotError::Invariant(_)), "{err:?}");
}

/// One step of a random history: time passes, and leases and puts happen.
#[derive(Debug, Clone)]
enum Step {
    Advance(u64),
    Acquire {
        res: usize,
        owner: usize,
    },
    Renew {
        res: usize,
        owner: usize,
    },
    Release {
        res: usize,
        owner: usize,
    },
    /// A put by `owner` with the token it was last granted on `res` (or a
    /// made-up one when it never was).
    Put {
        res: usize,
        owner: usize,
        key: usize,
    },
    Delete {
        res: usize,
        owner: usize,
        key: usize,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let (r, o, k) = (0..3usize, 0..4usize, 0..3usize);
    prop_oneof![
        (1..6_000u64).prop_map(Step::Advance),
        (r.clone(), o.clone()).prop_map(|(res, owner)| Step::Acquire { res, owner }),
        (r.clone(), o.clone()).prop_map(|(res, owner)| Step::Renew { res, owner }),
        (r.clone(), o.clone()).prop_map(|(res, owner)| Step::Release { res, owner }),
        (r.clone(), o.clone(), k.clone()).prop_map(|(res, owner, key)| Step::Put {
            res,
            owner,
            key
        }),
        (r, o, k).prop_map(|(res, owner, key)| Step::Delete { res, owner, key }),
    ]
}

/// Who holds what, rebuilt from the table's own grants, renewals, releases
/// and expiry events only: the put decision is checked against it.
#[derive(Default)]
struct Model {
    /// resource → (owner, token, expires_at)
    holders: BTreeMap<usize, (usize, Token, ClusterTime)>,
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn no_put_with_a_non_current_token_is_ever_applied(
        steps in proptest::collection::vec(proptest::collection::vec(step(), 1..4), 1..60)
    ) {
        let owners: Vec<OwnerId> = (0..4).map(|_| OwnerId::random()).collect();
        let res_name = |r: usize| name(&format!("r{r}"));
        let key_name = |k: usize| KvKey::new(&format!("k{k}")).unwrap();
        let owner_index = |o: OwnerId| owners.iter().position(|x| *x == o).unwrap();
        let mut table = LeaseTable::new();
        let mut model = Model::default();
        // The token each (resource, owner) was last granted: what it writes with.
        let mut granted: BTreeMap<(usize, usize), Token> = BTreeMap::new();
        let mut key_tokens: BTreeMap<usize, Token> = BTreeMap::new();
        let mut now = 0u64;
        for batch_steps in steps {
            let mut commands = Vec::new();
            for s in &batch_steps {
                let token_of = |res, owner| granted.get(&(res, owner)).copied().unwrap_or(Token::new(1).unwrap());
                commands.push(match *s {
                    Step::Advance(ms) => { now += ms; continue; }
                    Step::Acquire { res, owner } => acquire(&format!("r{res}"), owners[owner]),
                    Step::Renew { res, owner } => Command::Renew {
                        resource: res_name(res), owner_id: owners[owner], token: token_of(res, owner), ttl_ms: TTL,
                    },
                    Step::Release { res, owner } => Command::Release {
                        resource: res_name(res), owner_id: owners[owner], token: token_of(res, owner),
                    },
                    Step::Put { res, owner, key } => put(&format!("k{key}"), &[key as u8; 3], &format!("r{res}"), owners[owner], token_of(res, owner)),
                    Step::Delete { res, owner, key } => Command::KvDelete {
                        key: key_name(key), resource: res_name(res), owner_id: owners[owner], token: token_of(res, owner),
                    },
                });
            }
            let stamp = at(now);
            let applied = table.apply(&Batch { stamp, commands: commands.clone() });
            table.check_invariants().map_err(TestCaseError::fail)?;
            // Expiries and hand-offs happen at the start of the entry.
            for event in &applied.events {
                if let Event::Expired { resource, .. } = event {
                    let r: usize = resource.as_str()[1..].parse().unwrap();
                    model.holders.remove(&r);
                }
            }
            for (command, outcome) in commands.iter().zip(&applied.outcomes) {
                let r: usize = command.resource().unwrap().as_str()[1..].parse().unwrap();
                let o = owner_index(command.owner_id().unwrap());
                match (command, outcome) {
                    (Command::Acquire { .. }, Outcome::Acquire(AcquireOutcome::Granted(g))) => {
                        model.holders.insert(r, (o, g.token, g.expires_at));
                        granted.insert((r, o), g.token);
                    }
                    (Command::Renew { .. }, Outcome::Renew(RenewOutcome::Renewed { expires_at, .. })) => {
                        let h = model.holders.get_mut(&r).expect("renewed a held lease");
                        prop_assert_eq!((h.0, h.1), (o, granted[&(r, o)]));
                        h.2 = *expires_at;
                    }
                    (Command::Release { token, .. }, Outcome::Release(ReleaseOutcome::Released))
                        if model.holders.get(&r).is_some_and(|h| h.0 == o && h.1 == *token) =>
                    {
                        model.holders.remove(&r);
                    }
                    (Command::KvPut { key, token, .. } | Command::KvDelete { key, token, .. }, outcome) => {
                        let current = model.holders.get(&r).is_some_and(|&(ho, ht, exp)| ho == o && ht == *token && exp > stamp);
                        let k: usize = key.as_str()[1..].parse().unwrap();
                        prop_assert_eq!(
                            matches!(command, Command::KvPut { .. }),
                            matches!(outcome, Outcome::KvPut(_)),
                            "{:?} answered with {:?}", command, outcome
                        );
                        match outcome {
                            Outcome::KvPut(KvPutOutcome::Applied { existed, .. })
                            | Outcome::KvDelete(KvDeleteOutcome::Applied { existed, .. }) => {
                                prop_assert!(current, "{:?} applied with a non-current token at {:?}: holders {:?}", command, stamp, model.holders);
                                if let Some(prev) = key_tokens.get(&k) {
                                    prop_assert!(*token >= *prev, "key k{} went from token {:?} back to {:?}", k, prev, token);
                                }
                                if matches!(command, Command::KvPut { .. }) {
                                    key_tokens.insert(k, *token);
                                } else if *existed {
                                    key_tokens.remove(&k);
                                }
                            }
                            Outcome::KvPut(KvPutOutcome::Refused(KvRefusal::Lease(_)))
                            | Outcome::KvDelete(KvDeleteOutcome::Refused(KvRefusal::Lease(_))) => {
                                prop_assert!(!current, "the current holder's {:?} was refused", command);
                            }
                            Outcome::KvPut(KvPutOutcome::Refused(KvRefusal::KeyHasNewerToken { key_token }))
                            | Outcome::KvDelete(KvDeleteOutcome::Refused(KvRefusal::KeyHasNewerToken { key_token })) => {
                                prop_assert!(key_token > token);
                            }
                            other => prop_assert!(false, "unexpected {:?}", other),
                        }
                    }
                    _ => {}
                }
            }
            // The store holds exactly what the applied writes left.
            for k in 0..3 {
                let stored = table.kv().get(key_name(k).as_str()).map(|e| e.token);
                prop_assert_eq!(stored, key_tokens.get(&k).copied());
            }
            for event in &applied.events {
                if let Event::WaiterGranted { .. } = event {
                    prop_assert!(false, "no waits in this history");
                }
            }
        }
    }
}
