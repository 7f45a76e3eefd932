//! The Raft log and vote on disk, through `raft-log` (a CRC-framed WAL made
//! for Raft): every append and vote is fdatasync'ed before openraft hears it
//! is done, so nothing is acknowledged that a crash could take back.

use std::{
    collections::BTreeMap,
    fmt::Debug,
    io,
    ops::{Bound, RangeBounds},
    path::Path,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, MutexGuard, OnceLock, PoisonError,
    },
};

use openraft::{
    storage::{LogFlushed, LogState, RaftLogStorage},
    AnyError, CommittedLeaderId, EntryPayload, Membership, OptionalSend, RaftLogReader,
    StorageIOError, Vote,
};
use raft_log::{
    api::raft_log_writer::RaftLogWriter,
    codeq::{Decode, Encode},
};
use tokio::sync::watch;

use crate::{
    codec,
    types::{Entry, LogId, Node, NodeId, StorageError, TypeConfig},
};

/// A log id in raft-log's encoding (openraft's own type has none).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct WalLogId(LogId);

impl Encode for WalLogId {
    fn encode<W: io::Write>(&self, mut w: W) -> Result<usize, io::Error> {
        Ok(self.0.leader_id.term.encode(&mut w)?
            + self.0.leader_id.node_id.encode(&mut w)?
            + self.0.index.encode(&mut w)?)
    }
}

impl Decode for WalLogId {
    fn decode<R: io::Read>(mut r: R) -> Result<Self, io::Error> {
        let term = u64::decode(&mut r)?;
        let node_id = u64::decode(&mut r)?;
        let index = u64::decode(&mut r)?;
        Ok(Self(LogId::new(
            CommittedLeaderId::new(term, node_id),
            index,
        )))
    }
}

/// A vote in raft-log's encoding, ordered exactly as openraft orders votes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WalVote(Vote<NodeId>);

impl PartialOrd for WalVote {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        self.0.partial_cmp(&other.0)
    }
}

impl Encode for WalVote {
    fn encode<W: io::Write>(&self, mut w: W) -> Result<usize, io::Error> {
        Ok(self.0.leader_id.term.encode(&mut w)?
            + self.0.leader_id.node_id.encode(&mut w)?
            + self.0.committed.encode(&mut w)?)
    }
}

impl Decode for WalVote {
    fn decode<R: io::Read>(mut r: R) -> Result<Self, io::Error> {
        let term = u64::decode(&mut r)?;
        let node_id = u64::decode(&mut r)?;
        let committed = bool::decode(&mut r)?;
        let mut vote = Vote::new(term, node_id);
        if committed {
            vote.commit();
        }
        Ok(Self(vote))
    }
}

/// Called by raft-log's flush thread once the data is on disk.
pub enum FlushDone {
    Raft(LogFlushed<TypeConfig>),
    Wait(tokio::sync::oneshot::Sender<io::Result<()>>),
    /// The simulation's flush: its thread waits for it (see [`SimFsync`]).
    Block(std::sync::mpsc::SyncSender<io::Result<()>>),
}

