//! Checks of the fenced key-value store (service Kv): no put applied for a
//! lease that had ended before the put was sent, per-key tokens read in
//! real-time order never go back, and every value read was written by a put
//! that was applied or may have been.
//!
//! Time model (that of `invariants`): harness time is one monotonic clock;
//! cluster time runs at most ρ slower than it, and stands still while no
//! leader serves (an election), which `election_slack_ns` bounds. A lease is
//! known to have ended before a put was invoked when, before that moment,
//! - a grant of a higher token on its resource completed (superseded);
//! - the cluster said so: a describe answered free with newest token ≥ T or
//!   held with newest token > T, a renew of T answered lost, a release of T
//!   answered released, or a kv put with T was refused as expired, released
//!   or superseded (cluster time never runs back: checked elsewhere);
//! - or by the clock: every acquire and renew of the lease had definite
//!   answers, and the latest successful one completed more than
//!   TTL/(1−ρ) + election slack earlier. An acquire or renew of unknown
//!   outcome may be applied at any later time, so it disables this bound.

use std::collections::{BTreeMap, HashMap};

use crate::{
    check::invariants::Finding,
    history::{Answer, Op, F},
};

/// How long cluster time may stand still behind harness time in all: from
/// the last entry before a leader is lost to the new leader's first, over
/// the run's elections (each 1–1.5 s after the 1 s leader lease, the longest
/// leader pause 5 s). Only the clock bound uses it; the other ways a lease
/// is seen ended need no clock.
pub const ELECTION_SLACK_MS: u64 = 6_000;

/// The op id a kv value names (the workload writes `put op N`).
pub fn value_op(value: &str) -> Option<u64> {
    value.strip_prefix("put op ")?.parse().ok()
}

/// Counts about the kv puts.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct KvStats {
    pub applied: usize,
    pub refused: usize,
    pub unknown: usize,
    /// Puts whose lease was known to have ended before they were sent.
    pub late_sent: usize,
    pub late_refused: usize,
    pub reads_found: usize,
}

fn owner(op: &Op) -> &str {
    op.owner.as_deref().unwrap_or("")
}

/// When the lease `(resource, owner, token)` is known to have ended, in
/// harness nanoseconds, and why; `None` if the history never shows it.
struct Ends<'a> {
    ops: &'a [Op],
    rho: f64,
    election_slack_ns: u64,
}

impl Ends<'_> {
    fn ended_before(&self, put: &Op, token: u64) -> Option<String> {
        let at = put.invoke_ns;
        let r = put.resource.as_str();
        let o = owner(put);
        let before = |x: &&Op| x.resource == r && x.complete_ns.is_some_and(|c| c < at);
        for x in self.ops.iter().filter(before) {
            let same = owner(x) == o && x.token == Some(token);
            let why = match (&x.f, &x.answer) {
                (F::Acquire, Some(Answer::Granted { token: t, .. })) if *t > token => {
                    Some(format!("token {t} was granted (op {})", x.id))
                }
                (
                    F::Describe,
                    Some(Answer::Described {
                        last_token, held, ..
                    }),
                ) if (!held && *last_token >= token) || (*held && *last_token > token) => {
                    Some(format!(
                        "describe op {} answered held {held}, newest token {last_token}",
                        x.id
                    ))
                }
                (F::Renew, Some(Answer::Lost { reason, .. })) if same => {
                    Some(format!("renew op {} answered lost ({reason})", x.id))
                }
                (F::Release, Some(Answer::Released)) if same => {
                    Some(format!("release op {} released it", x.id))
                }
                // The key's own refusals say nothing about the lease.
                (F::KvPut, Some(Answer::KvRefused { reason, .. }))
                    if same
                        && reason != "key_has_newer_token"
                        && reason != "key_of_another_resource" =>
                {
                    Some(format!("kv put op {} was refused ({reason})", x.id))
                }
                _ => None,
            };
            if why.is_some() {
                return why;
            }
        }
        self.clock_expiry(r, o, token)
            .filter(|&end| end < at)
            .map(|end| {
                format!(
                    "by the clock: it ran out by {} ms into the run at the latest, the put was sent at {} ms",
                    end / 1_000_000,
                    at / 1_000_000
                )
            })
    }

    fn keeps<'b>(&'b self, r: &'b str, o: &'b str, token: u64) -> impl Iterator<Item = &'b Op> {
        self.ops.iter().filter(move |x| {
            x.resource == r
                && owner(x) == o
                && match x.f {
                    F::Acquire => x.is_unknown() || x.granted_token() == Some(token),
                    F::Renew => x.token == Some(token),
                    _ => false,
                }
        })
    }

    /// The latest harness time the lease can still run, if every acquire and
    /// renew of it has a definite answer.
    fn clock_expiry(&self, r: &str, o: &str, token: u64) -> Option<u64> {
        let mut end = None;
        for x in self.keeps(r, o, token) {
            let ttl = match &x.answer {
                None => return None,
                Some(Answer::Granted { ttl_ms, .. } | Answer::Renewed { ttl_ms }) => *ttl_ms,
                Some(_) => continue,
            };
            let c = x.complete_ns?;
            let e = c + scaled_ms(ttl, 1.0 / (1.0 - self.rho)) + self.election_slack_ns;
            end = Some(end.map_or(e, |m: u64| m.max(e)));
        }
        end
    }
}

