//! Membership changes as an operator makes them (etcd's `member add`,
//! `promote`, `remove`): the checks that refuse a change before anything is
//! written, and the joining side of `fenced run --join`.
//!
//! A new node starts as a learner: it receives the log (a snapshot first
//! when the log behind it was purged) but does not vote, so adding it never
//! changes what a majority is. An operator promotes it once it is caught up
//! (docs/DECISIONS.md, "A learner becomes a voter when an operator
//! promotes it").

use std::{
    collections::{BTreeMap, BTreeSet},
    sync::Arc,
    time::Duration,
};

use fenced_proto::v1::{self, cluster_client::ClusterClient};
use tokio_util::sync::CancellationToken;
use tonic::{Code, Status};

use crate::{
    headers::LEADER_HEADER,
    peer::peer_channel::peer_channel,
    peer::retired::{RetiredIds, MAX_RETIRED_IDS},
    security::tls::NodeTls,
    types::{Node, NodeId, Raft},
};

/// A learner is promoted only while it is at most this many entries behind
/// the leader's last entry. A batch entry carries up to hundreds of
/// commands, so this is a few seconds of a busy cluster's writes: a learner
/// that close catches up in one or two replication rounds, and the majority
/// it joins does not wait on it.
pub const PROMOTE_MAX_LAG: u64 = 1_000;

/// At most this many members, voters and learners together: five voters
/// and room to replace and grow.
pub const MAX_MEMBERS: usize = 9;

/// The longest address accepted (a DNS name is at most 253 bytes).
pub const MAX_ADDR_BYTES: usize = 260;

/// One member as the leader sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MemberState {
    pub node: Node,
    pub voter: bool,
}

/// The membership by node id.
pub type Members = BTreeMap<NodeId, MemberState>;

/// The membership `raft` knows now.
pub fn members_of(raft: &Raft) -> Members {
    let m = raft.metrics().borrow().clone();
    let membership = m.membership_config.membership();
    let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
    membership
        .nodes()
        .map(|(id, node)| {
            (
                *id,
                MemberState {
                    node: node.clone(),
                    voter: voters.contains(id),
                },
            )
        })
        .collect()
}

/// What adding a learner would do.
#[derive(Debug, PartialEq, Eq)]
pub enum AddPlan {
    /// Add it.
    Add,
    /// It already is a learner at exactly these addresses: nothing to do
    /// (a retried join, or an operator's add before the node asked).
    AlreadyLearner,
}

fn check_addr(field: &str, addr: &str, required: bool) -> Result<(), Status> {
    if addr.is_empty() {
        return if required {
            Err(Status::invalid_argument(format!(
                "{field}: required, host:port"
            )))
        } else {
            Ok(())
        };
    }
    if addr.len() > MAX_ADDR_BYTES {
        return Err(Status::invalid_argument(format!(
            "{field}: at most {MAX_ADDR_BYTES} bytes, got {}",
            addr.len()
        )));
    }
    let valid = addr
        .rsplit_once(':')
        .is_some_and(|(host, port)| !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p > 0))
        && addr.bytes().all(|b| b.is_ascii_graphic());
    if !valid {
        return Err(Status::invalid_argument(format!(
            "{field}: {addr:?} is not host:port"
        )));
    }
    Ok(())
}

