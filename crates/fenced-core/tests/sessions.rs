//! Sessions: leases that live with a session, which one keep-alive extends
//! and whose lapse ends every one of them at the same cluster time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use fenced_core::*;
use proptest::prelude::*;

const TTL: u64 = 10_000;
const ME: &str = "app";

fn name(s: &str) -> ResourceName {
    ResourceName::new(s).unwrap()
}

fn at(ms: u64) -> ClusterTime {
    ClusterTime::from_millis(ms)
}

fn bounds() -> SessionBounds {
    Limits::default().session_bounds()
}

fn apply(table: &mut LeaseTable, ms: u64, commands: Vec<Command>) -> Applied {
    let applied = table.apply(&Batch {
        stamp: at(ms),
        commands,
    });
    table.check_invariants().unwrap();
    applied
}

fn one(table: &mut LeaseTable, ms: u64, command: Command) -> Outcome {
    apply(table, ms, vec![command]).outcomes.remove(0)
}

fn open(session: SessionId, identity: &str, ttl_ms: u64) -> Command {
    Command::OpenSession {
        session,
        identity: identity.into(),
        ttl_ms,
        bounds: bounds(),
    }
}

fn keep_alive(session: SessionId, identity: &str) -> Command {
    Command::KeepAlive {
        session,
        identity: identity.into(),
    }
}

fn close(session: SessionId, identity: &str) -> Command {
    Command::CloseSession {
        session,
        identity: identity.into(),
    }
}

fn in_session(res: &str, owner: OwnerId, session: SessionId, identity: &str) -> Command {
    Command::AcquireInSession {
        resource: name(res),
        owner_id: owner,
        session,
        identity: identity.into(),
        capacity: Capacity::UNBOUNDED,
    }
}

fn plain(res: &str, owner: OwnerId, wait_ms: u64) -> Command {
    Command::Acquire {
        resource: name(res),
        owner_id: owner,
        ttl_ms: TTL,
        wait_ms,
    }
}

/// The grant in an acquire's outcome, plain or in a session.
fn grant_of(outcome: &Outcome) -> Option<Grant> {
    match outcome {
        Outcome::Acquire(AcquireOutcome::Granted(g))
        | Outcome::AcquireInSession(AcquireInSessionOutcome::Acquire(AcquireOutcome::Granted(g))) => {
            Some(*g)
        }
        _ => None,
    }
}

fn granted(outcome: Outcome) -> Grant {
    grant_of(&outcome).unwrap_or_else(|| panic!("not granted: {outcome:?}"))
}

/// The refusal in a session command's outcome, whichever the command.
fn session_refusal(outcome: &Outcome) -> Option<SessionRefusal> {
    match outcome {
        Outcome::Session(SessionOutcome::Refused(r))
        | Outcome::AcquireInSession(AcquireInSessionOutcome::SessionRefused(r)) => Some(*r),
        Outcome::CloseSession(CloseSessionOutcome::NotOwner) => Some(SessionRefusal::NotOwner),
        _ => None,
    }
}

/// A table with session `s` opened at 0 (TTL 10 s) holding `n` leases
/// `r0`.., acquired at 100; returns their owners and grants.
fn session_with(n: usize) -> (LeaseTable, SessionId, Vec<(OwnerId, Grant)>) {
    let mut table = LeaseTable::new();
    let s = SessionId::random();
    assert_eq!(
        one(&mut table, 0, open(s, ME, TTL)),
        Outcome::Session(SessionOutcome::Alive {
            expires_at: at(TTL),
            ttl_ms: TTL,
            leases: 0
        })
    );
    let owners: Vec<OwnerId> = (0..n).map(|_| OwnerId::random()).collect();
    let commands = owners
        .iter()
        .enumerate()
        .map(|(i, o)| in_session(&format!("r{i}"), *o, s, ME))
        .collect();
    let out = apply(&mut table, 100, commands);
    let grants = owners
        .into_iter()
        .zip(out.outcomes.into_iter().map(granted))
        .collect();
    (table, s, grants)
}