impl raft_log::Callback for FlushDone {
    fn send(self, res: Result<(), io::Error>) {
        match self {
            FlushDone::Raft(done) => done.log_io_completed(res),
            FlushDone::Wait(tx) => {
                let _ = tx.send(res);
            }
            // raft-log's own callback for a std channel.
            FlushDone::Block(tx) => raft_log::Callback::send(tx, res),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalTypes;

type Wal = Arc<Mutex<raft_log::RaftLog<WalTypes>>>;

impl raft_log::Types for WalTypes {
    type LogId = WalLogId;
    /// An `EntryPayload` in [`codec`]'s versioned encoding.
    type LogPayload = Vec<u8>;
    type Vote = WalVote;
    type Callback = FlushDone;
    type UserData = Vec<u8>;

    fn log_index(log_id: &Self::LogId) -> u64 {
        log_id.0.index
    }

    fn payload_size(payload: &Self::LogPayload) -> u64 {
        payload.len() as u64
    }
}

/// How far the log may be purged: never past the last entry that the
/// snapshot on disk covers. openraft 0.9 purges the log up to a received
/// snapshot as soon as it has queued the snapshot's install, without waiting
/// for it; a crash in between would leave the old snapshot beside a log
/// purged past it, and the entries a restart must re-apply gone. So a purge
/// past the durable snapshot is held back (deferred) and done once a snapshot
/// that covers it is on disk, or at the next purge that it then allows.
///
/// Shared by the log store, which purges, and the state machine, which says
/// when a snapshot is durable.
#[derive(Clone)]
pub struct PurgeHorizon {
    wal: Wal,
    gate: Arc<watch::Sender<Gate>>,
}

#[derive(Debug, Clone, Default)]
struct Gate {
    /// The last log id the snapshot on disk covers.
    durable: Option<LogId>,
    /// The furthest purge openraft asked for that is not done yet.
    deferred: Option<LogId>,
    /// A snapshot install failed, and none was written since: a deferred
    /// purge may wait for it in vain.
    failed: bool,
}

impl PurgeHorizon {
    /// Called once a snapshot covering the log up to `last` is on disk
    /// (renamed and its directory synced): does the purge held back for it.
    pub fn snapshot_durable(&self, last: Option<LogId>) {
        let mut res = Ok(());
        self.gate.send_modify(|gate| {
            if last > gate.durable {
                gate.durable = last;
                gate.failed = false;
            }
            res = self.purge_allowed(gate);
        });
        if let Err(error) = res {
            // The entries stay; the next purge tries again.
            tracing::warn!(%error, durable = ?last, "deferred log purge failed");
        }
    }

    /// Called when a snapshot install failed (before or after openraft's
    /// purge for it): appends stop waiting for it, and fail, until a
    /// snapshot is written.
    pub fn snapshot_failed(&self) {
        self.gate.send_modify(|gate| gate.failed = true);
    }

    /// Purges up to `upto`, or up to the durable snapshot and the rest later.
    fn purge(&self, upto: LogId) -> io::Result<()> {
        let mut res = Ok(());
        self.gate.send_modify(|gate| {
            gate.deferred = gate.deferred.max(Some(upto));
            res = self.purge_allowed(gate);
        });
        res
    }

    /// Purges what is deferred, as far as the durable snapshot allows.
    fn purge_allowed(&self, gate: &mut Gate) -> io::Result<()> {
        let Some(wanted) = gate.deferred else {
            return Ok(());
        };
        // CANARY (planted in a `canaries` build, `canary::on`): purges as far
        // as openraft asks, past the snapshot on disk.
        let durable = if fenced_core::canary::on(fenced_core::canary::Canary::PurgePastSnapshot) {
            Some(wanted)
        } else {
            gate.durable
        };
        if let Some(upto) = durable.min(Some(wanted)) {
            let mut wal = self.wal.lock().unwrap_or_else(PoisonError::into_inner);
            wal.purge(WalLogId(upto))?;
            wal.flush(true, None)?;
        }
        if Some(wanted) <= durable {
            gate.deferred = None;
        } else {
            tracing::info!(
                purge = %wanted,
                durable_snapshot = ?gate.durable,
                "log purge held back until the snapshot covering it is on disk"
            );
        }
        Ok(())
    }

    /// The log id openraft counts as purged but the log still holds.
    fn deferred(&self) -> Option<LogId> {
        self.gate.borrow().deferred
    }

    /// Waits until no purge is held back. openraft appends after the
    /// snapshot it purged for, and the log only takes entries that follow
    /// its own last one: the deferred purge must be done first.
    async fn settled(&self) -> Result<(), StorageError> {
        let mut rx = self.gate.subscribe();
        let gate = rx
            .wait_for(|gate| gate.deferred.is_none() || gate.failed)
            .await
            .map_err(write_err)?;
        if gate.deferred.is_some() {
            return Err(write_err(io::Error::other(
                "the snapshot a held-back log purge waits for was not written",
            )));
        }
        Ok(())
    }
}

/// The size at which raft-log starts a new chunk file: the log appended
/// between two snapshots (`NodeConfig::snapshot_log_bytes`), so that a purge
/// behind a snapshot can delete the chunks before it.
pub const LOG_CHUNK_BYTES: usize = 16 << 20;

/// The bytes of entries raft-log keeps in memory (see [`LogStore::open`]):
/// about sixty of the largest entries (4,096 commands), thousands of the
/// usual ones, so applying and replicating recent entries never reads back.
/// 16 MiB rather than 32: a node holding a million leases stays under its
/// 400 MB budget with room (docs/SCALING.md).
pub const LOG_CACHE_BYTES: usize = 16 << 20;

/// The deterministic simulation's fsync (crate `fenced-sim`): the log is
/// flushed while the simulation's one thread waits, so no other thread
/// decides what happens next, and the flush's answer reaches openraft after
/// the simulated latency this returns, on tokio's paused clock. A node
/// stopped in between has its entries on disk and never said so: a crash
/// between an fsync and its answer. An error instead (EIO, ENOSPC) is what
/// the flush fails with, and the bytes it wrote are taken back: a write the
/// disk lost, and said so.
pub type SimFsync = Arc<dyn Fn() -> io::Result<std::time::Duration> + Send + Sync>;

/// Under the simulation: where the log's last chunk ends on disk, and how
/// much of it openraft was told is durable. The bytes between are what a
/// crash now may leave torn (their fsync, as the simulation draws it, has
/// not finished).
#[derive(Debug, Clone, Default)]
struct SimTail {
    chunk: std::path::PathBuf,
    answered_to: u64,
    written_to: u64,
}

/// A crash's view of the log's tail under the simulation: the last chunk,
/// and the bytes of it whose flush openraft has not heard of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnansweredTail {
    pub chunk: std::path::PathBuf,
    pub bytes: std::ops::Range<u64>,
}

/// The durable Raft log and vote of one node.
#[derive(Clone)]
pub struct LogStore {
    wal: Wal,
    horizon: PurgeHorizon,
    /// Set under the simulation only.
    sim_fsync: Option<SimFsync>,
    /// Under the simulation: the log's directory and its tail on disk.
    sim_dir: std::path::PathBuf,
    sim_tail: Arc<Mutex<SimTail>>,
    /// Told of every append once it is handed to the flush thread; set once
    /// Raft runs. The log store knows nothing of what it does with it (the
    /// replication adapter copies a leader's appends early).
    sink: Arc<OnceLock<Arc<dyn AppendSink>>>,
    /// Bytes of entries appended since the log was opened (see
    /// [`LogStore::appended_bytes`]).
    appended: Arc<AtomicU64>,
}

/// An append the log store took, as its sink is told of it: the log's vote,
/// last entry before it and commit index as of the append, and the entries.
#[derive(Debug)]
pub struct Appended {
    pub vote: Option<Vote<NodeId>>,
    pub last_before: Option<LogId>,
    pub committed: Option<LogId>,
    pub entries: Vec<Entry>,
}

/// Told of each append right after it is handed to the flush thread, before
/// the flush ends. Must not wait.
pub trait AppendSink: Send + Sync + 'static {
    fn appended(&self, append: Appended);
}

/// The id of the log's last entry, or of the last purged one when nothing
/// follows it.
fn last_log_id(wal: &raft_log::RaftLog<WalTypes>) -> Option<LogId> {
    let state = wal.log_state();
    state.last().or(state.purged()).map(|x| x.0)
}

fn is_pristine(wal: &raft_log::RaftLog<WalTypes>) -> bool {
    last_log_id(wal).is_none() && wal.log_state().vote().is_none()
}

/// The error of opening the Raft log in `dir`, naming the directory and,
/// for a record raft-log found damaged or cut (it names the chunk and the
/// offset), the next step; a directory another process holds says so.
pub fn unreadable_log(dir: &Path, e: io::Error) -> io::Error {
    let kind = e.kind();
    let text = match kind {
        io::ErrorKind::WouldBlock => format!(
            "{}: the Raft log is held by another process (a node running on this data \
             dir?): {e}",
            dir.display()
        ),
        io::ErrorKind::InvalidData
            if e.to_string().contains(crate::storage::checksum::NEXT_STEP) =>
        {
            format!("{}: the Raft log is damaged: {e}", dir.display())
        }
        io::ErrorKind::InvalidData | io::ErrorKind::UnexpectedEof => format!(
            "{}: the Raft log is damaged: {e}; {}",
            dir.display(),
            crate::storage::checksum::NEXT_STEP
        ),
        _ => format!("{}: opening the Raft log: {e}", dir.display()),
    };
    io::Error::new(kind, text)
}

/// The Raft log in a directory, locked as a node locks it but not opened
/// for writing: for `fenced check` on a stopped node.
pub struct LockedLog {
    dir: std::path::PathBuf,
    dump: raft_log::Dump<WalTypes>,
}

impl LockedLog {
    /// Takes raft-log's lock on `dir` (its `LOCK` file is created if
    /// missing, nothing else is written); refused while a node holds it.
    pub fn lock(dir: &Path) -> io::Result<Self> {
        let config = raft_log::Config::new(dir.to_string_lossy().to_string());
        let dump = raft_log::Dump::new(Arc::new(config)).map_err(|e| unreadable_log(dir, e))?;
        Ok(Self {
            dir: dir.to_path_buf(),
            dump,
        })
    }