fn scaled_ms(ms: u64, factor: f64) -> u64 {
    // Float is fine here: TTLs are far below 2^53 ns.
    (ms as f64 * 1_000_000.0 * factor) as u64
}

/// (a) No kv put was applied for a lease known to have ended (superseded,
/// released or expired) before the put was invoked.
pub fn puts_fenced(ops: &[Op], rho: f64, election_slack_ns: u64) -> (Finding, KvStats) {
    let ends = Ends {
        ops,
        rho,
        election_slack_ns,
    };
    let mut stats = KvStats::default();
    let mut violations = Vec::new();
    let mut checked = 0;
    for put in ops.iter().filter(|o| o.f == F::KvPut) {
        match &put.answer {
            None => stats.unknown += 1,
            Some(Answer::KvApplied { .. }) => stats.applied += 1,
            Some(_) => stats.refused += 1,
        }
        let Some(token) = put.token else { continue };
        checked += 1;
        let Some(why) = ends.ended_before(put, token) else {
            continue;
        };
        stats.late_sent += 1;
        match &put.answer {
            Some(Answer::KvApplied { revision }) => violations.push(format!(
                "{}: kv put op {} of key {} with token {token} (owner {}) was applied (revision {revision}), but its lease had ended before it was sent: {why}",
                put.resource,
                put.id,
                put.key.as_deref().unwrap_or("?"),
                owner(put)
            )),
            Some(Answer::KvRefused { .. }) => stats.late_refused += 1,
            _ => {}
        }
    }
    stats.reads_found = ops
        .iter()
        .filter(|o| matches!(o.answer, Some(Answer::KvRead { found: true, .. })))
        .count();
    (
        Finding {
            name: "no kv put applied for an ended lease",
            checked,
            violations,
        },
        stats,
    )
}

/// (b) Per key, the token of what a read found never goes back in real
/// time: not below an earlier read's (that completed before this one was
/// invoked), nor below an applied put's that completed before it.
pub fn key_tokens_monotonic(ops: &[Op]) -> Finding {
    let mut violations = Vec::new();
    let mut checked = 0;
    // key -> (completion, token, op id, what) of reads and applied puts.
    let mut seen: BTreeMap<&str, Vec<(u64, u64, u64, &str)>> = BTreeMap::new();
    for op in ops {
        let (Some(key), Some(c)) = (op.key.as_deref(), op.complete_ns) else {
            continue;
        };
        match (&op.f, &op.answer, op.token) {
            (F::KvPut, Some(Answer::KvApplied { .. }), Some(t)) => {
                seen.entry(key)
                    .or_default()
                    .push((c, t, op.id, "applied put"));
            }
            (F::KvGet, Some(Answer::KvRead { found, token, .. }), _) => {
                let t = if *found { *token } else { 0 };
                seen.entry(key).or_default().push((c, t, op.id, "read"));
            }
            _ => {}
        }
    }
    for op in ops.iter().filter(|o| o.f == F::KvGet) {
        let (Some(key), Some(Answer::KvRead { found, token, .. })) =
            (op.key.as_deref(), &op.answer)
        else {
            continue;
        };
        let t = if *found { *token } else { 0 };
        let Some(earlier) = seen.get(key) else {
            continue;
        };
        checked += 1;
        if let Some((_, et, eid, what)) = earlier
            .iter()
            .filter(|(c, et, ..)| *c < op.invoke_ns && *et > t)
            .max_by_key(|(_, et, ..)| *et)
        {
            violations.push(format!(
                "key {key}: read op {} found token {t} (found {found}), but {what} op {eid} had token {et} and completed before the read was sent",
                op.id
            ));
        }
    }
    Finding {
        name: "kv tokens read never go back",
        checked,
        violations,
    }
}

