//! Linearizability of one resource's lock operations against an owner-aware
//! fenced mutex, by the Wing–Gong–Lowe search (with Lowe's cache of
//! (linearized set, state) pairs).
//!
//! The model assumes no lease expires during the history (the long-TTL
//! workload's leases outlive the run): acquire grants a free resource to the
//! caller with a token above every earlier one, and answers the holder's retry
//! with its own grant; renew and release succeed only for the holder's owner
//! id and token; a release repeated by the owner of the most recently released
//! lease answers "released" again; describe returns the newest token and
//! whether the resource is held.
//!
//! Operations of unknown outcome may take effect at any point after their
//! invocation, or never. A token that was granted by such an operation is
//! unknown until a later answer reveals it. When the search exceeds its step
//! budget the result is UNKNOWN, never PASS.

use std::collections::{BTreeSet, HashMap, HashSet};

use crate::history::{Answer, Op, F};

/// The outcome of the search.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Linearizable {
    Pass,
    Fail(Counterexample),
    /// The search ran out of budget: nothing is proven.
    Unknown {
        steps: u64,
    },
}

/// Where the search got stuck on a non-linearizable history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Counterexample {
    pub resource: String,
    /// The longest order of operations (ids) the search could find that the
    /// model accepts; the last few are the interesting ones.
    pub longest_prefix: Vec<u64>,
    /// The model state after that prefix.
    pub state: String,
    /// Operations that had to come next (their completion precedes the
    /// invocation of everything still pending) and could not.
    pub stuck_on: Vec<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Tok {
    Known(u64),
    /// Granted by an operation of unknown outcome: some value above `above`.
    Unknown {
        above: u64,
    },
}

impl Tok {
    fn lower(self) -> u64 {
        match self {
            Tok::Known(t) => t,
            Tok::Unknown { above } => above,
        }
    }

