//! The follower side of Raft on the peer port: openraft's AppendEntries,
//! votes and snapshot chunks, and fenced's pre-vote, each answered by
//! openraft or [`super::election`] and followed by the actions
//! [`super::stream`] decides (restart the pre-vote's lease, take the
//! leader's time). [`crate::node::peer_listener`] routes connections and frames
//! here.

use std::{
    io,
    sync::{atomic::Ordering::Relaxed, Arc},
};

use super::{
    election::Election,
    pre_vote::PreVoteRequest,
    sender::{self, Refusal},
    stream::{self, Heard},
};
use crate::{
    clock::floor::{LeaderTime, TimeFloor},
    peer::handoff,
    peer::network::{
        check_snapshot_chunk, decode_call, encode_call, MessageTime, PeerVersion, RaftCall,
    },
    repair::RepairGate,
    security::limits::LimitCounters,
    security::tls::Members,
    types::{NodeId, Raft, TypeConfig},
};

/// The node a peer connection's certificate names and the view that says
/// whether it votes; `None` without TLS.
pub type Sender<'a> = Option<(NodeId, &'a Members)>;

/// What a Raft connection is served with.
#[derive(Clone)]
pub struct RaftPeer {
    pub raft: Raft,
    /// Told of every message from a leader; answers pre-votes.
    pub election: Arc<Election>,
    /// Takes the time of every message accepted from a leader; its value
    /// goes back with every granted vote.
    pub floor: Arc<TimeFloor>,
    /// A snapshot chunk reaching past this many bytes is refused.
    pub max_snapshot_bytes: u64,
    pub counters: Arc<LimitCounters>,
    /// While the node is being repaired, the calls it may not answer yet.
    pub repair: Arc<RepairGate>,
}

impl RaftPeer {
    /// Refuses, counts and logs a frame whose claimed sender `claimed` the
    /// connection's certificate may not speak for ([`sender::check`]); the
    /// connection then closes.
    pub fn admit(
        &self,
        call: RaftCall,
        from: Sender<'_>,
        claimed: Option<NodeId>,
    ) -> io::Result<()> {
        let Some((certificate, members)) = from else {
            return Ok(());
        };
        sender::check(Some(certificate), claimed, members.is_voter(certificate)).map_err(
            |refusal| {
                let counter = match refusal {
                    Refusal::Impersonation { .. } => &self.counters.peer_impersonations,
                    Refusal::NotVoter { node } => {
                        // It may be a voter of a membership this node has not
                        // seen yet: ask the voters.
                        members.refused(node, std::time::Instant::now());
                        &self.counters.peer_not_voter
                    }
                };
                counter.fetch_add(1, Relaxed);
                tracing::warn!(
                    peer_node = certificate,
                    call = call.name(),
                    reason = %refusal,
                    "raft frame refused: its sender may not send it"
                );
                io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("{} refused: {refusal}", call.name()),
                )
            },
        )
    }

    /// Answers one Raft call from `from`, encoded.
    pub async fn answer(
        &self,
        call: RaftCall,
        version: PeerVersion,
        time: MessageTime,
        body: &[u8],
        from: Sender<'_>,
    ) -> io::Result<Vec<u8>> {
        let (raft, floor) = (&self.raft, &self.floor);
        if !self.repair.admits(call) {
            // Like a node that is down: the caller retries later.
            return Err(io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!(
                    "{} refused: this node is being repaired (docs/OPERATIONS.md, \"A damaged node\")",
                    call.name()
                ),
            ));
        }
        let reply = match call {
            RaftCall::AppendEntries => {
                let req: openraft::raft::AppendEntriesRequest<TypeConfig> =
                    decode_call(call, body)?;
                self.admit(call, from, req.vote.leader_id().voted_for())?;
                let time = time.of_term(version, req.vote.leader_id().get_term())?;
                // Held across the append and the recording of its time, so a
                // vote granted after openraft took the append carries it.
                let _gate = floor.gate.read().await;
                let resp = raft.append_entries(req).await;
                self.heard(stream::after_append(&resp, time.at, time.durable))
                    .await?;
                encode_call(call, &resp)?
            }
            RaftCall::Vote => {
                let req: openraft::raft::VoteRequest<NodeId> = decode_call(call, body)?;
                self.admit(call, from, req.vote.leader_id().voted_for())?;
                // A decision to stand waits for this answer (election.rs),
                // also while it waits for the appends ahead of it.
                let _voting = self.election.voting().await;
                let _gate = floor.gate.write().await;
                let resp = raft.vote(req).await;
                if stream::after_vote(&resp) {
                    self.election.heard_from_leader();
                }
                encode_call(call, &resp)?
            }
            RaftCall::InstallSnapshot => {
                let req: openraft::raft::InstallSnapshotRequest<TypeConfig> =
                    decode_call(call, body)?;
                if let Err(e) = check_snapshot_chunk(&req, self.max_snapshot_bytes) {
                    self.counters.snapshot_chunks.fetch_add(1, Relaxed);
                    return Err(e);
                }
                self.admit(call, from, req.vote.leader_id().voted_for())?;
                let _gate = floor.gate.read().await;
                let vote = req.vote;
                let time = time.of_term(version, vote.leader_id().get_term())?;
                let resp = raft.install_snapshot(req).await;
                self.heard(stream::after_snapshot(&resp, vote, time.at, time.durable))
                    .await?;
                encode_call(call, &resp)?
            }
            RaftCall::PreVote => {
                let req: PreVoteRequest = decode_call(call, body)?;
                self.admit(call, from, Some(req.candidate))?;
                encode_call(call, &self.election.answer(raft, &req))?
            }
            RaftCall::TimeoutNow => {
                let req: handoff::TimeoutNow = decode_call(call, body)?;
                self.admit(call, from, Some(req.leader))?;
                let sender = from.map(|(id, _)| id);
                encode_call(call, &handoff::answer(raft, sender, &req).await)?
            }
        };
        Ok(reply)
    }

    /// Executes what hearing (or not) from a leader means.
    async fn heard(&self, heard: Heard) -> io::Result<()> {
        match heard {
            Heard::Nothing => Ok(()),
            Heard::Leader { at, durable } => {
                self.election.heard_from_leader();
                accept_time(&self.floor, at, durable).await
            }
        }
    }
}

/// Records the time of a message accepted from a leader; made durable
/// first when the leader asked (a read will reveal it).
async fn accept_time(floor: &TimeFloor, at: LeaderTime, durable: bool) -> io::Result<()> {
    if durable {
        floor.make_durable(at).await.map_err(|e| {
            tracing::error!(error = %e, "cannot make the cluster time durable");
            e
        })
    } else {
        floor.raise(at);
        Ok(())
    }
}