/// Checks an add of node `id` at `node`'s addresses against `members`.
pub fn check_add(members: &Members, id: NodeId, node: &Node) -> Result<AddPlan, Status> {
    if id == 0 {
        return Err(Status::invalid_argument("node_id: must be at least 1"));
    }
    check_addr("peer_addr", &node.peer_addr, true)?;
    check_addr("client_addr", &node.client_addr, false)?;
    if let Some(existing) = members.get(&id) {
        if existing.voter {
            return Err(Status::already_exists(format!(
                "node_id: node {id} is already a voter (peer {}); a node with an empty data \
                 directory must never join under a member's id (it could vote twice in one \
                 term): if it is node {id} whose data was lost, run fenced repair on it and \
                 start it again; otherwise remove node {id} first and add the new \
                 node under a new id",
                existing.node.peer_addr
            )));
        }
        if existing.node == *node {
            return Ok(AddPlan::AlreadyLearner);
        }
        return Err(Status::already_exists(format!(
            "node_id: node {id} is already a learner at peer {} client {}; remove it first to \
             change its addresses",
            existing.node.peer_addr, existing.node.client_addr
        )));
    }
    for (other, m) in members {
        if m.node.peer_addr == node.peer_addr {
            return Err(Status::already_exists(format!(
                "peer_addr: {} is already node {other}'s; remove node {other} first",
                node.peer_addr
            )));
        }
        if !node.client_addr.is_empty() && m.node.client_addr == node.client_addr {
            return Err(Status::already_exists(format!(
                "client_addr: {} is already node {other}'s; remove node {other} first",
                node.client_addr
            )));
        }
    }
    if members.len() >= MAX_MEMBERS {
        return Err(Status::resource_exhausted(format!(
            "members: the cluster has {} members, at most {MAX_MEMBERS} are allowed; remove one \
             first",
            members.len()
        )));
    }
    Ok(AddPlan::Add)
}

/// Refuses to add (or promote, or make a voter of) node `id` once it was
/// retired: a removed id never returns (docs/DECISIONS.md, "A removed node
/// id never returns"). INVALID_ARGUMENT, like other ids that can never be
/// added: a joining node stops on it with the reason.
pub fn check_not_retired(retired: &RetiredIds, id: NodeId) -> Result<(), Status> {
    if retired.contains(id) {
        return Err(Status::invalid_argument(format!(
            "node_id: node {id} was removed from this cluster and a removed id never returns \
             (its certificate stays refused on the peer ports); add the node under a new id"
        )));
    }
    Ok(())
}

/// Refuses a change that would retire `leaving` more ids than the retired
/// list has room for: a retired id is never dropped to make room.
pub fn check_retire_room(retired: &RetiredIds, leaving: usize) -> Result<(), Status> {
    if leaving > retired.room() {
        return Err(Status::failed_precondition(format!(
            "node_id: the cluster keeps at most {MAX_RETIRED_IDS} retired node ids and has {}; \
             removing {leaving} more would pass the bound, and a retired id is never forgotten",
            retired.len()
        )));
    }
    Ok(())
}

/// What promoting a member would do.
#[derive(Debug, PartialEq, Eq)]
pub enum PromotePlan {
    Promote,
    /// It already votes: nothing to do (a retried promote).
    AlreadyVoter,
}

/// Checks a promotion of `id`; `matched` is the last index the leader knows
/// matches on it, `last_log_index` the leader's own.
pub fn check_promote(
    members: &Members,
    id: NodeId,
    matched: Option<u64>,
    last_log_index: u64,
) -> Result<PromotePlan, Status> {
    let Some(member) = members.get(&id) else {
        return Err(unknown(members, id));
    };
    if member.voter {
        return Ok(PromotePlan::AlreadyVoter);
    }
    let Some(matched) = matched else {
        return Err(Status::failed_precondition(format!(
            "node_id: learner {id} has not answered the leader yet (is it running at peer {}?); \
             promote it once it has caught up",
            member.node.peer_addr
        )));
    };
    let lag = last_log_index.saturating_sub(matched);
    if lag > PROMOTE_MAX_LAG {
        return Err(Status::failed_precondition(format!(
            "node_id: learner {id} lags the leader by {lag} entries (matched {matched} of \
             {last_log_index}); it is promoted only within {PROMOTE_MAX_LAG}: retry once it has \
             caught up"
        )));
    }
    Ok(PromotePlan::Promote)
}

fn unknown(members: &Members, id: NodeId) -> Status {
    Status::not_found(format!(
        "node_id: node {id} is not a member (members: {:?})",
        members.keys().collect::<Vec<_>>()
    ))
}

