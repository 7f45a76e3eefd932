//! Invariants over a whole history and the cluster's final state. Each
//! returns its violations; an empty list is the only pass.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use crate::history::{Answer, Op, F};

/// What one node holds at the end of a run, read from its local state after
/// the cluster converged.
#[derive(Debug, Clone, Serialize)]
pub struct NodeFinal {
    pub node: u64,
    pub last_applied: u64,
    pub digest: u64,
    /// Newest token per resource, as this node's table has it.
    pub last_tokens: BTreeMap<String, u64>,
}

/// One invariant's result.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub name: &'static str,
    /// How many cases were examined (a check that examined nothing proves nothing).
    pub checked: usize,
    pub violations: Vec<String>,
}

/// Counts about the fenced writes.
#[derive(Debug, Clone, Default, Serialize)]
pub struct WriteStats {
    pub accepted: usize,
    pub rejected: usize,
    /// Writes whose token was below one the resource had already accepted
    /// before the write was sent.
    pub stale_sent: usize,
    pub stale_rejected: usize,
    pub stale_accepted: usize,
}

/// Counts about grants.
#[derive(Debug, Clone, Default, Serialize)]
pub struct GrantStats {
    pub acknowledged: usize,
    pub max_token: u64,
    pub missing: usize,
    pub phantom: usize,
}

fn by_resource(ops: &[Op], f: impl Fn(&Op) -> bool) -> BTreeMap<&str, Vec<&Op>> {
    let mut map: BTreeMap<&str, Vec<&Op>> = BTreeMap::new();
    for op in ops.iter().filter(|o| f(o)) {
        map.entry(op.resource.as_str()).or_default().push(op);
    }
    map
}

fn grants(ops: &[Op]) -> BTreeMap<&str, Vec<&Op>> {
    by_resource(ops, |o| o.f == F::Acquire && o.granted_token().is_some())
}

fn owner(op: &Op) -> &str {
    op.owner.as_deref().unwrap_or("")
}

/// No token is granted to two different owners of one resource.
pub fn tokens_unique(ops: &[Op]) -> Finding {
    let mut violations = Vec::new();
    let mut checked = 0;
    for (resource, gs) in grants(ops) {
        let mut seen: HashMap<u64, &Op> = HashMap::new();
        for g in gs {
            checked += 1;
            let Some(t) = g.granted_token() else { continue };
            match seen.get(&t) {
                Some(prev) if owner(prev) != owner(g) => violations.push(format!(
                    "{resource}: token {t} granted to owner {} (op {}) and to owner {} (op {})",
                    owner(prev),
                    prev.id,
                    owner(g),
                    g.id
                )),
                Some(_) => {}
                None => {
                    seen.insert(t, g);
                }
            }
        }
    }
    Finding {
        name: "no token granted twice",
        checked,
        violations,
    }
}

/// A grant that completed before another was invoked has the lower token.
pub fn grants_ordered(ops: &[Op]) -> Finding {
    let mut violations = Vec::new();
    let mut checked = 0;
    for (resource, mut gs) in grants(ops) {
        gs.sort_by_key(|g| g.complete_ns);
        for b in &gs {
            for a in &gs {
                let (Some(ac), Some(ta), Some(tb)) =
                    (a.complete_ns, a.granted_token(), b.granted_token())
                else {
                    continue;
                };
                if ac >= b.invoke_ns {
                    break;
                }
                if owner(a) == owner(b) {
                    continue;
                }
                checked += 1;
                if ta >= tb {
                    violations.push(format!(
                        "{resource}: op {} granted token {ta} and completed before op {} was invoked, which was granted token {tb}",
                        a.id, b.id
                    ));
                }
            }
        }
    }
    Finding {
        name: "grants in real-time order have increasing tokens",
        checked,
        violations,
    }
}

