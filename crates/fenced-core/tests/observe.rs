//! What the table records for observers: numbered ownership changes (Watch),
//! the last grants per resource (History) and token states (ValidateToken).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{apply, at};
use fenced_core::*;

const TTL: u64 = 30_000;

fn name(s: &str) -> ResourceName {
    ResourceName::new(s).unwrap()
}

fn acquire(res: &str, owner: OwnerId, wait_ms: u64) -> Command {
    Command::Acquire {
        resource: name(res),
        owner_id: owner,
        ttl_ms: TTL,
        wait_ms,
    }
}

fn release(res: &str, owner: OwnerId, token: Token) -> Command {
    Command::Release {
        resource: name(res),
        owner_id: owner,
        token,
    }
}

fn token(outcome: &Outcome) -> Token {
    match outcome {
        Outcome::Acquire(AcquireOutcome::Granted(g)) => g.token,
        other => panic!("expected a grant, got {other:?}"),
    }
}

fn kinds(changes: &[Change]) -> Vec<(u64, &str, ChangeKind, u64)> {
    changes
        .iter()
        .map(|c| (c.revision, c.resource.as_str(), c.kind, c.token.get()))
        .collect()
}

#[test]
fn grants_releases_and_expiries_are_numbered_in_apply_order() {
    let mut t = LeaseTable::new();
    let (a, b, c) = (OwnerId::random(), OwnerId::random(), OwnerId::random());
    let out = apply(
        &mut t,
        0,
        vec![acquire("jobs/x", a, 0), acquire("jobs/y", b, 0)],
    );
    let (tx, ty) = (token(&out[0]), token(&out[1]));
    // C waits for x; x is released and C is granted in the same entry.
    apply(&mut t, 10, vec![acquire("jobs/x", c, 60_000)]);
    let out = apply(&mut t, 20, vec![release("jobs/x", a, tx)]);
    assert_eq!(out[0], Outcome::Release(ReleaseOutcome::Released));
    // y runs out: the sweep of the next entry records it.
    apply(&mut t, TTL + 5, vec![]);
    let all = t.changes_after(0, "", 100).unwrap();
    let tc = t.holder("jobs/x").unwrap().1.token;
    assert_eq!(
        kinds(&all.changes),
        vec![
            (1, "jobs/x", ChangeKind::Granted, tx.get()),
            (2, "jobs/y", ChangeKind::Granted, ty.get()),
            (3, "jobs/x", ChangeKind::Released, tx.get()),
            (4, "jobs/x", ChangeKind::Granted, tc.get()),
            (5, "jobs/y", ChangeKind::Expired, ty.get()),
        ]
    );
    assert_eq!(all.changes[3].owner_id, c);
    assert_eq!(all.changes[4].at, at(TTL + 5));
    assert_eq!(t.revision(), 5);
    assert_eq!(all.scanned_to, 5);
}

#[test]
fn a_holder_asking_again_or_renewing_records_no_change() {
    let mut t = LeaseTable::new();
    let a = OwnerId::random();
    let tok = token(&apply(&mut t, 0, vec![acquire("r", a, 0)])[0]);
    apply(&mut t, 5, vec![acquire("r", a, 0)]);
    apply(
        &mut t,
        6,
        vec![Command::Renew {
            resource: name("r"),
            owner_id: a,
            token: tok,
            ttl_ms: TTL,
        }],
    );
    assert_eq!(t.revision(), 1);
}

#[test]
fn changes_after_filters_by_prefix_and_resumes_exactly() {
    let mut t = LeaseTable::new();
    for i in 0..10u64 {
        let res = if i % 2 == 0 { "billing/a" } else { "mail/b" };
        let owner = OwnerId::random();
        let tok = token(&apply(&mut t, i * 10, vec![acquire(res, owner, 0)])[0]);
        apply(&mut t, i * 10 + 1, vec![release(res, owner, tok)]);
    }
    assert_eq!(t.revision(), 20);
    // Read in pages of 3 from 0: every billing change once, in order.
    let mut cursor = 0;
    let mut seen = Vec::new();
    loop {
        let page = t.changes_after(cursor, "billing/", 3).unwrap();
        if page.scanned_to == cursor {
            break;
        }
        assert!(page.changes.len() <= 3);
        seen.extend(page.changes.iter().map(|c| c.revision));
        cursor = page.scanned_to;
    }
    assert_eq!(seen, vec![1, 2, 5, 6, 9, 10, 13, 14, 17, 18]);
    // A cursor ahead of this table (a lagging node) stays where it is.
    let ahead = t.changes_after(50, "", 10).unwrap();
    assert!(ahead.changes.is_empty());
    assert_eq!(ahead.scanned_to, 50);
}

