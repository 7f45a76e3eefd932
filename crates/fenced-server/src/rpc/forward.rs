//! Forwarding to the leader: which node leads, the channel to it, the
//! request as forwarded, the refusals that name the leader, and the hints
//! every answer carries.

use std::{
    collections::HashMap,
    future::Future,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant},
};

use fenced_proto::v1::{
    self, cluster_client::ClusterClient, kv_client::KvClient, lock_client::LockClient,
};
use openraft::ServerState;
use tonic::{
    metadata::{Ascii, MetadataMap, MetadataValue},
    transport::Channel,
    Request, Response, Status,
};

use crate::{
    headers::{LEADER_HEADER, NODE_HEADER},
    peer::network::Reachability,
    peer::peer_channel::peer_channel,
    proposer::{leader_of, ProposeError},
    security::auth::FORWARDED_IDENTITY,
    security::tls::NodeTls,
    types::{Node, NodeId},
};

use super::context::NodeContext;

/// What forwarding to the leader keeps: a channel per leader, the calls
/// sent on, the TLS they go over, and which peers this node's Raft calls
/// and pre-votes could not reach (told to a client that finds no leader
/// here).
#[derive(Default)]
pub(crate) struct Forwarding {
    /// By leader id and address: the answer must come from that node's
    /// certificate, and an id may move to another address.
    channels: Mutex<HashMap<(NodeId, String), Channel>>,
    sent: AtomicU64,
    /// Forwarded calls go over mutual TLS when set.
    tls: Option<Arc<NodeTls>>,
    reachability: Arc<Reachability>,
}

impl Forwarding {
    pub(super) fn new(tls: Option<Arc<NodeTls>>, reachability: Arc<Reachability>) -> Self {
        Self {
            tls,
            reachability,
            ..Self::default()
        }
    }
}

/// Marks a request a follower forwarded, so it is never forwarded twice: a
/// node that is not the leader refuses such a call instead.
pub const FORWARDED: &str = "x-fenced-forwarded";
/// Extra time a parked acquire waits past its `wait_ms` for the answer.
pub(crate) const WAIT_GRACE: Duration = Duration::from_secs(5);
impl NodeContext {
    /// UNAVAILABLE naming the leader (with its client address in
    /// [`LEADER_HEADER`]), or, when there is none, this node and how many
    /// members it reaches, so that a client can say why.
    pub(super) fn not_leader(&self, leader: Option<&(NodeId, Node)>) -> Status {
        if leader.is_some() {
            return not_leader(leader);
        }
        let voters: Vec<NodeId> = {
            let metrics = self.replica.raft.metrics();
            let m = metrics.borrow();
            m.membership_config.membership().voter_ids().collect()
        };
        let reachable = voters
            .iter()
            .filter(|id| **id == self.replica.id || self.forwarding.reachability.is_reachable(**id))
            .count();
        Status::unavailable(no_leader_message(self.replica.id, reachable, voters.len()))
    }

    pub(crate) fn propose_status(&self, e: ProposeError) -> Status {
        match e {
            ProposeError::NotLeader { leader } => self.not_leader(leader.as_ref()),
            e => propose_status(e),
        }
    }

    /// The leader, when it is known and is not this node.
    pub(crate) fn other_leader(&self) -> Option<(NodeId, Node)> {
        // Read in place: cloning the metrics (membership included) on every
        // request costs more than the check.
        if self.replica.raft.metrics().borrow().state == ServerState::Leader {
            return None;
        }
        leader_of(&self.replica.raft)
    }

    pub(crate) fn channel_to(&self, leader: &(NodeId, Node)) -> Result<Channel, Status> {
        let mut map = self
            .forwarding
            .channels
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        // By id and address: the answer must come from that node's
        // certificate, and an id may move to another address.
        let key = (leader.0, leader.1.peer_addr.clone());
        if let Some(ch) = map.get(&key) {
            return Ok(ch.clone());
        }
        let addr = &key.1;
        let ch = peer_channel(addr, self.forwarding.tls.as_ref(), Some(leader.0))
            .map_err(|e| Status::unavailable(format!("leader address {addr}: {e}")))?;
        map.insert(key, ch.clone());
        Ok(ch)
    }