/// Every acknowledged grant is in every node's final state (its token is at
/// most the node's newest token for the resource), and no node holds a token
/// that no grant, acknowledged or of unknown outcome, can explain.
pub fn final_state(ops: &[Op], finals: &[NodeFinal]) -> (Finding, GrantStats) {
    let mut violations = Vec::new();
    let mut stats = GrantStats::default();
    let mut checked = 0;
    let gs = grants(ops);
    let unknown_acquires = by_resource(ops, |o| o.f == F::Acquire && o.is_unknown());
    for (resource, list) in &gs {
        for g in list {
            let Some(t) = g.granted_token() else { continue };
            stats.acknowledged += 1;
            stats.max_token = stats.max_token.max(t);
            for n in finals {
                checked += 1;
                let have = n.last_tokens.get(*resource).copied().unwrap_or(0);
                if have < t {
                    stats.missing += 1;
                    violations.push(format!(
                        "{resource}: grant of token {t} (op {}) was acknowledged but node {} ends with newest token {have}",
                        g.id, n.node
                    ));
                }
            }
        }
    }
    for n in finals {
        for (resource, &have) in &n.last_tokens {
            if have == 0 {
                continue;
            }
            checked += 1;
            let acknowledged = gs
                .get(resource.as_str())
                .is_some_and(|l| l.iter().any(|g| g.granted_token() == Some(have)));
            let unknown = unknown_acquires.contains_key(resource.as_str());
            if !acknowledged && !unknown {
                stats.phantom += 1;
                violations.push(format!(
                    "{resource}: node {} ends with token {have}, which no acknowledged or unanswered acquire explains",
                    n.node
                ));
            }
        }
    }
    (
        Finding {
            name: "acknowledged grants survive; no phantom grants",
            checked,
            violations,
        },
        stats,
    )
}

/// The replicas converged to the same applied index and the same state digest.
pub fn digests_equal(finals: &[NodeFinal]) -> Finding {
    let mut violations = Vec::new();
    if finals.len() < 2 {
        violations.push(format!(
            "only {} node(s) reported a final state",
            finals.len()
        ));
    }
    for w in finals.windows(2) {
        if w[0].last_applied != w[1].last_applied || w[0].digest != w[1].digest {
            violations.push(format!(
                "node {} (applied {}, digest {:#x}) differs from node {} (applied {}, digest {:#x})",
                w[0].node, w[0].last_applied, w[0].digest, w[1].node, w[1].last_applied, w[1].digest
            ));
        }
    }
    Finding {
        name: "replicas' final state digests are equal",
        checked: finals.len(),
        violations,
    }
}

/// A checker over the fault records that carry a yes or no of their own:
/// each `false` is a violation, described as `what`.
fn each_fault_held(
    name: &'static str,
    records: &[crate::nemesis::FaultRecord],
    held: impl Fn(&crate::nemesis::FaultRecord) -> Option<bool>,
    what: &str,
) -> Finding {
    let judged: Vec<_> = records
        .iter()
        .filter_map(|r| held(r).map(|ok| (r, ok)))
        .collect();
    Finding {
        name,
        checked: judged.len(),
        violations: judged
            .iter()
            .filter(|(_, ok)| !ok)
            .map(|(r, _)| format!("{} on {}: {what} ({})", r.fault, r.target, r.evidence))
            .collect(),
    }
}

/// Every damaged file the nemesis left for a node to start on was refused by
/// its checksum, naming the next step: a node never loads damaged state
/// (docs/DESIGN.md, guarantee 10).
pub fn damage_refused(records: &[crate::nemesis::FaultRecord]) -> Finding {
    each_fault_held(
        "a damaged file is never loaded",
        records,
        |r| r.damage_refused,
        "not refused by its checksum",
    )
}

/// Every node whose disk filled while it ran stopped with the storage exit
/// code meanwhile, for its supervisor to start it again: a node that goes
/// on past a write it could not make may acknowledge what it does not hold.
pub fn full_disk_stops(records: &[crate::nemesis::FaultRecord]) -> Finding {
    each_fault_held(
        "a node whose disk is full stops",
        records,
        |r| r.full_disk_stopped,
        "did not stop with the storage exit code",
    )
}

/// A leader paused for no longer than its followers' lease allows
/// ([`crate::nemesis::KEEPS_LEADER_MS`]) still led afterwards: a pause that
/// short is a garbage-collection stall or a busy host, and an election it
/// caused would cost every client a failover for nothing
/// (docs/decisions/replication.md, "The election timeout is 200 ms").
pub fn short_pause_keeps_leader(records: &[crate::nemesis::FaultRecord]) -> Finding {
    each_fault_held(
        "a short leader pause elects no other",
        records,
        |r| r.leader_kept,
        "another node was elected",
    )
}