#[test]
fn a_resume_point_older_than_the_window_is_compacted() {
    let mut t = LeaseTable::new().with_watch_window(4);
    for i in 0..5u64 {
        let owner = OwnerId::random();
        let tok = token(&apply(&mut t, i * 10, vec![acquire("r", owner, 0)])[0]);
        apply(&mut t, i * 10 + 1, vec![release("r", owner, tok)]);
    }
    assert_eq!(t.revision(), 10);
    assert_eq!(t.oldest_revision(), 7);
    assert_eq!(
        t.changes_after(5, "", 10),
        Err(Compacted { oldest_revision: 7 })
    );
    // 6 is the last one gone: resuming after it misses nothing.
    let page = t.changes_after(6, "", 10).unwrap();
    assert_eq!(
        page.changes.iter().map(|c| c.revision).collect::<Vec<_>>(),
        vec![7, 8, 9, 10]
    );
    // An empty table: from now on.
    let empty = LeaseTable::new();
    assert_eq!(empty.oldest_revision(), 1);
    assert!(empty.changes_after(0, "", 10).unwrap().changes.is_empty());
}

#[test]
fn history_keeps_the_last_n_grants_newest_first_and_how_each_ended() {
    let mut t = LeaseTable::new().with_history_len(3);
    let mut tokens = Vec::new();
    for i in 0..4u64 {
        let owner = OwnerId::random();
        // The third runs out: the fourth's entry sweeps it first.
        let ms = if i == 3 { 200 + TTL } else { i * 100 };
        let tok = token(&apply(&mut t, ms, vec![acquire("r", owner, 0)])[0]);
        tokens.push((tok, owner));
        if i < 2 {
            apply(&mut t, ms + 1, vec![release("r", owner, tok)]);
        }
    }
    let h = t.history("r", 100);
    assert_eq!(h.len(), 3, "bounded at 3");
    assert_eq!(h[0].token, tokens[3].0);
    assert_eq!(h[0].owner_id, tokens[3].1);
    assert_eq!(h[0].end, None, "the newest is live");
    assert_eq!(h[1].token, tokens[2].0);
    assert_eq!(
        h[1].end,
        Some(LeaseEnd {
            at: at(200 + TTL),
            how: ChangeKind::Expired
        })
    );
    assert_eq!(h[2].token, tokens[1].0);
    assert_eq!(
        h[2].end,
        Some(LeaseEnd {
            at: at(101),
            how: ChangeKind::Released
        })
    );
    assert_eq!(h[2].granted_at, at(100));
    assert_eq!(t.history("r", 1).len(), 1);
    assert!(t.history("other", 10).is_empty());
}

#[test]
fn an_expired_lease_ends_in_history_as_expired() {
    let mut t = LeaseTable::new();
    let a = OwnerId::random();
    token(&apply(&mut t, 0, vec![acquire("r", a, 0)])[0]);
    apply(&mut t, TTL, vec![]);
    let h = t.history("r", 10);
    assert_eq!(
        h[0].end,
        Some(LeaseEnd {
            at: at(TTL),
            how: ChangeKind::Expired
        })
    );
}

#[test]
fn history_is_forgotten_with_its_resource() {
    let mut t = LeaseTable::with_max_idle(1);
    for res in ["a", "b"] {
        let owner = OwnerId::random();
        let tok = token(&apply(&mut t, 0, vec![acquire(res, owner, 0)])[0]);
        apply(&mut t, 1, vec![release(res, owner, tok)]);
    }
    assert!(t.history("a", 10).is_empty(), "a was forgotten");
    assert_eq!(t.history("b", 10).len(), 1);
}

#[test]
fn validate_tells_each_state_of_a_token() {
    let mut t = LeaseTable::new();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let ta = token(&apply(&mut t, 0, vec![acquire("r", a, 0)])[0]);
    let v = t.validate("r", ta, at(1_000));
    assert_eq!(
        v,
        Validation {
            state: TokenState::Current {
                remaining_ms: TTL - 1_000
            },
            current_token: Some(ta)
        }
    );
    // Past its end but not yet swept: already expired to a reader.
    assert_eq!(t.validate("r", ta, at(TTL)).state, TokenState::Expired);
    let above = Token::new(ta.get() + 1).unwrap();
    assert_eq!(t.validate("r", above, at(1)).state, TokenState::Unknown);
    assert_eq!(t.validate("nope", ta, at(1)).current_token, None);
    assert_eq!(t.validate("nope", ta, at(1)).state, TokenState::Unknown);

    apply(&mut t, 10, vec![release("r", a, ta)]);
    assert_eq!(t.validate("r", ta, at(11)).state, TokenState::Released);
    let tb = token(&apply(&mut t, 20, vec![acquire("r", b, 0)])[0]);
    let v = t.validate("r", ta, at(21));
    assert_eq!(v.state, TokenState::Superseded);
    assert_eq!(v.current_token, Some(tb));
    apply(&mut t, 20 + TTL, vec![]);
    assert_eq!(t.validate("r", tb, at(20 + TTL)).state, TokenState::Expired);
}