    /// Whether `t` may be this token.
    fn admits(self, t: u64) -> bool {
        match self {
            Tok::Known(k) => k == t,
            Tok::Unknown { above } => t > above,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct State {
    last: Tok,
    /// (owner index, token)
    holder: Option<(u32, Tok)>,
    /// The most recently released lease.
    released: Option<(u32, u64)>,
}

impl State {
    fn initial() -> Self {
        State {
            last: Tok::Known(0),
            holder: None,
            released: None,
        }
    }

    /// Fixes the unknown token to `t` (the holder's and the newest token are
    /// the same unknown value).
    fn bind(&mut self, t: u64) {
        if let Some((_, tok @ Tok::Unknown { .. })) = &mut self.holder {
            *tok = Tok::Known(t);
        }
        if let Tok::Unknown { .. } = self.last {
            self.last = Tok::Known(t);
        }
    }

    fn holds(&self, owner: u32, t: u64) -> bool {
        matches!(self.holder, Some((o, tok)) if o == owner && tok.admits(t))
    }
}

/// One operation, as the model sees it.
#[derive(Debug, Clone)]
struct MOp {
    id: u64,
    f: F,
    owner: u32,
    token: u64,
    answer: Option<Answer>,
}

/// The model's transition: the state after `op`, or `None` if `op` cannot
/// happen (with its answer) in `s`.
fn step(s: &State, op: &MOp) -> Option<State> {
    let mut n = s.clone();
    match (op.f, &op.answer) {
        // The mutex model has no key-value store; run.rs leaves kv ops out.
        (F::KvPut | F::KvGet, _) => {}
        (F::Acquire, answer) => match (s.holder, answer) {
            (None, Some(Answer::Granted { token, .. })) => {
                if *token <= s.last.lower() {
                    return None;
                }
                n.holder = Some((op.owner, Tok::Known(*token)));
                n.last = Tok::Known(*token);
            }
            (None, None) => {
                let tok = Tok::Unknown {
                    above: s.last.lower(),
                };
                n.holder = Some((op.owner, tok));
                n.last = tok;
            }
            // The owner's lease ended before: it holds nothing now.
            (holder, Some(Answer::Ended { .. })) if holder.is_none_or(|(o, _)| o != op.owner) => {}
            (None, Some(_)) => return None,
            (Some((o, tok)), Some(Answer::Granted { token, .. })) if o == op.owner => {
                if !tok.admits(*token) {
                    return None;
                }
                n.bind(*token);
            }
            (Some((o, tok)), Some(Answer::Held { current_token })) if o != op.owner => {
                if !tok.admits(*current_token) {
                    return None;
                }
                n.bind(*current_token);
            }
            (Some(_), None) => {}
            (Some(_), Some(_)) => return None,
        },
        (F::Renew, Some(Answer::Renewed { .. })) => {
            if !s.holds(op.owner, op.token) {
                return None;
            }
            n.bind(op.token);
        }
        (F::Renew, Some(Answer::Lost { .. })) => {
            if matches!(s.holder, Some((o, Tok::Known(t))) if o == op.owner && t == op.token) {
                return None;
            }
        }
        (F::Renew, _) => {}
        (F::Release, answer) => {
            let holder = s.holds(op.owner, op.token);
            let repeat = s.released == Some((op.owner, op.token));
            let definitely_holder =
                matches!(s.holder, Some((o, Tok::Known(t))) if o == op.owner && t == op.token);
            match answer {
                Some(Answer::Released) | None if holder => {
                    n.bind(op.token);
                    n.holder = None;
                    n.released = Some((op.owner, op.token));
                }
                Some(Answer::Released) if repeat => {}
                Some(Answer::Released) => return None,
                None => {}
                Some(Answer::NotHolder { .. }) if definitely_holder || repeat => return None,
                Some(Answer::NotHolder { .. }) => {}
                Some(_) => return None,
            }
        }
        (
            F::Describe,
            Some(Answer::Described {
                last_token, held, ..
            }),
        ) => {
            if !s.last.admits(*last_token) || *held != s.holder.is_some() {
                return None;
            }
            n.bind(*last_token);
        }
        (F::Describe, _) => {}
        (F::Write, _) => {}
    }
    Some(n)
}

/// Every long-TTL resource of the history (named `long-...`, whose leases
/// outlive the run, as the model assumes) against the model, each within
/// `budget` steps: the first failure, else the first UNKNOWN, else PASS;
/// UNKNOWN of 0 steps when there is no such resource. Kv operations are
/// left out (`check::kv` judges them). Also returns how many resources were
/// searched.
pub fn check_long_resources(ops: &[Op], budget: u64) -> (Linearizable, usize) {
    let long: BTreeSet<&str> = ops
        .iter()
        .map(|o| o.resource.as_str())
        .filter(|r| r.starts_with("long-"))
        .collect();
    if long.is_empty() {
        return (Linearizable::Unknown { steps: 0 }, 0);
    }
    let mut verdict = Linearizable::Pass;
    let mut searched = 0;
    for r in long {
        let rops: Vec<&Op> = ops
            .iter()
            .filter(|o| o.resource == r && !matches!(o.f, F::KvPut | F::KvGet))
            .collect();
        searched += 1;
        match check_resource(r, &rops, budget) {
            Linearizable::Pass => {}
            f @ Linearizable::Fail(_) => return (f, searched),
            u @ Linearizable::Unknown { .. } => {
                if verdict == Linearizable::Pass {
                    verdict = u;
                }
            }
        }
    }
    (verdict, searched)
}

/// Checks one resource's operations (acquire, renew, release, describe; other
/// kinds are ignored). `budget` bounds the search steps.
pub fn check_resource(resource: &str, ops: &[&Op], budget: u64) -> Linearizable {
    let mut owners: HashMap<&str, u32> = HashMap::new();
    let mut mops = Vec::new();
    let mut times = Vec::new();
    for op in ops {
        let relevant = matches!(op.f, F::Acquire | F::Renew | F::Release | F::Describe);
        // Unknown renews and describes change nothing: leave them out.
        let inert = op.is_unknown() && matches!(op.f, F::Renew | F::Describe);
        if !relevant || inert {
            continue;
        }
        let next = u32::try_from(owners.len()).unwrap_or(u32::MAX);
        let owner = *owners
            .entry(op.owner.as_deref().unwrap_or(""))
            .or_insert(next);
        mops.push(MOp {
            id: op.id,
            f: op.f,
            owner,
            token: op.token.unwrap_or(0),
            answer: op.answer.clone(),
        });
        times.push((op.invoke_ns, op.complete_ns));
    }
    wgl(resource, &mops, &times, budget)
}

const NIL: usize = usize::MAX;

fn wgl(resource: &str, ops: &[MOp], times: &[(u64, Option<u64>)], budget: u64) -> Linearizable {
    // Entries: a call per op, a return per op with a known completion.
    // (time, is_return, op index); calls sort before returns at equal times,
    // which treats such operations as concurrent (the lenient reading).
    let mut raw: Vec<(u64, bool, usize)> = Vec::new();
    for (i, (inv, comp)) in times.iter().enumerate() {
        raw.push((*inv, false, i));
        if let Some(c) = comp {
            raw.push((*c, true, i));
        }
    }
    raw.sort();
    let n = raw.len();
    let head = n;
    let mut next = vec![NIL; n + 1];
    let mut prev = vec![NIL; n + 1];
    let mut is_return = vec![false; n];
    let mut op_of = vec![0usize; n];
    let mut ret_of = vec![NIL; ops.len()];
    let mut last = head;
    for (k, (_, ret, i)) in raw.iter().enumerate() {
        is_return[k] = *ret;
        op_of[k] = *i;
        if *ret {
            ret_of[*i] = k;
        }
        next[last] = k;
        prev[k] = last;
        last = k;
    }
    let determinate = ops.iter().filter(|o| o.answer.is_some()).count();

    let words = ops.len().div_ceil(64);
    let mut bits = vec![0u64; words];
    let mut cache: HashSet<(Vec<u64>, State)> = HashSet::new();
    let mut stack: Vec<(usize, State)> = Vec::new();
    let mut state = State::initial();
    let mut done = 0usize;
    let mut steps = 0u64;
    let mut best: (usize, Vec<u64>, State, Vec<u64>) = (0, Vec::new(), state.clone(), Vec::new());

    let lift = |k: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>| {
        let unlink = |x: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>| {
            let (p, nx) = (prev[x], next[x]);
            next[p] = nx;
            if nx != NIL {
                prev[nx] = p;
            }
        };
        unlink(k, next, prev);
        let r = ret_of[op_of[k]];
        if r != NIL {
            unlink(r, next, prev);
        }
    };
    let unlift = |k: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>| {
        let relink = |x: usize, next: &mut Vec<usize>, prev: &mut Vec<usize>| {
            let (p, nx) = (prev[x], next[x]);
            next[p] = x;
            if nx != NIL {
                prev[nx] = x;
            }
        };
        let r = ret_of[op_of[k]];
        if r != NIL {
            relink(r, next, prev);
        }
        relink(k, next, prev);
    };

    let mut entry = next[head];
    loop {
        if done == determinate {
            return Linearizable::Pass;
        }
        if entry == NIL || is_return[entry] {
            if stack.len() >= best.0 {
                let stuck: Vec<u64> = if entry == NIL {
                    Vec::new()
                } else {
                    vec![ops[op_of[entry]].id]
                };
                let prefix: Vec<u64> = stack.iter().map(|(k, _)| ops[op_of[*k]].id).collect();
                best = (stack.len(), prefix, state.clone(), stuck);
            }
            let Some((k, s)) = stack.pop() else {
                let (_, prefix, st, stuck) = best;
                return Linearizable::Fail(Counterexample {
                    resource: resource.to_string(),
                    longest_prefix: prefix,
                    state: format!("{st:?}"),
                    stuck_on: stuck,
                });
            };
            state = s;
            let i = op_of[k];
            bits[i / 64] &= !(1u64 << (i % 64));
            if ops[i].answer.is_some() {
                done -= 1;
            }
            unlift(k, &mut next, &mut prev);
            entry = next[k];
            continue;
        }
        steps += 1;
        if steps > budget {
            return Linearizable::Unknown { steps };
        }
        let i = op_of[entry];
        if let Some(ns) = step(&state, &ops[i]) {
            let mut nb = bits.clone();
            nb[i / 64] |= 1u64 << (i % 64);
            if cache.insert((nb.clone(), ns.clone())) {
                stack.push((entry, std::mem::replace(&mut state, ns)));
                bits = nb;
                if ops[i].answer.is_some() {
                    done += 1;
                }
                lift(entry, &mut next, &mut prev);
                entry = next[head];
                continue;
            }
        }
        entry = next[entry];
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::history::Op;

    fn op(
        id: u64,
        f: F,
        owner: &str,
        token: Option<u64>,
        t: (u64, Option<u64>),
        a: Option<Answer>,
    ) -> Op {
        Op {
            id,
            worker: 0,
            f,
            resource: "r".into(),
            owner: Some(owner.into()),
            token,
            ttl_ms: Some(60_000),
            key: None,
            deliberate_stale: false,
            invoke_ns: t.0,
            complete_ns: t.1,
            answer: a,
        }
    }

    fn granted(token: u64) -> Option<Answer> {
        Some(Answer::Granted {
            token,
            ttl_ms: 60_000,
        })
    }

    fn run(ops: &[Op]) -> Linearizable {
        let refs: Vec<&Op> = ops.iter().collect();
        check_resource("r", &refs, 1_000_000)
    }

    fn ended() -> Option<Answer> {
        Some(Answer::Ended {
            reason: "Released".into(),
            current_token: 0,
        })
    }

    #[test]
    fn an_acquire_answered_ended_after_its_own_release_passes() {
        let h = [
            op(0, F::Acquire, "a", None, (0, Some(10)), granted(1)),
            op(
                1,
                F::Release,
                "a",
                Some(1),
                (11, Some(20)),
                Some(Answer::Released),
            ),
            op(2, F::Acquire, "a", None, (21, Some(30)), ended()),
        ];
        assert_eq!(run(&h), Linearizable::Pass);
    }

    #[test]
    fn an_acquire_answered_ended_while_its_owner_holds_fails() {
        let h = [
            op(0, F::Acquire, "a", None, (0, Some(10)), granted(1)),
            op(1, F::Acquire, "a", None, (11, Some(20)), ended()),
        ];
        assert!(matches!(run(&h), Linearizable::Fail(_)));
    }

    #[test]
    fn sequential_mutex_history_passes() {
        let h = [
            op(0, F::Acquire, "a", None, (0, Some(10)), granted(1)),
            op(
                1,
                F::Acquire,
                "b",
                None,
                (11, Some(20)),
                Some(Answer::Held { current_token: 1 }),
            ),
            op(
                2,
                F::Renew,
                "a",
                Some(1),
                (21, Some(30)),
                Some(Answer::Renewed { ttl_ms: 1 }),
            ),
            op(
                3,
                F::Release,
                "a",
                Some(1),
                (31, Some(40)),
                Some(Answer::Released),
            ),
            op(4, F::Acquire, "b", None, (41, Some(50)), granted(5)),
            op(
                5,
                F::Release,
                "a",
                Some(1),
                (51, Some(60)),
                Some(Answer::Released),
            ),
            op(
                6,
                F::Describe,
                "x",
                None,
                (61, Some(70)),
                Some(Answer::Described {
                    last_token: 5,
                    held: true,
                    cluster_time_ms: 0,
                }),
            ),
        ];
        assert_eq!(run(&h), Linearizable::Pass);
    }

    #[test]
    fn two_holders_at_once_fail() {
        let h = [
            op(0, F::Acquire, "a", None, (0, Some(10)), granted(1)),
            op(1, F::Acquire, "b", None, (11, Some(20)), granted(2)),
        ];
        assert!(matches!(run(&h), Linearizable::Fail(_)));
    }

    #[test]
    fn concurrent_grants_may_order_either_way_but_not_both_hold() {
        // Overlapping acquires: one is granted, the other is told held by it.
        let h = [
            op(
                0,
                F::Acquire,
                "a",
                None,
                (0, Some(10)),
                Some(Answer::Held { current_token: 4 }),
            ),
            op(1, F::Acquire, "b", None, (1, Some(9)), granted(4)),
        ];
        assert_eq!(run(&h), Linearizable::Pass);
    }

    #[test]
    fn token_going_backwards_fails() {
        let h = [
            op(0, F::Acquire, "a", None, (0, Some(10)), granted(7)),
            op(
                1,
                F::Release,
                "a",
                Some(7),
                (11, Some(20)),
                Some(Answer::Released),
            ),
            op(2, F::Acquire, "b", None, (21, Some(30)), granted(7)),
        ];
        assert!(matches!(run(&h), Linearizable::Fail(_)));
    }

    #[test]
    fn a_stale_release_that_succeeds_fails() {
        let h = [
            op(0, F::Acquire, "a", None, (0, Some(10)), granted(1)),
            op(
                1,
                F::Release,
                "a",
                Some(1),
                (11, Some(20)),
                Some(Answer::Released),
            ),
            op(2, F::Acquire, "b", None, (21, Some(30)), granted(2)),
            op(
                3,
                F::Release,
                "c",
                Some(2),
                (31, Some(40)),
                Some(Answer::Released),
            ),
        ];
        assert!(matches!(run(&h), Linearizable::Fail(_)));
    }

    #[test]
    fn a_stale_read_fails() {
        let h = [
            op(0, F::Acquire, "a", None, (0, Some(10)), granted(3)),
            op(
                1,
                F::Describe,
                "x",
                None,
                (11, Some(20)),
                Some(Answer::Described {
                    last_token: 0,
                    held: false,
                    cluster_time_ms: 0,
                }),
            ),
        ];
        assert!(matches!(run(&h), Linearizable::Fail(_)));
    }

    #[test]
    fn an_unknown_acquire_may_have_taken_effect() {
        // a's acquire timed out, but b is told the resource is held by 9,
        // and a's retry with the same owner id gets 9.
        let h = [
            op(0, F::Acquire, "a", None, (0, None), None),
            op(
                1,
                F::Acquire,
                "b",
                None,
                (5, Some(10)),
                Some(Answer::Held { current_token: 9 }),
            ),
            op(2, F::Acquire, "a", None, (11, Some(20)), granted(9)),
        ];
        assert_eq!(run(&h), Linearizable::Pass);
    }

    #[test]
    fn an_unknown_acquire_cannot_explain_a_held_before_it_was_sent() {
        let h = [
            op(
                0,
                F::Acquire,
                "b",
                None,
                (0, Some(10)),
                Some(Answer::Held { current_token: 9 }),
            ),
            op(1, F::Acquire, "a", None, (11, None), None),
        ];
        assert!(matches!(run(&h), Linearizable::Fail(_)));
    }

    #[test]
    fn a_tiny_budget_gives_unknown_not_pass() {
        let h = [
            op(0, F::Acquire, "a", None, (0, Some(10)), granted(1)),
            op(
                1,
                F::Release,
                "a",
                Some(1),
                (11, Some(20)),
                Some(Answer::Released),
            ),
        ];
        let refs: Vec<&Op> = h.iter().collect();
        assert!(matches!(
            check_resource("r", &refs, 1),
            Linearizable::Unknown { .. }
        ));
    }
}
