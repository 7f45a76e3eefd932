//! Random interleavings of commands from several owners on several resources,
//! checked against a deliberately naive reference model of the contract, and
//! against the guarantees directly.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use fenced_core::*;
use proptest::prelude::*;

const RESOURCES: [&str; 3] = ["billing", "statement:1842", "import"];
const OWNERS: usize = 5;

#[derive(Debug, Clone)]
enum Op {
    Acquire {
        res: usize,
        owner: usize,
        ttl_ms: u64,
        wait_ms: u64,
    },
    Renew {
        res: usize,
        owner: usize,
        token_pick: u8,
        ttl_ms: u64,
    },
    Release {
        res: usize,
        owner: usize,
        token_pick: u8,
    },
}

#[derive(Debug, Clone)]
struct Step {
    advance_ms: u64,
    ops: Vec<Op>,
    snapshot_round_trip: bool,
}

fn op() -> impl Strategy<Value = Op> {
    let res = 0..RESOURCES.len();
    let owner = 0..OWNERS;
    let ttl = prop_oneof![Just(1_000u64), Just(2_000), Just(5_000)];
    let wait = prop_oneof![Just(0u64), Just(0), Just(1_500), Just(6_000)];
    prop_oneof![
        (res.clone(), owner.clone(), ttl.clone(), wait).prop_map(
            |(res, owner, ttl_ms, wait_ms)| {
                Op::Acquire {
                    res,
                    owner,
                    ttl_ms,
                    wait_ms,
                }
            }
        ),
        (res.clone(), owner.clone(), any::<u8>(), ttl).prop_map(
            |(res, owner, token_pick, ttl_ms)| {
                Op::Renew {
                    res,
                    owner,
                    token_pick,
                    ttl_ms,
                }
            }
        ),
        (res, owner, any::<u8>()).prop_map(|(res, owner, token_pick)| Op::Release {
            res,
            owner,
            token_pick
        }),
    ]
}

fn step() -> impl Strategy<Value = Step> {
    (
        prop_oneof![Just(0u64), 0..700u64, 900..2_500u64],
        prop::collection::vec(op(), 0..4),
        prop::bool::weighted(0.05),
    )
        .prop_map(|(advance_ms, ops, snapshot_round_trip)| Step {
            advance_ms,
            ops,
            snapshot_round_trip,
        })
}

// ---- the reference model: plain vectors, linear scans, no indexes ----

#[derive(Debug, Clone, Default)]
struct ModelResource {
    last_token: u64,
    holder: Option<(OwnerId, u64, u64, u64)>, // owner, token, expires_at, ttl
    ended: Option<(OwnerId, u64, bool)>,      // owner, token, released?
    waiters: Vec<(OwnerId, u64, u64)>,        // owner, ttl, deadline
}

#[derive(Debug, Default)]
struct Model {
    now: u64,
    counter: u64,
    res: BTreeMap<String, ModelResource>,
}

impl Model {
    fn grant(&mut self, name: &str, owner: OwnerId, ttl: u64) -> Grant {
        self.counter += 1;
        let now = self.now;
        let r = self.res.entry(name.to_string()).or_default();
        r.last_token = self.counter;
        r.holder = Some((owner, self.counter, now + ttl, ttl));
        Grant {
            token: Token::new(self.counter).unwrap(),
            expires_at: ClusterTime::from_millis(now + ttl),
            ttl_ms: ttl,
        }
    }

    fn hand_off(&mut self, name: &str, events: &mut Vec<Event>) {
        let r = self.res.get_mut(name).unwrap();
        if r.holder.is_none() && !r.waiters.is_empty() {
            let (owner, ttl, _) = r.waiters.remove(0);
            let grant = self.grant(name, owner, ttl);
            events.push(Event::WaiterGranted {
                resource: ResourceName::new(name).unwrap(),
                owner_id: owner,
                grant,
            });
        }
    }

    fn reason(r: &ModelResource, owner: OwnerId, token: u64) -> LostReason {
        match r.ended {
            Some((o, t, released)) if o == owner && t == token => {
                if released {
                    LostReason::Released
                } else {
                    LostReason::Expired
                }
            }
            _ if token < r.last_token => LostReason::Superseded {
                current_token: Token::new(r.last_token).unwrap(),
            },
            _ => LostReason::Unknown,
        }
    }

