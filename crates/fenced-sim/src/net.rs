//! The simulated network: every Raft call between nodes, as
//! [`fenced_server::peer::network::Wire`] carries it, delivered to the target's
//! real [`RaftPeer`] after a delay drawn from the run's seed, or lost to a
//! partition, a stopped node or a frozen one.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use fenced_proto::v1::{self, cluster_server::Cluster as _};
use fenced_server::{
    clock::floor::LeaderTime,
    peer::network::{MessageTime, PeerVersion, RaftCall, Wire, WireReply},
    repair::run::{AskStatus, StatusAnswer},
    replication::RaftPeer,
    rpc::{ClusterService, NodeContext},
    types::NodeId,
};
use tokio::sync::watch;

use crate::Rng;

/// Who can reach whom, and the nodes' answerers.
pub struct Net {
    rng: Rng,
    /// The answerer of each running node; absent while it is stopped.
    peers: Mutex<BTreeMap<NodeId, RaftPeer>>,
    /// What each running node answers a status question from.
    contexts: Mutex<BTreeMap<NodeId, NodeContext>>,
    /// Directed cuts: (from, to) messages are lost.
    cuts: Mutex<BTreeSet<(NodeId, NodeId)>>,
    /// Frozen nodes (a paused process): their messages, both ways, wait.
    frozen: watch::Sender<BTreeSet<NodeId>>,
}

impl Net {
    pub fn new(rng: Rng) -> Arc<Self> {
        Arc::new(Self {
            rng,
            peers: Mutex::default(),
            contexts: Mutex::default(),
            cuts: Mutex::default(),
            frozen: watch::Sender::new(BTreeSet::new()),
        })
    }

    /// The wire node `from` sends on.
    pub fn wire(self: &Arc<Self>, from: NodeId) -> Arc<dyn Wire> {
        Arc::new(Link {
            from,
            net: Arc::clone(self),
        })
    }

    pub fn attach(&self, id: NodeId, peer: RaftPeer, ctx: NodeContext) {
        lock(&self.peers).insert(id, peer);
        lock(&self.contexts).insert(id, ctx);
    }

    pub fn detach(&self, id: NodeId) {
        lock(&self.peers).remove(&id);
        lock(&self.contexts).remove(&id);
    }

    /// How node `from` asks the others for their status (a node being
    /// repaired does), over this network.
    pub fn status_asker(self: &Arc<Self>, from: NodeId) -> Arc<dyn AskStatus> {
        Arc::new(StatusLink {
            from,
            net: Arc::clone(self),
        })
    }

    /// A status question from `from` to the node at `addr` (`sim-nID:PORT`):
    /// held while either is frozen, lost to a cut (the caller's timeout
    /// ends it), refused at once by a stopped node.
    async fn status(
        &self,
        from: NodeId,
        addr: &str,
        expect: Option<NodeId>,
    ) -> Option<v1::StatusResponse> {
        let to: NodeId = addr
            .strip_prefix("sim-n")?
            .split(':')
            .next()?
            .parse()
            .ok()?;
        if expect.is_some_and(|e| e != to) {
            return None;
        }
        self.thawed(from, to).await;
        tokio::time::sleep(self.delay()).await;
        if self.is_cut(from, to) {
            std::future::pending::<()>().await;
        }
        let ctx = lock(&self.contexts).get(&to).cloned()?;
        let answer = ClusterService::new(ctx, false)
            .status(tonic::Request::new(v1::StatusRequest {
                with_digest: false,
            }))
            .await
            .ok()?
            .into_inner();
        self.thawed(from, to).await;
        tokio::time::sleep(self.delay()).await;
        if self.is_cut(to, from) {
            std::future::pending::<()>().await;
        }
        Some(answer)
    }

    /// Cuts `node` off from every other node, both ways.
    pub fn isolate(&self, node: NodeId, all: &[NodeId]) {
        let mut cuts = lock(&self.cuts);
        for &other in all.iter().filter(|o| **o != node) {
            cuts.insert((node, other));
            cuts.insert((other, node));
        }
    }

    /// Cuts one direction only: `from`'s messages to `to` are lost.
    pub fn cut(&self, from: NodeId, to: NodeId) {
        lock(&self.cuts).insert((from, to));
    }

    pub fn heal(&self) {
        lock(&self.cuts).clear();
    }

    pub fn freeze(&self, node: NodeId) {
        self.frozen.send_modify(|f| {
            f.insert(node);
        });
    }

    pub fn thaw_all(&self) {
        self.frozen.send_modify(BTreeSet::clear);
    }

    fn is_cut(&self, from: NodeId, to: NodeId) -> bool {
        lock(&self.cuts).contains(&(from, to))
    }

    /// Waits while `a` or `b` is frozen.
    async fn thawed(&self, a: NodeId, b: NodeId) {
        let mut rx = self.frozen.subscribe();
        let _ = rx.wait_for(|f| !f.contains(&a) && !f.contains(&b)).await;
    }

    /// One way's delay: mostly a fraction of a millisecond, now and then a
    /// slow moment.
    fn delay(&self) -> Duration {
        self.rng.latency(3, 5_000..80_000, 100..1_500)
    }

    async fn deliver(
        &self,
        from: NodeId,
        to: NodeId,
        call: RaftCall,
        time: MessageTime,
        payload: Vec<u8>,
    ) -> io::Result<(LeaderTime, Vec<u8>)> {
        self.thawed(from, to).await;
        tokio::time::sleep(self.delay()).await;
        let lost = || {
            io::Error::new(
                io::ErrorKind::TimedOut,
                format!("simulated network: {from} -> {to} lost"),
            )
        };
        let peer = lock(&self.peers).get(&to).cloned();
        let Some(peer) = peer.filter(|_| !self.is_cut(from, to)) else {
            // A lost message: the sender waits as for a timeout.
            let wait = Duration::from_millis(self.rng.lock().u64(50..500));
            tokio::time::sleep(wait).await;
            return Err(lost());
        };
        if call == RaftCall::TimeoutNow {
            return Err(io::Error::other("simulated network: call not simulated"));
        }
        let reply = peer
            .answer(call, PeerVersion::V3, time, &payload, None)
            .await?;
        let floor = peer.floor.leader_time();
        self.thawed(from, to).await;
        tokio::time::sleep(self.delay()).await;
        if self.is_cut(to, from) {
            return Err(lost());
        }
        Ok((floor, reply))
    }
}

struct StatusLink {
    from: NodeId,
    net: Arc<Net>,
}

impl AskStatus for StatusLink {
    fn status(&self, addr: String, expect: Option<NodeId>, timeout: Duration) -> StatusAnswer {
        let (net, from) = (Arc::clone(&self.net), self.from);
        Box::pin(async move {
            tokio::time::timeout(timeout, net.status(from, &addr, expect))
                .await
                .ok()
                .flatten()
        })
    }
}

struct Link {
    from: NodeId,
    net: Arc<Net>,
}

impl Wire for Link {
    fn exchange(
        &self,
        target: NodeId,
        call: RaftCall,
        time: MessageTime,
        payload: Vec<u8>,
    ) -> WireReply {
        let (net, from) = (Arc::clone(&self.net), self.from);
        Box::pin(async move { net.deliver(from, target, call, time, payload).await })
    }
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}
