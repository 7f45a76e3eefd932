//! Every command is answered with its own outcome type: the server builds
//! each reply from exactly the cases its command can produce, and relies on
//! this pairing (`CommandOutcome`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use fenced_core::*;
use proptest::prelude::*;

#[derive(Debug, Clone)]
enum Step {
    Acquire {
        res: u8,
        owner: u8,
        wait: bool,
    },
    AcquireBounded {
        res: u8,
        owner: u8,
        room: u64,
    },
    Renew {
        res: u8,
        owner: u8,
        token: u64,
    },
    Release {
        res: u8,
        owner: u8,
        token: u64,
    },
    Put {
        res: u8,
        owner: u8,
        token: u64,
        room: u64,
    },
    Delete {
        res: u8,
        owner: u8,
        token: u64,
    },
    RenewMany {
        leases: Vec<(u8, u8, u64)>,
    },
    Open {
        session: u8,
    },
    KeepAlive {
        session: u8,
    },
    Close {
        session: u8,
    },
    InSession {
        res: u8,
        owner: u8,
        session: u8,
    },
    Wall {
        unix_ms: u64,
    },
}

fn step() -> impl Strategy<Value = Step> {
    let r = 0..3u8;
    let o = 0..3u8;
    let t = 1..8u64;
    prop_oneof![
        (r.clone(), o.clone(), any::<bool>()).prop_map(|(res, owner, wait)| Step::Acquire {
            res,
            owner,
            wait
        }),
        (r.clone(), o.clone(), 0..3u64).prop_map(|(res, owner, room)| Step::AcquireBounded {
            res,
            owner,
            room
        }),
        (r.clone(), o.clone(), t.clone()).prop_map(|(res, owner, token)| Step::Renew {
            res,
            owner,
            token
        }),
        (r.clone(), o.clone(), t.clone()).prop_map(|(res, owner, token)| Step::Release {
            res,
            owner,
            token
        }),
        (r.clone(), o.clone(), t.clone(), 0..3u64).prop_map(|(res, owner, token, room)| {
            Step::Put {
                res,
                owner,
                token,
                room,
            }
        }),
        (r.clone(), o.clone(), t.clone()).prop_map(|(res, owner, token)| Step::Delete {
            res,
            owner,
            token
        }),
        prop::collection::vec((r.clone(), o.clone(), t), 1..5)
            .prop_map(|leases| Step::RenewMany { leases }),
        (0..2u8).prop_map(|session| Step::Open { session }),
        (0..2u8).prop_map(|session| Step::KeepAlive { session }),
        (0..2u8).prop_map(|session| Step::Close { session }),
        (r, o, 0..2u8).prop_map(|(res, owner, session)| Step::InSession {
            res,
            owner,
            session
        }),
        any::<u64>().prop_map(|unix_ms| Step::Wall { unix_ms }),
    ]
}

fn res(i: u8) -> ResourceName {
    ResourceName::new(&format!("r{i}")).unwrap()
}

fn owner(i: u8) -> OwnerId {
    OwnerId::from_bytes(&[i + 1; 16]).unwrap()
}

fn session(i: u8) -> SessionId {
    SessionId::from_bytes(&[i + 1; 16]).unwrap()
}

fn token(t: u64) -> Token {
    Token::new(t).unwrap()
}

