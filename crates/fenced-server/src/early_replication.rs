//! Sends a leader's new entries to its followers while its own fdatasync
//! runs, instead of after it.
//!
//! openraft 0.9 runs log writes inside its core task and waits there for the
//! flush callback before it hands the entries to replication, so a commit
//! costs the leader's fdatasync *then* a follower's. Raft does not need that
//! order (Raft thesis §10.2.1: a leader may write to its disk in parallel
//! with replicating): an entry counts towards a majority only once it is
//! durable, and that stays as it was. The leader counts itself only after its
//! own fdatasync (raft-log's callback), a follower answers openraft's own
//! AppendEntries only after its fdatasync, and openraft commits on those
//! answers alone.
//!
//! What this adds is an early copy of the same AppendEntries (the leader's
//! committed vote, the entry before them, the entries) on a connection of
//! its own per follower. The follower handles it like any AppendEntries:
//! refused for a lower vote, refused when the previous entry does not match,
//! otherwise appended and fdatasync'ed. Its reply is read and dropped. When
//! openraft's own AppendEntries follows, the follower has the entries on disk
//! already and answers at once. The early copy is best effort: when a
//! follower is still busy with earlier ones it is skipped, and openraft's
//! replication carries everything as before.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use openraft::{raft::AppendEntriesRequest, RaftMetrics};
use tokio::sync::{mpsc, watch};

use crate::{
    codec,
    network::{Peer, RaftCall},
    types::{Node, NodeId, TypeConfig},
};

/// How long one early copy may take before its connection is dropped.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(1);

/// After a failed copy, how long a follower gets none: a member that is down
/// would otherwise cost a connection attempt per append.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_millis(500);

struct Link {
    addr: String,
    tx: mpsc::Sender<Vec<u8>>,
    /// A copy is on its way or queued. Further ones are skipped: under load
    /// openraft's own AppendEntries is close behind anyway, and a follower
    /// busy with copies would only sync smaller pieces more often.
    busy: Arc<AtomicBool>,
}

/// The leader side: one sending task per follower, made as the membership
/// names them.
pub struct EarlyReplication {
    me: NodeId,
    metrics: watch::Receiver<RaftMetrics<NodeId, Node>>,
    links: Mutex<HashMap<NodeId, Link>>,
    sent: AtomicU64,
}

impl EarlyReplication {
    pub fn new(me: NodeId, metrics: watch::Receiver<RaftMetrics<NodeId, Node>>) -> Self {
        Self {
            me,
            metrics,
            links: Mutex::new(HashMap::new()),
            sent: AtomicU64::new(0),
        }
    }

    pub fn me(&self) -> NodeId {
        self.me
    }

    /// Early copies handed to a follower's connection since start.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Queues `req` for every other member. Never waits.
    pub fn offer(&self, req: &AppendEntriesRequest<TypeConfig>) {
        let targets: Vec<(NodeId, String)> = {
            let m = self.metrics.borrow();
            m.membership_config
                .membership()
                .nodes()
                .filter(|(id, _)| **id != self.me)
                .map(|(id, n)| (*id, n.peer_addr.clone()))
                .collect()
        };
        if targets.is_empty() {
            return;
        }
        let frame = match codec::encode("append_entries", req) {
            Ok(f) => f,
            Err(e) => {
                tracing::warn!(error = %e, "early append not encoded");
                return;
            }
        };
        let mut links = self.links.lock().unwrap_or_else(PoisonError::into_inner);
        links.retain(|id, _| targets.iter().any(|(t, _)| t == id));
        for (target, addr) in targets {
            let link = links
                .entry(target)
                .and_modify(|l| {
                    if l.addr != addr {
                        *l = Link::start(target, addr.clone());
                    }
                })
                .or_insert_with(|| Link::start(target, addr.clone()));
            if link.busy.swap(true, Ordering::AcqRel) {
                continue;
            }
            if link.tx.try_send(frame.clone()).is_ok() {
                self.sent.fetch_add(1, Ordering::Relaxed);
            } else {
                link.busy.store(false, Ordering::Release);
            }
        }
    }
}

