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
fn a_key_belongs_to_the_resource_that_first_wrote_it() {
    let mut table = LeaseTable::new();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let ta = grant(&mut table, 0, "r1", a);
    let tb = grant(&mut table, 0, "r2", b);
    assert!(tb > ta);
    apply_one(&mut table, 1, put("shared", b"b", "r2", b, tb));
    // A still holds r1, but the key is r2's.
    assert_eq!(
        refused(apply_one(&mut table, 2, put("shared", b"a", "r1", a, ta))),
        KvRefusal::KeyOfAnotherResource {
            key_resource: name("r2")
        }
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
        KvRefusal::KeyOfAnotherResource {
            key_resource: name("r2")
        }
    );
    assert_eq!(table.kv().get("shared").unwrap().value.as_bytes(), b"b");
    // A newer token of another resource does not take it either.
    let a2 = OwnerId::random();
    let t3 = grant(&mut table, 3, "r3", a2);
    assert_eq!(
        refused(apply_one(&mut table, 4, put("shared", b"c", "r3", a2, t3))),
        KvRefusal::KeyOfAnotherResource {
            key_resource: name("r2")
        }
    );
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
    // The tombstone keeps the key (its bytes count), its resource and token.
    assert_eq!(table.kv().total_bytes(), 1);
    let tomb = table.kv().tombstone("k").unwrap();
    assert_eq!(
        (tomb.resource.as_str(), tomb.token, tomb.revision),
        ("job", tb, 2)
    );
    assert_eq!(
        refused(apply_one(
            &mut table,
            TTL + 5,
            put("k", b"late", "job", a, ta)
        )),
        KvRefusal::KeyHasNewerToken { key_token: tb }
    );
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

fn delete(key: &str, res: &str, owner: OwnerId, token: Token) -> Command {
    Command::KvDelete {
        key: KvKey::new(key).unwrap(),
        resource: name(res),
        owner_id: owner,
        token,
    }
}

fn is_refused(outcome: &Outcome) -> bool {
    matches!(
        outcome,
        Outcome::KvPut(KvPutOutcome::Refused(_)) | Outcome::KvDelete(KvDeleteOutcome::Refused(_))
    )
}

/// The attack: B holds its own resource with a newer token than A's and
/// writes (or deletes) a key A's lease wrote. The key is A's.
#[test]
fn a_holder_of_another_resource_cannot_write_a_key_even_with_a_newer_token() {
    let mut table = LeaseTable::new();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let ta = grant(&mut table, 0, "ledger/a", a);
    apply_one(&mut table, 1, put("balance", b"100", "ledger/a", a, ta));
    let tb = grant(&mut table, 2, "other/b", b);
    assert!(tb > ta);
    let out = apply_one(&mut table, 3, put("balance", b"0", "other/b", b, tb));
    assert!(is_refused(&out), "B overwrote A's key: {out:?}");
    let out = apply_one(&mut table, 3, delete("balance", "other/b", b, tb));
    assert!(is_refused(&out), "B deleted A's key: {out:?}");
    let entry = table.kv().get("balance").unwrap();
    assert_eq!(
        (entry.value.as_bytes(), entry.resource.as_str(), entry.token),
        (&b"100"[..], "ledger/a", ta)
    );
    // A itself still writes it.
    assert!(matches!(
        apply_one(&mut table, 4, put("balance", b"90", "ledger/a", a, ta)),
        Outcome::KvPut(KvPutOutcome::Applied { .. })
    ));
}

/// The attack: after a delete by the newer holder, an older holder's put
/// must not land, and the key's token must not go back. The older holder
/// here holds another resource (live), and then the same resource
/// (superseded).
#[test]
fn after_a_delete_an_older_holders_put_is_refused_and_the_token_never_goes_back() {
    let mut table = LeaseTable::new();
    let (a, b, c) = (OwnerId::random(), OwnerId::random(), OwnerId::random());
    let told = grant(&mut table, 0, "r-old", a);
    let t1 = grant(&mut table, 0, "job", b);
    apply_one(&mut table, 1, put("k", b"one", "job", b, t1));
    apply_one(
        &mut table,
        2,
        Command::Release {
            resource: name("job"),
            owner_id: b,
            token: t1,
        },
    );
    let t2 = grant(&mut table, 3, "job", c);
    assert!(t2 > told);
    apply_one(&mut table, 4, put("k", b"two", "job", c, t2));
    assert!(matches!(
        apply_one(&mut table, 5, delete("k", "job", c, t2)),
        Outcome::KvDelete(KvDeleteOutcome::Applied { existed: true, .. })
    ));
    assert!(
        table.kv().get("k").is_none(),
        "a deleted key reads as absent"
    );
    // A live lease on another resource, older token.
    let out = apply_one(&mut table, 6, put("k", b"stale", "r-old", a, told));
    assert!(
        is_refused(&out),
        "an older token landed after a delete: {out:?}"
    );
    // The released holder of the key's own resource.
    let out = apply_one(&mut table, 6, put("k", b"stale", "job", b, t1));
    assert!(
        is_refused(&out),
        "a released token landed after a delete: {out:?}"
    );
    assert!(table.kv().get("k").is_none());
    // The key's holder writes it again, with its token.
    assert!(matches!(
        apply_one(&mut table, 7, put("k", b"three", "job", c, t2)),
        Outcome::KvPut(KvPutOutcome::Applied { .. })
    ));
    assert_eq!(table.kv().get("k").unwrap().token, t2);
}

/// The same attacks against a store that went through its snapshot (and
/// its JSON form): what a delete leaves, and whose key it is, survive.
#[test]
fn a_keys_resource_and_deleted_token_survive_a_snapshot_round_trip() {
    let mut table = LeaseTable::new();
    let (a, b, c) = (OwnerId::random(), OwnerId::random(), OwnerId::random());
    let t1 = grant(&mut table, 0, "job", a);
    apply_one(&mut table, 1, put("gone", b"x", "job", a, t1));
    apply_one(&mut table, 1, put("kept", b"y", "job", a, t1));
    let t2 = grant(&mut table, TTL + 1, "job", b);
    apply_one(&mut table, TTL + 2, put("gone", b"x2", "job", b, t2));
    apply_one(&mut table, TTL + 2, delete("gone", "job", b, t2));
    let t3 = grant(&mut table, TTL + 2, "other", c);
    let kv = serde_json::to_string(&table.kv_snapshot()).unwrap();
    let mut restored = LeaseTable::from_snapshot(table.snapshot()).unwrap();
    restored
        .restore_kv(serde_json::from_str(&kv).unwrap())
        .unwrap();
    restored.check_invariants().unwrap();
    assert_eq!(restored.kv(), table.kv());
    assert!(restored.kv().get("gone").is_none());
    let out = apply_one(&mut restored, TTL + 3, put("gone", b"stale", "job", a, t1));
    assert!(is_refused(&out), "{out:?}");
    let out = apply_one(&mut restored, TTL + 3, put("kept", b"z", "other", c, t3));
    assert!(is_refused(&out), "{out:?}");
    let out = apply_one(&mut restored, TTL + 3, put("gone", b"z", "other", c, t3));
    assert!(is_refused(&out), "{out:?}");
    assert!(restored.kv().get("gone").is_none());
    assert_eq!(restored.kv().get("kept").unwrap().token, t1);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// Random histories of grants, renewals, releases, puts and deletes on
    /// three resources and three keys, checked against a model: a key
    /// belongs to the resource that first wrote it, only that resource's
    /// current holder writes or deletes it, and its token never goes back,
    /// deletes included; across snapshot round trips too.
    #[test]
    fn a_key_is_written_only_by_its_resources_holder_and_its_token_never_goes_back(
        steps in proptest::collection::vec(
            (proptest::collection::vec(step(), 1..4), any::<bool>()), 1..60)
    ) {
        let owners: Vec<OwnerId> = (0..4).map(|_| OwnerId::random()).collect();
        let res_name = |r: usize| name(&format!("r{r}"));
        let key_name = |k: usize| KvKey::new(&format!("k{k}")).unwrap();
        let owner_index = |o: OwnerId| owners.iter().position(|x| *x == o).unwrap();
        let mut table = LeaseTable::new();
        let mut model = Model::default();
        let mut granted: BTreeMap<(usize, usize), Token> = BTreeMap::new();
        // key → (its resource, its token, live)
        let mut keys: BTreeMap<usize, (usize, Token, bool)> = BTreeMap::new();
        let mut now = 0u64;
        for (batch_steps, round_trip) in steps {
            if round_trip {
                let kv = serde_json::to_string(&table.kv_snapshot()).unwrap();
                let mut restored = LeaseTable::from_snapshot(table.snapshot()).unwrap();
                restored.restore_kv(serde_json::from_str(&kv).unwrap()).unwrap();
                prop_assert_eq!(restored.kv(), table.kv());
                table = restored;
            }
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
                    Step::Delete { res, owner, key } => delete(&format!("k{key}"), &format!("r{res}"), owners[owner], token_of(res, owner)),
                });
            }
            let stamp = at(now);
            let applied = table.apply(&Batch { stamp, commands: commands.clone() });
            table.check_invariants().map_err(TestCaseError::fail)?;
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
                        let owned = keys.get(&k).is_none_or(|&(kr, _, _)| kr == r);
                        let is_put = matches!(command, Command::KvPut { .. });
                        let applied = matches!(outcome,
                            Outcome::KvPut(KvPutOutcome::Applied { .. })
                            | Outcome::KvDelete(KvDeleteOutcome::Applied { .. }));
                        prop_assert_eq!(applied, current && owned,
                            "{:?} answered {:?}: holders {:?}, keys {:?}", command, outcome, model.holders, keys);
                        prop_assert_eq!(is_put, matches!(outcome, Outcome::KvPut(_)));
                        let refusal = match outcome {
                            Outcome::KvPut(KvPutOutcome::Refused(r)) | Outcome::KvDelete(KvDeleteOutcome::Refused(r)) => Some(r),
                            _ => None,
                        };
                        // Each refusal is for what it says.
                        match refusal {
                            Some(KvRefusal::Lease(_)) => prop_assert!(!current, "the current holder's {:?} was refused", command),
                            Some(KvRefusal::KeyHasNewerToken { key_token }) => {
                                prop_assert_eq!(keys.get(&k).map(|e| e.1), Some(*key_token));
                                prop_assert!(key_token > token);
                            }
                            Some(KvRefusal::KeyOfAnotherResource { key_resource }) => {
                                prop_assert_eq!(keys.get(&k).map(|e| res_name(e.0)), Some(key_resource.clone()));
                                prop_assert!(!owned);
                            }
                            None => prop_assert!(applied, "unexpected {:?}", outcome),
                        }
                        if applied {
                            if let Some(&(_, kt, _)) = keys.get(&k) {
                                prop_assert!(*token >= kt, "key k{} went from token {:?} back to {:?}", k, kt, token);
                            }
                            match keys.get_mut(&k) {
                                Some(e) if is_put || e.2 => *e = (r, *token, is_put),
                                Some(_) => {}
                                None if is_put => { keys.insert(k, (r, *token, true)); }
                                None => {}
                            }
                        }
                    }
                    _ => {}
                }
            }
            for k in 0..3 {
                let stored = table.kv().get(key_name(k).as_str()).map(|e| (e.resource.as_str()[1..].parse::<usize>().unwrap(), e.token));
                let want = keys.get(&k).filter(|e| e.2).map(|e| (e.0, e.1));
                prop_assert_eq!(stored, want);
            }
        }
    }
}

