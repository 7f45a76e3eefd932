//! The Raft transport between nodes: tonic over long-lived HTTP/2 channels to
//! each peer's peer port, one RPC per Raft message, payloads in the versioned
//! codec. Connections are made lazily and re-made by tonic after a failure;
//! openraft backs off after `Unreachable`.

use std::{collections::HashMap, time::Duration};

use fenced_proto::v1::{raft_client::RaftClient, RaftMessage};
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
use tonic::transport::{Channel, Endpoint};

use crate::{
    codec,
    types::{Node, NodeId, TypeConfig},
};

/// The largest Raft message accepted or sent, in bytes.
pub const RAFT_MESSAGE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// Opens a lazily connecting channel to `addr` (host:port).
pub fn channel(addr: &str, connect_timeout: Duration) -> Result<Channel, tonic::transport::Error> {
    Ok(Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(connect_timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5))
        .connect_lazy())
}

/// Hands out one long-lived channel per peer address.
#[derive(Clone, Default)]
pub struct Network {
    channels: HashMap<String, Channel>,
}

pub struct Peer {
    target: NodeId,
    addr: String,
    client: Option<RaftClient<Channel>>,
}

impl RaftNetworkFactory<TypeConfig> for Network {
    type Network = Peer;

    async fn new_client(&mut self, target: NodeId, node: &Node) -> Peer {
        let client = match self.channels.get(&node.peer_addr) {
            Some(ch) => Some(ch.clone()),
            None => match channel(&node.peer_addr, Duration::from_secs(1)) {
                Ok(ch) => {
                    self.channels.insert(node.peer_addr.clone(), ch.clone());
                    Some(ch)
                }
                Err(e) => {
                    tracing::warn!(target_node = target, addr = %node.peer_addr, error = %e, "bad peer address");
                    None
                }
            },
        }
        .map(|ch| {
            RaftClient::new(ch)
                .max_decoding_message_size(RAFT_MESSAGE_MAX_BYTES)
                .max_encoding_message_size(RAFT_MESSAGE_MAX_BYTES)
        });
        Peer {
            target,
            addr: node.peer_addr.clone(),
            client,
        }
    }
}

#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct TransportError(String);

impl Peer {
    async fn call<Req, Resp, E>(
        &mut self,
        rpc: &'static str,
        req: &Req,
        option: &RPCOption,
    ) -> Result<Resp, RPCError<NodeId, Node, RaftError<NodeId, E>>>
    where
        Req: Serialize,
        Resp: DeserializeOwned,
        E: std::error::Error + DeserializeOwned,
    {
        let Some(client) = self.client.as_mut() else {
            return Err(RPCError::Unreachable(Unreachable::new(&TransportError(
                format!("invalid peer address {}", self.addr),
            ))));
        };
        let payload =
            codec::encode(rpc, req).map_err(|e| RPCError::Network(NetworkError::new(&e)))?;
        let mut request = tonic::Request::new(RaftMessage { payload });
        request.set_timeout(option.hard_ttl());
        let response = match rpc {
            "append_entries" => client.append_entries(request).await,
            "vote" => client.vote(request).await,
            _ => client.install_snapshot(request).await,
        };
        let response = response.map_err(|status| {
            let err = TransportError(format!(
                "{rpc} to node {} at {}: {status}",
                self.target, self.addr
            ));
            match status.code() {
                tonic::Code::Unavailable | tonic::Code::Unknown => {
                    RPCError::Unreachable(Unreachable::new(&err))
                }
                _ => RPCError::Network(NetworkError::new(&err)),
            }
        })?;
        let reply: Result<Resp, RaftError<NodeId, E>> =
            codec::decode(rpc, &response.into_inner().payload)
                .map_err(|e| RPCError::Network(NetworkError::from(AnyError::new(&e))))?;
        reply.map_err(|e| RPCError::RemoteError(RemoteError::new(self.target, e)))
    }
}

impl RaftNetwork<TypeConfig> for Peer {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call("append_entries", &rpc, &option).await
    }

    async fn install_snapshot(
        &mut self,
        rpc: InstallSnapshotRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>,
    > {
        self.call("install_snapshot", &rpc, &option).await
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        self.call("vote", &rpc, &option).await
    }
}