#[test]
fn a_lease_in_a_session_expires_with_it_and_a_keep_alive_extends_all_of_them() {
    let (mut table, s, grants) = session_with(50);
    for (_, g) in &grants {
        assert_eq!(g.expires_at, at(TTL), "a lease runs as its session does");
        assert_eq!(g.ttl_ms, TTL);
    }
    assert_eq!(table.live_leases(), 50);
    assert_eq!(table.session(s), Some((at(TTL), 50)));
    // One command, one write: every lease now runs to 15 s.
    let applied = apply(&mut table, 5_000, vec![keep_alive(s, ME)]);
    assert_eq!(
        applied.outcomes,
        vec![Outcome::Session(SessionOutcome::Alive {
            expires_at: at(15_000),
            ttl_ms: TTL,
            leases: 50
        })]
    );
    for i in 0..50 {
        let d = table.describe(&format!("r{i}"), at(14_999));
        assert!(d.held && d.remaining_ms == 1, "r{i}: {d:?}");
        let (_, grant) = table.holder(&format!("r{i}")).unwrap();
        assert_eq!(grant.expires_at, at(15_000));
    }
    let list = table.leases("r", at(14_000), 100);
    assert_eq!(list.rows.len(), 50);
    assert!(list
        .rows
        .iter()
        .all(|l| l.remaining_ms == 1_000 && l.ttl_ms == TTL));
}

#[test]
fn a_lapsed_session_ends_all_its_leases_at_one_cluster_time() {
    let (mut table, s, grants) = session_with(40);
    // Just before the lapse every lease is current, at it none is, whether
    // or not an entry has swept it yet.
    for (i, (owner, g)) in grants.iter().enumerate() {
        let r = format!("r{i}");
        assert!(matches!(
            table.validate(&r, g.token, at(TTL - 1)).state,
            TokenState::Current { remaining_ms: 1 }
        ));
        assert_eq!(
            table.validate(&r, g.token, at(TTL)).state,
            TokenState::Expired
        );
        assert_eq!(
            table.check_holder(&r, *owner, g.token, at(TTL)),
            Err(LostReason::Expired)
        );
        assert!(!table.describe(&r, at(TTL)).held);
    }
    assert_eq!(table.next_sweep(), Some(at(TTL)));
    // The entry at the lapse ends all of them in one step.
    let applied = apply(&mut table, TTL + 250, vec![]);
    let expired = applied
        .events
        .iter()
        .filter(|e| matches!(e, Event::Expired { .. }))
        .count();
    assert_eq!(expired, 40);
    assert!(applied.events.contains(&Event::SessionExpired {
        session: s,
        leases: 40
    }));
    assert_eq!(table.live_leases(), 0);
    assert_eq!(table.sessions(), 0);
    assert_eq!(table.session(s), None);
    let ends: Vec<LeaseEnd> = (0..40)
        .map(|i| table.history(&format!("r{i}"), 1)[0].end.unwrap())
        .collect();
    assert!(
        ends.iter().all(|e| *e == ends[0]),
        "every lease ended at the same time: {ends:?}"
    );
    assert_eq!(ends[0].how, ChangeKind::Expired);
    // A keep-alive after the lapse revives nothing.
    assert_eq!(
        one(&mut table, TTL + 300, keep_alive(s, ME)),
        Outcome::Session(SessionOutcome::Refused(SessionRefusal::Gone))
    );
    assert_eq!(table.live_leases(), 0);
}

#[test]
fn a_lapsed_sessions_lease_is_granted_again_only_after_the_lapse_with_a_higher_token() {
    let (mut table, s, grants) = session_with(3);
    let other = OwnerId::random();
    assert!(matches!(
        one(&mut table, 6_000, keep_alive(s, ME)),
        Outcome::Session(SessionOutcome::Alive { .. })
    ));
    // Kept alive at 6 s: held until 16 s.
    assert!(matches!(
        one(&mut table, 15_999, plain("r1", other, 0)),
        Outcome::Acquire(AcquireOutcome::Held {
            remaining_ms: 1,
            ..
        })
    ));
    let g = granted(one(&mut table, 16_000, plain("r1", other, 0)));
    assert!(grants.iter().all(|(_, old)| g.token > old.token));
    assert_eq!(table.last_token(), Some(g.token));
}

