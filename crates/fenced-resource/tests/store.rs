//! The fence store's contract, one scenario per test.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{sync::Arc, thread, time::Duration};

use fenced_core::{OwnerId, ResourceName, Token};
use fenced_resource::{
    FenceStore, Mode, RejectReason, StoreError, VersionId, Write, WriteOutcome,
    IDEMPOTENCY_KEY_MAX_BYTES, KEY_MAX_BYTES, VALUE_MAX_BYTES,
};
use proptest::prelude::*;

const RES: &str = "statement:account-1842:2026-07";

fn res() -> ResourceName {
    ResourceName::new(RES).unwrap()
}

fn write(token: u64, owner: OwnerId, value: &str) -> Write {
    Write::for_resource(res(), Token::new(token).unwrap(), owner, value)
}

fn open() -> (tempfile::TempDir, FenceStore) {
    let dir = tempfile::tempdir().unwrap();
    let store = FenceStore::open(dir.path()).unwrap();
    (dir, store)
}

fn rejected(outcome: WriteOutcome) -> fenced_resource::Rejection {
    match outcome {
        WriteOutcome::Rejected(r) => r,
        other => panic!("expected a rejection, got {other:?}"),
    }
}

#[test]
fn stale_owner_write_is_rejected_and_the_newer_data_kept() {
    let (_dir, store) = open();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    assert_eq!(
        store.write(&write(41, a, "A part 1")).unwrap(),
        WriteOutcome::Accepted {
            token: 41,
            version: 1
        }
    );
    assert_eq!(
        store.write(&write(42, b, "B final")).unwrap(),
        WriteOutcome::Accepted {
            token: 42,
            version: 2
        }
    );
    let mut late = write(41, a, "A final");
    late.operation_id = Some("render-statement".into());
    let r = rejected(store.write(&late).unwrap());
    assert_eq!(r.reason, RejectReason::StaleToken);
    assert_eq!((r.key.as_str(), r.token, r.highest_token), (RES, 41, 42));
    assert_eq!(r.owner, a);
    assert_eq!(r.operation_id.as_deref(), Some("render-statement"));
    assert!(r.is_final());
    let text = r.to_string();
    assert!(
        text.contains("41") && text.contains("42") && text.contains("render-statement"),
        "{text}"
    );
    let current = store.get(RES).unwrap().unwrap();
    assert_eq!((current.token, current.version), (42, 2));
    assert_eq!(current.value, b"B final");
}

#[test]
fn allow_equal_lets_one_owner_write_many_times() {
    let (_dir, store) = open();
    let a = OwnerId::random();
    for (i, v) in ["1", "2", "3"].iter().enumerate() {
        assert_eq!(
            store.write(&write(5, a, v)).unwrap(),
            WriteOutcome::Accepted {
                token: 5,
                version: i as u64 + 1
            }
        );
    }
    assert_eq!(store.get(RES).unwrap().unwrap().value, b"3");
}

#[test]
fn strict_accepts_one_write_per_token_and_reports_the_rest_as_already_applied() {
    let (_dir, store) = open();
    let a = OwnerId::random();
    let mut first = write(5, a, "final");
    first.mode = Some(Mode::Strict);
    assert_eq!(
        store.write(&first).unwrap(),
        WriteOutcome::Accepted {
            token: 5,
            version: 1
        }
    );
    let mut again = write(5, a, "another final");
    again.mode = Some(Mode::Strict);
    assert_eq!(
        store.write(&again).unwrap(),
        WriteOutcome::AlreadyApplied {
            token: 5,
            version: 1
        }
    );
    // The key keeps its contract when a write names none.
    assert_eq!(
        store.write(&write(5, a, "x")).unwrap(),
        WriteOutcome::AlreadyApplied {
            token: 5,
            version: 1
        }
    );
    assert_eq!(store.get(RES).unwrap().unwrap().value, b"final");
    // A newer generation writes once.
    let b = OwnerId::random();
    assert!(matches!(
        store.write(&write(6, b, "B")).unwrap(),
        WriteOutcome::Accepted { token: 6, .. }
    ));
    // A write may not switch the key's contract.
    let mut switch = write(7, b, "y");
    switch.mode = Some(Mode::AllowEqual);
    match store.write(&switch) {
        Err(StoreError::InvalidArgument(e)) => assert_eq!(e.field(), "mode"),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.get(RES).unwrap().unwrap().token, 6);
}

