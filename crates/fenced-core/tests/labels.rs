//! Job labels: an acquire's label rides with the lease it grants, at once
//! or after waiting, while the lease lives; it goes with the lease, is
//! kept by snapshots, and a snapshot from before labels still loads.

#![allow(clippy::unwrap_used)]

use fenced_core::{
    AcquireOutcome, Batch, ClusterTime, Command, IdentityBounds, JobLabel, LeaseTable, Limits,
    Outcome, OwnerId, ResourceName, TableSnapshot, Token, SNAPSHOT_FORMAT_VERSION,
};

fn at(ms: u64) -> ClusterTime {
    ClusterTime::from_millis(ms)
}

fn acquire(resource: &str, owner: OwnerId, wait_ms: u64, label: Option<&str>) -> Command {
    Command::Acquire {
        resource: ResourceName::new(resource).unwrap(),
        owner_id: owner,
        ttl_ms: 10_000,
        wait_ms,
    }
    .labelled(label.map(|l| JobLabel::new(l).unwrap()))
}

fn release(resource: &str, owner: OwnerId, token: Token) -> Command {
    Command::Release {
        resource: ResourceName::new(resource).unwrap(),
        owner_id: owner,
        token,
    }
}

fn apply(table: &mut LeaseTable, ms: u64, command: Command) -> Outcome {
    let out = table.apply(&Batch {
        stamp: at(ms),
        commands: vec![command],
    });
    table.check_invariants().unwrap();
    out.outcomes.into_iter().next().unwrap()
}

fn granted(outcome: Outcome) -> Token {
    match outcome {
        Outcome::Acquire(AcquireOutcome::Granted(g)) => g.token,
        other => panic!("not granted: {other:?}"),
    }
}

fn label(table: &LeaseTable, resource: &str) -> Option<String> {
    table.label_of(resource).map(|l| l.as_str().to_string())
}

#[test]
fn a_label_lives_with_its_lease_and_no_longer() {
    let mut t = LeaseTable::new();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let token = granted(apply(
        &mut t,
        0,
        acquire("jobs/run", a, 0, Some("nightly run #3")),
    ));
    assert_eq!(label(&t, "jobs/run").as_deref(), Some("nightly run #3"));
    let listed = t.leases("jobs/", at(1), 10);
    assert_eq!(
        listed.rows[0].label.as_ref().map(JobLabel::as_str),
        Some("nightly run #3")
    );
    // The holder asking again with another label keeps its grant and label.
    assert_eq!(
        granted(apply(&mut t, 5, acquire("jobs/run", a, 0, Some("other")))),
        token
    );
    assert_eq!(label(&t, "jobs/run").as_deref(), Some("nightly run #3"));
    apply(&mut t, 10, release("jobs/run", a, token));
    assert_eq!(label(&t, "jobs/run"), None);
    // The next lease, unlabelled, shows none.
    granted(apply(&mut t, 20, acquire("jobs/run", b, 0, None)));
    assert_eq!(label(&t, "jobs/run"), None);
    // An expired lease takes its label with it.
    granted(apply(&mut t, 30, acquire("jobs/other", a, 0, Some("x"))));
    apply(
        &mut t,
        20_000,
        Command::WallClock {
            unix_ms: 1_800_000_000_000,
        },
    );
    assert_eq!(label(&t, "jobs/other"), None);
}

