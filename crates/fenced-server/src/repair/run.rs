//! The node's side of a repair: asks the members, stores the fence before
//! Raft starts, and ends the repair once the node caught up. The decisions
//! are [`super::fence`]'s.

use std::{
    collections::{BTreeMap, BTreeSet},
    path::Path,
    sync::Arc,
    time::Duration,
};

use fenced_proto::v1::{self, cluster_client::ClusterClient};
use openraft::Vote;
use tokio_util::sync::CancellationToken;

use super::{
    fence::{self, Answer, Fence, Wait},
    gate::RepairGate,
    marker::{self, Marker, Step},
};
use crate::{
    clock::floor::TimeFloor,
    peer::peer_channel::peer_channel,
    security::tls::{Members, NodeTls},
    state_machine::Shared,
    storage::log_store::LogStore,
    types::{NodeId, Raft},
};

/// How long one member gets to answer.
const ASK_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a member gets to answer whether the cluster formed, at every
/// start on an empty log: a first start waits no longer than this.
const PROBE_TIMEOUT: Duration = Duration::from_millis(500);
/// The longest pause between two rounds of questions.
const MAX_PAUSE: Duration = Duration::from_secs(2);

/// Where the members are: client addresses by id (a channel checks that
/// the answering certificate names that id), and addresses whose id is
/// not known (`--join` endpoints), asked only to learn the members.
#[derive(Debug, Clone, Default)]
pub struct Directory {
    pub by_id: BTreeMap<NodeId, String>,
    pub unnamed: Vec<String>,
}

/// Why a repair cannot go on at all.
#[derive(Debug, thiserror::Error)]
pub enum RepairError {
    #[error("node {node} cannot be repaired from its peers: {reason}")]
    Refused { node: NodeId, reason: Wait },
    #[error("the repair marker names node {marked}, but this node is {me}: this data directory is another node's")]
    OtherNode { marked: NodeId, me: NodeId },
    #[error("repair: {0}")]
    Io(#[from] std::io::Error),
}

fn answer_of(status: v1::StatusResponse) -> Answer {
    Answer {
        node: status.node_id,
        term: status.term,
        leads: status.leader_id == status.node_id,
        last_applied: status.last_applied,
        last_applied_term: status.last_applied_term,
        last_log_index: status.last_log_index,
        membership_index: status.membership_index,
        voters: status
            .members
            .iter()
            .filter(|m| m.voter)
            .map(|m| m.id)
            .collect(),
        members: status.members.iter().map(|m| m.id).collect(),
    }
}

/// A member's status on its way, or `None` for no answer.
pub type StatusAnswer =
    std::pin::Pin<Box<dyn std::future::Future<Output = Option<v1::StatusResponse>> + Send>>;

/// How a member is asked for its status: over gRPC on its client port, or,
/// under the deterministic simulation, in process through its network.
pub trait AskStatus: Send + Sync + 'static {
    /// The status of the node at `addr`; with `expect`, only over a
    /// channel that checked the answering certificate names that node.
    /// `None` when it does not answer within `timeout`.
    fn status(&self, addr: String, expect: Option<NodeId>, timeout: Duration) -> StatusAnswer;
}

/// Members asked over gRPC, with the node's TLS when it has it.
pub struct GrpcStatus(pub Option<Arc<NodeTls>>);

impl AskStatus for GrpcStatus {
    fn status(&self, addr: String, expect: Option<NodeId>, timeout: Duration) -> StatusAnswer {
        let tls = self.0.clone();
        Box::pin(async move {
            let ch = peer_channel(&addr, tls.as_ref(), expect).ok()?;
            let mut req = tonic::Request::new(v1::StatusRequest { with_digest: false });
            req.set_timeout(timeout);
            let answer = tokio::time::timeout(timeout, ClusterClient::new(ch).status(req))
                .await
                .ok()?
                .ok()?
                .into_inner();
            Some(answer)
        })
    }
}

/// One round: every member of `dir` (and every member their answers name)
/// is asked for its status, except `me`. Only an answer over a channel
/// that checked the node's id counts, and only if it answers as that id:
/// a spare certificate of the cluster's CA cannot speak for a voter.
pub async fn ask(
    me: NodeId,
    dir: &mut Directory,
    peers: &Arc<dyn AskStatus>,
    timeout: Duration,
) -> Vec<Answer> {
    for addr in dir.unnamed.clone() {
        if let Some(s) = peers.status(addr, None, timeout).await {
            learn(me, dir, &s, false);
        }
    }
    let mut answers = Vec::new();
    let mut asked = BTreeSet::new();
    // Answers may name members not asked yet: a second pass asks them.
    for _ in 0..2 {
        let round: Vec<(NodeId, String)> = dir
            .by_id
            .iter()
            .filter(|(id, _)| **id != me && !asked.contains(*id))
            .map(|(id, a)| (*id, a.clone()))
            .collect();
        let mut calls = tokio::task::JoinSet::new();
        for (id, addr) in round {
            asked.insert(id);
            let call = peers.status(addr, Some(id), timeout);
            calls.spawn(async move { (id, call.await) });
        }
        while let Some(done) = calls.join_next().await {
            let Ok((id, Some(s))) = done else { continue };
            if s.node_id != id {
                tracing::warn!(
                    asked = id,
                    answered_as = s.node_id,
                    "repair: an answer for another node is ignored"
                );
                continue;
            }
            learn(me, dir, &s, true);
            answers.push(answer_of(s));
        }
    }
    answers
}

