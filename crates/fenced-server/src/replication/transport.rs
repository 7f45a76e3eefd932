//! openraft's transport ([`RaftNetworkFactory`]): one [`RaftClient`] per
//! replication stream or leadership check, each on its own connection
//! ([`crate::peer::network::Peer`]). It executes [`super::stream::Stream`]'s plan
//! for each AppendEntries: answered from a stored early copy
//! ([`super::early::EarlyAnswers`]) or sent, stamped with this node's
//! cluster time.
//!
//! Every request carries the sender's cluster time and every reply the
//! answerer's floor ([`crate::clock::floor`]): a candidate learns from each
//! granted vote the highest time its voter accepted, so the next leader's
//! clock starts where the last one's left off (DECISIONS.md, "Cluster time
//! rides on every Raft message").

use std::sync::Arc;

use openraft::{
    error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable},
    network::{RPCOption, RaftNetwork, RaftNetworkFactory},
    raft::{
        AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest,
        InstallSnapshotResponse, VoteRequest, VoteResponse,
    },
    AnyError,
};
use serde::{de::DeserializeOwned, Serialize};

use super::{
    early::EarlyAnswers,
    stream::{Plan, Stream},
};
use crate::{
    clock::{floor::LeaderTime, ClusterClock},
    codec,
    peer::network::{MessageTime, Peer, RaftCall, Reachability, Wire},
    security::tls::NodeTls,
    types::{Node, NodeId, TypeConfig},
};

/// Makes one Raft client per replication stream, each with its own
/// connection.
#[derive(Clone)]
pub struct Network {
    /// Followers' answers to early copies of this node's appends.
    early: Arc<EarlyAnswers>,
    time: Arc<ClusterClock>,
    tls: Option<Arc<NodeTls>>,
    reachability: Arc<Reachability>,
    wire: Option<Arc<dyn Wire>>,
}

impl Network {
    pub fn new(early: Arc<EarlyAnswers>, time: Arc<ClusterClock>) -> Self {
        Self {
            early,
            time,
            tls: None,
            reachability: Arc::default(),
            wire: None,
        }
    }

    /// Which peers this node's Raft calls could not reach.
    pub fn reachability(&self) -> Arc<Reachability> {
        Arc::clone(&self.reachability)
    }

    /// Connects to peers over mutual TLS.
    pub fn with_tls(self, tls: Option<Arc<NodeTls>>) -> Self {
        Self { tls, ..self }
    }

    /// Sends Raft calls over `wire` instead of TCP (simulation).
    pub fn with_wire(self, wire: Option<Arc<dyn Wire>>) -> Self {
        Self { wire, ..self }
    }
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = RaftClient;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> RaftClient {
        let peer = Peer::new(target, node.peer_addr.clone())
            .with_reachability(Some(Arc::clone(&self.reachability)))
            .with_tls(self.tls.clone())
            .with_wire(self.wire.clone());
        RaftClient::new(
            peer,
            Some(Arc::clone(&self.early)),
            Some(Arc::clone(&self.time)),
        )
    }
}

/// openraft's client for one follower on one connection.
pub struct RaftClient {
    peer: Peer,
    early: Option<Arc<EarlyAnswers>>,
    /// This node's clock: stamps requests, takes the floors voters send.
    time: Option<Arc<ClusterClock>>,
    stream: Stream,
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

type CallError<E> = RPCError<NodeId, Node, RaftError<NodeId, E>>;

impl RaftClient {
    /// A client on `peer` whose AppendEntries may be answered from the
    /// follower's answers to `early` copies, stamped with `time`.
    pub fn new(
        peer: Peer,
        early: Option<Arc<EarlyAnswers>>,
        time: Option<Arc<ClusterClock>>,
    ) -> Self {
        Self {
            peer,
            early,
            time,
            stream: Stream::default(),
        }
    }