impl Link {
    /// Starts the task that sends one follower its early copies in order;
    /// it ends when the link is dropped.
    fn start(target: NodeId, addr: String) -> Self {
        let (tx, mut rx) = mpsc::channel::<Vec<u8>>(1);
        let busy = Arc::new(AtomicBool::new(false));
        let mut peer = Peer::new(target, addr.clone());
        let done = Arc::clone(&busy);
        tokio::spawn(async move {
            while let Some(frame) = rx.recv().await {
                // The reply is not needed: openraft's own AppendEntries
                // learns the follower's state. An error or a timeout drops
                // the connection (the exchange owns it) and the next copy
                // connects again.
                let failure = match tokio::time::timeout(
                    EXCHANGE_TIMEOUT,
                    peer.exchange(RaftCall::AppendEntries, &frame),
                )
                .await
                {
                    Ok(Ok(_)) => None,
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some("no reply in time".to_string()),
                };
                if let Some(error) = failure {
                    tracing::debug!(target_node = target, %error, "early append failed");
                    tokio::time::sleep(PAUSE_AFTER_FAILURE).await;
                }
                done.store(false, Ordering::Release);
            }
        });
        Self { addr, tx, busy }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::{BTreeMap, BTreeSet};

    use openraft::{CommittedLeaderId, EntryPayload, LogId, Membership, StoredMembership, Vote};
    use tokio::{
        io::{AsyncReadExt, AsyncWriteExt, BufStream},
        net::TcpListener,
    };

    use super::*;
    use crate::{
        network::{read_frame, write_frame, PREFACE},
        types::Entry,
    };

    /// A follower that hands every AppendEntries it gets to the test, and
    /// answers only when `answer`.
    async fn follower(
        id: NodeId,
        answer: bool,
        seen: mpsc::UnboundedSender<(NodeId, AppendEntriesRequest<TypeConfig>)>,
    ) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                let seen = seen.clone();
                tokio::spawn(async move {
                    let mut conn = BufStream::new(stream);
                    let mut preface = [0u8; 8];
                    conn.read_exact(&mut preface).await?;
                    assert_eq!(&preface, PREFACE);
                    while let Some(frame) = read_frame(&mut conn).await? {
                        assert_eq!(frame[0], RaftCall::AppendEntries as u8);
                        let _ =
                            seen.send((id, codec::decode("append_entries", &frame[1..]).unwrap()));
                        if answer {
                            write_frame(&mut conn, &[], b"ok").await?;
                            conn.flush().await?;
                        }
                    }
                    Ok::<_, std::io::Error>(())
                });
            }
        });
        addr
    }

    fn metrics(nodes: &[(NodeId, String)]) -> watch::Receiver<RaftMetrics<NodeId, Node>> {
        let voters: BTreeSet<NodeId> = nodes.iter().map(|(id, _)| *id).collect();
        let nodes: BTreeMap<NodeId, Node> = nodes
            .iter()
            .map(|(id, addr)| {
                (
                    *id,
                    Node {
                        peer_addr: addr.clone(),
                        client_addr: String::new(),
                    },
                )
            })
            .collect();
        let mut m = RaftMetrics::new_initial(1);
        m.membership_config = Arc::new(StoredMembership::new(
            None,
            Membership::new(vec![voters], nodes),
        ));
        watch::channel(m).1
    }

    fn request(index: u64) -> AppendEntriesRequest<TypeConfig> {
        let mut vote = Vote::new(2, 1);
        vote.commit();
        let id = |i| LogId::new(CommittedLeaderId::new(2, 1), i);
        AppendEntriesRequest {
            vote,
            prev_log_id: Some(id(index - 1)),
            entries: vec![Entry {
                log_id: id(index),
                payload: EntryPayload::Blank,
            }],
            leader_commit: Some(id(index - 2)),
        }
    }

    #[tokio::test]
    async fn every_other_member_gets_the_append_as_sent() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let nodes = vec![
            // This node's own address is never dialled.
            (1, "127.0.0.1:1".to_string()),
            (2, follower(2, true, tx.clone()).await),
            (3, follower(3, true, tx).await),
        ];
        let early = EarlyReplication::new(1, metrics(&nodes));
        let req = request(7);
        early.offer(&req);
        let mut got = BTreeMap::new();
        for _ in 0..2 {
            let (id, r) = tokio::time::timeout(Duration::from_secs(5), rx.recv())
                .await
                .unwrap()
                .unwrap();
            got.insert(id, r);
        }
        assert_eq!(got.keys().copied().collect::<Vec<_>>(), vec![2, 3]);
        for r in got.values() {
            assert_eq!(r.vote, req.vote);
            assert_eq!(r.prev_log_id, req.prev_log_id);
            assert_eq!(r.entries, req.entries);
            assert_eq!(r.leader_commit, req.leader_commit);
        }
        assert_eq!(early.sent(), 2);
    }

    #[tokio::test]
    async fn a_follower_that_cannot_be_reached_gets_no_copy_for_a_while() {
        // A port nothing listens on: bound, then closed.
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().to_string()
        };
        let nodes = vec![(1, "127.0.0.1:1".to_string()), (2, closed)];
        let early = EarlyReplication::new(1, metrics(&nodes));
        early.offer(&request(7));
        assert_eq!(early.sent(), 1);
        tokio::time::sleep(Duration::from_millis(100)).await;
        early.offer(&request(8));
        assert_eq!(
            early.sent(),
            1,
            "no new connection attempt right after a failure"
        );
        tokio::time::sleep(PAUSE_AFTER_FAILURE + Duration::from_millis(300)).await;
        early.offer(&request(9));
        assert_eq!(early.sent(), 2, "tried again after the pause");
    }

    #[tokio::test]
    async fn a_follower_still_busy_with_a_copy_is_skipped() {
        let (tx, mut rx) = mpsc::unbounded_channel();
        let nodes = vec![
            (1, "127.0.0.1:1".to_string()),
            (2, follower(2, false, tx).await),
        ];
        let early = EarlyReplication::new(1, metrics(&nodes));
        early.offer(&request(7));
        let (_, first) = rx.recv().await.unwrap();
        assert_eq!(first.entries[0].log_id.index, 7);
        // No answer yet: the next copy would only queue behind it.
        early.offer(&request(8));
        assert_eq!(early.sent(), 1);
        assert!(
            tokio::time::timeout(Duration::from_millis(200), rx.recv())
                .await
                .is_err(),
            "nothing else reached the busy follower"
        );
    }
}