#[test]
fn a_waiters_label_is_its_lease_once_granted() {
    let mut t = LeaseTable::new();
    let (a, b) = (OwnerId::random(), OwnerId::random());
    let first = granted(apply(&mut t, 0, acquire("jobs/run", a, 0, Some("first"))));
    let waiting = apply(&mut t, 1, acquire("jobs/run", b, 5_000, Some("second")));
    assert!(
        matches!(waiting, Outcome::Acquire(AcquireOutcome::Waiting { .. })),
        "{waiting:?}"
    );
    // The waiter's label survives a snapshot while it waits.
    let text = serde_json::to_string(&t.snapshot()).unwrap();
    let mut t = LeaseTable::from_snapshot(serde_json::from_str(&text).unwrap()).unwrap();
    assert_eq!(label(&t, "jobs/run").as_deref(), Some("first"));
    let out = t.apply(&Batch {
        stamp: at(2),
        commands: vec![release("jobs/run", a, first)],
    });
    assert!(
        out.events
            .iter()
            .any(|e| format!("{e:?}").contains("WaiterGranted")),
        "{out:?}"
    );
    t.check_invariants().unwrap();
    assert_eq!(label(&t, "jobs/run").as_deref(), Some("second"));
}

#[test]
fn labels_survive_a_snapshot_and_an_older_snapshot_loads_without_them() {
    let mut t = LeaseTable::new();
    granted(apply(
        &mut t,
        0,
        acquire("a", OwnerId::random(), 0, Some("job a")),
    ));
    granted(apply(&mut t, 0, acquire("b", OwnerId::random(), 0, None)));
    let snapshot = t.snapshot();
    assert_eq!(snapshot.format_version(), SNAPSHOT_FORMAT_VERSION);
    let text = serde_json::to_string(&snapshot).unwrap();
    assert_eq!(text, serde_json::to_string(&t.snapshot_ref()).unwrap());
    let restored = LeaseTable::from_snapshot(serde_json::from_str(&text).unwrap()).unwrap();
    assert_eq!(label(&restored, "a").as_deref(), Some("job a"));
    assert_eq!(label(&restored, "b"), None);
    assert_eq!(restored.snapshot(), snapshot);

    let mut value: serde_json::Value = serde_json::to_value(&snapshot).unwrap();
    value["format_version"] = 5.into();
    value.as_object_mut().unwrap().remove("labels");
    let old: TableSnapshot = serde_json::from_value(value).unwrap();
    let loaded = LeaseTable::from_snapshot(old).unwrap();
    assert_eq!(loaded.live_leases(), 2);
    assert_eq!(label(&loaded, "a"), None);
}

/// A damaged snapshot: a label for a resource nobody holds is refused.
#[test]
fn a_snapshot_with_a_label_for_no_lease_is_refused() {
    let mut t = LeaseTable::new();
    granted(apply(
        &mut t,
        0,
        acquire("a", OwnerId::random(), 0, Some("job a")),
    ));
    let mut value: serde_json::Value = serde_json::to_value(t.snapshot()).unwrap();
    value["labels"]["holders"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!(["nobody", "ghost"]));
    let damaged: TableSnapshot = serde_json::from_value(value).unwrap();
    let err = LeaseTable::from_snapshot(damaged).unwrap_err().to_string();
    assert!(err.contains("nobody"), "{err}");
}

#[test]
fn only_an_acquire_carries_a_label() {
    let limits = Limits::default();
    let owner = OwnerId::random();
    let ok = acquire("a", owner, 0, Some("fine"));
    assert!(ok.validate(&limits).is_ok());
    assert!(ok
        .clone()
        .as_identity("app", IdentityBounds::UNBOUNDED)
        .validate(&limits)
        .is_ok());
    let token = Token::new(1).unwrap();
    let not_acquire = release("a", owner, token).labelled(Some(JobLabel::new("x").unwrap()));
    let err = not_acquire.validate(&limits).unwrap_err().to_string();
    assert!(err.contains("label"), "{err}");
    // Twice labelled, or labelling an identity's command: refused.
    let twice = ok.clone().labelled(Some(JobLabel::new("y").unwrap()));
    assert!(twice.validate(&limits).is_err());
    let outside = ok
        .as_identity("app", IdentityBounds::UNBOUNDED)
        .labelled(Some(JobLabel::new("z").unwrap()));
    assert!(outside.validate(&limits).is_err());
}
