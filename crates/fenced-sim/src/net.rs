//! The simulated network: every Raft call between nodes, as
//! [`fenced_server::network::Wire`] carries it, delivered to the target's
//! real [`RaftPeer`] after a delay drawn from the run's seed, or lost to a
//! partition, a stopped node or a frozen one.

use std::{
    collections::{BTreeMap, BTreeSet},
    io,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use fenced_server::{
    clock::floor::LeaderTime,
    network::{MessageTime, PeerVersion, RaftCall, Wire, WireReply},
    replication::RaftPeer,
    types::NodeId,
};
use tokio::sync::watch;

use crate::Rng;

/// Who can reach whom, and the nodes' answerers.
pub struct Net {
    rng: Rng,
    /// The answerer of each running node; absent while it is stopped.
    peers: Mutex<BTreeMap<NodeId, RaftPeer>>,
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

    pub fn attach(&self, id: NodeId, peer: RaftPeer) {
        lock(&self.peers).insert(id, peer);
    }

    pub fn detach(&self, id: NodeId) {
        lock(&self.peers).remove(&id);
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