    /// Reads every record of every chunk, each checked against its CRC;
    /// how many there are, or the first damaged one.
    pub fn verify(&self) -> io::Result<u64> {
        use raft_log::DumpApi;
        crate::storage::log_tail::refuse_damage_before_the_tail::<WalTypes>(&self.dir)?;
        let mut records = 0u64;
        self.dump
            .write_with(|_chunk, _index, record| {
                record?;
                records = records.saturating_add(1);
                Ok(())
            })
            .map_err(|e| unreadable_log(&self.dir, e))?;
        Ok(records)
    }
}

fn write_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_logs(AnyError::new(&e)).into()
}

fn read_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::read_logs(AnyError::new(&e)).into()
}

impl LogStore {
    /// Opens (or creates) the log in `dir`; takes an exclusive lock on it.
    pub fn open(dir: &Path) -> io::Result<Self> {
        std::fs::create_dir_all(dir)?;
        crate::storage::log_tail::refuse_damage_before_the_tail::<WalTypes>(dir)?;
        let mut config = raft_log::Config::new(dir.to_string_lossy().to_string());
        // The flush thread would linger this long for more writes before
        // each write+fdatasync (1 ms by default). Commands are coalesced
        // upstream: the proposer puts every queued command in one entry and
        // keeps one entry in flight, and a follower gets one
        // AppendEntries at a time per leader. Lingering therefore merged
        // almost nothing and only delayed every commit, on the leader and
        // again on the follower that completes the majority: in paired runs
        // of fenced-bench S1/S3, no linger beat 50 µs in four of five pairs
        // (S1 cycle p50 2.6–3.0 ms against 2.9–4.9 ms).
        config.wal.flush_batch_wait = Some(std::time::Duration::ZERO);
        // raft-log keeps every entry not yet purged in memory, up to 1 GiB by
        // default; past this many bytes the oldest flushed ones are read back
        // from their chunk when asked for (a follower far behind), so the
        // log's memory has a bound in bytes, not only in entries.
        config.log_cache_capacity = Some(LOG_CACHE_BYTES);
        // raft-log frees disk only by deleting a whole chunk behind a purge,
        // and starts a new chunk only at 1 GiB by default: the log on disk
        // grew with history up to that, whatever the snapshots allowed (a
        // 30-minute soak ended with 97 MB data directories). Chunks the size
        // of the log between two snapshots keep it near live state.
        config.wal.chunk_max_size = Some(LOG_CHUNK_BYTES);
        let wal = Arc::new(Mutex::new(raft_log::RaftLog::<WalTypes>::open(Arc::new(
            config,
        ))?));
        let horizon = PurgeHorizon {
            wal: Arc::clone(&wal),
            gate: Arc::new(watch::Sender::new(Gate::default())),
        };
        Ok(Self {
            wal,
            horizon,
            sim_fsync: None,
            sim_dir: std::path::PathBuf::new(),
            sim_tail: Arc::default(),
            sink: Arc::new(OnceLock::new()),
            appended: Arc::default(),
        })
    }

