//! Sends a leader's new entries to its followers while its own fdatasync
//! runs, instead of after it: the I/O side of [`super::copies`], which
//! decides what is copied to whom and what an answer vouches for.
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
//! otherwise appended and fdatasync'ed, and it answers only after that
//! fdatasync (openraft's follower writes and syncs before it replies).
//!
//! The answer is kept in [`EarlyAnswers`]. When openraft's own AppendEntries
//! for those entries follows, the transport ([`super::transport`]) looks there
//! first: a success for an early copy under the same vote that reached at
//! least as far is the answer the follower would give again (its log matches
//! the leader's up to there, durably, and a leader never rewrites its log
//! under one vote), so it is returned without a second round trip. Anything
//! else (no copy, a refusal, an error, a copy still unanswered after a while)
//! and the AppendEntries goes to the follower as usual. The early copy is
//! best effort: when a follower is still busy with earlier ones it is
//! skipped, and openraft's replication carries everything as before.
//!
//! openraft also follows every commit with a heartbeat to each follower that
//! only tells it the new commit index: one more round trip per follower per
//! command, about as much CPU as the append itself on a small machine. On a
//! replication stream, such a heartbeat is answered from a stored copy under
//! the same vote that reached its previous entry
//! ([`EarlyAnswers::cover_heartbeat`]): that is all the follower's answer
//! would say, since its log cannot lose what it stored under that vote. The
//! commit index then rides on the next copy (every copy carries the leader's
//! commit index); the stream's next heartbeat always goes out, so when
//! writes stop a follower learns the commit index at the latest one
//! heartbeat interval later. Commit needs no heartbeat: it counts only
//! answers to entries. openraft's leadership checks use connections of their
//! own, which are never answered this way.

use std::{
    collections::HashMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::Duration,
};

use openraft::{
    error::RaftError,
    raft::{AppendEntriesRequest, AppendEntriesResponse},
    RaftMetrics,
};
// tokio's clock: the simulation runs it paused, and the real one otherwise.
use tokio::{
    sync::{mpsc, watch},
    time::Instant,
};

use super::copies::{self, Kept, Need, Sent};
use crate::{
    codec,
    peer::network::{Peer, RaftCall, Wire},
    security::tls::NodeTls,
    storage::log_store::{AppendSink, Appended},
    types::{Node, NodeId, TypeConfig},
};

/// How long one early copy may take before its connection is dropped.
const EXCHANGE_TIMEOUT: Duration = Duration::from_secs(1);

/// After a failed copy, how long a follower gets none: a member that is down
/// would otherwise cost a connection attempt per append.
const PAUSE_AFTER_FAILURE: Duration = Duration::from_millis(500);

/// How a follower answered an early copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Answer {
    Pending,
    /// Appended and fdatasync'ed: the follower's log matches the leader's up
    /// to the copy's last entry.
    Stored,
    /// Refused, failed or timed out: openraft asks the follower itself.
    NotStored,
}

/// The answers to early copies, shared between the early links and the
/// transport of openraft's replication.
#[derive(Default)]
pub struct EarlyAnswers {
    by_follower: Mutex<HashMap<NodeId, Kept<watch::Receiver<Answer>>>>,
    sent: AtomicU64,
    reused: AtomicU64,
    heartbeats: AtomicU64,
}

impl EarlyAnswers {
    /// Early copies handed to a follower's connection since start.
    pub fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// openraft AppendEntries answered from an early copy since start.
    pub fn reused(&self) -> u64 {
        self.reused.load(Ordering::Relaxed)
    }

    fn record(&self, target: NodeId, sent: Sent<watch::Receiver<Answer>>) {
        self.by_follower
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entry(target)
            .or_default()
            .record(sent);
    }

    /// Commit-only heartbeats answered from a stored early copy since start.
    pub fn heartbeats_answered(&self) -> u64 {
        self.heartbeats.load(Ordering::Relaxed)
    }

    /// Whether `req` to `target` is answered by an early copy: one sent
    /// within `wait`, under the same vote, that reached at least `req`'s last
    /// entry and told the follower at least `req`'s commit index, and that
    /// the follower stored. Waits up to `wait` for such a copy's answer. A
    /// heartbeat (no entries) is never covered here (see
    /// [`EarlyAnswers::cover_heartbeat`]).
    pub(crate) async fn cover(
        &self,
        target: NodeId,
        req: &AppendEntriesRequest<TypeConfig>,
        wait: Duration,
    ) -> bool {
        self.counted(&self.reused, target, Need::entries(req), wait)
            .await
    }