    /// Calls this node has forwarded to the leader since it started.
    pub fn forwarded_calls(&self) -> u64 {
        self.forwarding.sent.load(Ordering::Relaxed)
    }

    /// Counts a call sent on to the leader.
    fn count_forward(&self) {
        self.forwarding.sent.fetch_add(1, Ordering::Relaxed);
    }

    /// The leader hint, `<id>,<client address>`, as this node knows it now.
    fn leader_hint(&self) -> Option<MetadataValue<Ascii>> {
        // Read in place, like `other_leader`: this runs on every answer.
        let metrics = self.replica.raft.metrics();
        let m = metrics.borrow();
        let id = m.current_leader?;
        let node = m.membership_config.membership().get_node(&id)?;
        leader_hint_value(id, &node.client_addr)
    }

    /// Puts this node's id and its leader hint on an answer. A hint already
    /// there came from the leader itself (a forwarded call) and stays.
    pub(crate) fn hinted<T>(
        &self,
        answer: Result<Response<T>, Status>,
    ) -> Result<Response<T>, Status> {
        let node = MetadataValue::from(self.replica.id);
        match answer {
            Ok(mut resp) => {
                self.add_hint(resp.metadata_mut(), node);
                Ok(resp)
            }
            Err(mut status) => {
                self.add_hint(status.metadata_mut(), node);
                Err(status)
            }
        }
    }

    fn add_hint(&self, md: &mut MetadataMap, node: MetadataValue<Ascii>) {
        md.insert(NODE_HEADER, node);
        if !md.contains_key(LEADER_HEADER) {
            if let Some(hint) = self.leader_hint() {
                md.insert(LEADER_HEADER, hint);
            }
        }
    }
}

/// `<id>,<client address>`; `None` when the address is unknown or cannot
/// travel in metadata.
fn leader_hint_value(id: NodeId, client_addr: &str) -> Option<MetadataValue<Ascii>> {
    if client_addr.is_empty() {
        return None;
    }
    MetadataValue::try_from(format!("{id},{client_addr}")).ok()
}

fn is_forwarded<T>(req: &Request<T>) -> bool {
    req.metadata().contains_key(FORWARDED)
}

/// The call to send the leader: it carries the identity this node
/// authenticated, which the leader trusts on its peer port only.
/// The forwarded request carries the caller's own bearer token when it had
/// one, so the leader authenticates it itself; a certificate identity goes
/// by name, believed only over the peer port's mutual TLS.
fn forwarded<T>(
    msg: T,
    timeout: Duration,
    authorization: Option<MetadataValue<tonic::metadata::Ascii>>,
    identity: Option<&str>,
) -> Result<Request<T>, Status> {
    let mut req = Request::new(msg);
    req.metadata_mut()
        .insert(FORWARDED, MetadataValue::from_static("1"));
    if let Some(token) = authorization {
        req.metadata_mut().insert("authorization", token);
    } else if let Some(identity) = identity {
        let value = MetadataValue::try_from(identity)
            .map_err(|_| Status::internal("the identity's name cannot be forwarded"))?;
        req.metadata_mut().insert(FORWARDED_IDENTITY, value);
    }
    req.set_timeout(timeout);
    Ok(req)
}

/// What a node without a leader tells a client.
fn no_leader_message(me: NodeId, reachable: usize, members: usize) -> String {
    format!(
        "node {me} has no leader: {reachable} of {members} members reachable; \
         a majority ({}) must run and reach each other; retry with backoff",
        members / 2 + 1
    )
}

pub(crate) fn not_leader(leader: Option<&(NodeId, Node)>) -> Status {
    match leader {
        None => Status::unavailable("no leader is elected right now; retry with backoff"),
        Some((id, node)) => {
            let mut status = Status::unavailable(format!(
                "this node is not the leader; the leader is node {id} (client address {})",
                if node.client_addr.is_empty() {
                    "unknown"
                } else {
                    &node.client_addr
                }
            ));
            if let Some(v) = leader_hint_value(*id, &node.client_addr) {
                status.metadata_mut().insert(LEADER_HEADER, v);
            }
            status
        }
    }
}