#[test]
fn tombstones_count_toward_the_key_and_byte_bounds() {
    let mut table = LeaseTable::new();
    let a = OwnerId::random();
    let t = grant(&mut table, 0, "job", a);
    let bounds = KvBounds {
        max_keys: 2,
        max_total_bytes: 12,
    };
    apply_one(
        &mut table,
        1,
        put_within("k1", b"12345", "job", a, t, bounds),
    );
    apply_one(&mut table, 1, delete("k1", "job", a, t));
    apply_one(&mut table, 1, put_within("k2", b"1", "job", a, t, bounds));
    assert_eq!(table.kv().key_count(), 2);
    assert_eq!(table.kv().total_bytes(), 2 + 2 + 1);
    // A third key would pass max_keys: the tombstone holds its place.
    assert_eq!(
        apply_one(&mut table, 2, put_within("k3", b"", "job", a, t, bounds)),
        Outcome::KvPut(KvPutOutcome::BoundReached {
            bound: KvBound::Keys,
            limit: 2
        })
    );
    // Writing the deleted key again takes its place back, counted once.
    assert!(matches!(
        apply_one(
            &mut table,
            2,
            put_within("k1", b"1234567", "job", a, t, bounds)
        ),
        Outcome::KvPut(KvPutOutcome::Applied { existed: false, .. })
    ));
    assert_eq!(table.kv().total_bytes(), 2 + 7 + 2 + 1);
    assert_eq!(table.kv().tombstones(), 0);
}