/// The protected resource accepted tokens in non-decreasing order (by the
/// version it assigned), and never accepted a write whose token was below one
/// it had accepted before the write was sent.
pub fn fenced_writes(ops: &[Op]) -> (Finding, WriteStats) {
    let mut violations = Vec::new();
    let mut stats = WriteStats::default();
    let mut checked = 0;
    for (resource, writes) in by_resource(ops, |o| o.f == F::Write) {
        let mut accepted: Vec<(u64, u64, u64, u64)> = Vec::new(); // (version, token, complete, op)
        for w in &writes {
            match w.answer {
                Some(Answer::Accepted { token, version }) => {
                    stats.accepted += 1;
                    if let Some(c) = w.complete_ns {
                        accepted.push((version, token, c, w.id));
                    }
                }
                Some(Answer::Rejected { .. }) => stats.rejected += 1,
                _ => {}
            }
        }
        accepted.sort();
        for pair in accepted.windows(2) {
            checked += 1;
            if pair[1].1 < pair[0].1 {
                violations.push(format!(
                    "{resource}: version {} accepted token {} (op {}) after version {} had accepted token {} (op {})",
                    pair[1].0, pair[1].1, pair[1].3, pair[0].0, pair[0].1, pair[0].3
                ));
            }
        }
        for w in &writes {
            let Some(t) = w.token else { continue };
            let newer = accepted
                .iter()
                .filter(|(_, tok, c, _)| *c < w.invoke_ns && *tok > t)
                .map(|(_, tok, _, _)| *tok)
                .max();
            let Some(newer) = newer else { continue };
            stats.stale_sent += 1;
            checked += 1;
            match w.answer {
                Some(Answer::Rejected { .. }) => stats.stale_rejected += 1,
                Some(Answer::Accepted { .. }) | Some(Answer::AlreadyApplied { .. }) => {
                    stats.stale_accepted += 1;
                    violations.push(format!(
                        "{resource}: write op {} with token {t} was accepted although token {newer} had been accepted before it was sent",
                        w.id
                    ));
                }
                _ => {}
            }
        }
    }
    (
        Finding {
            name: "protected resource never accepts an older token",
            checked,
            violations,
        },
        stats,
    )
}

/// A renew keeps its token: a describe by the same worker, sent after the
/// renew answered, before the worker released the lease, and answered well
/// within the renewed lease, reports the renewed token as the newest one and
/// the resource as held.
pub fn renew_keeps_token(ops: &[Op], rho: f64) -> Finding {
    let mut violations = Vec::new();
    let mut checked = 0;
    let mut by_worker: HashMap<u32, Vec<&Op>> = HashMap::new();
    for op in ops {
        by_worker.entry(op.worker).or_default().push(op);
    }
    for list in by_worker.values() {
        for (i, r) in list.iter().enumerate() {
            let (F::Renew, Some(Answer::Renewed { ttl_ms }), Some(rc), Some(t)) =
                (r.f, &r.answer, r.complete_ns, r.token)
            else {
                continue;
            };
            let bound = r.invoke_ns + scaled_ms(*ttl_ms, 1.0 - rho);
            // The worker's next describe of the resource while it still
            // holds this lease: a release (or a new acquire) of its own
            // ends what the renew vouches for.
            let Some(d) = list[i + 1..]
                .iter()
                .filter(|d| d.resource == r.resource)
                .take_while(|d| !matches!(d.f, F::Release | F::Acquire))
                .find(|d| d.f == F::Describe)
            else {
                continue;
            };
            let (
                Some(Answer::Described {
                    last_token, held, ..
                }),
                Some(dc),
            ) = (&d.answer, d.complete_ns)
            else {
                continue;
            };
            if d.invoke_ns < rc || dc >= bound {
                continue;
            }
            checked += 1;
            if *last_token != t || !held {
                violations.push(format!(
                    "{}: renew op {} kept token {t}, but describe op {} within the lease reports newest token {last_token}, held {held}",
                    r.resource, r.id, d.id
                ));
            }
        }
    }
    Finding {
        name: "a renew keeps its token",
        checked,
        violations,
    }
}

fn scaled_ms(ms: u64, factor: f64) -> u64 {
    // Float is fine here: TTLs are far below 2^53 ns.
    (ms as f64 * 1_000_000.0 * factor) as u64
}

/// (resource, owner, token)
type LeaseKey<'a> = (&'a str, &'a str, u64);