    /// Bytes of entries appended since the log was opened: what the node
    /// counts to build a snapshot every so many bytes of log.
    pub fn appended_bytes(&self) -> u64 {
        self.appended.load(Ordering::Relaxed)
    }

    /// [`LogStore::open`] for the deterministic simulation: flushes end
    /// as [`SimFsync`] says.
    pub fn open_simulated(dir: &Path, fsync: SimFsync) -> io::Result<Self> {
        let log = Self {
            sim_fsync: Some(fsync),
            sim_dir: dir.to_path_buf(),
            ..Self::open(dir)?
        };
        let (chunk, len) = crate::storage::log_tail::last_chunk(dir)?;
        *log.sim_tail() = SimTail {
            chunk,
            answered_to: len,
            written_to: len,
        };
        Ok(log)
    }

    fn sim_tail(&self) -> MutexGuard<'_, SimTail> {
        self.sim_tail.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Under the simulation: flushes now, with this thread waiting, and
    /// returns the latency to wait before saying so, and where the flush
    /// ended (to pass to [`LogStore::answered`] once said). A flush the
    /// simulation fails has what it wrote cut off the file again.
    fn flush_simulated(&self, fsync: &SimFsync) -> io::Result<(std::time::Duration, u64)> {
        let (before_chunk, before) = crate::storage::log_tail::last_chunk(&self.sim_dir)?;
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        self.wal().flush(true, Some(FlushDone::Block(tx)))?;
        rx.recv()
            .map_err(|_| io::Error::other("log flush thread stopped"))??;
        let (chunk, after) = crate::storage::log_tail::last_chunk(&self.sim_dir)?;
        match fsync() {
            Ok(latency) => {
                let mut tail = self.sim_tail();
                if chunk != tail.chunk {
                    // A new chunk: its first record is not torn by a crash
                    // (nothing of it is counted unanswered).
                    *tail = SimTail {
                        chunk,
                        answered_to: after,
                        written_to: after,
                    };
                } else {
                    tail.written_to = after;
                }
                Ok((latency, after))
            }
            Err(e) => {
                if chunk == before_chunk {
                    std::fs::OpenOptions::new()
                        .write(true)
                        .open(&chunk)?
                        .set_len(before)?;
                }
                Err(e)
            }
        }
    }