/// Checks a removal of `id`. `in_contact` are the voters the leader has
/// just heard from (itself included). A voter is removed only when the
/// voters left that are in contact are a majority of the voters left: the
/// change itself, and every write after it, needs such a majority, and a
/// change that cannot commit would leave the cluster stuck in the joint
/// configuration until enough nodes came back.
pub fn check_remove(
    members: &Members,
    id: NodeId,
    in_contact: &BTreeSet<NodeId>,
) -> Result<(), Status> {
    let Some(member) = members.get(&id) else {
        return Err(unknown(members, id));
    };
    if !member.voter {
        return Ok(());
    }
    let rest: BTreeSet<NodeId> = members
        .iter()
        .filter(|(v, m)| m.voter && **v != id)
        .map(|(v, _)| *v)
        .collect();
    if rest.is_empty() {
        return Err(Status::failed_precondition(format!(
            "node_id: node {id} is the last voter; a cluster needs at least one (add and promote \
             another node first)"
        )));
    }
    let reachable: BTreeSet<NodeId> = rest.intersection(in_contact).copied().collect();
    let majority = rest.len() / 2 + 1;
    if reachable.len() < majority {
        return Err(Status::failed_precondition(format!(
            "node_id: removing node {id} would leave voters {rest:?}, of which the leader is in \
             contact with {reachable:?} only: a majority of {} needs {majority}. Remove an \
             unreachable voter first, or bring one back",
            rest.len()
        )));
    }
    Ok(())
}

/// What `fenced run --join` asks for.
#[derive(Debug, Clone)]
pub struct Join {
    /// Client addresses of current members.
    pub endpoints: Vec<String>,
    pub id: NodeId,
    /// This node's advertised addresses.
    pub node: Node,
}

/// How asking to join ended, when it ended without this node being added.
#[derive(Debug)]
pub enum JoinRefused {
    /// The cluster said no for a reason that waiting will not change (the
    /// id is a voter's, an address is taken): the node must not run.
    Fatal(String),
}

/// Whether `raft` has applied a membership naming this node. A membership
/// it only holds in its log may not commit: a leader cut off from its
/// voters can still reach the joining node, append the node's addition and
/// send it over, and then lose its leadership; the voters' new leader never
/// had the entry. Joining stops only on a committed (applied) one.
pub fn is_member(raft: &Raft, id: NodeId) -> bool {
    let m = raft.metrics().borrow().clone();
    named_and_applied(
        m.membership_config.membership().get_node(&id).is_some(),
        m.membership_config.log_id().map(|l| l.index),
        m.last_applied.map(|l| l.index),
    )
}

/// A membership that names this node counts once it is applied (one that
/// was never logged, the initial one, counts at once).
fn named_and_applied(named: bool, membership_index: Option<u64>, applied: Option<u64>) -> bool {
    named
        && match membership_index {
            None => true,
            Some(i) => applied.is_some_and(|a| a >= i),
        }
}