/// No conflicting grant completes earlier than TTL×(1−ρ) after the previous
/// holder's last successful acquire or renew was invoked, unless that holder
/// released (or may have released) first.
pub fn leases_respected(ops: &[Op], rho: f64) -> Finding {
    let mut violations = Vec::new();
    let mut checked = 0;
    // (resource, owner, token) -> invocations of successful acquire/renew with their TTL
    let mut keeps: HashMap<LeaseKey, Vec<(u64, u64)>> = HashMap::new();
    // (resource, owner, token) -> earliest invocation of a release that did or may have succeeded
    let mut releases: HashMap<LeaseKey, u64> = HashMap::new();
    for op in ops {
        match (&op.f, &op.answer) {
            (F::Acquire, Some(Answer::Granted { token, ttl_ms })) => keeps
                .entry((&op.resource, owner(op), *token))
                .or_default()
                .push((op.invoke_ns, *ttl_ms)),
            (F::Renew, Some(Answer::Renewed { ttl_ms })) => {
                if let Some(t) = op.token {
                    keeps
                        .entry((&op.resource, owner(op), t))
                        .or_default()
                        .push((op.invoke_ns, *ttl_ms));
                }
            }
            (F::Release, Some(Answer::Released) | None) => {
                if let Some(t) = op.token {
                    let e = releases
                        .entry((&op.resource, owner(op), t))
                        .or_insert(op.invoke_ns);
                    *e = (*e).min(op.invoke_ns);
                }
            }
            _ => {}
        }
    }
    for (resource, gs) in grants(ops) {
        for b in &gs {
            let (Some(bc), Some(tb)) = (b.complete_ns, b.granted_token()) else {
                continue;
            };
            for ((r, o, ta), list) in &keeps {
                if *r != resource || *o == owner(b) || *ta >= tb {
                    continue;
                }
                if releases.get(&(*r, *o, *ta)).is_some_and(|&ri| ri < bc) {
                    continue;
                }
                for (inv, ttl) in list.iter().filter(|(inv, _)| *inv < bc) {
                    checked += 1;
                    let earliest = inv + scaled_ms(*ttl, 1.0 - rho);
                    if bc < earliest {
                        violations.push(format!(
                            "{resource}: token {tb} (op {}) was granted {} ms after owner {o} renewed or acquired token {ta} with ttl {ttl} ms; at least {} ms must pass",
                            b.id,
                            bc.saturating_sub(*inv) / 1_000_000,
                            scaled_ms(*ttl, 1.0 - rho) / 1_000_000
                        ));
                    }
                }
            }
        }
    }
    Finding {
        name: "no grant before the previous lease ran out",
        checked,
        violations,
    }
}

/// A lease seen ended is never seen held again by the same token. A lease
/// of token T is seen ended when a describe answers free with a newest token
/// of T or above, a renew of T answers lost, or another owner is granted a
/// token above T. It is seen held by T when a describe answers held with
/// newest token T, or a renew of T succeeds. Only observations that started
/// after the ending one completed count: a cluster whose time runs backwards
/// (a new leader starting its clock behind time already reported) revives
/// leases that had run out.
pub fn ended_leases_stay_ended(ops: &[Op]) -> Finding {
    let mut violations = Vec::new();
    let mut checked = 0;
    let resources = by_resource(ops, |o| {
        o.answer.is_some() && matches!(o.f, F::Acquire | F::Renew | F::Describe)
    });
    for (resource, rops) in resources {
        // The owner each token was granted to.
        let owners: HashMap<u64, &str> = rops
            .iter()
            .filter_map(|o| o.granted_token().map(|t| (t, owner(o))))
            .collect();
        // (completion, op id, tokens ended: those in lo..=hi)
        let mut ends: Vec<(u64, u64, u64, u64)> = Vec::new();
        // (invocation, op id, token, how it was seen held)
        let mut helds: Vec<(u64, u64, u64, &str)> = Vec::new();
        for o in &rops {
            let Some(c) = o.complete_ns else { continue };
            match (&o.f, &o.answer) {
                (
                    F::Describe,
                    Some(Answer::Described {
                        last_token, held, ..
                    }),
                ) => {
                    if *held {
                        helds.push((o.invoke_ns, o.id, *last_token, "a describe reports it held"));
                    } else {
                        ends.push((c, o.id, 1, *last_token));
                    }
                }
                (F::Renew, Some(Answer::Lost { .. })) => {
                    if let Some(t) = o.token {
                        ends.push((c, o.id, t, t));
                    }
                }
                (F::Renew, Some(Answer::Renewed { .. })) => {
                    if let Some(t) = o.token {
                        helds.push((o.invoke_ns, o.id, t, "a renew of it succeeds"));
                    }
                }
                (F::Acquire, Some(Answer::Granted { token, .. })) => {
                    // Ends every earlier token of another owner; a token of
                    // this same owner (a retry) is not ended by its own grant.
                    let g_owner = owner(o);
                    for (&t, &t_owner) in &owners {
                        if t < *token && t_owner != g_owner {
                            ends.push((c, o.id, t, t));
                        }
                    }
                }
                _ => {}
            }
        }
        ends.sort_unstable();
        for (inv, held_op, t, how) in &helds {
            checked += 1;
            for (c, end_op, lo, hi) in ends.iter().take_while(|e| e.0 < *inv) {
                if !(lo..=hi).contains(&t) {
                    continue;
                }
                violations.push(format!(
                    "{resource}: the lease of token {t} was seen ended by op {end_op} (completed at {} ms), then {how} in op {held_op} (invoked at {} ms)",
                    c / 1_000_000,
                    inv / 1_000_000
                ));
                break;
            }
        }
    }
    Finding {
        name: "a lease seen ended is never seen held again",
        checked,
        violations,
    }
}