#[test]
fn a_format_1_kv_snapshot_loads_without_tombstones() {
    let json = serde_json::json!({
        "format_version": 1,
        "revision": 3,
        "entries": [["k", {"value": [118], "resource": "job", "token": 2, "revision": 3}]],
    });
    let store = KvStore::from_snapshot(serde_json::from_value(json).unwrap()).unwrap();
    assert_eq!(store.get("k").unwrap().resource.as_str(), "job");
    assert_eq!(store.tombstones(), 0);
    // A store without tombstones is still written as format 1, which the
    // release before them reads; with one it is format 2.
    assert_eq!(store.snapshot().format_version(), 1);
    let mut table = LeaseTable::new();
    let a = OwnerId::random();
    let t = grant(&mut table, 0, "job", a);
    apply_one(&mut table, 1, put("k", b"v", "job", a, t));
    apply_one(&mut table, 1, delete("k", "job", a, t));
    assert_eq!(
        table.kv_snapshot().format_version(),
        KV_SNAPSHOT_FORMAT_VERSION
    );
    // A format 1 snapshot claiming tombstones is refused.
    let mut json = serde_json::to_value(table.kv_snapshot()).unwrap();
    json["format_version"] = 1.into();
    assert!(matches!(
        KvStore::from_snapshot(serde_json::from_value(json).unwrap()),
        Err(SnapshotError::Invariant(_))
    ));
}

#[test]
fn the_revision_counter_refuses_at_its_end_without_wrapping() {
    let mut table = LeaseTable::new();
    let a = OwnerId::random();
    let t = grant(&mut table, 0, "job", a);
    let json = serde_json::json!({
        "format_version": 1,
        "revision": u64::MAX,
        "entries": [["k", {"value": [118], "resource": "job", "token": t.get(), "revision": u64::MAX}]],
    });
    table
        .restore_kv(serde_json::from_value(json).unwrap())
        .unwrap();
    let full = KvBound::Revisions;
    assert_eq!(
        apply_one(&mut table, 1, put("k", b"w", "job", a, t)),
        Outcome::KvPut(KvPutOutcome::BoundReached {
            bound: full,
            limit: u64::MAX
        })
    );
    assert_eq!(
        apply_one(&mut table, 1, delete("k", "job", a, t)),
        Outcome::KvDelete(KvDeleteOutcome::BoundReached {
            bound: full,
            limit: u64::MAX
        })
    );
    assert_eq!(table.kv().get("k").unwrap().value.as_bytes(), b"v");
    assert_eq!(table.kv().revision(), u64::MAX);
}