/// Asks the cluster at `join.endpoints` to add this node as a learner,
/// retrying while no leader answers, until it is added or `stop`. With
/// `tls`, the call goes over TLS with this node's own certificate, the
/// identity a cluster with auth on lets add itself. A refusal of this
/// identity is not fatal: the node waits for an operator's
/// `fencectl member add`.
pub async fn join(
    raft: Raft,
    join: Join,
    tls: Option<Arc<NodeTls>>,
    stop: CancellationToken,
) -> Result<(), JoinRefused> {
    let mut targets: Vec<String> = join.endpoints.clone();
    let mut i = 0usize;
    let mut pause = Duration::from_millis(100);
    loop {
        if is_member(&raft, join.id) {
            tracing::info!(
                node = join.id,
                "a member now: receiving the log as a learner"
            );
            return Ok(());
        }
        let target = targets[i % targets.len()].clone();
        i += 1;
        let answer = match peer_channel(&target, tls.as_ref(), None) {
            Ok(ch) => {
                if let Some(tls) = &tls {
                    seed_from(&tls.members, ch.clone(), &target).await;
                }
                let mut req = tonic::Request::new(v1::AddLearnerRequest {
                    node_id: join.id,
                    peer_addr: join.node.peer_addr.clone(),
                    client_addr: join.node.client_addr.clone(),
                });
                req.set_timeout(Duration::from_secs(10));
                let mut client = ClusterClient::new(ch);
                tokio::select! {
                    _ = stop.cancelled() => return Ok(()),
                    r = client.add_learner(req) => r,
                }
            }
            Err(e) => Err(Status::unavailable(e.to_string())),
        };
        match answer {
            Ok(resp) => {
                // The leader answers once the addition is committed: this
                // node is a member now, even while its own log has not
                // applied it (the loop must not ask again: by then it may
                // be a voter, and asking would be refused as a new node
                // taking a voter's id).
                tracing::info!(
                    node = join.id,
                    via = %target,
                    log_index = resp.get_ref().log_index,
                    "added as a learner; an operator promotes it once caught up \
                     (fencectl member promote {})", join.id
                );
                return Ok(());
            }
            Err(s) => match s.code() {
                Code::PermissionDenied | Code::Unauthenticated => {
                    tracing::info!(
                        node = join.id,
                        via = %target,
                        error = s.message(),
                        "the cluster does not let this node add itself; waiting for an \
                         operator to add it (fencectl member add)"
                    );
                    return wait_until_member(&raft, join.id, &stop).await;
                }
                Code::AlreadyExists | Code::InvalidArgument | Code::ResourceExhausted => {
                    return Err(JoinRefused::Fatal(format!(
                        "join refused by {target}: {}",
                        s.message()
                    )));
                }
                _ => {
                    // The hint is `<id>,<client address>`.
                    if let Some(leader) = s
                        .metadata()
                        .get(LEADER_HEADER)
                        .and_then(|v| v.to_str().ok())
                        .and_then(|v| v.split_once(',').map(|(_, addr)| addr))
                        .filter(|l| !l.is_empty())
                    {
                        if !targets.iter().any(|t| t == leader) {
                            targets.push(leader.to_string());
                        }
                        if let Some(pos) = targets.iter().position(|t| t == leader) {
                            i = pos;
                        }
                    }
                    tracing::info!(
                        node = join.id,
                        via = %target,
                        error = s.message(),
                        "join not answered; retrying"
                    );
                }
            },
        }
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            _ = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(Duration::from_secs(2));
    }
}

/// Seeds a joining node's peer-port admission with the members the node at
/// `target` (over TLS, a certificate of this cluster's CA) lists, so that
/// until a membership reaches this node's log only they are admitted.
async fn seed_from(
    members: &crate::security::tls::Members,
    ch: tonic::transport::Channel,
    target: &str,
) {
    let mut req = tonic::Request::new(v1::StatusRequest { with_digest: false });
    req.set_timeout(Duration::from_secs(2));
    match ClusterClient::new(ch).status(req).await {
        Ok(status) => {
            let status = status.into_inner();
            let ids = status.members.iter().map(|m| m.id).collect();
            let voters = status
                .members
                .iter()
                .filter(|m| m.voter)
                .map(|m| m.id)
                .collect();
            members.seed(ids, voters);
        }
        Err(e) => {
            tracing::debug!(via = %target, error = e.message(), "no status to seed the joining node's admission")
        }
    }
}

async fn wait_until_member(
    raft: &Raft,
    id: NodeId,
    stop: &CancellationToken,
) -> Result<(), JoinRefused> {
    let mut metrics = raft.metrics();
    loop {
        if is_member(raft, id) {
            tracing::info!(node = id, "a member now: receiving the log as a learner");
            return Ok(());
        }
        tokio::select! {
            _ = stop.cancelled() => return Ok(()),
            r = metrics.changed() => if r.is_err() { return Ok(()) },
        }
    }
}