    /// Names the call, the peer and what went wrong (built only on errors).
    fn failed(&self, call: RaftCall, what: String) -> TransportError {
        TransportError(format!(
            "{} to node {} at {}: {what}",
            call.name(),
            self.peer.target(),
            self.peer.addr()
        ))
    }

    /// The time a message from a node in `term` carries.
    fn stamp(&self, term: u64, durable: bool) -> MessageTime {
        match &self.time {
            Some(time) => MessageTime {
                at: time.for_message(term),
                durable,
            },
            None => MessageTime::NONE,
        }
    }

    async fn call<Req, Resp, E>(
        &mut self,
        call: RaftCall,
        time: MessageTime,
        req: &Req,
        option: &RPCOption,
    ) -> Result<(LeaderTime, Resp), CallError<E>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let rpc = call.name();
        let payload =
            codec::encode(rpc, req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let reply = match tokio::time::timeout(
            option.hard_ttl(),
            self.peer.exchange_timed(call, time, &payload),
        )
        .await
        {
            Ok(Ok(reply)) => reply,
            Ok(Err(e)) => {
                // Logged by exchange_timed, once per outage; openraft's own
                // error line for an Unreachable is dropped (crate::observe::raft_noise).
                return Err(RPCError::Unreachable(Unreachable::new(
                    &self.failed(call, e.to_string()),
                )));
            }
            Err(_) => {
                // The connection went with the dropped exchange: a reply
                // still on its way can never be read as the next one.
                return Err(RPCError::Network(NetworkError::new(
                    &self.failed(call, format!("no reply within {:?}", option.hard_ttl())),
                )));
            }
        };
        let (floor, reply) = reply;
        let reply: Result<Resp, RaftError<NodeId, E>> =
            codec::decode(rpc, &reply).map_err(|e| {
                self.peer.disconnect();
                RPCError::Network(NetworkError::from(AnyError::new(&e)))
            })?;
        reply
            .map(|r| (floor, r))
            .map_err(|e| RPCError::RemoteError(RemoteError::new(self.peer.target(), e)))
    }
}

impl RaftNetwork<TypeConfig> for RaftClient {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        let has_entries = !rpc.entries.is_empty();
        let plan = self.stream.plan(has_entries, self.early.is_some());
        if let (Some(early), Plan::CoverEntries | Plan::CoverHeartbeat) = (&self.early, plan) {
            // The follower's own answer, given already to an early copy
            // (see super::early). Half the soft deadline leaves the ordinary
            // call time enough when the copy failed.
            let wait = option.soft_ttl() / 2;
            let target = self.peer.target();
            let covered = if plan == Plan::CoverHeartbeat {
                early.cover_heartbeat(target, &rpc, wait).await
            } else {
                early.cover(target, &rpc, wait).await
            };
            if covered {
                self.stream.covered(plan);
                return Ok(AppendEntriesResponse::Success);
            }
        }
        let durable_time = self.stream.durable_time(has_entries);
        let time = self.stamp(rpc.vote.leader_id().get_term(), durable_time);
        let answer = self
            .call(RaftCall::AppendEntries, time, &rpc, &option)
            .await
            .map(|(_, r)| r);
        self.stream.answered(answer.as_ref().ok());
        answer
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>,
    > {
        let time = self.stamp(rpc.vote.leader_id().get_term(), false);
        self.call(RaftCall::InstallSnapshot, time, &rpc, &option)
            .await
            .map(|(_, r)| r)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        let time = self.stamp(rpc.vote.leader_id().get_term(), false);
        let (floor, resp): (_, VoteResponse<NodeId>) =
            self.call(RaftCall::Vote, time, &rpc, &option).await?;
        // The voter's floor as of its grant: the highest time it accepted
        // from any leader before it. The new leader's clock starts there.
        if resp.vote_granted {
            if let Some(t) = &self.time {
                t.floor().raise(floor);
            }
        }
        Ok(resp)
    }
}