pub(crate) fn propose_status(e: ProposeError) -> Status {
    match e {
        ProposeError::NotLeader { leader } => not_leader(leader.as_ref()),
        ProposeError::QueueFull(_) => Status::resource_exhausted(e.to_string()),
        ProposeError::Unknown(_) | ProposeError::Unavailable(_) => {
            Status::unavailable(e.to_string())
        }
        ProposeError::DeadlineExceeded => Status::deadline_exceeded(e.to_string()),
        ProposeError::Internal(_) => Status::internal(e.to_string()),
    }
}

/// The timeout of a forwarded call: what is left of the caller's deadline
/// (so the leader drops the command once the caller gave up), at most
/// `budget`. `None` when the deadline has already passed.
fn forward_timeout(deadline: Option<Instant>, budget: Duration) -> Option<Duration> {
    match deadline {
        None => Some(budget),
        Some(d) => {
            let left = d.checked_duration_since(Instant::now())?;
            (!left.is_zero()).then(|| left.min(budget))
        }
    }
}

/// A call a follower can hand to the leader: the generated client method
/// that carries it there, and its name for the log.
pub(crate) trait ToLeader: Clone + Send + Sync + 'static {
    type Reply: Send + 'static;
    const RPC: &'static str;
    fn send(
        leader: Channel,
        req: Request<Self>,
    ) -> impl Future<Output = Result<Response<Self::Reply>, Status>> + Send;
}

/// One line per forwardable call: `Client::method(Request) -> Reply`.
macro_rules! to_leader {
    ($($client:ident :: $method:ident ($req:ty) -> $reply:ty;)*) => {$(
        impl ToLeader for $req {
            type Reply = $reply;
            const RPC: &'static str = stringify!($method);
            fn send(
                leader: Channel,
                req: Request<Self>,
            ) -> impl Future<Output = Result<Response<$reply>, Status>> + Send {
                async move { $client::new(leader).$method(req).await }
            }
        }
    )*};
}

to_leader! {
    LockClient::acquire(v1::AcquireRequest) -> v1::AcquireResponse;
    LockClient::renew(v1::RenewRequest) -> v1::RenewResponse;
    LockClient::renew_many(v1::RenewManyRequest) -> v1::RenewManyResponse;
    LockClient::release(v1::ReleaseRequest) -> v1::ReleaseResponse;
    LockClient::acquire_in_session(v1::AcquireInSessionRequest) -> v1::AcquireResponse;
    LockClient::open_session(v1::OpenSessionRequest) -> v1::SessionResponse;
    LockClient::keep_alive(v1::KeepAliveRequest) -> v1::SessionResponse;
    LockClient::close_session(v1::CloseSessionRequest) -> v1::CloseSessionResponse;
    LockClient::describe(v1::DescribeRequest) -> v1::DescribeResponse;
    LockClient::validate_token(v1::ValidateTokenRequest) -> v1::ValidateTokenResponse;
    LockClient::validate_tokens(v1::ValidateTokensRequest) -> v1::ValidateTokensResponse;
    LockClient::history(v1::HistoryRequest) -> v1::HistoryResponse;
    KvClient::put(v1::KvPutRequest) -> v1::KvPutResponse;
    KvClient::delete(v1::KvDeleteRequest) -> v1::KvDeleteResponse;
    KvClient::get(v1::KvGetRequest) -> v1::KvGetResponse;
    ClusterClient::add_learner(v1::AddLearnerRequest) -> v1::MembershipResponse;
    ClusterClient::change_membership(v1::ChangeMembershipRequest) -> v1::MembershipResponse;
    ClusterClient::remove_node(v1::RemoveNodeRequest) -> v1::MembershipResponse;
    ClusterClient::promote_learner(v1::PromoteLearnerRequest) -> v1::MembershipResponse;
    ClusterClient::list_members(v1::ListMembersRequest) -> v1::ListMembersResponse;
}

