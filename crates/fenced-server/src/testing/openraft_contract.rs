//! What fenced relies on in openraft 0.9, each behaviour checked against the
//! real `openraft::Raft` with fenced's own [`LogStore`] and [`StateMachine`],
//! three nodes in one process joined by a test network that records, in
//! order, every AppendEntries sent and answered. An openraft upgrade that
//! changes one of these behaviours fails here, before it ships.
//!
//! 1. A leader counts an entry as its own (its match in openraft's
//!    progress) and sends it on openraft's replication path only after its
//!    own log store reported the entry flushed (`LogFlushed`, called by
//!    raft-log after fdatasync). fenced's early copies
//!    (`replication/early.rs`) send entries before that flush, so fenced
//!    does not rely on the sending order for followers' logs; it relies on
//!    the leader counting itself only after its flush (a commit needs a
//!    majority of fdatasync'ed copies, the leader's own included only once
//!    durable), and on openraft's own AppendEntries, which the transport may
//!    answer from an early copy, never running ahead of the leader's flush.
//!    The old consequence, that a log id reached a follower only after it
//!    was on the leader's disk, is the one early copies give up, and item 5
//!    is fenced's answer to that. Test:
//!    `a_leader_replicates_an_entry_only_after_its_own_flush`.
//! 2. A follower answers AppendEntries only after its own flush: the early
//!    copies' answers stand in for openraft's own round trip
//!    (`EarlyAnswers::cover`) only because both are given after the
//!    follower's fdatasync. Test:
//!    `a_follower_answers_append_entries_only_after_its_flush`.
//! 3. A heartbeat (no entries) never moves the leader's match index for a
//!    follower, and carries the follower's match as its previous entry:
//!    `EarlyAnswers::cover_heartbeat` answers heartbeats without the
//!    follower, which is safe only because commit counts answers to entries
//!    alone. Test: `heartbeat_answers_never_move_a_followers_match_or_commit`.
//! 4. `ensure_linearizable` returns only after the new leader's first entry
//!    of its term is applied there, so everything committed in earlier
//!    terms is applied too. `proposer/mod.rs` starts a new leader's clock from
//!    the cluster time applied after it (a clock that started lower could
//!    end a lease early), and Describe and Kv `Get` read after it
//!    (`NodeContext::linearizable_read` in `rpc/context.rs`). Test:
//!    `a_linearizable_read_waits_for_the_new_leaders_first_entry_to_apply`.
//! 5. A restarted node whose stored vote is its own committed one leads again
//!    at once, under that vote. With early copies that would let one log id
//!    name two entries, so `replication::give_up_restored_leadership`
//!    (called by `node.rs` before Raft starts) replaces that vote. Test:
//!    `a_restarted_leader_leads_again_unless_it_gives_up_its_vote` (both the
//!    openraft behaviour and fenced's answer to it).
//! 6. A leadership check (`ensure_linearizable`) goes to each follower on a
//!    client of its own, one that never carried entries, and needs those
//!    clients' answers: a replication stream's answers never stand in for
//!    it. fenced's transport answers heartbeats from early copies only on a
//!    connection that carried entries, and makes the time of the others
//!    durable (`replication::stream::Stream`), so a check always reaches the
//!    followers. Test:
//!    `a_leadership_check_goes_on_clients_of_its_own_and_needs_their_answers`.
//! 7. Elections disabled at run time (`runtime_config().elect(false)`, as
//!    `node.rs` does right after `Raft::new`) stay disabled: a follower
//!    whose leader is gone never stands by itself, so elections start only
//!    from fenced's pre-vote (`replication::election`). Test:
//!    `a_follower_with_elections_disabled_at_run_time_never_stands_by_itself`.
//!
//! And `the_contract_was_checked_against_the_locked_openraft_version`: the
//! openraft in Cargo.lock is the one these were checked against.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::{BTreeMap, HashMap},
    fmt::Debug,
    ops::RangeBounds,
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use fenced_core::{Batch, ClusterTime};
use openraft::{
    error::{InstallSnapshotError, NetworkError, RPCError, RaftError, RemoteError, Unreachable},
    network::{RPCOption, RaftNetwork, RaftNetworkFactory},
    raft::{
        AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest,
        InstallSnapshotResponse, VoteRequest, VoteResponse,
    },
    storage::{LogFlushed, LogState, RaftLogStorage, RaftStateMachine},
    OptionalSend, RaftLogReader, ServerState, Vote,
};
use tokio::sync::{mpsc, watch};