#[test]
fn store_default_contract_applies_to_new_keys() {
    let dir = tempfile::tempdir().unwrap();
    let store = FenceStore::open_with_mode(dir.path(), Mode::Strict).unwrap();
    let a = OwnerId::random();
    store.write(&write(3, a, "once")).unwrap();
    assert!(matches!(
        store.write(&write(3, a, "twice")).unwrap(),
        WriteOutcome::AlreadyApplied { .. }
    ));
    assert_eq!(store.get(RES).unwrap().unwrap().mode, Mode::Strict);
}

#[test]
fn an_equal_token_from_another_owner_id_is_refused() {
    let (_dir, store) = open();
    store.write(&write(9, OwnerId::random(), "mine")).unwrap();
    let r = rejected(store.write(&write(9, OwnerId::random(), "theirs")).unwrap());
    assert_eq!(r.reason, RejectReason::OwnerMismatch);
    assert_eq!(store.get(RES).unwrap().unwrap().value, b"mine");
}

#[test]
fn a_retried_write_with_an_idempotency_key_is_applied_once() {
    let (_dir, store) = open();
    let a = OwnerId::random();
    let mut w = write(3, a, "charge 10 EUR");
    w.idempotency_key = Some("charge-42".into());
    let first = store.write(&w).unwrap();
    assert_eq!(
        first,
        WriteOutcome::Accepted {
            token: 3,
            version: 1
        }
    );
    for _ in 0..3 {
        assert_eq!(store.write(&w).unwrap(), first, "same answer again");
    }
    assert_eq!(store.get(RES).unwrap().unwrap().version, 1, "applied once");
    // Even after a newer owner wrote, the retry answers what happened.
    store.write(&write(4, OwnerId::random(), "B")).unwrap();
    assert_eq!(store.write(&w).unwrap(), first);
    assert_eq!(store.get(RES).unwrap().unwrap().value, b"B");
    // The same idempotency key for a different write is a mistake.
    let mut other = write(4, a, "charge 20 EUR");
    other.idempotency_key = Some("charge-42".into());
    match store.write(&other) {
        Err(StoreError::InvalidArgument(e)) => {
            assert_eq!(e.field(), "idempotency_key");
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn idempotency_survives_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let a = OwnerId::random();
    let mut w = write(3, a, "once");
    w.idempotency_key = Some("op-1".into());
    {
        let store = FenceStore::open(dir.path()).unwrap();
        store.write(&w).unwrap();
    }
    let store = FenceStore::open(dir.path()).unwrap();
    assert_eq!(
        store.write(&w).unwrap(),
        WriteOutcome::Accepted {
            token: 3,
            version: 1
        }
    );
    assert_eq!(store.get(RES).unwrap().unwrap().version, 1);
}

#[test]
fn a_token_of_another_lock_resource_is_refused() {
    let (_dir, store) = open();
    store
        .write(&write(10, OwnerId::random(), "guarded"))
        .unwrap();
    let other = ResourceName::new("some-other-lock").unwrap();
    let w = Write::new(
        RES,
        other,
        Token::new(1_000).unwrap(),
        OwnerId::random(),
        "x",
    );
    let r = rejected(store.write(&w).unwrap());
    assert_eq!(
        r.reason,
        RejectReason::WrongResource {
            bound: RES.to_string()
        }
    );
    let c = store.get(RES).unwrap().unwrap();
    assert_eq!((c.token, c.value.as_slice()), (10, &b"guarded"[..]));
}

#[test]
fn expected_version_is_checked_with_the_token() {
    let (_dir, store) = open();
    let a = OwnerId::random();
    let mut create = write(1, a, "v1");
    create.expected_version = Some(0);
    store.write(&create).unwrap();
    let r = rejected(store.write(&create).unwrap());
    assert_eq!(
        r.reason,
        RejectReason::VersionMismatch {
            expected: 0,
            actual: 1
        }
    );
    let mut update = write(1, a, "v2");
    update.expected_version = Some(1);
    assert!(matches!(
        store.write(&update).unwrap(),
        WriteOutcome::Accepted { version: 2, .. }
    ));
    // computed from version 1, which is gone
    let mut outdated = write(2, OwnerId::random(), "v2'");
    outdated.expected_version = Some(1);
    assert!(matches!(
        rejected(store.write(&outdated).unwrap()).reason,
        RejectReason::VersionMismatch {
            expected: 1,
            actual: 2
        }
    ));
    // a key that does not exist has version 0
    let mut missing = Write::for_resource(
        ResourceName::new("new-key").unwrap(),
        Token::new(1).unwrap(),
        a,
        "x",
    );
    missing.expected_version = Some(3);
    assert!(matches!(
        rejected(store.write(&missing).unwrap()).reason,
        RejectReason::VersionMismatch {
            expected: 3,
            actual: 0
        }
    ));
    assert_eq!(store.get("new-key").unwrap(), None);
}

#[test]
fn sequence_numbers_order_writes_of_one_owner_under_one_token() {
    let (_dir, store) = open();
    let a = OwnerId::random();
    let seq = |s: u64, v: &str| {
        let mut w = write(8, a, v);
        w.sequence = Some(s);
        w
    };
    store.write(&seq(1, "one")).unwrap();
    store.write(&seq(3, "three")).unwrap();
    let r = rejected(store.write(&seq(2, "two, late")).unwrap());
    assert_eq!(
        r.reason,
        RejectReason::StaleSequence {
            last: 3,
            presented: 2
        }
    );
    assert_eq!(store.get(RES).unwrap().unwrap().value, b"three");
    // A new generation starts its own sequence.
    let mut b = write(9, OwnerId::random(), "B");
    b.sequence = Some(1);
    assert!(matches!(
        store.write(&b).unwrap(),
        WriteOutcome::Accepted { .. }
    ));
}

#[test]
fn bad_input_is_refused_by_field_and_nothing_is_written() {
    let (_dir, store) = open();
    let a = OwnerId::random();
    let field_of = |w: &Write| match store.write(w) {
        Err(StoreError::InvalidArgument(e)) => {
            let text = e.to_string();
            assert!(text.starts_with(e.field()), "{text}");
            (e.field(), text)
        }
        other => panic!("expected invalid argument, got {other:?}"),
    };
    let big = write(1, a, &"x".repeat(VALUE_MAX_BYTES + 1));
    let (f, text) = field_of(&big);
    assert_eq!(f, "value");
    assert!(text.contains(&VALUE_MAX_BYTES.to_string()), "{text}");

    let mut long_key = write(1, a, "v");
    long_key.key = "k".repeat(KEY_MAX_BYTES + 1);
    let (f, text) = field_of(&long_key);
    assert_eq!(f, "key");
    assert!(text.contains(&KEY_MAX_BYTES.to_string()), "{text}");

    let mut empty_key = write(1, a, "v");
    empty_key.key = String::new();
    assert_eq!(field_of(&empty_key).0, "key");

    let mut idem = write(1, a, "v");
    idem.idempotency_key = Some("i".repeat(IDEMPOTENCY_KEY_MAX_BYTES + 1));
    let (f, text) = field_of(&idem);
    assert_eq!(f, "idempotency_key");
    assert!(text.contains("128"), "{text}");

    assert_eq!(
        Token::new(0).unwrap_err().field(),
        "token",
        "token 0 cannot even be built"
    );
    assert_eq!("both".parse::<Mode>().unwrap_err().field(), "mode");

    assert_eq!(store.get(RES).unwrap(), None, "nothing was written");
    // A value at the bound is fine.
    assert!(matches!(
        store
            .write(&write(1, a, &"x".repeat(VALUE_MAX_BYTES)))
            .unwrap(),
        WriteOutcome::Accepted { .. }
    ));
}

#[test]
fn every_accepted_write_is_synced_before_it_is_acknowledged() {
    let (_dir, store) = open();
    let a = OwnerId::random();
    let before = store.syncs();
    for i in 0..5 {
        store.write(&write(1, a, &format!("v{i}"))).unwrap();
    }
    assert!(store.syncs() >= before + 5);
    // A rejection writes nothing and needs no sync.
    store.write(&write(2, OwnerId::random(), "B")).unwrap();
    let after_b = store.syncs();
    rejected(store.write(&write(1, a, "late")).unwrap());
    assert_eq!(store.syncs(), after_b);
}

#[test]
fn a_large_value_survives_a_reopen() {
    // Large values go to sled's blob files, which the store fsyncs itself.
    let dir = tempfile::tempdir().unwrap();
    let big = "b".repeat(VALUE_MAX_BYTES);
    {
        let store = FenceStore::open(dir.path()).unwrap();
        store.write(&write(1, OwnerId::random(), &big)).unwrap();
    }
    let store = FenceStore::open(dir.path()).unwrap();
    assert_eq!(store.get(RES).unwrap().unwrap().value, big.as_bytes());
}

#[test]
fn concurrent_writers_with_mixed_tokens_never_move_the_fence_back() {
    let (_dir, store) = open();
    let store = Arc::new(store);
    let owners: Vec<OwnerId> = (0..=40).map(|_| OwnerId::random()).collect();
    let writers: Vec<_> = (0..4)
        .map(|w| {
            let store = store.clone();
            let owners = owners.clone();
            thread::spawn(move || {
                // Each thread writes tokens in its own scrambled order.
                for i in 0..40u64 {
                    let token = (i * 7 + w * 13) % 40 + 1;
                    let owner = owners[token as usize];
                    store
                        .write(&write(token, owner, &format!("written with {token}")))
                        .unwrap();
                }
            })
        })
        .collect();
    let reader = {
        let store = store.clone();
        thread::spawn(move || {
            let mut last = 0;
            for _ in 0..200 {
                if let Some(c) = store.get(RES).unwrap() {
                    assert!(
                        c.token >= last,
                        "fence went back from {last} to {}",
                        c.token
                    );
                    assert_eq!(c.value, format!("written with {}", c.token).as_bytes());
                    last = c.token;
                }
            }
        })
    };
    for w in writers {
        w.join().unwrap();
    }
    reader.join().unwrap();
    let c = store.get(RES).unwrap().unwrap();
    assert_eq!(c.token, 40);
    assert_eq!(c.value, b"written with 40");
}

#[test]
fn versioned_objects_a_stale_worker_cannot_replace_the_current_version() {
    let (_dir, store) = open();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let r = res();
    let from_a = store.put_version(RES, b"A's statement").unwrap();
    let from_b = store.put_version(RES, b"B's statement").unwrap();
    assert!(matches!(
        store
            .publish(RES, &r, Token::new(42).unwrap(), b, from_b)
            .unwrap(),
        WriteOutcome::Accepted { .. }
    ));
    let late = store
        .publish(RES, &r, Token::new(41).unwrap(), a, from_a)
        .unwrap();
    assert_eq!(rejected(late).reason, RejectReason::StaleToken);
    let (id, content) = store.current_version(RES).unwrap().unwrap();
    assert_eq!((id, content.as_slice()), (from_b, &b"B's statement"[..]));

    // Cleanup spares recent versions, then removes A's orphan only.
    assert_eq!(
        store
            .remove_unreferenced_versions(RES, Duration::from_secs(3600))
            .unwrap(),
        0
    );
    assert_eq!(
        store
            .remove_unreferenced_versions(RES, Duration::ZERO)
            .unwrap(),
        1
    );
    assert_eq!(store.read_version(RES, from_a).unwrap(), None);
    assert_eq!(
        store.current_version(RES).unwrap().unwrap().1,
        b"B's statement"
    );

    // Publishing a removed (or never stored) version is refused, not dangling.
    let c = OwnerId::random();
    match store.publish(RES, &r, Token::new(43).unwrap(), c, from_a) {
        Err(StoreError::InvalidArgument(e)) => assert_eq!(e.field(), "value"),
        other => panic!("{other:?}"),
    }
    match store.publish(RES, &r, Token::new(43).unwrap(), c, VersionId::random()) {
        Err(StoreError::InvalidArgument(e)) => assert_eq!(e.field(), "value"),
        other => panic!("{other:?}"),
    }
    assert_eq!(store.current_version(RES).unwrap().unwrap().0, from_b);
}

/// A reference model of one key under allow-equal: the highest token wins,
/// an equal token by the same owner overwrites.
#[derive(Debug, Clone)]
struct Op {
    token: u64,
    owner: usize,
    strict: bool,
}

fn op() -> impl Strategy<Value = Op> {
    (1u64..8, 0usize..3, any::<bool>()).prop_map(|(token, owner, strict)| Op {
        token,
        owner,
        strict,
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    #[test]
    fn random_writes_match_the_model(ops in proptest::collection::vec(op(), 1..24)) {
        let (_dir, store) = open();
        let owners: Vec<OwnerId> = (0..3).map(|_| OwnerId::random()).collect();
        // Owner of each token, so a token belongs to one acquisition, except
        // where the test deliberately presents it with another owner id.
        let mut model: Option<(u64, usize, u64, String, Mode)> = None;
        for (i, o) in ops.iter().enumerate() {
            let value = format!("op{i}");
            let mut w = write(o.token, owners[o.owner], &value);
            let mode = if o.strict { Mode::Strict } else { Mode::AllowEqual };
            w.mode = Some(mode);
            let outcome = store.write(&w);
            match &model {
                None => {
                    prop_assert_eq!(outcome.unwrap(), WriteOutcome::Accepted { token: o.token, version: 1 });
                    model = Some((o.token, o.owner, 1, value, mode));
                }
                Some((token, owner, version, _, key_mode)) => {
                    let (token, owner, version, key_mode) = (*token, *owner, *version, *key_mode);
                    if mode != key_mode {
                        prop_assert!(matches!(outcome, Err(StoreError::InvalidArgument(_))));
                    } else if o.token < token {
                        prop_assert_eq!(rejected(outcome.unwrap()).reason, RejectReason::StaleToken);
                    } else if o.token == token && o.owner != owner {
                        prop_assert_eq!(rejected(outcome.unwrap()).reason, RejectReason::OwnerMismatch);
                    } else if o.token == token && key_mode == Mode::Strict {
                        prop_assert_eq!(outcome.unwrap(), WriteOutcome::AlreadyApplied { token, version });
                    } else {
                        prop_assert_eq!(outcome.unwrap(), WriteOutcome::Accepted { token: o.token, version: version + 1 });
                        model = Some((o.token, o.owner, version + 1, value, key_mode));
                    }
                }
            }
            let (token, _, version, value, _) = model.clone().unwrap();
            let c = store.get(RES).unwrap().unwrap();
            prop_assert_eq!((c.token, c.version, c.value), (token, version, value.into_bytes()));
        }
    }
}