impl NodeContext {
    /// The leader's answer to `req` when another node leads; `None` when
    /// the call is this node's to serve. It goes as `identity` (authorized
    /// here; the leader checks it again), with what is left of the caller's
    /// `deadline`: a call whose deadline passed before it could be
    /// forwarded (this node was paused, say) is answered DEADLINE_EXCEEDED
    /// unforwarded, and a call already forwarded once is refused, never sent
    /// on again.
    pub(crate) async fn to_leader<T: ToLeader>(
        &self,
        req: &Request<T>,
        deadline: Option<Instant>,
        identity: Option<&str>,
    ) -> Option<Result<Response<T::Reply>, Status>> {
        self.to_leader_within(req, deadline, identity, Duration::ZERO)
            .await
    }

    /// As [`NodeContext::to_leader`], for a call that may take `extra` past
    /// the request timeout at the leader (a blocking acquire's wait).
    pub(crate) async fn to_leader_within<T: ToLeader>(
        &self,
        req: &Request<T>,
        deadline: Option<Instant>,
        identity: Option<&str>,
        extra: Duration,
    ) -> Option<Result<Response<T::Reply>, Status>> {
        let leader = self.other_leader()?;
        Some(self.forward(&leader, req, deadline, identity, extra).await)
    }

    async fn forward<T: ToLeader>(
        &self,
        leader: &(NodeId, Node),
        req: &Request<T>,
        deadline: Option<Instant>,
        identity: Option<&str>,
        extra: Duration,
    ) -> Result<Response<T::Reply>, Status> {
        if is_forwarded(req) {
            return Err(not_leader(Some(leader)));
        }
        let budget = self.policy.request_timeout + WAIT_GRACE + extra;
        let Some(timeout) = forward_timeout(deadline, budget) else {
            self.replica.proposer.note_deadline_drop();
            tracing::info!(
                rpc = T::RPC,
                leader = leader.0,
                "request not forwarded: its caller's deadline passed"
            );
            return Err(Status::deadline_exceeded(
                "the caller's deadline passed before the request reached the leader; \
                 nothing was written",
            ));
        };
        let channel = self.channel_to(leader)?;
        self.count_forward();
        let authorization = req.metadata().get("authorization").cloned();
        let sent = forwarded(req.get_ref().clone(), timeout, authorization, identity)?;
        T::send(channel, sent).await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    #[test]
    fn a_node_without_a_leader_names_itself_and_the_majority_it_needs() {
        assert_eq!(
            no_leader_message(2, 1, 3),
            "node 2 has no leader: 1 of 3 members reachable; a majority (2) must run and \
             reach each other; retry with backoff"
        );
        assert!(no_leader_message(1, 2, 5).contains("2 of 5 members reachable; a majority (3)"));
    }

    #[test]
    fn a_forward_gets_only_what_is_left_of_the_deadline() {
        let budget = Duration::from_secs(15);
        assert_eq!(forward_timeout(None, budget), Some(budget));
        let left = forward_timeout(Some(Instant::now() + Duration::from_secs(2)), budget)
            .expect("time left");
        assert!(left <= Duration::from_secs(2) && left > Duration::from_secs(1));
        assert_eq!(
            forward_timeout(Some(Instant::now() + Duration::from_secs(60)), budget),
            Some(budget)
        );
        assert_eq!(forward_timeout(Some(Instant::now()), budget), None);
        let past = Instant::now()
            .checked_sub(Duration::from_millis(5))
            .expect("a monotonic clock well past its start");
        assert_eq!(forward_timeout(Some(past), budget), None);
    }

    #[test]
    fn the_leader_hint_is_id_comma_address_or_nothing() {
        let hint = leader_hint_value(2, "10.0.0.2:7101").expect("a hint");
        assert_eq!(hint.to_str().ok(), Some("2,10.0.0.2:7101"));
        assert!(leader_hint_value(2, "").is_none(), "no address, no hint");
        assert!(
            leader_hint_value(2, "bad\naddress").is_none(),
            "an address that cannot travel in metadata is left out"
        );
    }
}