/// The describes that answered: each with its completion and cluster time.
fn described(ops: &[Op]) -> impl Iterator<Item = (&Op, u64, u64)> {
    ops.iter()
        .filter(|o| o.f == F::Describe)
        .filter_map(|o| match (o.complete_ns, &o.answer) {
            (
                Some(c),
                Some(Answer::Described {
                    cluster_time_ms, ..
                }),
            ) => Some((o, c, *cluster_time_ms)),
            _ => None,
        })
}

/// Cluster time never runs backwards: a describe invoked after another one
/// completed (any resource, any client) reports a `cluster_time_ms` at or
/// above the earlier one's.
pub fn cluster_time_monotonic(ops: &[Op]) -> Finding {
    let mut violations = Vec::new();
    // (time, op id, cluster time)
    let mut done: Vec<(u64, u64, u64)> = Vec::new();
    let mut reads: Vec<(u64, u64, u64, &str)> = Vec::new();
    for (o, c, ct) in described(ops) {
        done.push((c, o.id, ct));
        reads.push((o.invoke_ns, o.id, ct, o.resource.as_str()));
    }
    done.sort_unstable();
    reads.sort_unstable();
    // Sweep in invocation order, keeping the highest cluster time among the
    // describes completed before the current invocation.
    let mut highest: Option<(u64, u64, u64)> = None; // (cluster time, op, completion)
    let mut next = 0;
    for (inv, id, ct, resource) in &reads {
        while let Some(&(c, a_id, a_ct)) = done.get(next) {
            if c >= *inv {
                break;
            }
            if highest.is_none_or(|(h, _, _)| a_ct > h) {
                highest = Some((a_ct, a_id, c));
            }
            next += 1;
        }
        if let Some((h, a_id, a_c)) = highest {
            if *ct < h {
                violations.push(format!(
                    "{resource}: describe op {id} (invoked at {} ms) reports cluster time {ct} ms, {} ms behind the {h} ms of describe op {a_id}, which completed at {} ms",
                    inv / 1_000_000,
                    h - ct,
                    a_c / 1_000_000
                ));
            }
        }
    }
    Finding {
        name: "cluster time never runs backwards",
        checked: reads.len(),
        violations,
    }
}

