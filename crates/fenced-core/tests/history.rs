//! The grant history against a naive model built from the change log: for
//! every history length, whatever grants, renewals, releases, expiries,
//! waits, sessions and snapshot round trips happen, `history` answers the
//! last grants of each resource with how each ended. The table makes a live
//! lease's entry from the lease itself (docs/SCALING.md); the model keeps
//! every entry as an entry.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use fenced_core::*;
use proptest::prelude::*;

const RESOURCES: [&str; 3] = ["a", "b", "c"];
const OWNERS: usize = 4;
const IDENTITY: &str = "app";

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        res: usize,
        owner: usize,
        wait: bool,
    },
    InSession {
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
    OpenSession,
    CloseSession,
    RoundTrip,
}

fn op() -> impl Strategy<Value = Op> {
    let res = 0..RESOURCES.len();
    let owner = 0..OWNERS;
    prop_oneof![
        4 => (res.clone(), owner.clone(), any::<bool>())
            .prop_map(|(res, owner, wait)| Op::Acquire { res, owner, wait }),
        2 => (res.clone(), owner.clone()).prop_map(|(res, owner)| Op::InSession { res, owner }),
        1 => (res.clone(), owner.clone()).prop_map(|(res, owner)| Op::Renew { res, owner }),
        3 => (res, owner).prop_map(|(res, owner)| Op::Release { res, owner }),
        1 => Just(Op::OpenSession),
        1 => Just(Op::CloseSession),
        1 => Just(Op::RoundTrip),
    ]
}

fn name(i: usize) -> ResourceName {
    ResourceName::new(RESOURCES[i]).unwrap()
}

/// The history the old layout kept: every grant an entry, its end set on
/// the entry with its token, the oldest dropped beyond `len`.
fn model(changes: &[Change], len: usize) -> BTreeMap<String, Vec<HistoryEntry>> {
    let mut kept: BTreeMap<String, Vec<HistoryEntry>> = BTreeMap::new();
    if len == 0 {
        return kept;
    }
    for c in changes {
        let entries = kept.entry(c.resource.as_str().to_owned()).or_default();
        if c.kind == ChangeKind::Granted {
            if entries.len() >= len {
                entries.remove(0);
            }
            entries.push(HistoryEntry {
                token: c.token,
                owner_id: c.owner_id,
                granted_at: c.at,
                end: None,
            });
        } else if let Some(e) = entries.iter_mut().find(|e| e.token == c.token) {
            e.end = Some(LeaseEnd {
                at: c.at,
                how: c.kind,
            });
        }
    }
    kept
}

fn run(len: usize, steps: &[(u64, Vec<Op>)]) {
    let fresh = || {
        LeaseTable::new()
            .with_history_len(len)
            .with_watch_window(100_000)
    };
    let mut table = fresh();
    let owners: Vec<OwnerId> = (0..OWNERS).map(|_| OwnerId::random()).collect();
    let mut session = SessionId::random();
    let mut changes: Vec<Change> = Vec::new();
    let mut now = 1;
    for (advance, ops) in steps {
        now += advance;
        let mut commands = Vec::new();
        for op in ops {
            let command = match *op {
                Op::Acquire { res, owner, wait } => Command::Acquire {
                    resource: name(res),
                    owner_id: owners[owner],
                    ttl_ms: 1_000,
                    wait_ms: if wait { 1_500 } else { 0 },
                },
                Op::InSession { res, owner } => Command::AcquireInSession {
                    resource: name(res),
                    owner_id: owners[owner],
                    session,
                    identity: IDENTITY.into(),
                    capacity: Capacity::UNBOUNDED,
                },
                Op::Renew { res, owner } => Command::Renew {
                    resource: name(res),
                    owner_id: owners[owner],
                    token: table.last_token().unwrap_or(Token::new(1).unwrap()),
                    ttl_ms: 1_000,
                },
                Op::Release { res, owner } => {
                    let token = table
                        .holder(RESOURCES[res])
                        .map_or(Token::new(1).unwrap(), |(_, g)| g.token);
                    Command::Release {
                        resource: name(res),
                        owner_id: owners[owner],
                        token,
                    }
                }
                Op::OpenSession => {
                    session = SessionId::random();
                    Command::OpenSession {
                        session,
                        identity: IDENTITY.into(),
                        ttl_ms: 2_000,
                        bounds: Limits::default().session_bounds(),
                    }
                }
                Op::CloseSession => Command::CloseSession {
                    session,
                    identity: IDENTITY.into(),
                },
                Op::RoundTrip => {
                    let snapshot = table.snapshot();
                    table = LeaseTable::from_snapshot_with_history(snapshot.clone(), len)
                        .unwrap()
                        .with_watch_window(100_000);
                    assert_eq!(
                        table.snapshot(),
                        snapshot,
                        "a snapshot round trip changed it"
                    );
                    continue;
                }
            };
            commands.push(command);
        }
        let before = table.revision();
        table.apply(&Batch {
            stamp: ClusterTime::from_millis(now),
            commands,
        });
        table.check_invariants().unwrap();
        changes.extend(table.changes_after(before, "", 100_000).unwrap().changes);
        let expected = model(&changes, len);
        for r in RESOURCES {
            let mut want = expected.get(r).cloned().unwrap_or_default();
            want.reverse();
            assert_eq!(table.history(r, 64), want, "history of {r} at {now} ms");
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    #[test]
    fn history_matches_the_change_log(
        len in prop_oneof![Just(0usize), Just(1), Just(2), Just(3), Just(16)],
        steps in prop::collection::vec(
            (prop_oneof![Just(0u64), 0..700u64, 900..2_500u64], prop::collection::vec(op(), 0..4)),
            1..40,
        ),
    ) {
        run(len, &steps);
    }
}