    /// Whether heartbeat `req` (no entries) to `target` is answered by an
    /// early copy sent within `wait`, under the same vote, that reached at
    /// least the heartbeat's previous entry, and that the follower stored:
    /// the follower's log then matches the leader's that far, which is all
    /// its answer would say. What such an answer does not do is tell the
    /// follower `req`'s commit index: the caller must see that the next
    /// message to it does.
    pub(crate) async fn cover_heartbeat(
        &self,
        target: NodeId,
        req: &AppendEntriesRequest<TypeConfig>,
        wait: Duration,
    ) -> bool {
        self.counted(&self.heartbeats, target, Need::heartbeat(req), wait)
            .await
    }

    /// [`EarlyAnswers::stored`] for `need` (none: not covered), counted in
    /// `count` when covered.
    async fn counted(
        &self,
        count: &AtomicU64,
        target: NodeId,
        need: Option<Need>,
        wait: Duration,
    ) -> bool {
        let Some(need) = need else {
            return false;
        };
        let covered = self.stored(target, &need, wait).await;
        if covered {
            count.fetch_add(1, Ordering::Relaxed);
        }
        covered
    }

    /// Whether a copy to `target` that vouches for `need` within `wait`
    /// was stored; waits up to `wait` for its answer.
    async fn stored(&self, target: NodeId, need: &Need, wait: Duration) -> bool {
        let answer = {
            let all = self
                .by_follower
                .lock()
                .unwrap_or_else(PoisonError::into_inner);
            all.get(&target)
                .and_then(|kept| kept.find(need, Instant::now(), wait).cloned())
        };
        let Some(mut answer) = answer else {
            return false;
        };
        let stored = matches!(
            tokio::time::timeout(wait, answer.wait_for(|a| *a != Answer::Pending)).await,
            Ok(Ok(a)) if *a == Answer::Stored
        );
        stored
    }
}

struct Link {
    addr: String,
    tx: mpsc::Sender<(Vec<u8>, watch::Sender<Answer>)>,
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
    answers: Arc<EarlyAnswers>,
    /// Copies go over mutual TLS when set.
    tls: Option<Arc<NodeTls>>,
    wire: Option<Arc<dyn Wire>>,
}

impl EarlyReplication {
    pub fn new(
        me: NodeId,
        metrics: watch::Receiver<RaftMetrics<NodeId, Node>>,
        answers: Arc<EarlyAnswers>,
    ) -> Self {
        Self {
            me,
            metrics,
            links: Mutex::new(HashMap::new()),
            answers,
            tls: None,
            wire: None,
        }
    }

    /// Sends copies over mutual TLS.
    pub fn with_tls(self, tls: Option<Arc<NodeTls>>) -> Self {
        Self { tls, ..self }
    }

    /// Sends copies over `wire` instead of TCP (simulation).
    pub fn with_wire(self, wire: Option<Arc<dyn Wire>>) -> Self {
        Self { wire, ..self }
    }

    fn peer(&self, target: NodeId, addr: &str) -> Peer {
        Peer::new(target, addr.to_string())
            .with_tls(self.tls.clone())
            .with_wire(self.wire.clone())
    }

    pub fn answers(&self) -> &EarlyAnswers {
        &self.answers
    }

    pub fn me(&self) -> NodeId {
        self.me
    }

    /// Early copies handed to a follower's connection since start.
    pub fn sent(&self) -> u64 {
        self.answers.sent()
    }

    /// Queues `req` for every other member. Never waits.
    pub fn offer(&self, req: &AppendEntriesRequest<TypeConfig>) {
        if req.entries.is_empty() {
            return;
        }
        let targets: Vec<(NodeId, String)> = {
            let m = self.metrics.borrow();
            copies::copy_targets(
                m.membership_config
                    .membership()
                    .nodes()
                    .map(|(id, n)| (id, n.peer_addr.clone())),
                self.me,
            )
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
                        *l = Link::start(target, addr.clone(), self.peer(target, &addr));
                    }
                })
                .or_insert_with(|| Link::start(target, addr.clone(), self.peer(target, &addr)));
            if link.busy.swap(true, Ordering::AcqRel) {
                continue;
            }
            let (answer_tx, answer) = watch::channel(Answer::Pending);
            if link.tx.try_send((frame.clone(), answer_tx)).is_ok() {
                self.answers.sent.fetch_add(1, Ordering::Relaxed);
                if let Some(sent) = Sent::of(req, Instant::now(), answer) {
                    self.answers.record(target, sent);
                }
            } else {
                link.busy.store(false, Ordering::Release);
            }
        }
    }
}