#[test]
fn any_lease_running_out_asks_for_a_sweep() {
    let mut t = LeaseTable::new();
    assert_eq!(t.next_sweep(), None);
    apply(&mut t, 0, vec![acquire("r", OwnerId::random(), 0)]);
    // No one waits, but the expiry must still be recorded with a revision.
    assert_eq!(t.next_wakeup(), None);
    assert_eq!(t.next_sweep(), Some(at(TTL)));
}

#[test]
fn snapshots_carry_revisions_changes_and_history() {
    let mut t = LeaseTable::new().with_history_len(4);
    let mut replica = LeaseTable::new().with_history_len(4);
    for i in 0..6u64 {
        let owner = OwnerId::random();
        let batch = vec![acquire("jobs/r", owner, 0)];
        let tok = token(&apply(&mut t, i * 10, batch.clone())[0]);
        apply(&mut replica, i * 10, batch);
        if i == 2 {
            // The replica restarts from a snapshot mid-way.
            replica = LeaseTable::from_snapshot(replica.snapshot())
                .unwrap()
                .with_history_len(4);
        }
        let batch = vec![release("jobs/r", owner, tok)];
        apply(&mut t, i * 10 + 1, batch.clone());
        apply(&mut replica, i * 10 + 1, batch);
    }
    assert_eq!(
        t.snapshot(),
        replica.snapshot(),
        "the same state and revisions"
    );
    let restored = LeaseTable::from_snapshot(t.snapshot()).unwrap();
    assert_eq!(restored.revision(), 12);
    assert_eq!(
        restored.changes_after(0, "", 100),
        t.changes_after(0, "", 100)
    );
    assert_eq!(restored.history("jobs/r", 16).len(), 4);
    assert_eq!(restored.history("jobs/r", 16), t.history("jobs/r", 16));
    assert_eq!(t.snapshot().format_version(), SNAPSHOT_FORMAT_VERSION);
}

#[test]
fn a_version_1_snapshot_without_the_new_fields_still_loads() {
    let mut t = LeaseTable::new();
    let a = OwnerId::random();
    let tok = token(&apply(&mut t, 0, vec![acquire("r", a, 0)])[0]);
    let mut value = serde_json::to_value(t.snapshot()).unwrap();
    let map = value.as_object_mut().unwrap();
    for field in ["revision", "changes", "history"] {
        map.remove(field).unwrap();
    }
    map.insert("format_version".into(), 1.into());
    let old: TableSnapshot = serde_json::from_value(value).unwrap();
    let mut loaded = LeaseTable::from_snapshot(old).unwrap();
    assert_eq!(loaded.revision(), 0);
    assert!(loaded.history("r", 10).is_empty());
    assert_eq!(
        loaded.validate("r", tok, at(1)).state,
        TokenState::Current {
            remaining_ms: TTL - 1
        }
    );
    // It carries on: the release of a lease granted before is recorded.
    apply(&mut loaded, 5, vec![release("r", a, tok)]);
    assert_eq!(loaded.revision(), 1);
    assert!(
        loaded.history("r", 10).is_empty(),
        "its grant predates history"
    );
}

#[test]
fn a_watch_prefix_is_bounded_and_named() {
    assert_eq!(watch_prefix(b"").unwrap(), "");
    assert_eq!(watch_prefix(b"jobs/").unwrap(), "jobs/");
    let long = vec![b'a'; RESOURCE_NAME_MAX_BYTES + 1];
    let e = watch_prefix(&long).unwrap_err();
    assert_eq!(e.field(), "prefix");
    assert!(e.to_string().contains("0 to 200 bytes"), "{e}");
    assert_eq!(watch_prefix(&[0xff]).unwrap_err().field(), "prefix");
    assert_eq!(watch_prefix(b"a\nb").unwrap_err().field(), "prefix");
}