#[test]
fn a_waiter_on_a_sessions_lease_is_granted_when_the_session_lapses() {
    let (mut table, _s, grants) = session_with(2);
    let waiter = OwnerId::random();
    assert!(matches!(
        one(&mut table, 200, plain("r0", waiter, 60_000)),
        Outcome::Acquire(AcquireOutcome::Waiting { position: 1 })
    ));
    assert_eq!(table.next_wakeup(), Some(at(TTL)));
    let applied = apply(&mut table, TTL, vec![]);
    let grant = applied.events.iter().find_map(|e| match e {
        Event::WaiterGranted {
            owner_id: owner,
            grant,
            ..
        } if *owner == waiter => Some(*grant),
        _ => None,
    });
    let grant = grant.expect("the waiter is granted at the lapse");
    assert!(grant.token > grants[1].1.token);
    assert_eq!(grant.expires_at, at(TTL + TTL));
}

#[test]
fn closing_a_session_releases_its_leases_and_a_retried_close_is_answered_the_same() {
    let (mut table, s, grants) = session_with(5);
    let waiter = OwnerId::random();
    one(&mut table, 200, plain("r3", waiter, 60_000));
    let applied = apply(&mut table, 300, vec![close(s, ME)]);
    assert_eq!(
        applied.outcomes,
        vec![Outcome::CloseSession(CloseSessionOutcome::Closed {
            leases: 5
        })]
    );
    assert!(applied
        .events
        .iter()
        .any(|e| matches!(e, Event::WaiterGranted { owner_id: owner, .. } if *owner == waiter)));
    assert_eq!(table.live_leases(), 1, "only the waiter's lease");
    let (owner, g) = grants[0];
    assert_eq!(
        one(
            &mut table,
            400,
            Command::Release {
                resource: name("r0"),
                owner_id: owner,
                token: g.token
            }
        ),
        Outcome::Release(ReleaseOutcome::Released),
        "a release after the close is told the lease was released"
    );
    assert_eq!(
        one(&mut table, 500, close(s, ME)),
        Outcome::CloseSession(CloseSessionOutcome::Closed { leases: 0 })
    );
}

#[test]
fn another_identity_can_neither_keep_close_nor_acquire_in_a_session() {
    let (mut table, s, _) = session_with(2);
    let mut untouched = table.clone();
    apply(&mut untouched, 1_000, vec![]);
    for command in [
        keep_alive(s, "intruder"),
        close(s, "intruder"),
        in_session("x", OwnerId::random(), s, "intruder"),
        open(s, "intruder", TTL),
    ] {
        assert_eq!(
            session_refusal(&one(&mut table, 1_000, command)),
            Some(SessionRefusal::NotOwner)
        );
    }
    assert_eq!(table.session(s), Some((at(TTL), 2)));
    assert_eq!(table.snapshot(), untouched.snapshot(), "nothing changed");
}

#[test]
fn a_retried_open_keeps_the_session_alive_and_never_shortens_it() {
    let mut table = LeaseTable::new();
    let s = SessionId::random();
    one(&mut table, 0, open(s, ME, 30_000));
    assert_eq!(
        one(&mut table, 1_000, open(s, ME, 30_000)),
        Outcome::Session(SessionOutcome::Alive {
            expires_at: at(31_000),
            ttl_ms: 30_000,
            leases: 0
        })
    );
    assert_eq!(table.sessions(), 1);
    // A keep-alive early in a long session never moves its end earlier.
    assert_eq!(
        one(&mut table, 1_001, keep_alive(s, ME)),
        Outcome::Session(SessionOutcome::Alive {
            expires_at: at(31_001),
            ttl_ms: 30_000,
            leases: 0
        })
    );
}

