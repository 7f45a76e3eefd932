//! The Raft log and vote on disk, through `raft-log` (a CRC-framed WAL made
//! for Raft): every append and vote is fdatasync'ed before openraft hears it
//! is done, so nothing is acknowledged that a crash could take back.

use std::{
    fmt::Debug,
    io,
    ops::{Bound, RangeBounds},
    path::Path,
    sync::{Arc, Mutex, MutexGuard, OnceLock, PoisonError},
};

use openraft::{
    raft::AppendEntriesRequest,
    storage::{LogFlushed, LogState, RaftLogStorage},
    AnyError, CommittedLeaderId, EntryPayload, OptionalSend, RaftLogReader, StorageIOError, Vote,
};
use raft_log::{
    api::raft_log_writer::RaftLogWriter,
    codeq::{Decode, Encode},
};

use crate::{
    codec,
    early_replication::EarlyReplication,
    types::{Entry, LogId, NodeId, StorageError, TypeConfig},
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
}

impl raft_log::Callback for FlushDone {
    fn send(self, res: Result<(), io::Error>) {
        match self {
            FlushDone::Raft(done) => done.log_io_completed(res),
            FlushDone::Wait(tx) => {
                let _ = tx.send(res);
            }
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct WalTypes;

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

/// The durable Raft log and vote of one node.
#[derive(Clone)]
pub struct LogStore {
    wal: Arc<Mutex<raft_log::RaftLog<WalTypes>>>,
    /// Set once Raft runs (it needs Raft's metrics for the membership).
    early: Arc<OnceLock<EarlyReplication>>,
}

/// Whether `vote` is the one node `me` leads under: its own, and won.
fn leads_under(vote: &Vote<NodeId>, me: NodeId) -> bool {
    vote.is_committed() && vote.leader_id().voted_for() == Some(me)
}

/// When this node appends as leader (under its own committed vote), that
/// vote and the entry its new entries follow (its last one); `None` for a
/// follower's or a candidate's append.
fn leader_append(
    vote: Option<Vote<NodeId>>,
    me: NodeId,
    last: Option<LogId>,
) -> Option<(Vote<NodeId>, Option<LogId>)> {
    vote.filter(|v| leads_under(v, me)).map(|v| (v, last))
}

/// The id of the log's last entry, or of the last purged one when nothing
/// follows it.
fn last_log_id(wal: &raft_log::RaftLog<WalTypes>) -> Option<LogId> {
    let state = wal.log_state();
    state.last().or(state.purged()).map(|x| x.0)
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
        let wal = raft_log::RaftLog::<WalTypes>::open(Arc::new(config))?;
        Ok(Self {
            wal: Arc::new(Mutex::new(wal)),
            early: Arc::new(OnceLock::new()),
        })
    }

    /// From now on, a leader's appends also go to its followers before its
    /// own fdatasync ends (see [`crate::early_replication`]).
    pub fn replicate_early(&self, early: EarlyReplication) {
        let _ = self.early.set(early);
    }

    /// Early copies of appends sent to followers since start.
    pub fn early_appends_sent(&self) -> u64 {
        self.early.get().map_or(0, EarlyReplication::sent)
    }

    /// The id of the log's last entry (or of the last purged one).
    pub fn last(&self) -> Option<LogId> {
        last_log_id(&self.wal())
    }

    /// openraft AppendEntries answered by a follower's answer to an early
    /// copy, without a round trip of their own.
    pub fn early_answers_reused(&self) -> u64 {
        self.early.get().map_or(0, |e| e.answers().reused())
    }

    /// Commit-only heartbeats to followers answered from a stored early
    /// copy, their commit index left to the next message.
    pub fn early_heartbeats_answered(&self) -> u64 {
        self.early
            .get()
            .map_or(0, |e| e.answers().heartbeats_answered())
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

    /// Called before Raft starts. When this node led under the stored vote
    /// in its last run, replaces that vote with its own uncommitted vote for
    /// the next term, durably; returns that term.
    ///
    /// openraft 0.9 would otherwise make a restarted leader lead again under
    /// the same vote, and assign log ids again from its last durable entry.
    /// With early replication a follower may hold an entry of that leader
    /// which the leader itself lost in the crash (sent before its own
    /// fdatasync ended); a new entry with the same log id would then be taken
    /// by that follower as one it already has, and the two logs would differ
    /// under equal ids. In a new term every log id is new, and Raft replaces
    /// the follower's uncommitted leftover as usual.
    pub async fn give_up_restored_leadership(&self, me: NodeId) -> io::Result<Option<u64>> {
        let term = {
            let mut wal = self.wal();
            let led = wal.log_state().vote().map(|v| v.0);
            let Some(led) = led.filter(|v| leads_under(v, me)) else {
                return Ok(None);
            };
            let term = led.leader_id().get_term() + 1;
            wal.save_vote(WalVote(Vote::new(term, me)))?;
            term
        };
        self.sync().await?;
        Ok(Some(term))
    }

    /// Flushes with fdatasync and waits for it.
    async fn sync(&self) -> io::Result<()> {
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
        Ok(self.wal().log_state().vote().map(|v| v.0))
    }

    async fn save_committed(&mut self, committed: Option<LogId>) -> Result<(), StorageError> {
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
        let entries: Vec<Entry> = entries.into_iter().collect();
        let mut items = Vec::with_capacity(entries.len());
        for e in &entries {
            items.push((
                WalLogId(e.log_id),
                codec::encode("log entry", &e.payload).map_err(write_err)?,
            ));
        }
        let mut wal = self.wal();
        let early = self.early.get().and_then(|early| {
            let state = wal.log_state();
            let (vote, prev) =
                leader_append(state.vote().map(|v| v.0), early.me(), last_log_id(&wal))?;
            Some((early, vote, prev, state.committed().map(|x| x.0)))
        });
        wal.append(items).map_err(write_err)?;
        // openraft counts the entries as persisted only when raft-log's flush
        // thread calls back, after fdatasync.
        wal.flush(true, Some(FlushDone::Raft(callback)))
            .map_err(write_err)?;
        drop(wal);
        if let Some((early, vote, prev_log_id, leader_commit)) = early {
            early.offer(&AppendEntriesRequest {
                vote,
                prev_log_id,
                entries,
                leader_commit,
            });
        }
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.wal().truncate(log_id.index).map_err(write_err)?;
        self.sync().await.map_err(write_err)?;
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut wal = self.wal();
        wal.purge(WalLogId(log_id)).map_err(write_err)?;
        wal.flush(true, None).map_err(write_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn log_id(term: u64, node: NodeId, index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(term, node), index)
    }

    /// The vote of node `leader` once it won `term`.
    fn won(term: u64, leader: NodeId) -> Vote<NodeId> {
        let mut vote = Vote::new(term, leader);
        vote.commit();
        vote
    }

    /// A log in `dir` whose vote is `vote`.
    async fn log_with_vote(dir: &Path, vote: Vote<NodeId>) -> LogStore {
        let mut log = LogStore::open(dir).unwrap();
        log.save_vote(&vote).await.unwrap();
        log
    }

    #[tokio::test]
    async fn a_restarted_leader_keeps_no_vote_of_its_last_run() {
        let dir = tempfile::tempdir().unwrap();
        drop(log_with_vote(dir.path(), won(3, 1)).await);
        let mut log = LogStore::open(dir.path()).unwrap();
        assert_eq!(log.give_up_restored_leadership(1).await.unwrap(), Some(4));
        let own_next = Vote::new(4, 1);
        assert_eq!(log.read_vote().await.unwrap(), Some(own_next));
        drop(log);
        // Durable: the next start sees the new vote, and leaves it alone.
        let mut log = LogStore::open(dir.path()).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(own_next));
        assert_eq!(log.give_up_restored_leadership(1).await.unwrap(), None);
        assert_eq!(log.read_vote().await.unwrap(), Some(own_next));
    }

    #[tokio::test]
    async fn a_followers_vote_survives_a_restart_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = log_with_vote(dir.path(), won(3, 2)).await;
        assert_eq!(log.give_up_restored_leadership(1).await.unwrap(), None);
        assert_eq!(log.read_vote().await.unwrap(), Some(won(3, 2)));
        assert_eq!(log.give_up_restored_leadership(2).await.unwrap(), Some(4));
    }

    #[test]
    fn only_a_leaders_own_appends_are_copied_early() {
        let last = Some(log_id(3, 1, 41));
        let leading = won(3, 1);
        assert_eq!(
            leader_append(Some(leading), 1, last),
            Some((leading, last)),
            "the leader's append follows its last entry"
        );
        assert_eq!(leader_append(Some(leading), 1, None), Some((leading, None)));
        // A follower appends what node 1 sent it.
        assert_eq!(leader_append(Some(leading), 2, last), None);
        // A candidate's vote for itself is not a leader's.
        assert_eq!(leader_append(Some(Vote::new(4, 1)), 1, last), None);
        assert_eq!(leader_append(None, 1, last), None);
    }
}