    /// Under the simulation: openraft heard that the flush ending at `to`
    /// is durable.
    fn answered(&self, to: u64) {
        let mut tail = self.sim_tail();
        tail.answered_to = tail.answered_to.max(to).min(tail.written_to);
    }

    /// Under the simulation: the bytes of the log's last chunk whose flush
    /// openraft has not heard of, which a crash now may leave torn.
    pub fn unanswered_tail(&self) -> Option<UnansweredTail> {
        let tail = self.sim_tail();
        (self.sim_fsync.is_some() && tail.written_to > tail.answered_to).then(|| UnansweredTail {
            chunk: tail.chunk.clone(),
            bytes: tail.answered_to..tail.written_to,
        })
    }

    /// The handle through which the state machine allows purges.
    pub fn purge_horizon(&self) -> PurgeHorizon {
        self.horizon.clone()
    }

    /// From now on, `sink` is told of every append before its flush ends
    /// (the first sink set stays).
    pub fn on_append(&self, sink: Arc<dyn AppendSink>) {
        let _ = self.sink.set(sink);
    }

    /// The id of the log's last entry (or of the last purged one), as
    /// openraft sees it: a purge held back counts as done.
    pub fn last(&self) -> Option<LogId> {
        last_log_id(&self.wal()).max(self.horizon.deferred())
    }

    /// The vote this node holds: set by openraft (through `save_vote`)
    /// before it answers a vote request, so it is never behind that answer,
    /// unlike openraft's metrics.
    pub fn vote(&self) -> Option<Vote<NodeId>> {
        self.wal().log_state().vote().map(|v| v.0)
    }

    fn wal(&self) -> MutexGuard<'_, raft_log::RaftLog<WalTypes>> {
        self.wal.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// How many times the log has been fdatasync'ed since it was opened.
    pub fn sync_count(&self) -> u64 {
        self.wal().stat().flush_metrics.sync_batch_count
    }

    /// The flush thread's statistics: syncs, their total and longest time.
    pub fn flush_metrics(&self) -> raft_log::FlushMetrics {
        self.wal().stat().flush_metrics
    }

    /// Replaces the stored vote with `replace(vote)` when that is `Some`,
    /// durably (fdatasync) before it returns the new vote. Called before
    /// Raft starts ([`crate::replication::restart`] decides).
    pub async fn replace_vote(
        &self,
        replace: impl FnOnce(Option<Vote<NodeId>>) -> Option<Vote<NodeId>>,
    ) -> io::Result<Option<Vote<NodeId>>> {
        let new = {
            let mut wal = self.wal();
            let Some(new) = replace(wal.log_state().vote().map(|v| v.0)) else {
                return Ok(None);
            };
            wal.save_vote(WalVote(new))?;
            new
        };
        self.sync().await?;
        Ok(Some(new))
    }

    /// Whether the log holds nothing at all: no entry and no vote (a new
    /// node, or one whose log was lost).
    pub fn is_pristine(&self) -> bool {
        is_pristine(&self.wal())
    }

    /// Writes the cluster's first membership as entry 0 of an empty log, the
    /// entry openraft's `initialize` writes, but without the election
    /// `initialize` starts at once: a node started before its peers listen
    /// would ask them for votes and fail, and nodes started together would
    /// stand against each other. Elections then start only from fenced's
    /// pre-vote ([`crate::election`]). Every node writes the same entry at
    /// the same log id, as with `initialize`. Returns whether it wrote it
    /// (nothing is written on a log that has entries or a vote).
    pub async fn seed_membership(&self, members: &BTreeMap<NodeId, Node>) -> io::Result<bool> {
        {
            let mut wal = self.wal();
            if !is_pristine(&wal) {
                return Ok(false);
            }
            let voters = members.keys().copied().collect();
            let entry = EntryPayload::<TypeConfig>::Membership(Membership::new(
                vec![voters],
                members.clone(),
            ));
            let bytes = codec::encode("log entry", &entry).map_err(io::Error::other)?;
            wal.append(vec![(WalLogId(LogId::default()), bytes)])?;
        }
        self.sync().await?;
        Ok(true)
    }

    /// Flushes with fdatasync and waits for it.
    async fn sync(&self) -> io::Result<()> {
        if let Some(fsync) = &self.sim_fsync {
            let (latency, to) = self.flush_simulated(fsync)?;
            tokio::time::sleep(latency).await;
            self.answered(to);
            return Ok(());
        }
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.wal().flush(true, Some(FlushDone::Wait(tx)))?;
        rx.await
            .map_err(|_| io::Error::other("log flush thread stopped"))?
    }
}