use crate::{
    replication::give_up_restored_leadership,
    state_machine::StateMachine,
    storage::log_store::{testing::open_state, LogStore},
    types::{
        Entry, LogId, Node, NodeId, Outcomes, Raft, Snapshot, SnapshotMeta, StorageError,
        StoredMembership, TypeConfig,
    },
};

/// The openraft release this contract was last checked against.
const CHECKED_OPENRAFT: &str = "0.9.25";

/// How long a held flush or apply is held: long enough that openraft, if it
/// did not wait for it, would have acted (it heartbeats every 50 ms here).
const HOLD: Duration = Duration::from_millis(600);

const WAIT: Duration = Duration::from_secs(10);

#[test]
fn the_contract_was_checked_against_the_locked_openraft_version() {
    let lock = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../Cargo.lock");
    let text = std::fs::read_to_string(&lock).expect("read Cargo.lock");
    let mut versions = Vec::new();
    let mut lines = text.lines();
    while let Some(line) = lines.next() {
        if line.trim() == "name = \"openraft\"" {
            if let Some(v) = lines
                .next()
                .and_then(|l| l.trim().strip_prefix("version = "))
            {
                versions.push(v.trim_matches('"').to_string());
            }
        }
    }
    assert_eq!(
        versions,
        vec![CHECKED_OPENRAFT.to_string()],
        "Cargo.lock holds openraft {versions:?}, but fenced's safety argument was checked \
         against openraft {CHECKED_OPENRAFT} only. Before bumping it, re-check every behaviour \
         listed in crates/fenced-server/src/testing/openraft_contract.rs (and docs/ARCHITECTURE.md, \
         \"What fenced relies on in openraft\") against the new release, then update \
         CHECKED_OPENRAFT."
    );
}

/// Something that happened, in the order it happened.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Event {
    /// A held append of `last` on `node` was handed to its log store.
    FlushReleased { node: NodeId, last: u64 },
    /// An AppendEntries to `to` carrying entries up to `last` was sent.
    Sent { to: NodeId, last: u64 },
    /// `to` answered that AppendEntries with success.
    Stored { to: NodeId, last: u64 },
    /// A heartbeat (no entries) to `to` was answered without `to`.
    HeartbeatAnswered { to: NodeId },
    /// `node`'s state machine applied the entry at `index`.
    Applied { node: NodeId, index: u64 },
    /// `ensure_linearizable` on `node` returned.
    ReadReturned { node: NodeId },
}

#[derive(Default)]
struct Journal(Mutex<Vec<Event>>);

impl Journal {
    fn push(&self, e: Event) {
        self.0.lock().unwrap().push(e);
    }

    fn all(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }

    /// Position of the first event matching `f`.
    fn first(&self, f: impl Fn(&Event) -> bool) -> Option<usize> {
        self.all().iter().position(f)
    }
}

/// The in-process transport: calls the target's `Raft` directly.
#[derive(Default)]
struct Router {
    nodes: Mutex<HashMap<NodeId, Raft>>,
    journal: Journal,
    /// AppendEntries with entries fail as unreachable, and heartbeats are
    /// answered with success without the follower (as fenced's transport
    /// answers a heartbeat from an early copy).
    entries_cut: AtomicBool,
    heartbeats_answered: AtomicU64,
    /// The target and previous entry of every heartbeat answered so.
    heartbeat_prevs: Mutex<Vec<(NodeId, Option<LogId>)>>,
    /// Heartbeats on a client that never carried entries fail as
    /// unreachable; those on a replication stream's client go through.
    checks_cut: AtomicBool,
    /// Heartbeats answered by a follower on a client that carried entries.
    stream_heartbeats: AtomicU64,
}