#[test]
fn sessions_are_bounded_in_all_and_per_identity() {
    let mut table = LeaseTable::new();
    let tight = SessionBounds {
        max_sessions: 3,
        max_sessions_per_identity: 2,
    };
    let open_in = |identity: &str| Command::OpenSession {
        session: SessionId::random(),
        identity: identity.into(),
        ttl_ms: TTL,
        bounds: tight,
    };
    assert!(matches!(
        one(&mut table, 0, open_in("a")),
        Outcome::Session(SessionOutcome::Alive { .. })
    ));
    assert!(matches!(
        one(&mut table, 0, open_in("a")),
        Outcome::Session(SessionOutcome::Alive { .. })
    ));
    assert_eq!(
        one(&mut table, 0, open_in("a")),
        Outcome::Session(SessionOutcome::Refused(SessionRefusal::Bound {
            bound: SessionBound::SessionsPerIdentity,
            limit: 2
        }))
    );
    assert!(matches!(
        one(&mut table, 0, open_in("b")),
        Outcome::Session(SessionOutcome::Alive { .. })
    ));
    assert_eq!(
        one(&mut table, 0, open_in("c")),
        Outcome::Session(SessionOutcome::Refused(SessionRefusal::Bound {
            bound: SessionBound::Sessions,
            limit: 3
        }))
    );
    assert_eq!(SessionBound::Sessions.setting(), "max_sessions");
    // Lapsed sessions count no more.
    assert!(matches!(
        one(&mut table, TTL, open_in("c")),
        Outcome::Session(SessionOutcome::Alive { .. })
    ));
    assert_eq!(table.sessions(), 1);
}

#[test]
fn a_sessions_lease_is_not_renewed_on_its_own_and_is_released_alone() {
    let (mut table, s, grants) = session_with(2);
    let (owner, g) = grants[0];
    let renew = Command::Renew {
        resource: name("r0"),
        owner_id: owner,
        token: g.token,
        ttl_ms: 60_000,
    };
    assert_eq!(
        one(&mut table, 500, renew),
        Outcome::Renew(RenewOutcome::KeptBySession)
    );
    assert_eq!(table.holder("r0").unwrap().1.expires_at, at(TTL));
    assert_eq!(
        one(
            &mut table,
            600,
            Command::Release {
                resource: name("r0"),
                owner_id: owner,
                token: g.token
            }
        ),
        Outcome::Release(ReleaseOutcome::Released)
    );
    assert_eq!(table.session(s), Some((at(TTL), 1)));
    assert_eq!(table.live_leases(), 1);
    // The holder asking again gets its grant, as its session runs.
    let (owner1, g1) = grants[1];
    assert_eq!(
        granted(one(&mut table, 700, in_session("r1", owner1, s, ME))),
        g1
    );
}

#[test]
fn an_acquire_in_a_session_that_is_not_open_grants_nothing() {
    let mut table = LeaseTable::new();
    let s = SessionId::random();
    assert_eq!(
        one(&mut table, 0, in_session("r", OwnerId::random(), s, ME)),
        Outcome::AcquireInSession(AcquireInSessionOutcome::SessionRefused(
            SessionRefusal::Gone
        ))
    );
    one(&mut table, 0, open(s, ME, TTL));
    assert_eq!(
        one(&mut table, TTL, in_session("r", OwnerId::random(), s, ME)),
        Outcome::AcquireInSession(AcquireInSessionOutcome::SessionRefused(
            SessionRefusal::Gone
        ))
    );
    assert_eq!(table.live_leases(), 0);
    assert_eq!(table.last_token(), None);
}

#[test]
fn a_sessions_leases_count_against_the_live_lease_capacity() {
    let (mut table, s, _) = session_with(3);
    let command = Command::AcquireInSession {
        resource: name("more"),
        owner_id: OwnerId::random(),
        session: s,
        identity: ME.into(),
        capacity: Capacity {
            max_live_leases: 3,
            max_waiters: 10,
        },
    };
    assert_eq!(
        one(&mut table, 200, command),
        Outcome::AcquireInSession(AcquireInSessionOutcome::Acquire(
            AcquireOutcome::CapacityReached {
                bound: CapacityBound::LiveLeases,
                limit: 3
            }
        ))
    );
}