    fn apply(&mut self, stamp: u64, commands: &[Command]) -> Applied {
        self.now = self.now.max(stamp);
        let now = self.now;
        let mut events = vec![];
        // Elapsed waits, in (deadline, resource, owner) order.
        let mut elapsed: Vec<(u64, String, OwnerId)> = vec![];
        for (name, r) in &self.res {
            for (o, _, d) in &r.waiters {
                if *d <= now {
                    elapsed.push((*d, name.clone(), *o));
                }
            }
        }
        elapsed.sort();
        for (_, name, owner) in elapsed {
            let r = self.res.get_mut(&name).unwrap();
            r.waiters.retain(|w| w.0 != owner);
            let (_, token, exp, _) = r.holder.unwrap();
            events.push(Event::WaitElapsed {
                resource: ResourceName::new(&name).unwrap(),
                owner_id: owner,
                current_token: Token::new(token).unwrap(),
                remaining_ms: exp.saturating_sub(now),
            });
        }
        // Expired leases, in (expires_at, resource) order.
        let mut expired: Vec<(u64, String)> = self
            .res
            .iter()
            .filter_map(|(n, r)| r.holder.filter(|h| h.2 <= now).map(|h| (h.2, n.clone())))
            .collect();
        expired.sort();
        for (_, name) in expired {
            let r = self.res.get_mut(&name).unwrap();
            let (owner, token, _, _) = r.holder.take().unwrap();
            r.ended = Some((owner, token, false));
            events.push(Event::Expired {
                resource: ResourceName::new(&name).unwrap(),
                owner_id: owner,
                token: Token::new(token).unwrap(),
            });
            self.hand_off(&name, &mut events);
        }
        let mut outcomes = vec![];
        for c in commands {
            let name = c
                .resource()
                .expect("every command of the model names a resource")
                .as_str()
                .to_string();
            let out = match c {
                Command::Acquire {
                    owner_id: owner,
                    ttl_ms,
                    wait_ms,
                    ..
                } => match self.res.get(&name).and_then(|r| r.holder) {
                    // An owner id whose lease ended is spent, unless it holds a newer lease.
                    h if h.is_none_or(|h| h.0 != *owner)
                        && self
                            .res
                            .get(&name)
                            .and_then(|r| r.ended)
                            .is_some_and(|e| e.0 == *owner) =>
                    {
                        let r = &self.res[&name];
                        let (_, t, released) = r.ended.unwrap();
                        Outcome::Acquire(AcquireOutcome::Ended(if r.last_token > t {
                            LostReason::Superseded {
                                current_token: Token::new(r.last_token).unwrap(),
                            }
                        } else if released {
                            LostReason::Released
                        } else {
                            LostReason::Expired
                        }))
                    }
                    None => Outcome::Acquire(AcquireOutcome::Granted(
                        self.grant(&name, *owner, *ttl_ms),
                    )),
                    Some((o, token, exp, _)) if o == *owner => {
                        let exp = exp.max(now + ttl_ms);
                        let r = self.res.get_mut(&name).unwrap();
                        let h = r.holder.as_mut().unwrap();
                        if h.2 != exp {
                            h.2 = exp;
                            h.3 = *ttl_ms;
                        }
                        Outcome::Acquire(AcquireOutcome::Granted(Grant {
                            token: Token::new(token).unwrap(),
                            expires_at: ClusterTime::from_millis(h.2),
                            ttl_ms: h.3,
                        }))
                    }
                    Some((_, token, exp, _)) => {
                        let r = self.res.get_mut(&name).unwrap();
                        if *wait_ms == 0 {
                            Outcome::Acquire(AcquireOutcome::Held {
                                current_token: Token::new(token).unwrap(),
                                remaining_ms: exp - now,
                            })
                        } else if let Some(p) = r.waiters.iter().position(|w| w.0 == *owner) {
                            Outcome::Acquire(AcquireOutcome::Waiting {
                                position: p as u32 + 1,
                            })
                        } else {
                            r.waiters.push((*owner, *ttl_ms, now + wait_ms));
                            Outcome::Acquire(AcquireOutcome::Waiting {
                                position: r.waiters.len() as u32,
                            })
                        }
                    }
                },
                Command::Renew {
                    owner_id: owner,
                    token,
                    ttl_ms,
                    ..
                } => match self.res.get_mut(&name) {
                    None => Outcome::Renew(RenewOutcome::Lost(LostReason::Unknown)),
                    Some(r) => match &mut r.holder {
                        Some(h) if h.0 == *owner && h.1 == token.get() => {
                            h.2 = now + ttl_ms;
                            h.3 = *ttl_ms;
                            Outcome::Renew(RenewOutcome::Renewed {
                                expires_at: ClusterTime::from_millis(h.2),
                                ttl_ms: *ttl_ms,
                            })
                        }
                        _ => {
                            Outcome::Renew(RenewOutcome::Lost(Self::reason(r, *owner, token.get())))
                        }
                    },
                },
                // Capacity bounds are proven in tests/capacity.rs; the model
                // drives the unbounded acquire.
                // Fenced writes are proven in tests/kv.rs; batch renewals
                // against single ones in tests/renew_many.rs; sessions in
                // tests/sessions.rs.
                Command::AcquireBounded { .. }
                | Command::KvPut { .. }
                | Command::KvDelete { .. }
                | Command::RenewMany { .. }
                | Command::OpenSession { .. }
                | Command::KeepAlive { .. }
                | Command::CloseSession { .. }
                | Command::AcquireInSession { .. }
                | Command::AsIdentity { .. }
                | Command::Labelled { .. }
                | Command::WallClock { .. } => {
                    unreachable!(
                        "the model sends no bounded acquire, fenced write, batch renewal, \
                         session or wall-clock command"
                    )
                }
                Command::Release {
                    owner_id: owner,
                    token,
                    ..
                } => match self.res.get_mut(&name) {
                    None => Outcome::Release(ReleaseOutcome::NotHolder(LostReason::Unknown)),
                    Some(r) => match r.holder {
                        Some(h) if h.0 == *owner && h.1 == token.get() => {
                            r.holder = None;
                            r.ended = Some((*owner, token.get(), true));
                            self.hand_off(&name, &mut events);
                            Outcome::Release(ReleaseOutcome::Released)
                        }
                        _ => match Self::reason(r, *owner, token.get()) {
                            LostReason::Released => Outcome::Release(ReleaseOutcome::Released),
                            reason => Outcome::Release(ReleaseOutcome::NotHolder(reason)),
                        },
                    },
                },
            };
            outcomes.push(out);
        }
        Applied { outcomes, events }
    }
}