struct Net {
    router: Arc<Router>,
}

struct Link {
    target: NodeId,
    router: Arc<Router>,
    /// This client has carried entries (a replication stream's).
    carried: bool,
}

fn unreachable<E: std::error::Error>(why: &str) -> RPCError<NodeId, Node, E> {
    RPCError::Unreachable(Unreachable::new(&std::io::Error::other(why.to_string())))
}

impl Link {
    fn raft(&self) -> Option<Raft> {
        self.router.nodes.lock().unwrap().get(&self.target).cloned()
    }
}

impl RaftNetworkFactory<TypeConfig> for Net {
    type Network = Link;

    async fn new_client(&mut self, target: NodeId, _node: &Node) -> Link {
        Link {
            target,
            router: Arc::clone(&self.router),
            carried: false,
        }
    }
}

impl RaftNetwork<TypeConfig> for Link {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        let to = self.target;
        let last = rpc.entries.last().map(|e| e.log_id.index);
        if self.router.entries_cut.load(Ordering::SeqCst) {
            if last.is_some() {
                return Err(unreachable("entries cut"));
            }
            self.router
                .heartbeats_answered
                .fetch_add(1, Ordering::SeqCst);
            self.router.journal.push(Event::HeartbeatAnswered { to });
            self.router
                .heartbeat_prevs
                .lock()
                .unwrap()
                .push((to, rpc.prev_log_id));
            return Ok(AppendEntriesResponse::Success);
        }
        self.carried |= last.is_some();
        if last.is_none() && !self.carried && self.router.checks_cut.load(Ordering::SeqCst) {
            return Err(unreachable("checks cut"));
        }
        let raft = self.raft().ok_or_else(|| unreachable("node down"))?;
        if let Some(last) = last {
            self.router.journal.push(Event::Sent { to, last });
        } else if self.carried {
            self.router.stream_heartbeats.fetch_add(1, Ordering::SeqCst);
        }
        let res = raft
            .append_entries(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(to, e)))?;
        if let (Some(last), AppendEntriesResponse::Success) = (last, &res) {
            self.router.journal.push(Event::Stored { to, last });
        }
        Ok(res)
    }

    async fn install_snapshot(
        &mut self,
        _rpc: InstallSnapshotRequest<TypeConfig>,
        _option: RPCOption,
    ) -> Result<
        InstallSnapshotResponse<NodeId>,
        RPCError<NodeId, Node, RaftError<NodeId, InstallSnapshotError>>,
    > {
        Err(RPCError::Network(NetworkError::new(
            &std::io::Error::other("no snapshots in these tests"),
        )))
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<NodeId>,
        _option: RPCOption,
    ) -> Result<VoteResponse<NodeId>, RPCError<NodeId, Node, RaftError<NodeId>>> {
        let to = self.target;
        let raft = self.raft().ok_or_else(|| unreachable("node down"))?;
        raft.vote(rpc)
            .await
            .map_err(|e| RPCError::RemoteError(RemoteError::new(to, e)))
    }
}

/// A gate a test closes to hold a node's flushes or applies.
#[derive(Clone)]
struct Gate(Arc<watch::Sender<bool>>);

impl Gate {
    fn open() -> Self {
        Self(Arc::new(watch::Sender::new(true)))
    }

    fn set(&self, open: bool) {
        self.0.send_replace(open);
    }

    async fn pass(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|open| *open).await;
    }
}

/// fenced's [`LogStore`], whose appends a test can hold before they reach
/// it: while held, openraft has not been told they are flushed (its
/// callback goes to the log store, which calls it after fdatasync). Held
/// entries are readable, so an openraft that replicated before the flush
/// would find them and send them.
#[derive(Clone)]
struct HeldLog {
    inner: LogStore,
    held: Arc<Mutex<BTreeMap<u64, Entry>>>,
    queue: mpsc::UnboundedSender<(Vec<Entry>, LogFlushed<TypeConfig>)>,
}