#[test]
fn sessions_survive_a_snapshot_round_trip() {
    let (mut table, s, grants) = session_with(4);
    let other = SessionId::random();
    one(&mut table, 200, open(other, "b", 20_000));
    one(&mut table, 300, plain("own", OwnerId::random(), 0));
    let snapshot = table.snapshot();
    assert_eq!(snapshot.format_version(), SNAPSHOT_FORMAT_VERSION);
    let text = serde_json::to_string(&snapshot).unwrap();
    assert_eq!(text, serde_json::to_string(&table.snapshot_ref()).unwrap());
    let mut restored = LeaseTable::from_snapshot(serde_json::from_str(&text).unwrap()).unwrap();
    assert_eq!(restored.snapshot(), snapshot);
    assert_eq!(restored.session(s), Some((at(TTL), 4)));
    assert_eq!(restored.sessions(), 2);
    assert_eq!(restored.live_leases(), 5);
    // The restored table lapses the session as the original does.
    let a = apply(&mut table, TTL, vec![]);
    let b = apply(&mut restored, TTL, vec![]);
    assert_eq!(a, b);
    assert_eq!(restored.snapshot(), table.snapshot());
    for (i, (_, g)) in grants.iter().enumerate() {
        let state = restored.validate(&format!("r{i}"), g.token, at(TTL)).state;
        assert_eq!(state, TokenState::Expired, "r{i}");
    }
}

#[test]
fn a_version_2_snapshot_loads_without_sessions() {
    let mut table = LeaseTable::new();
    one(&mut table, 0, plain("a", OwnerId::random(), 0));
    let mut value: serde_json::Value = serde_json::to_value(table.snapshot()).unwrap();
    value["format_version"] = 2.into();
    value.as_object_mut().unwrap().remove("sessions");
    let old: TableSnapshot = serde_json::from_value(value).unwrap();
    let loaded = LeaseTable::from_snapshot(old).unwrap();
    assert_eq!(loaded.live_leases(), 1);
    assert_eq!(loaded.sessions(), 0);
    assert_eq!(loaded.snapshot().format_version(), SNAPSHOT_FORMAT_VERSION);
}

#[test]
fn session_commands_are_checked_by_field() {
    let limits = Limits::default();
    let bad_ttl = open(SessionId::random(), ME, 10);
    assert_eq!(bad_ttl.validate(&limits).unwrap_err().field(), "ttl_ms");
    let long = "x".repeat(SESSION_IDENTITY_MAX_BYTES + 1);
    let err = keep_alive(SessionId::random(), &long)
        .validate(&limits)
        .unwrap_err();
    assert_eq!(err.field(), "identity");
    assert!(err.to_string().contains("at most 256 bytes"), "{err}");
    assert!(SessionId::from_bytes(&[0; 16]).is_err());
    assert_eq!(open(SessionId::random(), ME, TTL).resource(), None);
}