// ---- the property ----

/// What the test knows each owner was granted, to pick plausible tokens.
fn pick_token(granted: &[(usize, usize, u64)], res: usize, owner: usize, pick: u8) -> Token {
    let mine: Vec<u64> = granted
        .iter()
        .filter(|g| g.0 == res && g.1 == owner)
        .map(|g| g.2)
        .collect();
    let any: Vec<u64> = granted.iter().filter(|g| g.0 == res).map(|g| g.2).collect();
    let t = match pick % 4 {
        0 | 1 if !mine.is_empty() => mine[mine.len() - 1 - (pick as usize / 4) % mine.len()],
        2 if !any.is_empty() => any[(pick as usize) % any.len()],
        _ => 1 + u64::from(pick % 16),
    };
    Token::new(t).unwrap()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn the_table_matches_the_model_and_keeps_every_guarantee(
        steps in prop::collection::vec(step(), 1..60)
    ) {
        let owners: Vec<OwnerId> = (0..OWNERS).map(|_| OwnerId::random()).collect();
        let mut table = LeaseTable::new();
        // The same commands applied one per entry: a batch must mean exactly that.
        let mut split = LeaseTable::new();
        let mut model = Model::default();
        let mut now = 0u64;
        // (res, owner, token) of every grant, in order.
        let mut granted: Vec<(usize, usize, u64)> = vec![];
        // Per resource: the highest token granted, and the live lease the
        // test believes in (owner, token, expires_at).
        let mut max_token = [0u64; RESOURCES.len()];
        let mut live: [Option<(OwnerId, u64, u64)>; RESOURCES.len()] = [None; RESOURCES.len()];
        let mut ended: Vec<(OwnerId, u64)> = vec![];

        for step in steps {
            now += step.advance_ms;
            let commands: Vec<Command> = step.ops.iter().map(|op| match *op {
                Op::Acquire { res, owner, ttl_ms, wait_ms } => Command::Acquire {
                    resource: ResourceName::new(RESOURCES[res]).unwrap(),
                    owner_id: owners[owner], ttl_ms, wait_ms,
                },
                Op::Renew { res, owner, token_pick, ttl_ms } => Command::Renew {
                    resource: ResourceName::new(RESOURCES[res]).unwrap(),
                    owner_id: owners[owner],
                    token: pick_token(&granted, res, owner, token_pick),
                    ttl_ms,
                },
                Op::Release { res, owner, token_pick } => Command::Release {
                    resource: ResourceName::new(RESOURCES[res]).unwrap(),
                    owner_id: owners[owner],
                    token: pick_token(&granted, res, owner, token_pick),
                },
            }).collect();

            let batch = Batch { stamp: ClusterTime::from_millis(now), commands: commands.clone() };
            let got = table.apply(&batch);
            let want = model.apply(now, &commands);
            prop_assert_eq!(&got, &want);
            prop_assert!(table.check_invariants().is_ok(), "{:?}", table.check_invariants());

            // Guarantees, checked on what the table said, in the order it said it.
            let owner_index = |o: &OwnerId| owners.iter().position(|x| x == o).unwrap();
            let res_index = |r: &ResourceName| RESOURCES.iter().position(|x| *x == r.as_str()).unwrap();
            let mut saw_grant = |res: usize, owner: OwnerId, g: &Grant,
                                 live: &mut [Option<(OwnerId, u64, u64)>; RESOURCES.len()]| -> Result<(), TestCaseError> {
                let t = g.token.get();
                match live[res] {
                    // Idempotent acquire: the holder gets its own token back.
                    Some((o, lt, exp)) if exp > now => {
                        prop_assert_eq!(o, owner, "a second unexpired lease was granted");
                        prop_assert_eq!(lt, t, "a retry got a different token");
                    }
                    _ => {
                        prop_assert!(t > max_token[res], "token {} not above {}", t, max_token[res]);
                        max_token[res] = t;
                        granted.push((res, owner_index(&owner), t));
                    }
                }
                live[res] = Some((owner, t, g.expires_at.as_millis()));
                Ok(())
            };
            let stamp = ClusterTime::from_millis(now);
            let tick = split.apply(&Batch { stamp, commands: vec![] });
            let mut parts = vec![(None, tick)];
            for cmd in &commands {
                parts.push((Some(cmd.clone()), split.apply(&Batch { stamp, commands: vec![cmd.clone()] })));
            }
            let events: Vec<Event> = parts.iter().flat_map(|p| p.1.events.clone()).collect();
            prop_assert_eq!(&events, &got.events);
            prop_assert_eq!(split.snapshot(), table.snapshot());

            for (cmd, part) in parts {
                if let Some(cmd) = cmd {
                    let out = &part.outcomes[0];
                    let r = res_index(cmd.resource().expect("every command of the model names a resource"));
                    match (&cmd, out) {
                        (Command::Acquire { owner_id: owner, .. }, Outcome::Acquire(AcquireOutcome::Granted(g))) => saw_grant(r, *owner, g, &mut live)?,
                        (Command::Acquire { owner_id: owner, .. }, Outcome::Acquire(AcquireOutcome::Ended(_))) => {
                            // Refused only for an attempt whose lease really ended.
                            prop_assert!(ended.iter().any(|(o, _)| o == owner), "acquire refused an unspent owner id");
                            prop_assert!(live[r].is_none_or(|(o, _, exp)| o != *owner || exp <= now), "the holder's retry was refused");
                        }
                        (Command::Acquire { .. }, Outcome::Acquire(AcquireOutcome::Held { current_token, .. })) => {
                            let (_, t, exp) = live[r].unwrap();
                            prop_assert_eq!(t, current_token.get());
                            prop_assert!(exp > now, "refused for an expired lease");
                        }
                        (Command::Renew { owner_id: owner, token, .. }, Outcome::Renew(RenewOutcome::Renewed { expires_at, .. })) => {
                            let (o, t, exp) = live[r].unwrap();
                            prop_assert_eq!((o, t), (*owner, token.get()), "renewed by a non-holder");
                            prop_assert!(exp > now, "an expired lease was revived");
                            prop_assert!(!ended.contains(&(o, t)), "an ended lease was renewed");
                            live[r] = Some((o, t, expires_at.as_millis()));
                        }
                        (Command::Release { owner_id: owner, token, .. }, Outcome::Release(ReleaseOutcome::Released)) => {
                            if let Some((o, t, _)) = live[r] {
                                if (o, t) == (*owner, token.get()) {
                                    live[r] = None;
                                    ended.push((o, t));
                                } else {
                                    prop_assert!(ended.contains(&(*owner, token.get())), "released by a non-holder");
                                }
                            } else {
                                prop_assert!(ended.contains(&(*owner, token.get())), "released by a non-holder");
                            }
                        }
                        _ => {}
                    }
                }
                for ev in &part.events {
                    match ev {
                        Event::Expired { resource, owner_id: owner, token } => {
                            let r = res_index(resource);
                            let (o, t, exp) = live[r].unwrap();
                            prop_assert_eq!((o, t), (*owner, token.get()));
                            prop_assert!(exp <= now, "expired early");
                            ended.push((o, t));
                            live[r] = None;
                        }
                        Event::WaiterGranted { resource, owner_id: owner, grant } => {
                            let r = res_index(resource);
                            prop_assert!(live[r].is_none(), "handed off while held");
                            saw_grant(r, *owner, grant, &mut live)?;
                        }
                        Event::WaitElapsed { .. } => {}
                        Event::SessionExpired { .. } => {
                            prop_assert!(false, "the model opens no session")
                        }
                        Event::TokensExhausted { .. } => {
                            prop_assert!(false, "the model's counter never nears its bound")
                        }
                        Event::OtherIdentity { .. } => {
                            prop_assert!(false, "the model's commands are all one identity's")
                        }
                    }
                }
            }

            if step.snapshot_round_trip {
                let restored = LeaseTable::from_snapshot(table.snapshot()).unwrap();
                prop_assert_eq!(restored.snapshot(), table.snapshot());
                table = restored;
                split = LeaseTable::from_snapshot(split.snapshot()).unwrap();
            }
        }
    }
}