impl HeldLog {
    fn new(node: NodeId, inner: LogStore, gate: Gate, journal: Arc<Router>) -> Self {
        let held: Arc<Mutex<BTreeMap<u64, Entry>>> = Arc::default();
        let (queue, mut rx) = mpsc::unbounded_channel::<(Vec<Entry>, LogFlushed<TypeConfig>)>();
        let (mut log, waiting) = (inner.clone(), Arc::clone(&held));
        tokio::spawn(async move {
            // In order, one append after the other, each after the gate.
            while let Some((entries, flushed)) = rx.recv().await {
                gate.pass().await;
                let last = entries.last().map_or(0, |e| e.log_id.index);
                let indexes: Vec<u64> = entries.iter().map(|e| e.log_id.index).collect();
                journal.journal.push(Event::FlushReleased { node, last });
                if log.append(entries, flushed).await.is_err() {
                    return;
                }
                let mut w = waiting.lock().unwrap();
                for i in indexes {
                    w.remove(&i);
                }
            }
        });
        Self { inner, held, queue }
    }
}

impl RaftLogReader<TypeConfig> for HeldLog {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let mut found: BTreeMap<u64, Entry> = self
            .inner
            .try_get_log_entries(range.clone())
            .await?
            .into_iter()
            .map(|e| (e.log_id.index, e))
            .collect();
        for (i, e) in self.held.lock().unwrap().range(range) {
            found.entry(*i).or_insert_with(|| e.clone());
        }
        Ok(found.into_values().collect())
    }
}

impl RaftLogStorage<TypeConfig> for HeldLog {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        self.inner.get_log_state().await
    }

    async fn get_log_reader(&mut self) -> Self {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        self.inner.save_vote(vote).await
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        self.inner.read_vote().await
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.inner.save_committed(committed).await
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        self.inner.read_committed().await
    }

    async fn append<I>(
        &mut self,
        entries: I,
        callback: LogFlushed<TypeConfig>,
    ) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        {
            let mut held = self.held.lock().unwrap();
            for e in &entries {
                held.insert(e.log_id.index, e.clone());
            }
        }
        self.queue.send((entries, callback)).map_err(|_| {
            StorageError::from(openraft::StorageIOError::write_logs(
                openraft::AnyError::error("hold task stopped"),
            ))
        })
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.held.lock().unwrap().retain(|i, _| *i < log_id.index);
        self.inner.truncate(log_id).await
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.inner.purge(log_id).await
    }
}

/// fenced's [`StateMachine`], whose applies a test can hold; each applied
/// entry is journaled.
struct HeldApply {
    node: NodeId,
    inner: StateMachine,
    gate: Gate,
    router: Arc<Router>,
}