/// Adds the members `status` names to `dir`. A member's own answer (over a
/// channel that checked its id) is its cluster's membership: its addresses
/// replace the configured ones, which may be stale. An answer from an
/// address whose node is not known only adds members not known yet.
fn learn(me: NodeId, dir: &mut Directory, status: &v1::StatusResponse, checked: bool) {
    for m in &status.members {
        if m.id != me && !m.client_addr.is_empty() {
            if checked {
                dir.by_id.insert(m.id, m.client_addr.clone());
            } else {
                dir.by_id
                    .entry(m.id)
                    .or_insert_with(|| m.client_addr.clone());
            }
        }
    }
}

/// Whether the cluster `dir` points at already formed (a member answers
/// with a term): a node that finds its log empty then lost its data (or
/// starts after the others formed the cluster without it) and must be
/// repaired, not seed a first membership and vote at term 0. One round of
/// questions; no answer means a first start.
pub async fn cluster_formed(me: NodeId, dir: &Directory, peers: &Arc<dyn AskStatus>) -> bool {
    let mut dir = dir.clone();
    ask(me, &mut dir, peers, PROBE_TIMEOUT)
        .await
        .iter()
        .any(|a| a.term > 0)
}

/// Before Raft starts on a data directory marked for repair at the fence:
/// asks the members until a majority of the other voters answered, stores a
/// vote at the fence, lets the peer port admit the members, and moves the
/// marker on. Waits as long as it takes (the caller drops the future to
/// stop).
pub async fn store_fence(
    me: NodeId,
    data_dir: &Path,
    log: &LogStore,
    mut dir: Directory,
    peers: &Arc<dyn AskStatus>,
    members: &Members,
) -> Result<Fence, RepairError> {
    let mut pause = Duration::from_millis(100);
    let mut last_reason = String::new();
    loop {
        let answers = ask(me, &mut dir, peers, ASK_TIMEOUT).await;
        match fence::fence(me, &answers) {
            Ok(fence) => {
                let vote = Vote::new(fence.term, fence.leader);
                log.replace_vote(|stored| match stored {
                    Some(s) if s.leader_id().get_term() >= fence.term => None,
                    _ => Some(vote),
                })
                .await?;
                if let Some(view) = answers.iter().max_by_key(|a| a.membership_index) {
                    members.seed(view.members.clone(), view.voters.clone());
                }
                marker::write(
                    data_dir,
                    &Marker {
                        node: me,
                        step: Step::CatchUp { term: fence.term },
                    },
                )?;
                tracing::info!(
                    node = me,
                    term = fence.term,
                    leader = fence.leader,
                    "repair: fenced at the highest term of the other voters; taking the log"
                );
                return Ok(fence);
            }
            Err(reason @ (Wait::NoPeer | Wait::NotMember { .. })) => {
                return Err(RepairError::Refused { node: me, reason })
            }
            Err(reason) => {
                let text = reason.to_string();
                if text != last_reason {
                    tracing::info!(node = me, "repair: waiting: {text}");
                    last_reason = text;
                }
            }
        }
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(MAX_PAUSE);
    }
}

/// A node being repaired, as the end of its repair needs it.
pub struct Repairing {
    pub me: NodeId,
    /// The term the fence was stored at.
    pub fence_term: u64,
    pub data_dir: std::path::PathBuf,
    pub dir: Directory,
    pub peers: Arc<dyn AskStatus>,
    pub gate: Arc<RepairGate>,
    pub floor: Arc<TimeFloor>,
}

/// While Raft runs: asks the members until a leader gives the index to
/// reach, waits until this node applied it, then removes the marker and
/// opens the gate: the node votes and stands again. Until `stop`.
pub async fn finish(node: Repairing, raft: Raft, shared: Arc<Shared>, stop: CancellationToken) {
    let Repairing {
        me,
        fence_term,
        data_dir,
        mut dir,
        peers,
        gate,
        floor,
    } = node;
    let mut target = None;
    let mut metrics = raft.metrics();
    loop {
        // The members as this node's log now names them, too.
        for (id, member) in raft
            .metrics()
            .borrow()
            .membership_config
            .membership()
            .nodes()
        {
            if *id != me && !member.client_addr.is_empty() {
                dir.by_id.insert(*id, member.client_addr.clone());
            }
        }
        let answers = ask(me, &mut dir, &peers, ASK_TIMEOUT).await;
        let heard = fence::catch_up_target(&answers, fence_term);
        if heard.is_some() && heard != target {
            tracing::info!(node = me, target = ?heard, "repair: catching up to a leader's last log index");
        }
        target = fence::next_target(target, heard);
        // Until the next round: as soon as the target is applied, or after
        // the pause (a leader that failed leaves a target that may never
        // be applied; the next round asks its successor).
        let until = tokio::time::Instant::now() + MAX_PAUSE;
        loop {
            let applied = shared.last_applied().map_or(0, |l| l.index);
            if let Some(t) = target.filter(|t| applied >= t.index) {
                tracing::info!(node = me, applied, target = t.index, "repair: caught up");
                return end_repair(me, &data_dir, &gate, &floor).await;
            }
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tokio::time::sleep_until(until) => break,
                r = metrics.changed() => if r.is_err() { return },
            }
        }
    }
}

/// Ends the repair: the cluster time taken from the leaders is made
/// durable (what a follower that confirmed reads before its data was lost
/// had made durable is gone with it), the marker goes, then the gate opens.
async fn end_repair(me: NodeId, data_dir: &Path, gate: &RepairGate, floor: &TimeFloor) {
    if let Err(e) = floor.make_durable(floor.leader_time()).await {
        tracing::error!(node = me, error = %e, "repair: the cluster time could not be made durable");
        return;
    }
    if let Err(e) = marker::remove(data_dir) {
        // The gate stays shut: the next start tries again.
        tracing::error!(node = me, error = %e, "repair: the marker could not be removed");
        return;
    }
    gate.set(None);
    tracing::info!(node = me, "repaired: voting again");
}