/// (c) Every value read was written by a kv put of that key, with that
/// resource and token, that was applied or whose outcome is unknown, and
/// that was invoked before the read completed.
pub fn no_phantom_values(ops: &[Op]) -> (Finding, usize) {
    let puts: HashMap<u64, &Op> = ops
        .iter()
        .filter(|o| o.f == F::KvPut)
        .map(|o| (o.id, o))
        .collect();
    let mut violations = Vec::new();
    let mut checked = 0;
    for op in ops.iter().filter(|o| o.f == F::KvGet) {
        let (
            Some(key),
            Some(Answer::KvRead {
                found: true,
                value,
                resource,
                token,
                ..
            }),
            Some(c),
        ) = (op.key.as_deref(), &op.answer, op.complete_ns)
        else {
            continue;
        };
        checked += 1;
        let put = value_op(value).and_then(|id| puts.get(&id));
        let explained = put.is_some_and(|p| {
            p.key.as_deref() == Some(key)
                && p.resource == *resource
                && p.token == Some(*token)
                && p.invoke_ns < c
                && matches!(p.answer, None | Some(Answer::KvApplied { .. }))
        });
        if !explained {
            violations.push(format!(
                "key {key}: read op {} found {value:?} (resource {resource}, token {token}), which no applied or unknown put of that key wrote: {}",
                op.id,
                match put {
                    Some(p) => format!("op {} was {:?}", p.id, p.answer),
                    None => "no such put".to_string(),
                }
            ));
        }
    }
    (
        Finding {
            name: "every kv value read was put",
            checked,
            violations,
        },
        checked,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: u64 = 1_000_000;
    const RHO: f64 = 0.05;
    const SLACK: u64 = ELECTION_SLACK_MS * MS;

    fn op(id: u64, f: F, owner: &str, token: Option<u64>, ms: (u64, u64), a: Answer) -> Op {
        Op {
            id,
            worker: 0,
            f,
            resource: "short-0".into(),
            owner: Some(owner.into()),
            token,
            ttl_ms: None,
            key: None,
            deliberate_stale: false,
            invoke_ns: ms.0 * MS,
            complete_ns: Some(ms.1 * MS),
            answer: Some(a),
        }
    }
    fn grant(id: u64, owner: &str, token: u64, ms: (u64, u64)) -> Op {
        let a = Answer::Granted {
            token,
            ttl_ms: 2_000,
        };
        op(id, F::Acquire, owner, None, ms, a)
    }
    fn put(id: u64, owner: &str, token: u64, ms: (u64, u64), a: Option<Answer>) -> Op {
        let mut p = op(
            id,
            F::KvPut,
            owner,
            Some(token),
            ms,
            Answer::KvApplied { revision: id },
        );
        p.key = Some("kv-short-0".into());
        if a.is_none() {
            p.complete_ns = None;
        }
        p.answer = a;
        p
    }
    fn applied(id: u64) -> Option<Answer> {
        Some(Answer::KvApplied { revision: id })
    }
    fn refused(reason: &str) -> Option<Answer> {
        Some(Answer::KvRefused {
            reason: reason.into(),
            current_token: 0,
        })
    }
    fn read(id: u64, ms: (u64, u64), value: &str, token: u64) -> Op {
        let a = Answer::KvRead {
            found: true,
            value: value.into(),
            resource: "short-0".into(),
            token,
            revision: 1,
        };
        let mut r = op(id, F::KvGet, "", None, ms, a);
        r.owner = None;
        r.key = Some("kv-short-0".into());
        r
    }
    fn violations(ops: &[Op]) -> [usize; 3] {
        [
            puts_fenced(ops, RHO, SLACK).0.violations.len(),
            key_tokens_monotonic(ops).violations.len(),
            no_phantom_values(ops).0.violations.len(),
        ]
    }

    /// Two holders in turn; the first's late put (after the second's grant)
    /// refused, reads see the puts in token order.
    #[test]
    fn a_correct_history_passes() {
        let ops = vec![
            grant(1, "a", 1, (0, 10)),
            put(2, "a", 1, (20, 30), applied(2)),
            read(3, (40, 50), "put op 2", 1),
            grant(4, "b", 2, (9_000, 9_010)),
            put(5, "a", 1, (9_100, 9_110), refused("superseded")),
            // Unknown outcome: a later read may see it.
            put(6, "b", 2, (9_200, 9_210), None),
            read(7, (9_300, 9_310), "put op 6", 2),
            read(8, (9_400, 9_410), "put op 6", 2),
        ];
        let (f, stats) = puts_fenced(&ops, RHO, SLACK);
        assert_eq!(f.checked, 3);
        assert_eq!(stats.late_refused, 1);
        assert_eq!(stats.reads_found, 3);
        assert_eq!(violations(&ops), [0, 0, 0]);
    }

    #[test]
    fn a_put_applied_after_a_higher_grant_fails() {
        let ops = vec![
            grant(1, "a", 1, (0, 10)),
            grant(2, "b", 2, (100, 110)),
            put(3, "a", 1, (120, 130), applied(3)),
        ];
        assert_eq!(violations(&ops), [1, 0, 0]);
        // Concurrent with the grant: the put may have been applied first.
        let ops = vec![
            grant(1, "a", 1, (0, 10)),
            grant(2, "b", 2, (100, 130)),
            put(3, "a", 1, (120, 140), applied(3)),
        ];
        assert_eq!(violations(&ops), [0, 0, 0]);
    }

    #[test]
    fn a_put_applied_after_its_lease_ran_out_by_the_clock_fails() {
        let late = 10 + 2_000 * 100 / 95 + ELECTION_SLACK_MS + 5;
        let ops = vec![
            grant(1, "a", 1, (0, 10)),
            put(2, "a", 1, (late, late + 10), applied(2)),
        ];
        assert_eq!(violations(&ops), [1, 0, 0]);
        // Just inside the bound: it may still have run.
        let ops = vec![
            grant(1, "a", 1, (0, 10)),
            put(2, "a", 1, (late - 10, late), applied(2)),
        ];
        assert_eq!(violations(&ops), [0, 0, 0]);
        // A renew of unknown outcome may have been applied at any time.
        let mut renew = op(3, F::Renew, "a", Some(1), (100, 0), Answer::Released);
        renew.complete_ns = None;
        renew.answer = None;
        let ops = vec![
            grant(1, "a", 1, (0, 10)),
            renew,
            put(2, "a", 1, (late, late + 10), applied(2)),
        ];
        assert_eq!(violations(&ops), [0, 0, 0]);
    }

    #[test]
    fn a_put_applied_after_the_cluster_said_the_lease_ended_fails() {
        let free = Answer::Described {
            last_token: 1,
            held: false,
            cluster_time_ms: 5,
        };
        let lost = Answer::Lost {
            reason: "expired".into(),
            current_token: 1,
        };
        for seen in [
            op(2, F::Describe, "", None, (2_100, 2_110), free),
            op(2, F::Renew, "a", Some(1), (2_100, 2_110), lost),
            op(
                2,
                F::Release,
                "a",
                Some(1),
                (2_100, 2_110),
                Answer::Released,
            ),
            put(2, "a", 1, (2_100, 2_110), refused("expired")),
        ] {
            let ops = vec![
                grant(1, "a", 1, (0, 10)),
                seen,
                put(3, "a", 1, (2_200, 2_210), applied(3)),
            ];
            assert_eq!(violations(&ops), [1, 0, 0], "{:?}", ops[1]);
        }
        // A refusal for the key's newer token, or for a key of another
        // resource, says nothing about the lease.
        for reason in ["key_has_newer_token", "key_of_another_resource"] {
            let ops = vec![
                grant(1, "a", 1, (0, 10)),
                put(2, "a", 1, (100, 110), refused(reason)),
                put(3, "a", 1, (200, 210), applied(3)),
            ];
            assert_eq!(violations(&ops), [0, 0, 0], "{reason}");
        }
    }

    #[test]
    fn a_token_read_going_back_fails() {
        let ops = vec![
            grant(1, "a", 1, (0, 10)),
            put(2, "a", 1, (20, 30), applied(2)),
            grant(3, "b", 2, (9_000, 9_010)),
            put(4, "b", 2, (9_020, 9_030), applied(4)),
            read(5, (9_040, 9_050), "put op 2", 1),
        ];
        assert_eq!(violations(&ops), [0, 1, 0]);
        let ops = vec![
            grant(1, "a", 1, (0, 10)),
            put(2, "a", 1, (20, 30), applied(2)),
            grant(3, "b", 2, (9_000, 9_010)),
            put(4, "b", 2, (9_020, 0), None),
            read(5, (9_040, 9_050), "put op 4", 2),
            read(6, (9_060, 9_070), "put op 2", 1),
        ];
        assert_eq!(violations(&ops), [0, 1, 0]);
    }

    #[test]
    fn a_phantom_value_fails() {
        let base = vec![
            grant(1, "a", 1, (0, 10)),
            put(2, "a", 1, (20, 30), refused("expired")),
            put(3, "a", 1, (40, 50), applied(3)),
        ];
        for bad in [
            read(4, (60, 70), "put op 2", 1), // a refused put
            read(4, (60, 70), "put op 9", 1), // no such put
            read(4, (60, 70), "garbage", 1),  // not a put's value
            read(4, (60, 70), "put op 3", 7), // another token
            read(4, (35, 38), "put op 3", 1), // read before the put was sent
        ] {
            let mut ops = base.clone();
            ops.push(bad);
            assert_eq!(violations(&ops)[2], 1, "{:?}", ops[3]);
        }
    }
}