fn command(step: &Step) -> Command {
    match step.clone() {
        Step::Acquire {
            res: r,
            owner: o,
            wait,
        } => Command::Acquire {
            resource: res(r),
            owner_id: owner(o),
            ttl_ms: 50,
            wait_ms: if wait { 30 } else { 0 },
        },
        Step::AcquireBounded {
            res: r,
            owner: o,
            room,
        } => Command::AcquireBounded {
            resource: res(r),
            owner_id: owner(o),
            ttl_ms: 50,
            wait_ms: 30,
            capacity: Capacity {
                max_live_leases: room,
                max_waiters: room,
            },
        },
        Step::Renew {
            res: r,
            owner: o,
            token: t,
        } => Command::Renew {
            resource: res(r),
            owner_id: owner(o),
            token: token(t),
            ttl_ms: 50,
        },
        Step::Release {
            res: r,
            owner: o,
            token: t,
        } => Command::Release {
            resource: res(r),
            owner_id: owner(o),
            token: token(t),
        },
        Step::Put {
            res: r,
            owner: o,
            token: t,
            room,
        } => Command::KvPut {
            key: KvKey::new(&format!("k{r}")).unwrap(),
            value: KvValue::new(b"v".to_vec()).unwrap(),
            resource: res(r),
            owner_id: owner(o),
            token: token(t),
            bounds: KvBounds {
                max_keys: room,
                max_total_bytes: 64,
            },
        },
        Step::Delete {
            res: r,
            owner: o,
            token: t,
        } => Command::KvDelete {
            key: KvKey::new(&format!("k{r}")).unwrap(),
            resource: res(r),
            owner_id: owner(o),
            token: token(t),
        },
        Step::RenewMany { leases } => Command::RenewMany {
            leases: RenewLeases::new(
                leases
                    .into_iter()
                    .map(|(r, o, t)| RenewLease {
                        resource: res(r),
                        owner_id: owner(o),
                        token: token(t),
                        ttl_ms: 50,
                    })
                    .collect(),
            )
            .unwrap(),
        },
        Step::Open { session: s } => Command::OpenSession {
            session: session(s),
            identity: "app".into(),
            ttl_ms: 50,
            bounds: Limits::default().session_bounds(),
        },
        Step::KeepAlive { session: s } => Command::KeepAlive {
            session: session(s),
            identity: "app".into(),
        },
        Step::Close { session: s } => Command::CloseSession {
            session: session(s),
            identity: "app".into(),
        },
        Step::InSession {
            res: r,
            owner: o,
            session: s,
        } => Command::AcquireInSession {
            resource: res(r),
            owner_id: owner(o),
            session: session(s),
            identity: "app".into(),
            capacity: Capacity::UNBOUNDED,
        },
        Step::Wall { unix_ms } => Command::WallClock { unix_ms },
    }
}

/// Whether `outcome` is the type `command`'s kind answers with.
fn answers(command: &Command, outcome: Outcome) -> bool {
    match command {
        Command::Acquire { .. } | Command::AcquireBounded { .. } => {
            AcquireOutcome::from_outcome(outcome).is_ok()
        }
        Command::Renew { .. } => RenewOutcome::from_outcome(outcome).is_ok(),
        Command::Release { .. } => ReleaseOutcome::from_outcome(outcome).is_ok(),
        Command::KvPut { .. } => KvPutOutcome::from_outcome(outcome).is_ok(),
        Command::KvDelete { .. } => KvDeleteOutcome::from_outcome(outcome).is_ok(),
        Command::RenewMany { leases } => {
            Vec::<RenewOutcome>::from_outcome(outcome).is_ok_and(|each| each.len() == leases.len())
        }
        Command::OpenSession { .. } | Command::KeepAlive { .. } => {
            SessionOutcome::from_outcome(outcome).is_ok()
        }
        Command::CloseSession { .. } => CloseSessionOutcome::from_outcome(outcome).is_ok(),
        Command::AcquireInSession { .. } => AcquireInSessionOutcome::from_outcome(outcome).is_ok(),
        // Answered as the command it wraps.
        Command::AsIdentity { command, .. } | Command::Labelled { command, .. } => {
            answers(command, outcome)
        }
        Command::WallClock { .. } => matches!(outcome, Outcome::WallClockNoted),
    }
}

proptest! {
    #[test]
    fn every_command_is_answered_with_its_own_outcome_type(
        entries in prop::collection::vec((prop::collection::vec(step(), 0..6), 0..40u64), 1..30),
    ) {
        let mut table = LeaseTable::new();
        let mut now = 0;
        for (steps, advance) in entries {
            now += advance;
            let commands: Vec<Command> = steps.iter().map(command).collect();
            let applied = table.apply(&Batch {
                stamp: ClusterTime::from_millis(now),
                commands: commands.clone(),
            });
            prop_assert_eq!(applied.outcomes.len(), commands.len());
            for (command, outcome) in commands.iter().zip(applied.outcomes) {
                let shown = format!("{outcome:?}");
                prop_assert!(answers(command, outcome), "{:?} answered with {}", command, shown);
            }
        }
    }
}

#[test]
fn an_outcome_is_not_taken_for_another_commands() {
    let released = Outcome::Release(ReleaseOutcome::Released);
    assert_eq!(
        RenewOutcome::from_outcome(released.clone()),
        Err(released.clone())
    );
    assert_eq!(
        ReleaseOutcome::from_outcome(released),
        Ok(ReleaseOutcome::Released)
    );
}