impl RaftStateMachine<TypeConfig> for HeldApply {
    type SnapshotBuilder = StateMachine;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        self.inner.applied_state().await
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcomes>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let entries: Vec<Entry> = entries.into_iter().collect();
        self.gate.pass().await;
        let indexes: Vec<u64> = entries.iter().map(|e| e.log_id.index).collect();
        let out = self.inner.apply(entries).await?;
        for index in indexes {
            self.router.journal.push(Event::Applied {
                node: self.node,
                index,
            });
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> StateMachine {
        self.inner.get_snapshot_builder().await
    }

    async fn begin_receiving_snapshot(
        &mut self,
    ) -> Result<Box<std::io::Cursor<Vec<u8>>>, StorageError> {
        self.inner.begin_receiving_snapshot().await
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<std::io::Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        self.inner.install_snapshot(meta, snapshot).await
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        self.inner.get_current_snapshot().await
    }
}

fn config() -> Arc<openraft::Config> {
    config_with(false)
}

/// `enable_elect: false` (elections start only when asked) or openraft's
/// default, `true`.
fn config_with(enable_elect: bool) -> Arc<openraft::Config> {
    Arc::new(
        openraft::Config {
            cluster_name: "contract".into(),
            heartbeat_interval: 50,
            election_timeout_min: 300,
            election_timeout_max: 600,
            enable_elect,
            ..Default::default()
        }
        .validate()
        .unwrap(),
    )
}

struct Member {
    raft: Raft,
    flush: Gate,
    apply: Gate,
}

struct Cluster {
    router: Arc<Router>,
    members: BTreeMap<NodeId, Member>,
    _dirs: Vec<tempfile::TempDir>,
}

/// Opens the log in `dir`, waiting for a stopped node's flush thread to
/// let go of its lock.
async fn open_log(dir: &Path) -> LogStore {
    let deadline = Instant::now() + WAIT;
    loop {
        match LogStore::open(&dir.join("raft-log")) {
            Ok(log) => return log,
            Err(e) if Instant::now() < deadline => {
                tracing::debug!(error = %e, "log still locked");
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("open the log: {e}"),
        }
    }
}

async fn start(router: &Arc<Router>, id: NodeId, dir: &Path) -> Member {
    start_with(router, id, dir, config()).await
}

async fn start_with(
    router: &Arc<Router>,
    id: NodeId,
    dir: &Path,
    config: Arc<openraft::Config>,
) -> Member {
    let log = open_log(dir).await;
    let sm = open_state(dir, &log);
    let (flush, apply) = (Gate::open(), Gate::open());
    let log = HeldLog::new(id, log, flush.clone(), Arc::clone(router));
    let sm = HeldApply {
        node: id,
        inner: sm,
        gate: apply.clone(),
        router: Arc::clone(router),
    };
    let net = Net {
        router: Arc::clone(router),
    };
    let raft = Raft::new(id, config, net, log, sm).await.unwrap();
    router.nodes.lock().unwrap().insert(id, raft.clone());
    Member { raft, flush, apply }
}

fn batch() -> Batch {
    Batch {
        stamp: ClusterTime::ZERO,
        commands: Vec::new(),
    }
}

impl Cluster {
    /// Three voters, node 1 the leader, its first entries applied everywhere.
    async fn three() -> Self {
        Self::three_with(config(), false).await
    }

    /// [`Cluster::three`] under `config`; `elect_off` turns elections off at
    /// run time right after `Raft::new`, as `node.rs` does.
    async fn three_with(config: Arc<openraft::Config>, elect_off: bool) -> Self {
        let router = Arc::new(Router::default());
        let mut members = BTreeMap::new();
        let mut dirs = Vec::new();
        for id in 1..=3 {
            let dir = tempfile::tempdir().unwrap();
            let m = start_with(&router, id, dir.path(), Arc::clone(&config)).await;
            if elect_off {
                m.raft.runtime_config().elect(false);
            }
            members.insert(id, m);
            dirs.push(dir);
        }
        let nodes: BTreeMap<NodeId, Node> = (1..=3).map(|id| (id, Node::default())).collect();
        members[&1].raft.initialize(nodes).await.unwrap();
        let c = Self {
            router,
            members,
            _dirs: dirs,
        };
        c.raft(1)
            .wait(Some(WAIT))
            .state(ServerState::Leader, "node 1 leads")
            .await
            .unwrap();
        c.write(1).await;
        c
    }

    fn raft(&self, id: NodeId) -> &Raft {
        &self.members[&id].raft
    }

    /// Commits one entry through `leader`; returns its index once every
    /// node applied it.
    async fn write(&self, leader: NodeId) -> u64 {
        let index = self
            .raft(leader)
            .client_write(batch())
            .await
            .unwrap()
            .log_id
            .index;
        for m in self.members.values() {
            m.raft
                .wait(Some(WAIT))
                .applied_index_at_least(Some(index), "applied everywhere")
                .await
                .unwrap();
        }
        index
    }

    fn last_index(&self, id: NodeId) -> u64 {
        self.raft(id).metrics().borrow().last_log_index.unwrap_or(0)
    }

    async fn stop(self) {
        for m in self.members.values() {
            // A node a test stopped already answers with an error.
            let _ = m.raft.shutdown().await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leader_replicates_an_entry_only_after_its_own_flush() {
    let c = Cluster::three().await;
    c.members[&1].flush.set(false);
    let next = c.last_index(1) + 1;
    let raft = c.raft(1).clone();
    let write = tokio::spawn(async move { raft.client_write(batch()).await });

    tokio::time::sleep(HOLD).await;
    let carries = |e: &Event| matches!(e, Event::Sent { last, .. } if *last >= next);
    assert_eq!(
        c.router.journal.first(carries),
        None,
        "entry {next} was sent to a follower before the leader's log store reported it \
         flushed: {:?}",
        c.router.journal.all()
    );
    assert!(!write.is_finished(), "entry {next} committed unflushed");
    // What fenced's early copies leave to openraft: the leader counts itself
    // towards a majority only once its own log store reported the flush.
    let own = c.raft(1).metrics().borrow().replication.clone();
    let own = own.and_then(|r| r.get(&1).cloned()).flatten();
    assert!(
        own.is_some_and(|m| m.index < next),
        "the leader counted entry {next} as its own before its flush: {own:?}"
    );

    c.members[&1].flush.set(true);
    let committed = tokio::time::timeout(WAIT, write)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(committed.log_id.index, next);
    let released = c
        .router
        .journal
        .first(|e| matches!(e, Event::FlushReleased { node: 1, last } if *last >= next))
        .expect("the leader's append was released");
    let sent = c
        .router
        .journal
        .first(carries)
        .expect("the entry was replicated once flushed");
    assert!(released < sent, "{:?}", c.router.journal.all());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_answers_append_entries_only_after_its_flush() {
    let c = Cluster::three().await;
    c.members[&2].flush.set(false);
    c.members[&3].flush.set(false);
    let next = c.last_index(1) + 1;
    let raft = c.raft(1).clone();
    let write = tokio::spawn(async move { raft.client_write(batch()).await });

    tokio::time::sleep(HOLD).await;
    let sent = |to: NodeId| {
        c.router
            .journal
            .first(|e| matches!(e, Event::Sent { to: t, last } if *t == to && *last >= next))
    };
    let stored = |to: NodeId| {
        c.router
            .journal
            .first(|e| matches!(e, Event::Stored { to: t, last } if *t == to && *last >= next))
    };
    assert!(
        sent(2).is_some() && sent(3).is_some(),
        "the leader sent entry {next}: {:?}",
        c.router.journal.all()
    );
    assert_eq!(
        (stored(2), stored(3)),
        (None, None),
        "a follower answered entry {next} before its log store flushed it"
    );
    assert!(
        !write.is_finished(),
        "entry {next} committed on the leader alone"
    );

    c.members[&2].flush.set(true);
    c.members[&3].flush.set(true);
    tokio::time::timeout(WAIT, write)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    for to in [2, 3] {
        let released = c
            .router
            .journal
            .first(|e| matches!(e, Event::FlushReleased { node, last } if *node == to && *last >= next))
            .expect("the follower's append was released");
        // openraft's own RPC timeout (the heartbeat interval) drops the
        // held attempts; a later one is answered once the follower flushed.
        let deadline = Instant::now() + WAIT;
        while stored(to).is_none() {
            assert!(
                Instant::now() < deadline,
                "{to} never answered entry {next}"
            );
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        let answered = stored(to).unwrap();
        assert!(released < answered, "{:?}", c.router.journal.all());
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn heartbeat_answers_never_move_a_followers_match_or_commit() {
    let c = Cluster::three().await;
    let followers = |c: &Cluster| -> BTreeMap<NodeId, Option<LogId>> {
        let m = c.raft(1).metrics().borrow().replication.clone();
        m.unwrap_or_default()
            .into_iter()
            .filter(|(id, _)| *id != 1)
            .collect()
    };
    // Start from followers that hold the whole log: an entry still in
    // flight when `before` is read would move a match for its own reason.
    let caught_up = Instant::now() + WAIT;
    let before = loop {
        let m = followers(&c);
        let last = c.last_index(1);
        if m.len() == 2 && m.values().all(|id| id.map(|id| id.index) == Some(last)) {
            break m;
        }
        assert!(
            Instant::now() < caught_up,
            "followers never caught up: {m:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // No entry reaches a follower; every heartbeat (an AppendEntries with
    // no entries) is answered with success without its follower, as
    // fenced's transport answers one from an early copy.
    c.router.entries_cut.store(true, Ordering::SeqCst);
    let raft = c.raft(1).clone();
    let next = c.last_index(1) + 1;
    let write = tokio::spawn(async move { raft.client_write(batch()).await });
    c.raft(1)
        .wait(Some(WAIT))
        .log_index(Some(next), "the leader appended the entry")
        .await
        .unwrap();

    // While the entry is in the leader's log and on no follower, heartbeats
    // go out: the replication streams' own and those of leadership checks.
    let answered_from = c.router.heartbeats_answered.load(Ordering::SeqCst);
    let deadline = Instant::now() + WAIT;
    while c.router.heartbeats_answered.load(Ordering::SeqCst) < answered_from + 10 {
        assert!(Instant::now() < deadline, "no heartbeats were sent");
        c.raft(1).ensure_linearizable().await.unwrap();
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(HOLD).await;
    let appended = c.last_index(1);
    let after = followers(&c);
    assert_eq!(
        after, before,
        "heartbeat answers moved a follower's match index (entry {appended} reached no follower)"
    );
    assert!(
        !write.is_finished(),
        "an entry no follower stored committed on heartbeat answers"
    );
    // A heartbeat says no more than "my log matches yours up to prev_log_id",
    // and openraft sends it with the follower's match as prev_log_id.
    let matched = |to: NodeId| before.get(&to).cloned().flatten();
    for (to, prev) in c.router.heartbeat_prevs.lock().unwrap().iter() {
        assert!(
            *prev <= matched(*to),
            "a heartbeat to {to} claimed {prev:?}, beyond its match {:?}",
            matched(*to)
        );
    }

    c.router.entries_cut.store(false, Ordering::SeqCst);
    tokio::time::timeout(WAIT, write)
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_linearizable_read_waits_for_the_new_leaders_first_entry_to_apply() {
    let c = Cluster::three().await;
    c.write(1).await;
    let old_last = c.last_index(1);
    // The leader goes away; node 2 stands (again, until node 3's lease on
    // node 1 has run out and it grants) and must not apply anything yet.
    c.router.nodes.lock().unwrap().remove(&1);
    c.raft(1).shutdown().await.unwrap();
    c.members[&2].apply.set(false);
    let deadline = Instant::now() + WAIT;
    while c.raft(2).metrics().borrow().state != ServerState::Leader {
        assert!(Instant::now() < deadline, "node 2 was not elected");
        c.raft(2).trigger().elect().await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    let raft = c.raft(2).clone();
    let router = Arc::clone(&c.router);
    let read = tokio::spawn(async move {
        let res = raft.ensure_linearizable().await;
        router.journal.push(Event::ReadReturned { node: 2 });
        res
    });
    tokio::time::sleep(HOLD).await;
    assert!(
        !read.is_finished(),
        "ensure_linearizable returned before the new leader applied its first entry"
    );

    c.members[&2].apply.set(true);
    let read_at = tokio::time::timeout(WAIT, read)
        .await
        .unwrap()
        .unwrap()
        .unwrap()
        .expect("a read log id");
    let term = c.raft(2).metrics().borrow().current_term;
    assert_eq!(read_at.leader_id.term, term, "read at the new term's entry");
    assert!(read_at.index > old_last, "the new leader's first entry");
    let applied = c
        .router
        .journal
        .first(|e| matches!(e, Event::Applied { node: 2, index } if *index == read_at.index))
        .expect("the first entry of the term was applied");
    let returned = c
        .router
        .journal
        .first(|e| *e == Event::ReadReturned { node: 2 })
        .unwrap();
    assert!(applied < returned, "{:?}", c.router.journal.all());
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_leader_leads_again_unless_it_gives_up_its_vote() {
    let c = Cluster::three().await;
    let vote = c.raft(1).metrics().borrow().vote;
    assert!(vote.is_committed() && vote.leader_id().voted_for() == Some(1));
    let dir = c._dirs[0].path().to_path_buf();
    let dirs = {
        let mut c = c;
        let dirs = std::mem::take(&mut c._dirs);
        c.stop().await;
        dirs
    };

    // openraft alone: node 1 comes back as leader at once, under the same
    // vote, with no other node up to vote for it.
    let router = Arc::new(Router::default());
    let m = start(&router, 1, &dir).await;
    m.raft
        .wait(Some(WAIT))
        .state(ServerState::Leader, "restored leadership")
        .await
        .expect("openraft 0.9 restores a leader from its committed vote");
    assert_eq!(m.raft.metrics().borrow().vote, vote);
    m.raft.shutdown().await.unwrap();
    drop(m);
    router.nodes.lock().unwrap().clear();

    // What node.rs does before Raft starts: the vote is given up.
    let log = open_log(&dir).await;
    let term = give_up_restored_leadership(&log, 1).await.unwrap();
    assert_eq!(term, Some(vote.leader_id().get_term() + 1));
    drop(log);
    let m = start(&router, 1, &dir).await;
    tokio::time::sleep(HOLD).await;
    let metrics = m.raft.metrics().borrow().clone();
    assert_ne!(
        metrics.state,
        ServerState::Leader,
        "a node that gave up its vote led again without an election"
    );
    assert_eq!(metrics.current_leader, None);
    assert!(!metrics.vote.is_committed());
    assert_eq!(
        metrics.vote.leader_id().get_term(),
        vote.leader_id().get_term() + 1
    );
    m.raft.shutdown().await.unwrap();
    drop(dirs);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_leadership_check_goes_on_clients_of_its_own_and_needs_their_answers() {
    let c = Cluster::three().await;
    c.write(1).await;
    c.raft(1).ensure_linearizable().await.unwrap();
    // Only clients that carried entries reach the followers now.
    c.router.checks_cut.store(true, Ordering::SeqCst);
    // The replication streams' heartbeats still reach the followers.
    let streams_before = c.router.stream_heartbeats.load(Ordering::SeqCst);
    let deadline = Instant::now() + WAIT;
    while c.router.stream_heartbeats.load(Ordering::SeqCst) < streams_before + 2 {
        assert!(Instant::now() < deadline, "no replication stream heartbeat");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let check = tokio::time::timeout(HOLD * 2, c.raft(1).ensure_linearizable()).await;
    assert!(
        !matches!(check, Ok(Ok(_))),
        "a leadership check succeeded with only the replication streams' answers: {check:?}"
    );
    // And with the check's own clients back, it succeeds.
    c.router.checks_cut.store(false, Ordering::SeqCst);
    tokio::time::timeout(WAIT, c.raft(1).ensure_linearizable())
        .await
        .unwrap()
        .unwrap();
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_with_elections_disabled_at_run_time_never_stands_by_itself() {
    // openraft's default, enable_elect: true, turned off at run time.
    let c = Cluster::three_with(config_with(true), true).await;
    let term = c.raft(2).metrics().borrow().current_term;
    // The leader goes away. With openraft's timer on, a follower would stand
    // within election_timeout_max (600 ms).
    c.router.nodes.lock().unwrap().remove(&1);
    c.raft(1).shutdown().await.unwrap();
    tokio::time::sleep(Duration::from_millis(600) * 4).await;
    for id in [2, 3] {
        let m = c.raft(id).metrics().borrow().clone();
        assert_eq!(m.current_term, term, "node {id} stood by itself");
        assert_eq!(m.state, ServerState::Follower, "node {id}");
    }
    // Asked, it stands (what the pre-vote does once it wins).
    c.raft(2).trigger().elect().await.unwrap();
    c.raft(2)
        .wait(Some(WAIT))
        .state(ServerState::Leader, "node 2 elected when asked")
        .await
        .unwrap();
    c.stop().await;
}