/// Asks the members this node knows about the node ids its peer port
/// refused (`members` notes them, see [`crate::security::tls::Members::refused`]), one
/// round per [`crate::security::tls::PROBE_INTERVAL`] at most, until `stop`. Each
/// member's `Status` (client port, this node's certificate) gives its view
/// and that view's membership index; an id named by a view newer than this
/// node's is admitted ([`crate::security::tls::Members::vouch`]). A node whose view lags
/// thus lets in the leader that joined after it and can catch it up.
pub async fn vouch_for_refused(
    members: crate::security::tls::Members,
    raft: Raft,
    id: NodeId,
    tls: Option<Arc<NodeTls>>,
    stop: CancellationToken,
) {
    loop {
        let refused = tokio::select! {
            _ = stop.cancelled() => return,
            r = members.next_refused() => r,
        };
        let asked: Vec<(NodeId, String)> = members_of(&raft)
            .into_iter()
            .filter(|(m, _)| *m != id)
            .map(|(m, s)| {
                let addr = if s.node.client_addr.is_empty() {
                    s.node.peer_addr
                } else {
                    s.node.client_addr
                };
                (m, addr)
            })
            .collect();
        tracing::debug!(refused = ?refused, asked = ?asked, "asking the members about refused peer certificates");
        let mut calls = tokio::task::JoinSet::new();
        for (m, addr) in asked {
            let tls = tls.clone();
            calls.spawn(async move {
                let ch = peer_channel(&addr, tls.as_ref(), Some(m)).map_err(|e| e.to_string())?;
                let mut req = tonic::Request::new(v1::StatusRequest { with_digest: false });
                req.set_timeout(crate::security::tls::PROBE_INTERVAL);
                let status = ClusterClient::new(ch)
                    .status(req)
                    .await
                    .map(tonic::Response::into_inner)
                    .map_err(|e| format!("node {m} at {addr}: {}", e.message()))?;
                // A member speaks for itself only: the answer counts as the
                // word of the node asked, and only if it says so.
                if status.node_id != m {
                    return Err(format!(
                        "node {m} at {addr} answered as node {}",
                        status.node_id
                    ));
                }
                Ok(status)
            });
        }
        let answers = tokio::select! {
            _ = stop.cancelled() => return,
            a = calls.join_all() => a,
        };
        let answers: Vec<_> = answers
            .into_iter()
            .filter_map(|answer| {
                answer
                    .inspect_err(|e| {
                        tracing::debug!(error = %e, "a member did not answer about refused peers")
                    })
                    .ok()
            })
            .collect();
        let own_index = members.view_index();
        for r in &refused {
            for (by, index, voter) in vouchers(*r, &answers, own_index) {
                members.vouch(*r, &by, index, voter);
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(crate::security::tls::PROBE_INTERVAL) => {}
        }
    }
}

/// What the members' `answers` say of node `id`: the members whose
/// membership, newer than this node's (at `own_index`), names it, with the
/// oldest of those memberships' indexes; once for those that name it at all
/// and once for those that name it a voter (for
/// [`crate::security::tls::Members::vouch`], which counts them). An answer with an
/// older membership is left out, so it cannot hold the others back.
fn vouchers(
    id: NodeId,
    answers: &[v1::StatusResponse],
    own_index: u64,
) -> Vec<(BTreeSet<NodeId>, u64, bool)> {
    let mut out = Vec::new();
    for voter in [false, true] {
        let naming: Vec<&v1::StatusResponse> = answers
            .iter()
            .filter(|s| s.membership_index > own_index)
            .filter(|s| s.members.iter().any(|m| m.id == id && (m.voter || !voter)))
            .collect();
        if let Some(index) = naming.iter().map(|s| s.membership_index).min() {
            out.push((naming.iter().map(|s| s.node_id).collect(), index, voter));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn vouchers_are_the_answers_with_a_newer_membership_naming_the_id() {
        let status =
            |node_id: u64, membership_index: u64, members: &[(u64, bool)]| v1::StatusResponse {
                node_id,
                membership_index,
                members: members
                    .iter()
                    .map(|(id, voter)| v1::Member {
                        id: *id,
                        voter: *voter,
                        ..Default::default()
                    })
                    .collect(),
                ..Default::default()
            };
        let answers = [
            status(1, 20, &[(1, true), (2, true), (4, true)]),
            status(2, 18, &[(1, true), (2, true), (4, false)]),
            // As old as this node's view: left out, not the minimum.
            status(5, 10, &[(4, false)]),
        ];
        let got = vouchers(4, &answers, 10);
        assert_eq!(
            got,
            vec![([1, 2].into(), 18, false), ([1].into(), 20, true),]
        );
        assert!(vouchers(9, &answers, 10).is_empty());
        assert!(vouchers(4, &answers, 20).is_empty());
    }

    #[test]
    fn a_joining_node_is_a_member_only_once_the_membership_naming_it_is_applied() {
        // Sent by a leader that then lost its voters: logged, not applied.
        assert!(!named_and_applied(true, Some(450), Some(449)));
        assert!(!named_and_applied(true, Some(450), None));
        assert!(named_and_applied(true, Some(450), Some(450)));
        assert!(named_and_applied(true, Some(450), Some(900)));
        assert!(!named_and_applied(false, Some(450), Some(900)));
        assert!(named_and_applied(true, None, None));
    }

    fn node(p: u16) -> Node {
        Node {
            peer_addr: format!("10.0.0.1:{p}"),
            client_addr: format!("10.0.0.1:{}", p + 1000),
        }
    }

    fn cluster(voters: &[NodeId], learners: &[NodeId]) -> Members {
        voters
            .iter()
            .map(|v| (*v, true))
            .chain(learners.iter().map(|l| (*l, false)))
            .map(|(id, voter)| {
                (
                    id,
                    MemberState {
                        node: node(7200 + id as u16),
                        voter,
                    },
                )
            })
            .collect()
    }

    #[test]
    fn an_add_is_checked_against_ids_and_addresses() {
        let m = cluster(&[1, 2, 3], &[4]);
        assert_eq!(check_add(&m, 5, &node(7205)).ok(), Some(AddPlan::Add));
        assert_eq!(
            check_add(&m, 4, &node(7204)).ok(),
            Some(AddPlan::AlreadyLearner)
        );
        let voter = check_add(&m, 2, &node(7299))
            .err()
            .map(|s| s.message().to_string());
        assert!(
            voter
                .as_deref()
                .is_some_and(|e| e.contains("already a voter") && e.contains("vote twice")),
            "{voter:?}"
        );
        let moved = check_add(&m, 4, &node(7299)).err().map(|s| s.code());
        assert_eq!(moved, Some(Code::AlreadyExists));
        let taken = check_add(&m, 6, &node(7202))
            .err()
            .map(|s| s.message().to_string());
        assert!(
            taken
                .as_deref()
                .is_some_and(|e| e.starts_with("peer_addr:") && e.contains("node 2")),
            "{taken:?}"
        );
        let mut same_client = node(7290);
        same_client.client_addr = node(7203).client_addr;
        let taken = check_add(&m, 6, &same_client)
            .err()
            .map(|s| s.message().to_string());
        assert!(
            taken
                .as_deref()
                .is_some_and(|e| e.starts_with("client_addr:") && e.contains("node 3")),
            "{taken:?}"
        );
        for bad in ["", "nohost", ":7", "h:0", "h:99999", "h :1"] {
            let n = Node {
                peer_addr: bad.into(),
                client_addr: String::new(),
            };
            assert_eq!(
                check_add(&m, 6, &n).err().map(|s| s.code()),
                Some(Code::InvalidArgument),
                "{bad:?}"
            );
        }
        assert_eq!(
            check_add(&m, 0, &node(7000)).err().map(|s| s.code()),
            Some(Code::InvalidArgument)
        );
        let full = cluster(&[1, 2, 3, 4, 5], &[6, 7, 8, 9]);
        assert_eq!(
            check_add(&full, 10, &node(7210)).err().map(|s| s.code()),
            Some(Code::ResourceExhausted)
        );
    }

    #[test]
    #[allow(clippy::unwrap_used)]
    fn a_retired_id_is_refused_by_name_and_the_bound_holds() {
        let retired = RetiredIds::from_ids([4]).unwrap();
        assert!(check_not_retired(&retired, 5).is_ok());
        let e = check_not_retired(&retired, 4).unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert!(
            e.message().contains("node 4 was removed") && e.message().contains("a new id"),
            "{e:?}"
        );
        assert!(check_retire_room(&retired, 1).is_ok());
        let full = RetiredIds::from_ids(1..=MAX_RETIRED_IDS as u64).unwrap();
        let e = check_retire_room(&full, 1).unwrap_err();
        assert_eq!(e.code(), Code::FailedPrecondition);
        assert!(e.message().contains("at most 4096"), "{e:?}");
        assert!(check_retire_room(&full, 0).is_ok());
    }

    #[test]
    fn a_lagging_learner_is_not_promoted() {
        let m = cluster(&[1, 2, 3], &[4]);
        assert_eq!(
            check_promote(&m, 4, Some(5_000), 5_000 + PROMOTE_MAX_LAG).ok(),
            Some(PromotePlan::Promote)
        );
        let lag = check_promote(&m, 4, Some(10), 5_000)
            .err()
            .map(|s| s.message().to_string());
        assert!(
            lag.as_deref()
                .is_some_and(|e| e.contains("lags the leader by 4990 entries")),
            "{lag:?}"
        );
        assert_eq!(
            check_promote(&m, 4, None, 5).err().map(|s| s.code()),
            Some(Code::FailedPrecondition)
        );
        assert_eq!(
            check_promote(&m, 2, None, 5).ok(),
            Some(PromotePlan::AlreadyVoter)
        );
        assert_eq!(
            check_promote(&m, 9, Some(5), 5).err().map(|s| s.code()),
            Some(Code::NotFound)
        );
    }

    #[test]
    fn a_removal_keeps_a_majority_that_can_commit() {
        let all = |ids: &[NodeId]| ids.iter().copied().collect::<BTreeSet<_>>();
        let one = cluster(&[1], &[2]);
        let last = check_remove(&one, 1, &all(&[1]))
            .err()
            .map(|s| s.message().to_string());
        assert!(
            last.as_deref().is_some_and(|e| e.contains("last voter")),
            "{last:?}"
        );
        // Learners go freely; unknown ids are named.
        assert!(check_remove(&one, 2, &all(&[1])).is_ok());
        assert_eq!(
            check_remove(&one, 7, &all(&[1])).err().map(|s| s.code()),
            Some(Code::NotFound)
        );
        let three = cluster(&[1, 2, 3], &[]);
        // Node 3 is dead: removing it leaves {1, 2}, both in contact.
        assert!(check_remove(&three, 3, &all(&[1, 2])).is_ok());
        // Removing a live one would leave {1, 3} with 3 dead: 1 of 2.
        let stuck = check_remove(&three, 2, &all(&[1, 2]))
            .err()
            .map(|s| s.message().to_string());
        assert!(
            stuck
                .as_deref()
                .is_some_and(|e| e.contains("majority of 2 needs 2")),
            "{stuck:?}"
        );
        // The leader may remove itself while the rest can commit.
        assert!(check_remove(&three, 1, &all(&[1, 2, 3])).is_ok());
        let five = cluster(&[1, 2, 3, 4, 5], &[]);
        assert!(check_remove(&five, 5, &all(&[1, 2, 3])).is_ok());
        assert!(check_remove(&five, 3, &all(&[1, 2, 3])).is_err());
    }
}