/// Cluster time never runs ahead of real time: a describe invoked after
/// another one completed reports a cluster time at most (1+ρ) times the real
/// time from the earlier one's invocation to its own completion above the
/// earlier one's. A clock ahead ends every live lease early by as much.
pub fn cluster_time_not_ahead(ops: &[Op], rho: f64) -> Finding {
    // Cluster time less real time (ms, scaled by 1+ρ) at a describe's
    // invocation: no later describe may stand higher at its completion.
    let scale = 1.0 + rho;
    let at = |ct: u64, ns: u64| ct as f64 - ns as f64 / 1_000_000.0 * scale;
    let mut done: Vec<(u64, u64, f64, u64)> = Vec::new(); // (completion, op, value, ct)
    let mut reads: Vec<(u64, u64, u64, &str)> = Vec::new(); // (invocation, op, completion, resource)
    let mut cts = std::collections::HashMap::new();
    for (o, c, ct) in described(ops) {
        done.push((c, o.id, at(ct, o.invoke_ns), ct));
        reads.push((o.invoke_ns, o.id, c, o.resource.as_str()));
        cts.insert(o.id, ct);
    }
    done.sort_unstable_by_key(|d| (d.0, d.1));
    reads.sort_unstable();
    // Sweep in invocation order, keeping the lowest value among the
    // describes completed before the current invocation.
    let mut lowest: Option<(f64, u64, u64)> = None; // (value, op, cluster time)
    let mut next = 0;
    let mut violations = Vec::new();
    for (inv, id, c, resource) in &reads {
        while let Some(&(done_at, a_id, v, a_ct)) = done.get(next) {
            if done_at >= *inv {
                break;
            }
            if lowest.is_none_or(|(l, _, _)| v < l) {
                lowest = Some((v, a_id, a_ct));
            }
            next += 1;
        }
        let ct = cts.get(id).copied().unwrap_or_default();
        if let Some((l, a_id, a_ct)) = lowest {
            // One millisecond of rounding on each side.
            let ahead = at(ct, *c) - l;
            if ahead > 2.0 {
                violations.push(format!(
                    "{resource}: describe op {id} (completed at {} ms) reports cluster time {ct} ms, {ahead:.0} ms further ahead of describe op {a_id} ({a_ct} ms) than real time allows",
                    c / 1_000_000
                ));
            }
        }
    }
    Finding {
        name: "cluster time never runs ahead of real time",
        checked: reads.len(),
        violations,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn op(id: u64, f: F, owner: &str, token: Option<u64>, t: (u64, u64), a: Answer) -> Op {
        Op {
            id,
            worker: 0,
            f,
            resource: "r".into(),
            owner: Some(owner.into()),
            token,
            ttl_ms: None,
            key: None,
            deliberate_stale: false,
            invoke_ns: t.0,
            complete_ns: Some(t.1),
            answer: Some(a),
        }
    }
    const MS: u64 = 1_000_000;
    fn granted(token: u64, ttl_ms: u64) -> Answer {
        Answer::Granted { token, ttl_ms }
    }

    #[test]
    fn a_token_granted_twice_is_caught() {
        let h = [
            op(0, F::Acquire, "a", None, (0, 1), granted(4, 2000)),
            op(1, F::Acquire, "b", None, (2, 3), granted(4, 2000)),
        ];
        assert_eq!(tokens_unique(&h).violations.len(), 1);
        // The same owner's retry getting the same token is fine.
        let ok = [
            op(0, F::Acquire, "a", None, (0, 1), granted(4, 2000)),
            op(1, F::Acquire, "a", None, (2, 3), granted(4, 2000)),
        ];
        assert!(tokens_unique(&ok).violations.is_empty());
    }

    #[test]
    fn a_later_grant_with_a_lower_token_is_caught() {
        let h = [
            op(0, F::Acquire, "a", None, (0, 10), granted(9, 2000)),
            op(1, F::Acquire, "b", None, (20, 30), granted(5, 2000)),
        ];
        let f = grants_ordered(&h);
        assert_eq!(f.violations.len(), 1);
        // Concurrent grants may come in either order.
        let ok = [
            op(0, F::Acquire, "a", None, (0, 30), granted(9, 2000)),
            op(1, F::Acquire, "b", None, (20, 40), granted(5, 2000)),
        ];
        assert!(grants_ordered(&ok).violations.is_empty());
    }

    fn final_of(node: u64, token: u64, digest: u64) -> NodeFinal {
        NodeFinal {
            node,
            last_applied: 10,
            digest,
            last_tokens: [("r".to_string(), token)].into_iter().collect(),
        }
    }

    #[test]
    fn a_lost_grant_and_a_phantom_are_caught() {
        let h = [op(0, F::Acquire, "a", None, (0, 10), granted(9, 2000))];
        let (f, stats) = final_state(&h, &[final_of(1, 9, 1), final_of(2, 0, 1)]);
        assert_eq!(stats.missing, 1);
        assert_eq!(f.violations.len(), 1);
        let (f, stats) = final_state(&h, &[final_of(1, 12, 1)]);
        assert_eq!(stats.phantom, 1);
        assert_eq!(f.violations.len(), 1);
        let (f, _) = final_state(&h, &[final_of(1, 9, 1), final_of(2, 9, 1)]);
        assert!(f.violations.is_empty());
    }

    #[test]
    fn diverged_replicas_are_caught() {
        assert_eq!(
            digests_equal(&[final_of(1, 9, 1), final_of(2, 9, 2)])
                .violations
                .len(),
            1
        );
        assert!(digests_equal(&[final_of(1, 9, 1), final_of(2, 9, 1)])
            .violations
            .is_empty());
    }

    fn write(id: u64, token: u64, t: (u64, u64), a: Answer) -> Op {
        op(id, F::Write, "w", Some(token), t, a)
    }

    #[test]
    fn a_stale_write_accepted_is_caught() {
        let h = [
            write(
                0,
                5,
                (0, 10),
                Answer::Accepted {
                    token: 5,
                    version: 1,
                },
            ),
            write(
                1,
                3,
                (20, 30),
                Answer::Accepted {
                    token: 3,
                    version: 2,
                },
            ),
        ];
        let (f, stats) = fenced_writes(&h);
        assert_eq!(stats.stale_accepted, 1);
        // Both the version order and the real-time rule catch it.
        assert_eq!(f.violations.len(), 2);
        let ok = [
            write(
                0,
                5,
                (0, 10),
                Answer::Accepted {
                    token: 5,
                    version: 1,
                },
            ),
            write(
                1,
                3,
                (20, 30),
                Answer::Rejected {
                    highest_token: 5,
                    reason: "stale_token".into(),
                },
            ),
        ];
        let (f, stats) = fenced_writes(&ok);
        assert!(f.violations.is_empty());
        assert_eq!(stats.stale_rejected, 1);
    }

    #[test]
    fn a_renew_that_changes_the_token_is_caught() {
        let h = [
            op(
                0,
                F::Renew,
                "a",
                Some(4),
                (0, 10 * MS),
                Answer::Renewed { ttl_ms: 2000 },
            ),
            op(
                1,
                F::Describe,
                "a",
                None,
                (20 * MS, 30 * MS),
                Answer::Described {
                    last_token: 5,
                    held: true,
                    cluster_time_ms: 0,
                },
            ),
        ];
        assert_eq!(renew_keeps_token(&h, 0.05).violations.len(), 1);
    }

    #[test]
    fn a_describe_after_the_worker_released_its_lease_is_not_held_to_the_renew() {
        let described = |token| Answer::Described {
            last_token: token,
            held: true,
            cluster_time_ms: 0,
        };
        let renewed = Answer::Renewed { ttl_ms: 2000 };
        let h = [
            op(0, F::Renew, "a", Some(4), (0, 10 * MS), renewed.clone()),
            op(
                1,
                F::Release,
                "a",
                Some(4),
                (10 * MS, 20 * MS),
                Answer::Released,
            ),
            op(
                2,
                F::Acquire,
                "b",
                None,
                (20 * MS, 30 * MS),
                granted(5, 2000),
            ),
            op(3, F::Describe, "b", None, (40 * MS, 50 * MS), described(5)),
        ];
        let f = renew_keeps_token(&h, 0.05);
        assert_eq!((f.checked, f.violations.len()), (0, 0));
        // Without the release, the same describe is a violation.
        let h = [
            op(0, F::Renew, "a", Some(4), (0, 10 * MS), renewed),
            op(3, F::Describe, "b", None, (40 * MS, 50 * MS), described(5)),
        ];
        assert_eq!(renew_keeps_token(&h, 0.05).violations.len(), 1);
    }

    #[test]
    fn an_early_conflicting_grant_is_caught() {
        let h = [
            op(0, F::Acquire, "a", None, (0, 10 * MS), granted(4, 2000)),
            op(
                1,
                F::Renew,
                "a",
                Some(4),
                (500 * MS, 510 * MS),
                Answer::Renewed { ttl_ms: 2000 },
            ),
            op(
                2,
                F::Acquire,
                "b",
                None,
                (1000 * MS, 1800 * MS),
                granted(6, 2000),
            ),
        ];
        assert_eq!(leases_respected(&h, 0.05).violations.len(), 2);
        // After a release, the next grant may come at once.
        let ok = [
            op(0, F::Acquire, "a", None, (0, 10 * MS), granted(4, 2000)),
            op(
                1,
                F::Release,
                "a",
                Some(4),
                (20 * MS, 30 * MS),
                Answer::Released,
            ),
            op(
                2,
                F::Acquire,
                "b",
                None,
                (40 * MS, 50 * MS),
                granted(6, 2000),
            ),
        ];
        assert!(leases_respected(&ok, 0.05).violations.is_empty());
        // And after the lease ran out.
        let late = [
            op(0, F::Acquire, "a", None, (0, 10 * MS), granted(4, 2000)),
            op(
                2,
                F::Acquire,
                "b",
                None,
                (1000 * MS, 2100 * MS),
                granted(6, 2000),
            ),
        ];
        assert!(leases_respected(&late, 0.05).violations.is_empty());
    }

    /// A describe over `ms` (invoked, completed) in milliseconds.
    fn describe(id: u64, ms: (u64, u64), last_token: u64, held: bool, cluster_ms: u64) -> Op {
        let a = Answer::Described {
            last_token,
            held,
            cluster_time_ms: cluster_ms,
        };
        op(id, F::Describe, "x", None, (ms.0 * MS, ms.1 * MS), a)
    }

    /// A renew of `token` by owner "a" over `ms`; `ok`: renewed, else lost.
    fn renew(id: u64, token: u64, ms: (u64, u64), ok: bool) -> Op {
        let a = if ok {
            Answer::Renewed { ttl_ms: 2000 }
        } else {
            Answer::Lost {
                reason: "expired".into(),
                current_token: token,
            }
        };
        op(id, F::Renew, "a", Some(token), (ms.0 * MS, ms.1 * MS), a)
    }

    fn grant(id: u64, owner: &str, token: u64, ms: (u64, u64)) -> Op {
        let a = granted(token, 2000);
        op(id, F::Acquire, owner, None, (ms.0 * MS, ms.1 * MS), a)
    }

    #[test]
    fn a_lease_seen_free_then_held_again_is_caught() {
        // The backwards-clock bug: free with token 1 at 5 s, then after a
        // leader change held by 1 again, and a renew of 1 succeeds.
        let h = [
            grant(0, "a", 1, (0, 10)),
            describe(1, (5000, 5010), 1, false, 5000),
            describe(2, (7000, 7010), 1, true, 400),
            renew(3, 1, (7020, 7030), true),
        ];
        assert_eq!(ended_leases_stay_ended(&h).violations.len(), 2);
    }

    #[test]
    fn a_lease_lost_or_superseded_then_renewed_is_caught() {
        let lost_then_renewed = [
            grant(0, "a", 4, (0, 10)),
            renew(1, 4, (3000, 3010), false),
            renew(2, 4, (3020, 3030), true),
        ];
        let f = ended_leases_stay_ended(&lost_then_renewed);
        assert_eq!(f.violations.len(), 1);
        let superseded_then_held = [
            grant(0, "a", 4, (0, 10)),
            grant(1, "b", 5, (3000, 3010)),
            describe(2, (3020, 3030), 4, true, 3020),
        ];
        let f = ended_leases_stay_ended(&superseded_then_held);
        assert_eq!(f.violations.len(), 1);
    }

    #[test]
    fn leases_that_end_once_pass() {
        let ok = [
            grant(0, "a", 1, (0, 10)),
            // Concurrent with the free answer below: either order is fine.
            renew(1, 1, (1990, 2100), true),
            describe(2, (2000, 2050), 1, false, 2000),
            // The same owner's retry of its grant does not end its lease.
            grant(3, "a", 1, (2200, 2210)),
            grant(4, "b", 2, (5000, 5010)),
            describe(5, (5020, 5030), 2, true, 5020),
            renew(6, 1, (5040, 5050), false),
        ];
        let f = ended_leases_stay_ended(&ok);
        assert!(f.violations.is_empty(), "{:?}", f.violations);
        assert_eq!(f.checked, 2);
    }

    #[test]
    fn cluster_time_running_backwards_is_caught() {
        let h = [
            describe(0, (0, 10), 0, false, 5000),
            describe(1, (20, 30), 0, false, 1000),
        ];
        assert_eq!(cluster_time_monotonic(&h).violations.len(), 1);
        // Overlapping describes may answer in either order.
        let ok = [
            describe(0, (0, 30), 0, false, 5000),
            describe(1, (20, 40), 0, false, 4990),
            describe(2, (50, 60), 0, false, 5000),
        ];
        let f = cluster_time_monotonic(&ok);
        assert!(f.violations.is_empty(), "{:?}", f.violations);
        assert_eq!(f.checked, 3);
    }

    #[test]
    fn cluster_time_running_ahead_is_caught() {
        // 1,000 ms of real time between the first describe's invocation and
        // the second's completion; cluster time moved 1,900 ms.
        let h = [
            describe(0, (0, 10), 0, false, 5000),
            describe(1, (990, 1000), 0, false, 6900),
        ];
        let f = cluster_time_not_ahead(&h, 0.05);
        assert_eq!(f.violations.len(), 1, "{:?}", f.violations);
        // Within (1+ρ) of real time, or behind it (a new leader's clock
        // starts behind), or overlapping: fine.
        let ok = [
            describe(0, (0, 10), 0, false, 5000),
            describe(1, (990, 1000), 0, false, 6040),
            describe(2, (1100, 1110), 0, false, 5200),
            describe(3, (5, 2000), 0, false, 7000),
        ];
        let f = cluster_time_not_ahead(&ok, 0.05);
        assert!(f.violations.is_empty(), "{:?}", f.violations);
        assert_eq!(f.checked, 4);
    }
}