#[derive(Debug, Clone)]
enum Op {
    Open(usize, u64),
    Keep(usize),
    Close(usize),
    InSession(usize, usize),
    Plain(usize, u64),
    Release(usize),
    Tick,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (0..3usize, 1_000..20_000u64).prop_map(|(s, t)| Op::Open(s, t)),
        (0..3usize).prop_map(Op::Keep),
        (0..3usize).prop_map(Op::Close),
        (0..3usize, 0..6usize).prop_map(|(s, r)| Op::InSession(s, r)),
        (0..6usize, 0..5_000u64).prop_map(|(r, w)| Op::Plain(r, w)),
        (0..6usize).prop_map(Op::Release),
        Just(Op::Tick),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// Whatever the mix of sessions and leases: the invariants hold after
    /// every entry, tokens only grow, and at any time the leases of one
    /// session are either all live or all over.
    #[test]
    fn sessions_keep_the_table_consistent(steps in prop::collection::vec((op(), 0..3_000u64), 1..80)) {
        let sessions: Vec<SessionId> = (0..3).map(|_| SessionId::random()).collect();
        let mut table = LeaseTable::new();
        let mut now = 0;
        let mut last_token = 0;
        // Leases granted in each session: (resource, token).
        let mut in_session_of: Vec<Vec<(String, Token)>> = vec![Vec::new(); 3];
        for (op, gap) in steps {
            now += gap;
            let command = match op {
                Op::Open(s, ttl) => Some(open(sessions[s], ME, ttl)),
                Op::Keep(s) => Some(keep_alive(sessions[s], ME)),
                Op::Close(s) => Some(close(sessions[s], ME)),
                Op::InSession(s, r) => Some(in_session(&format!("r{r}"), OwnerId::random(), sessions[s], ME)),
                Op::Plain(r, w) => Some(plain(&format!("r{r}"), OwnerId::random(), w)),
                Op::Release(r) => table.holder(&format!("r{r}")).map(|(owner, g)| Command::Release {
                    resource: name(&format!("r{r}")),
                    owner_id: owner,
                    token: g.token,
                }),
                Op::Tick => None,
            };
            if let Some(Command::Release { resource, token, .. }) = &command {
                for leases in in_session_of.iter_mut() {
                    leases.retain(|(r, t)| !(r == resource.as_str() && t == token));
                }
            }
            let applied = apply(&mut table, now, command.clone().into_iter().collect());
            let grants = applied.outcomes.iter().filter_map(|o| grant_of(o).map(|g| g.token));
            let handed = applied.events.iter().filter_map(|e| match e {
                Event::WaiterGranted { grant, .. } => Some(grant.token),
                _ => None,
            });
            // Every owner id is fresh: every grant is a new, higher token.
            let mut tokens: Vec<u64> = grants.chain(handed).map(Token::get).collect();
            tokens.sort_unstable();
            for token in tokens {
                prop_assert!(token > last_token, "token {} after {}", token, last_token);
                last_token = token;
            }
            if let (Some(Command::AcquireInSession { resource, session, .. }), Some(g)) =
                (&command, applied.outcomes.first().and_then(grant_of))
            {
                let i = sessions.iter().position(|s| s == session).unwrap();
                in_session_of[i].push((resource.as_str().to_string(), g.token));
            }
            prop_assert_eq!(table.last_token().map_or(0, Token::get), last_token);
            // Sessions that ended in this entry (a lapse, or a close): none of
            // their leases is current any more. (An id opened again in the
            // same entry is a new session.)
            let ended: Vec<SessionId> = applied
                .events
                .iter()
                .filter_map(|e| match e {
                    Event::SessionExpired { session, .. } => Some(*session),
                    _ => None,
                })
                .chain(match (&command, applied.outcomes.first()) {
                    (Some(Command::CloseSession { session, .. }), Some(Outcome::CloseSession(CloseSessionOutcome::Closed { .. }))) => {
                        Some(*session)
                    }
                    _ => None,
                })
                .collect();
            for (i, leases) in in_session_of.iter_mut().enumerate() {
                if ended.contains(&sessions[i]) {
                    for (r, token) in leases.iter() {
                        let state = table.validate(r, *token, at(now)).state;
                        prop_assert!(!matches!(state, TokenState::Current { .. }), "{} (token {})", r, token);
                    }
                    leases.clear();
                }
                let open = table.session(sessions[i]).is_some();
                for (r, token) in leases.iter() {
                    let live = matches!(table.validate(r, *token, at(now)).state, TokenState::Current { .. });
                    prop_assert_eq!(live, open, "{} (token {}) in session {}", r, token, i);
                }
                if !open {
                    leases.clear();
                }
            }
        }
    }
}

/// The commands that name their own identity are exactly those a wrapper
/// for an identity refuses, so a server that wraps every other command as
/// its caller's never sends one that is refused for being wrapped.
#[test]
fn commands_that_carry_their_identity_are_the_ones_never_wrapped() {
    let limits = Limits::default();
    let s = SessionId::random();
    let session_calls = [open(s, ME, TTL), keep_alive(s, ME), close(s, ME)];
    for command in session_calls {
        assert!(command.carries_identity(), "{command:?}");
        let wrapped = command.as_identity(ME, IdentityBounds::UNBOUNDED);
        assert!(wrapped.validate(&limits).is_err(), "{wrapped:?}");
    }
    let others = [
        in_session("a", OwnerId::random(), s, ME),
        Command::Acquire {
            resource: name("a"),
            owner_id: OwnerId::random(),
            ttl_ms: TTL,
            wait_ms: 0,
        },
    ];
    for command in others {
        assert!(!command.carries_identity(), "{command:?}");
        let wrapped = command.as_identity(ME, IdentityBounds::UNBOUNDED);
        assert_eq!(wrapped.validate(&limits), Ok(()), "{wrapped:?}");
    }
}