impl RaftLogReader<TypeConfig> for LogStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        let start = match range.start_bound() {
            Bound::Included(x) => *x,
            Bound::Excluded(x) => x.saturating_add(1),
            Bound::Unbounded => 0,
        };
        let end = match range.end_bound() {
            Bound::Included(x) => x.saturating_add(1),
            Bound::Excluded(x) => *x,
            Bound::Unbounded => u64::MAX,
        };
        let wal = self.wal();
        let mut entries = Vec::new();
        for item in wal.read(start, end) {
            let (log_id, payload) = item.map_err(read_err)?;
            let payload: EntryPayload<TypeConfig> =
                codec::decode("log entry", &payload).map_err(read_err)?;
            entries.push(Entry {
                log_id: log_id.0,
                payload,
            });
        }
        Ok(entries)
    }
}

impl RaftLogStorage<TypeConfig> for LogStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<TypeConfig>, StorageError> {
        let wal = self.wal();
        Ok(LogState {
            last_purged_log_id: wal.log_state().purged().map(|x| x.0),
            last_log_id: last_log_id(&wal),
        })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote<NodeId>) -> Result<(), StorageError> {
        let vote_err = |e: io::Error| StorageIOError::write_vote(AnyError::new(&e));
        self.wal().save_vote(WalVote(*vote)).map_err(vote_err)?;
        self.sync().await.map_err(vote_err)?;
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote<NodeId>>, StorageError> {
        Ok(self.vote())
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
        self.horizon.settled().await?;
        if let Some(c) = committed {
            // Buffered, not flushed: it reaches the disk with the next
            // append's write, which saves every node a write and a wake of
            // the flush thread per commit. A mark lost in a crash only means
            // the node re-applies those entries once the leader tells it the
            // commit index again; it never lets an uncommitted entry apply.
            self.wal().commit(WalLogId(c)).map_err(write_err)?;
        }
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.wal().log_state().committed().map(|x| x.0))
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
        self.horizon.settled().await?;
        let entries: Vec<Entry> = entries.into_iter().collect();
        let mut items = Vec::with_capacity(entries.len());
        for e in &entries {
            items.push((
                WalLogId(e.log_id),
                codec::encode("log entry", &e.payload).map_err(write_err)?,
            ));
        }
        let bytes: usize = items.iter().map(|(_, b)| b.len()).sum();
        self.appended
            .fetch_add(u64::try_from(bytes).unwrap_or(u64::MAX), Ordering::Relaxed);
        let mut wal = self.wal();
        // As of the append, read under the same lock.
        let told = self.sink.get().map(|sink| {
            let state = wal.log_state();
            let vote = state.vote().map(|v| v.0);
            let committed = state.committed().map(|x| x.0);
            (sink, vote, last_log_id(&wal), committed)
        });
        wal.append(items).map_err(write_err)?;
        if let Some(fsync) = &self.sim_fsync {
            drop(wal);
            // CANARY (planted in a `canaries` build, `canary::on`): a flush
            // that failed is reported done, as if the error were passing.
            let flushed = match self.flush_simulated(fsync) {
                Err(e) if fenced_core::canary::on(fenced_core::canary::Canary::AckFailedFlush) => {
                    tracing::warn!(error = %e, "canary: a failed log flush reported done");
                    Ok((std::time::Duration::ZERO, 0))
                }
                flushed => flushed,
            };
            let (latency, to) = flushed.map_err(write_err)?;
            let log = self.clone();
            tokio::spawn(async move {
                tokio::time::sleep(latency).await;
                log.answered(to);
                callback.log_io_completed(Ok(()));
            });
        } else {
            // openraft counts the entries as persisted only when raft-log's
            // flush thread calls back, after fdatasync.
            wal.flush(true, Some(FlushDone::Raft(callback)))
                .map_err(write_err)?;
            drop(wal);
        }
        if let Some((sink, vote, last_before, committed)) = told {
            sink.appended(Appended {
                vote,
                last_before,
                committed,
                entries,
            });
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.horizon.settled().await?;
        self.wal().truncate(log_id.index).map_err(write_err)?;
        self.sync().await.map_err(write_err)?;
        Ok(())
    }

    /// Never past the snapshot on disk: see [`PurgeHorizon`].
    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.horizon.purge(log_id).map_err(write_err)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use std::time::Duration;

    use openraft::{storage::RaftStateMachine, RaftSnapshotBuilder};

    fn log_id(term: u64, node: NodeId, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, node), index)
    }

    async fn indexes(log: &mut LogStore, range: std::ops::RangeInclusive<u64>) -> Vec<u64> {
        let entries = log.try_get_log_entries(range).await.unwrap();
        entries.iter().map(|e| e.log_id.index).collect()
    }

    /// A node whose snapshot on disk covers the log up to 10, with blank
    /// entries 1..=30 committed up to 25.
    async fn node_with_snapshot_at_10(
        dir: &Path,
    ) -> (LogStore, crate::state_machine::StateMachine) {
        let mut log = testing::log_with_blanks(&dir.join("raft-log"), 30, 25).await;
        let mut sm = testing::open_state(dir, &log);
        let blanks = log.try_get_log_entries(1..=10).await.unwrap();
        sm.apply(blanks).await.unwrap();
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        (log, sm)
    }

    fn chunk_files(dir: &Path) -> usize {
        std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| crate::storage::log_tail::is_chunk(&e.as_ref().unwrap().path()))
            .count()
    }

    #[tokio::test]
    async fn a_purge_deletes_the_chunks_behind_it_so_the_disk_tracks_live_state() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = LogStore::open(dir.path()).unwrap();
        // 48 MiB of log in entries of 1 MiB: three chunks at least.
        let entry = vec![0x5au8; 1 << 20];
        for i in 1..=48u64 {
            log.wal()
                .append(vec![(WalLogId(log_id(1, 1, i)), entry.clone())])
                .unwrap();
        }
        log.sync().await.unwrap();
        assert!(
            chunk_files(dir.path()) >= 3,
            "{} chunks",
            chunk_files(dir.path())
        );
        log.horizon
            .gate
            .send_modify(|g| g.durable = Some(log_id(1, 1, 46)));
        log.purge(log_id(1, 1, 46)).await.unwrap();
        // raft-log's flush thread unlinks them after the purge's sync; a
        // sync queued behind that has seen it done.
        log.sync().await.unwrap();
        assert!(
            chunk_files(dir.path()) <= 2,
            "the chunks behind the purge are deleted: {} left",
            chunk_files(dir.path())
        );
        let size: u64 = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().metadata().unwrap().len())
            .sum();
        assert!(
            size < 2 * LOG_CHUNK_BYTES as u64 + (2 << 20),
            "{size} bytes left"
        );
        let kept = log.wal().read(47, 49).count();
        assert_eq!(kept, 2, "the entries after the purge are kept");
    }

    /// openraft 0.9 queues the install of a received snapshot and purges the
    /// log up to it at once. A crash before the snapshot is on disk must
    /// leave the log the old snapshot needs to restart.
    #[tokio::test]
    async fn a_purge_past_the_durable_snapshot_keeps_the_entries_it_needs() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, sm) = node_with_snapshot_at_10(dir.path()).await;

        // A snapshot at 40 arrives: its install is queued, the purge is not.
        log.purge(log_id(1, 1, 40)).await.unwrap();
        assert_eq!(log.last(), Some(log_id(1, 1, 40)), "openraft's view");
        assert_eq!(
            log.get_log_state().await.unwrap().last_purged_log_id,
            Some(log_id(1, 1, 10)),
            "purged only as far as the durable snapshot"
        );
        // kill -9 here: the snapshot at 40 never reached the disk.
        drop((log, sm));

        // openraft's own restart re-applies the committed entries after the
        // durable snapshot: they are still there.
        let (mut log, mut sm) = testing::restart(dir.path()).await;
        assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(1, 1, 25)));
        assert_eq!(
            indexes(&mut log, 11..=30).await,
            (11..=30).collect::<Vec<_>>()
        );
    }

    /// The held-back purge is done once the snapshot it waits for is on
    /// disk, and appends that follow the snapshot wait for it.
    #[tokio::test]
    async fn a_held_back_purge_is_done_when_its_snapshot_is_durable() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, mut sm) = node_with_snapshot_at_10(dir.path()).await;
        log.purge(log_id(1, 1, 40)).await.unwrap();

        let horizon = log.purge_horizon();
        let append = tokio::spawn(async move { horizon.settled().await });
        for _ in 0..10 {
            tokio::task::yield_now().await;
        }
        assert!(!append.is_finished(), "an append waits for the purge");

        // The received snapshot at 40 lands.
        let (meta, body) = crate::state_machine::testing::snapshot_at(log_id(1, 1, 40));
        sm.install_snapshot(&meta, body).await.unwrap();
        append.await.unwrap().expect("the append may go on");
        let state = log.get_log_state().await.unwrap();
        assert_eq!(state.last_purged_log_id, Some(log_id(1, 1, 40)));
        assert_eq!(state.last_log_id, Some(log_id(1, 1, 40)));
        assert_eq!(indexes(&mut log, 1..=40).await, Vec::<u64>::new());
        drop((log, sm));

        let (_log, mut sm) = testing::restart(dir.path()).await;
        assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(1, 1, 40)));
    }

    /// An install that fails leaves nothing waiting for it: a purge made for
    /// it (here after the failure) holds the entries, and appends fail.
    #[tokio::test]
    async fn appends_fail_rather_than_wait_for_a_snapshot_that_failed() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, mut sm) = node_with_snapshot_at_10(dir.path()).await;
        let (meta, _) = crate::state_machine::testing::snapshot_at(log_id(1, 1, 40));
        let garbage = Box::new(io::Cursor::new(vec![0xff; 8]));
        assert!(sm.install_snapshot(&meta, garbage).await.is_err());
        log.purge(log_id(1, 1, 40)).await.unwrap();
        let settled = tokio::time::timeout(Duration::from_secs(10), log.horizon.settled());
        let settled = settled.await.expect("an append does not wait");
        assert!(settled.is_err(), "an append fails");
        assert_eq!(
            indexes(&mut log, 1..=30).await,
            (11..=30).collect::<Vec<_>>()
        );
    }

    /// A purge asked for while nothing allowed it is done at the next purge
    /// the durable snapshot allows.
    #[tokio::test]
    async fn a_held_back_purge_is_done_at_the_next_purge_allowed() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = testing::log_with_blanks(dir.path(), 30, 25).await;
        log.purge(log_id(1, 1, 20)).await.unwrap();
        assert_eq!(log.get_log_state().await.unwrap().last_purged_log_id, None);
        log.horizon.snapshot_durable(Some(log_id(1, 1, 15)));
        assert_eq!(
            log.get_log_state().await.unwrap().last_purged_log_id,
            Some(log_id(1, 1, 15))
        );
        log.horizon
            .gate
            .send_modify(|g| g.durable = Some(log_id(1, 1, 25)));
        log.purge(log_id(1, 1, 18)).await.unwrap();
        assert_eq!(
            log.get_log_state().await.unwrap().last_purged_log_id,
            Some(log_id(1, 1, 20)),
            "the earlier, further purge is done"
        );
        assert_eq!(
            indexes(&mut log, 1..=30).await,
            (21..=30).collect::<Vec<_>>()
        );
    }
}