/// The log store's appends: a leader's own are copied early.
impl AppendSink for EarlyReplication {
    fn appended(&self, a: Appended) {
        let Some((vote, prev_log_id)) = copies::leader_append(a.vote, self.me, a.last_before)
        else {
            return;
        };
        self.offer(&AppendEntriesRequest {
            vote,
            prev_log_id,
            entries: a.entries,
            leader_commit: a.committed,
        });
    }
}

impl Link {
    /// Starts the task that sends one follower its early copies in order;
    /// it ends when the link is dropped.
    fn start(target: NodeId, addr: String, mut peer: Peer) -> Self {
        let (tx, mut rx) = mpsc::channel::<(Vec<u8>, watch::Sender<Answer>)>(1);
        let busy = Arc::new(AtomicBool::new(false));
        let done = Arc::clone(&busy);
        tokio::spawn(async move {
            while let Some((frame, answer)) = rx.recv().await {
                // An error or a timeout drops the connection (the exchange
                // owns it) and the next copy connects again.
                let failure = match tokio::time::timeout(
                    EXCHANGE_TIMEOUT,
                    peer.exchange(RaftCall::AppendEntries, &frame),
                )
                .await
                {
                    Ok(Ok(reply)) => {
                        let reply: Result<
                            Result<AppendEntriesResponse<NodeId>, RaftError<NodeId>>,
                            _,
                        > = codec::decode("append_entries", &reply);
                        let stored = matches!(reply, Ok(Ok(AppendEntriesResponse::Success)));
                        answer.send_replace(if stored {
                            Answer::Stored
                        } else {
                            Answer::NotStored
                        });
                        None
                    }
                    Ok(Err(e)) => Some(e.to_string()),
                    Err(_) => Some("no reply in time".to_string()),
                };
                if let Some(error) = failure {
                    answer.send_replace(Answer::NotStored);
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

    use super::*;
    use openraft::network::{RPCOption, RaftNetwork};
    use openraft::{CommittedLeaderId, EntryPayload, LogId, Membership, StoredMembership, Vote};
    use tokio::net::TcpListener;

    use super::super::transport::RaftClient;
    use crate::{peer::network::fake_peer, types::Entry};

    /// A follower that hands every AppendEntries it gets to the test and
    /// answers with `answer`, or never when `None`.
    async fn follower(
        id: NodeId,
        answer: Option<AppendEntriesResponse<NodeId>>,
        seen: mpsc::UnboundedSender<(NodeId, AppendEntriesRequest<TypeConfig>)>,
    ) -> String {
        let answer = answer.map(|a| {
            let reply: Result<_, RaftError<NodeId>> = Ok(a);
            codec::encode("append_entries", &reply).unwrap()
        });
        fake_peer(move |frame| {
            assert_eq!(frame[0], RaftCall::AppendEntries as u8);
            let _ = seen.send((id, codec::decode("append_entries", &frame[1..]).unwrap()));
            std::future::ready(answer.clone())
        })
        .await
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
            (
                2,
                follower(2, Some(AppendEntriesResponse::Success), tx.clone()).await,
            ),
            (
                3,
                follower(3, Some(AppendEntriesResponse::Success), tx).await,
            ),
        ];
        let early = EarlyReplication::new(1, metrics(&nodes), Arc::default());
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

    /// A leader whose one follower's address has nothing listening on it.
    async fn leader_with_unreachable_follower() -> EarlyReplication {
        // A port nothing listens on: bound, then closed.
        let closed = {
            let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap().to_string()
        };
        let nodes = vec![(1, "127.0.0.1:1".to_string()), (2, closed)];
        EarlyReplication::new(1, metrics(&nodes), Arc::default())
    }

    #[tokio::test]
    async fn a_follower_that_cannot_be_reached_gets_no_copy_for_a_while() {
        let early = leader_with_unreachable_follower().await;
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
            (2, follower(2, None, tx).await),
        ];
        let early = EarlyReplication::new(1, metrics(&nodes), Arc::default());
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

    /// A leader whose one follower answers every early copy with `answer`.
    async fn leader_with(
        answer: Option<AppendEntriesResponse<NodeId>>,
    ) -> (
        EarlyReplication,
        mpsc::UnboundedReceiver<(NodeId, AppendEntriesRequest<TypeConfig>)>,
    ) {
        let (tx, rx) = mpsc::unbounded_channel();
        let nodes = vec![
            (1, "127.0.0.1:1".to_string()),
            (2, follower(2, answer, tx).await),
        ];
        (
            EarlyReplication::new(1, metrics(&nodes), Arc::default()),
            rx,
        )
    }

    const WAIT: Duration = Duration::from_secs(5);

    #[tokio::test]
    async fn a_stored_copy_answers_openraft_s_append_of_the_same_entries() {
        let (early, _seen) = leader_with(Some(AppendEntriesResponse::Success)).await;
        early.offer(&request(7));
        let answers = early.answers();
        assert!(answers.cover(2, &request(7), WAIT).await);
        // An entry the stored copy reached past is stored too.
        assert!(answers.cover(2, &request(6), WAIT).await);
        assert_eq!(answers.reused(), 2);
    }

    #[tokio::test]
    async fn nothing_but_a_stored_copy_under_the_same_vote_reaching_as_far_answers() {
        let (early, _seen) = leader_with(Some(AppendEntriesResponse::Success)).await;
        early.offer(&request(7));
        let answers = early.answers();
        assert!(answers.cover(2, &request(7), WAIT).await, "stored");

        let mut further = request(8);
        further.prev_log_id = Some(request(7).entries[0].log_id);
        assert!(
            !answers.cover(2, &further, WAIT).await,
            "an entry not copied"
        );

        let mut other_vote = request(7);
        other_vote.vote = Vote::new(3, 1);
        other_vote.vote.commit();
        assert!(!answers.cover(2, &other_vote, WAIT).await, "another vote");

        let mut newer_commit = request(7);
        newer_commit.leader_commit = Some(request(7).entries[0].log_id);
        assert!(
            !answers.cover(2, &newer_commit, WAIT).await,
            "the follower must still learn the newer commit index"
        );

        let mut heartbeat = request(7);
        heartbeat.entries.clear();
        assert!(!answers.cover(2, &heartbeat, WAIT).await, "a heartbeat");

        assert!(!answers.cover(3, &request(7), WAIT).await, "another member");
        tokio::time::sleep(Duration::from_millis(60)).await;
        assert!(
            !answers
                .cover(2, &request(7), Duration::from_millis(50))
                .await,
            "a copy sent longer ago than the wait"
        );
        assert_eq!(answers.reused(), 1);
    }

    #[tokio::test]
    async fn a_refused_copy_answers_nothing() {
        for refusal in [
            AppendEntriesResponse::Conflict,
            AppendEntriesResponse::HigherVote(Vote::new(9, 3)),
            AppendEntriesResponse::PartialSuccess(None),
        ] {
            let name = format!("{refusal:?}");
            let (early, _seen) = leader_with(Some(refusal)).await;
            early.offer(&request(7));
            assert!(!early.answers().cover(2, &request(7), WAIT).await, "{name}");
            assert_eq!(early.answers().reused(), 0);
        }
    }

    #[tokio::test]
    async fn an_unanswered_copy_is_waited_for_no_longer_than_asked() {
        let (early, mut seen) = leader_with(None).await;
        early.offer(&request(7));
        seen.recv().await.unwrap();
        let started = std::time::Instant::now();
        assert!(
            !early
                .answers()
                .cover(2, &request(7), Duration::from_millis(100))
                .await
        );
        let waited = started.elapsed();
        assert!(
            waited >= Duration::from_millis(100) && waited < Duration::from_secs(1),
            "{waited:?}"
        );
    }

    #[tokio::test]
    async fn a_copy_that_could_not_be_sent_answers_nothing_at_once() {
        let early = leader_with_unreachable_follower().await;
        early.offer(&request(7));
        let started = std::time::Instant::now();
        assert!(!early.answers().cover(2, &request(7), WAIT).await);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    /// A heartbeat from the leader of `request`: previous entry `prev`,
    /// commit index `commit`.
    fn heartbeat(prev: u64, commit: u64) -> AppendEntriesRequest<TypeConfig> {
        let r = request(prev);
        let id = |i| LogId::new(CommittedLeaderId::new(2, 1), i);
        AppendEntriesRequest {
            vote: r.vote,
            prev_log_id: Some(id(prev)),
            entries: Vec::new(),
            leader_commit: Some(id(commit)),
        }
    }

    /// The next AppendEntries the follower got, if one comes within 300 ms.
    async fn next_seen(
        seen: &mut mpsc::UnboundedReceiver<(NodeId, AppendEntriesRequest<TypeConfig>)>,
    ) -> Option<AppendEntriesRequest<TypeConfig>> {
        tokio::time::timeout(Duration::from_millis(300), seen.recv())
            .await
            .ok()
            .flatten()
            .map(|(_, r)| r)
    }

    /// A leader with one follower that answers every AppendEntries with
    /// `answer`, openraft's replication connection to it, and what the
    /// follower receives.
    async fn replication_stream(
        answer: AppendEntriesResponse<NodeId>,
    ) -> (
        EarlyReplication,
        RaftClient,
        mpsc::UnboundedReceiver<(NodeId, AppendEntriesRequest<TypeConfig>)>,
    ) {
        let (tx, seen) = mpsc::unbounded_channel();
        let addr = follower(2, Some(answer), tx).await;
        let nodes = vec![(1, "127.0.0.1:1".to_string()), (2, addr.clone())];
        let answers = Arc::new(EarlyAnswers::default());
        let early = EarlyReplication::new(1, metrics(&nodes), Arc::clone(&answers));
        let peer = RaftClient::new(Peer::new(2, addr), Some(answers), None);
        (early, peer, seen)
    }

    fn option() -> RPCOption {
        RPCOption::new(Duration::from_secs(2))
    }

    #[tokio::test]
    async fn a_commit_heartbeat_after_a_stored_copy_stays_home_once_and_the_next_copy_or_call_tells_the_commit(
    ) {
        let (early, mut peer, mut seen) = replication_stream(AppendEntriesResponse::Success).await;
        early.offer(&request(7));
        assert_eq!(next_seen(&mut seen).await.unwrap().entries.len(), 1);
        assert_eq!(
            peer.append_entries(request(7), option()).await.unwrap(),
            AppendEntriesResponse::Success
        );
        assert!(next_seen(&mut seen).await.is_none(), "the copy answered");

        // Entry 7 committed: openraft's heartbeat says so.
        assert_eq!(
            peer.append_entries(heartbeat(7, 7), option())
                .await
                .unwrap(),
            AppendEntriesResponse::Success
        );
        assert!(
            next_seen(&mut seen).await.is_none(),
            "answered from the stored copy of entry 7"
        );
        assert_eq!(early.answers().heartbeats_answered(), 1);

        // The follower has not been told commit 7: the next heartbeat goes.
        peer.append_entries(heartbeat(7, 7), option())
            .await
            .unwrap();
        let told = next_seen(&mut seen).await.unwrap(); // sent to the follower
        assert!(told.entries.is_empty());
        assert_eq!(told.leader_commit, heartbeat(7, 7).leader_commit);

        // A copy that tells the commit index settles what was owed: the
        // heartbeat after its entries may stay home again.
        let mut next = request(8);
        next.leader_commit = heartbeat(7, 7).leader_commit;
        early.offer(&next);
        assert_eq!(
            next_seen(&mut seen).await.unwrap().leader_commit,
            next.leader_commit
        );
        peer.append_entries(next, option()).await.unwrap();
        peer.append_entries(heartbeat(8, 8), option())
            .await
            .unwrap();
        assert!(next_seen(&mut seen).await.is_none());
        assert_eq!(early.answers().heartbeats_answered(), 2);
    }

    #[tokio::test]
    async fn a_heartbeat_the_copies_do_not_vouch_for_goes_to_the_follower() {
        let (early, mut peer, mut seen) = replication_stream(AppendEntriesResponse::Success).await;
        // Before the connection carried entries it may be a leadership
        // check's, which must reach the follower.
        early.offer(&request(7));
        next_seen(&mut seen).await.unwrap();
        peer.append_entries(heartbeat(7, 7), option())
            .await
            .unwrap();
        assert!(next_seen(&mut seen).await.is_some(), "a fresh connection");

        peer.append_entries(request(7), option()).await.unwrap();
        assert!(next_seen(&mut seen).await.is_none());
        let mut other_vote = heartbeat(7, 7);
        other_vote.vote = Vote::new(3, 1);
        other_vote.vote.commit();
        for (name, hb) in [
            ("past the stored copy", heartbeat(8, 7)),
            ("under another vote", other_vote),
        ] {
            peer.append_entries(hb, option()).await.unwrap();
            assert!(next_seen(&mut seen).await.is_some(), "{name}");
        }
        assert_eq!(early.answers().heartbeats_answered(), 0);
    }

    #[tokio::test]
    async fn a_refused_copy_vouches_for_no_heartbeat() {
        let (early, mut peer, mut seen) = replication_stream(AppendEntriesResponse::Conflict).await;
        early.offer(&request(7));
        next_seen(&mut seen).await.unwrap();
        peer.append_entries(request(7), option()).await.unwrap();
        assert_eq!(next_seen(&mut seen).await.unwrap().entries.len(), 1);
        peer.append_entries(heartbeat(7, 7), option())
            .await
            .unwrap();
        assert!(next_seen(&mut seen).await.is_some());
        assert_eq!(early.answers().heartbeats_answered(), 0);
    }
}