/// Logs for tests of other modules.
#[cfg(test)]
pub(crate) mod testing {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use openraft::StorageHelper;

    use super::*;
    use crate::{state_machine::parking::Parking, state_machine::StateMachine};

    /// The state machine of a node whose data directory is `dir`.
    pub fn open_state(dir: &Path, log: &LogStore) -> StateMachine {
        StateMachine::open(
            &dir.join("state"),
            Parking::new(16),
            log.purge_horizon(),
            fenced_core::DEFAULT_HISTORY_PER_RESOURCE,
        )
        .expect("open state machine")
    }

    /// Opens a node's log and state machine from `dir` and runs openraft's
    /// restart over them (it re-applies the committed log after the
    /// snapshot, and fails if an entry it needs is gone).
    pub async fn restart(dir: &Path) -> (LogStore, StateMachine) {
        let mut log = LogStore::open(&dir.join("raft-log")).expect("open log");
        let mut sm = open_state(dir, &log);
        StorageHelper::new(&mut log, &mut sm)
            .get_initial_state()
            .await
            .expect("the node restarts");
        (log, sm)
    }

    /// A log in `dir` holding `payloads` as entries `0..` of term 1 (the
    /// first at index 0, as openraft initialises a log), all committed.
    pub async fn log_with_payloads(dir: &Path, payloads: &[EntryPayload<TypeConfig>]) -> LogStore {
        let id = |i| WalLogId(LogId::new(CommittedLeaderId::new(1, 1), i));
        let log = LogStore::open(dir).unwrap();
        let items: Vec<_> = payloads
            .iter()
            .zip(0..)
            .map(|(p, i)| (id(i), codec::encode("log entry", p).unwrap()))
            .collect();
        let last = items.last().map(|(i, _)| i.clone()).unwrap();
        log.wal().append(items).unwrap();
        log.wal().commit(last).unwrap();
        log.sync().await.unwrap();
        log
    }

    /// A log in `dir` holding blank entries `1..=last` of term 1, committed
    /// up to `committed`.
    pub async fn log_with_blanks(dir: &Path, last: u64, committed: u64) -> LogStore {
        let id = |i| WalLogId(LogId::new(CommittedLeaderId::new(1, 1), i));
        let log = LogStore::open(dir).unwrap();
        let blank = codec::encode("log entry", &EntryPayload::<TypeConfig>::Blank).unwrap();
        let items = (1..=last).map(|i| (id(i), blank.clone()));
        log.wal().append(items.collect::<Vec<_>>()).unwrap();
        log.wal().commit(id(committed)).unwrap();
        log.sync().await.unwrap();
        log
    }
}
