//! The replicated state machine: the lease table of fenced-core, applied in
//! log order, kept in memory and persisted as snapshots (the log behind a
//! snapshot is purged). A restart loads the snapshot and openraft re-applies
//! the committed log after it, which restores exactly the committed state.
//! The snapshot files are `snapshots`'s: the state machine hands it the
//! state to write and takes back the state a snapshot holds. Blocking
//! acquires wait in `parking` until the table grants them.

pub mod parking;
mod snapshots;

use std::{
    io::Cursor,
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard, TryLockError,
    },
    time::{Duration, Instant},
};

use fenced_core::{
    AcquireInSessionOutcome, AcquireOutcome, CapacityBound, ChangesAfter, CloseSessionOutcome,
    ClusterTime, Compacted, Description, Event, KvBound, KvDeleteOutcome, KvEntry, KvPutOutcome,
    KvSnapshot, LeaseTable, Outcome, ReleaseOutcome, RenewOutcome, SessionOutcome, TableSnapshot,
    Token, Validation,
};
use openraft::{
    storage::RaftStateMachine, AnyError, EntryPayload, OptionalSend, RaftSnapshotBuilder,
    StorageIOError,
};

#[cfg(test)]
pub(crate) use self::snapshots::testing;
pub(crate) use self::snapshots::{check_snapshot_file, file_table, SNAPSHOT_FILE};
pub use self::snapshots::{inspect_export, write_restored_state, RestoredState};
use self::snapshots::{SnapshotBody, Snapshots};
use crate::{
    blocking::DiskWork,
    clock::AppliedTime,
    codec,
    counters::Counters,
    peer::retired::{RetiredIds, Retirement},
    state_machine::parking::Parking,
    storage::log_store::PurgeHorizon,
    types::{
        Entry, LogId, Outcomes, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
    },
};

/// The state applied so far: what a snapshot holds.
struct Data {
    table: LeaseTable,
    last_applied: Option<LogId>,
    membership: StoredMembership,
    /// Every node id a committed membership change removed.
    retired: RetiredIds,
}

/// The state shared between the state machine and the services that read it.
pub struct Shared {
    data: RwLock<Data>,
    /// An apply is waiting for the state ([`Shared::write_for_apply`]).
    apply_waiting: AtomicBool,
    /// Told of every applied entry's events; owned by `node.rs`, which
    /// hands the same one to the services that park callers.
    parking: Arc<Parking>,
    /// Owned by `node.rs`; the state machine counts what it applies (and
    /// `snapshots` what it writes).
    counters: Arc<Counters>,
    /// The snapshot on disk and its writer.
    snapshots: Snapshots,
    /// The grants remembered per resource (the same on every node).
    history_len: usize,
    /// The table's latest revision, for watchers waiting for changes.
    revisions: tokio::sync::watch::Sender<u64>,
    /// The retired node ids as applied, for the peer port's admission.
    retired: tokio::sync::watch::Sender<RetiredIds>,
}

impl Shared {
    fn read(&self) -> RwLockReadGuard<'_, Data> {
        self.data.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Data> {
        self.data.write().unwrap_or_else(PoisonError::into_inner)
    }

    fn try_write(&self) -> Option<RwLockWriteGuard<'_, Data>> {
        match self.data.try_write() {
            Ok(guard) => Some(guard),
            Err(TryLockError::Poisoned(poisoned)) => Some(poisoned.into_inner()),
            Err(TryLockError::WouldBlock) => None,
        }
    }

    /// The state for an apply, waited for without blocking the runtime
    /// thread. A snapshot's encode reads the state on a blocking thread for
    /// as long as it takes (about a second with a million leases); an apply
    /// that blocked its thread on the lock meanwhile stopped the node's
    /// heartbeats and its answers to the leader, and an election followed
    /// (three while a million leases were taken, at a 200 ms election
    /// timeout). Reads from other blocking threads let a waiting apply in
    /// first ([`Shared::read_behind_apply`]), so a run of them cannot hold
    /// it back.
    async fn write_for_apply(&self) -> RwLockWriteGuard<'_, Data> {
        loop {
            if let Some(guard) = self.try_write() {
                self.apply_waiting.store(false, Ordering::Release);
                return guard;
            }
            self.apply_waiting.store(true, Ordering::Release);
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }

    /// A read from a blocking thread that first lets a waiting apply in
    /// (for at most 100 ms: called by mistake on the runtime thread, it
    /// delays, never deadlocks).
    fn read_behind_apply(&self) -> RwLockReadGuard<'_, Data> {
        let started = Instant::now();
        while self.apply_waiting.load(Ordering::Acquire)
            && started.elapsed() < Duration::from_millis(100)
        {
            std::thread::sleep(Duration::from_millis(1));
        }
        self.read()
    }

    /// The cluster time of the latest applied entry.
    pub fn now(&self) -> ClusterTime {
        self.read().table.now()
    }

    pub fn describe(&self, resource: &str, now: ClusterTime) -> Description {
        self.read().table.describe(resource, now)
    }

    /// [`Shared::describe`] and the live lease's job label, read together.
    pub fn describe_labelled(
        &self,
        resource: &str,
        now: ClusterTime,
    ) -> (Description, Option<fenced_core::JobLabel>) {
        let data = self.read();
        (
            data.table.describe(resource, now),
            data.table.label_of(resource).cloned(),
        )
    }

    /// A key of the fenced store, as of the latest applied entry.
    pub fn kv_get(&self, key: &str) -> Option<KvEntry> {
        self.read().table.kv().get(key).cloned()
    }

    pub fn next_wakeup(&self) -> Option<ClusterTime> {
        self.read().table.next_wakeup()
    }

    /// When the leader should propose an entry to end waits and record
    /// expiries.
    pub fn next_sweep(&self) -> Option<ClusterTime> {
        self.read().table.next_sweep()
    }

    pub fn validate(&self, resource: &str, token: Token, now: ClusterTime) -> Validation {
        self.read().table.validate(resource, token, now)
    }

    /// The leader's wall clock at cluster time `t`, for people (see
    /// [`fenced_core::WallClock`]); `None` before the first anchor.
    pub fn wall_ms_at(&self, t: ClusterTime) -> Option<u64> {
        self.read().table.wall_ms_at(t)
    }

    /// The wall time of each of `changes`, if known, under one read of the
    /// table: a page of watch events or the status page's rows.
    pub fn wall_ms_of(&self, changes: &[fenced_core::Change]) -> Vec<Option<u64>> {
        let data = self.read();
        changes
            .iter()
            .map(|c| data.table.wall_ms_at(c.at))
            .collect()
    }

    /// Whether a leader whose wall clock reads `unix_ms` at `at` should
    /// record a new anchor.
    pub fn wall_needs_anchor(&self, at: ClusterTime, unix_ms: u64) -> bool {
        self.read().table.wall_clock().needs_anchor(at, unix_ms)
    }

    /// Validates every check under one read of the table. With an owner id,
    /// also whether the live lease is that owner's with that token (read
    /// from the lease itself, not the history, which a node may keep none
    /// of: `history_per_resource = 0`).
    pub fn validate_all(
        &self,
        checks: &[fenced_proto::TokenCheck],
        now: ClusterTime,
    ) -> Vec<(Validation, Option<bool>)> {
        let data = self.read();
        checks
            .iter()
            .map(|(r, t, owner)| {
                let v = data.table.validate(r.as_str(), *t, now);
                let matches = owner.map(|o| {
                    data.table
                        .holder(r.as_str())
                        .is_some_and(|(holder, grant)| grant.token == *t && holder == o)
                });
                (v, matches)
            })
            .collect()
    }

    /// The remembered grants of `resource`, newest first, with their wall
    /// times, under one read of the table.
    pub fn dated_history(
        &self,
        resource: &str,
        limit: usize,
    ) -> Vec<fenced_core::DatedHistoryEntry> {
        self.read().table.dated_history(resource, limit)
    }

    pub fn history_len(&self) -> usize {
        self.history_len
    }

    /// The revision of the latest change applied here.
    pub fn revision(&self) -> u64 {
        self.read().table.revision()
    }

    pub fn changes_after(
        &self,
        after: u64,
        prefix: &str,
        max: usize,
    ) -> Result<ChangesAfter, Compacted> {
        self.read().table.changes_after(after, prefix, max)
    }

    /// Told the revision each time changes are applied or a snapshot is
    /// installed.
    pub fn subscribe_revisions(&self) -> tokio::sync::watch::Receiver<u64> {
        self.revisions.subscribe()
    }

    fn announce_revision(&self, revision: u64) {
        self.revisions.send_if_modified(|r| {
            let changed = *r != revision;
            *r = revision;
            changed
        });
    }

    pub fn last_applied(&self) -> Option<LogId> {
        self.read().last_applied
    }

    /// The node ids retired so far (as applied here).
    pub fn retired_ids(&self) -> RetiredIds {
        self.read().retired.clone()
    }

    /// Told the retired ids each time they change (applied or installed).
    pub fn subscribe_retired(&self) -> tokio::sync::watch::Receiver<RetiredIds> {
        self.retired.subscribe()
    }

    fn announce_retired(&self, retired: &RetiredIds) {
        self.retired.send_if_modified(|r| {
            let changed = r != retired;
            if changed {
                r.clone_from(retired);
            }
            changed
        });
    }

    /// The last log id the snapshot file on disk covers (set once the file
    /// is renamed into place and its directory synced).
    pub fn snapshot_on_disk(&self) -> Option<LogId> {
        self.snapshots.durable_last()
    }

    /// Writes no snapshot from now on, not even one already under way:
    /// the simulation's crash, which must leave the disk as a process
    /// killed at that moment would.
    pub fn halt_writes(&self) {
        self.snapshots.halt();
    }

    /// Whether `owner` holds the lease on `resource` now.
    pub fn holds(&self, resource: &str, owner: fenced_core::OwnerId) -> bool {
        self.read()
            .table
            .holder(resource)
            .is_some_and(|(holder, _)| holder == owner)
    }

    pub fn live_leases(&self) -> usize {
        self.read().table.live_leases()
    }

    /// How many sessions are open.
    pub fn sessions(&self) -> usize {
        self.read().table.sessions()
    }

    /// [`fenced_core::LeaseTable::leases`]: a pass over the records under
    /// `prefix`, so call it off the runtime thread.
    pub fn leases(&self, prefix: &str, now: ClusterTime, limit: usize) -> fenced_core::LeaseList {
        self.read_behind_apply().table.leases(prefix, now, limit)
    }

    /// [`LeaseTable::last_token`]: every token granted from now on is above
    /// it.
    pub fn last_token(&self) -> Option<Token> {
        self.read().table.last_token()
    }

    /// Clients queued in the table for a held resource.
    pub fn waiters(&self) -> usize {
        self.read().table.waiters()
    }

    /// Puts an installed snapshot's state in place of the one applied.
    fn replace(&self, data: Data) {
        let revision = data.table.revision();
        let retired = data.retired.clone();
        *self.write() = data;
        self.announce_revision(revision);
        self.announce_retired(&retired);
    }

    /// A copy of the whole lease table and fenced store (for [`digest`],
    /// computed off the runtime thread) and the last entry applied to them,
    /// read together.
    pub fn table_snapshot(&self) -> (Option<LogId>, (TableSnapshot, KvSnapshot)) {
        let data = self.read_behind_apply();
        (
            data.last_applied,
            (data.table.snapshot(), data.table.kv_snapshot()),
        )
    }
}

/// The clock reads the applied entries' time here.
impl AppliedTime for Shared {
    fn applied_time(&self) -> ClusterTime {
        self.now()
    }
}

/// A digest (FNV-1a 64) of a lease table and fenced store, equal on
/// replicas that applied the same log. A pass over every byte of them: call
/// it off the runtime thread.
pub fn digest(snapshot: &(TableSnapshot, KvSnapshot)) -> u64 {
    let bytes = codec::encode("table", snapshot).unwrap_or_default();
    bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The openraft state machine over [`Shared`].
#[derive(Clone)]
pub struct StateMachine {
    shared: Arc<Shared>,
}

/// Runs `f`, file work of kind `work`, on a blocking thread.
async fn blocking<T: Send + 'static>(
    work: DiskWork,
    dir: &Path,
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    crate::blocking::run(work, dir, f)
        .await
        .map_err(|e| StorageError::from(StorageIOError::write_snapshot(None, AnyError::new(&e))))?
}

impl StateMachine {
    /// Opens the state machine kept in `dir`, loading its last snapshot;
    /// tells `horizon` what that snapshot covers.
    /// `history_len` grants are remembered per resource. Counts into
    /// counters of its own (tools, tests): see [`StateMachine::open_counted`].
    pub fn open(
        dir: &Path,
        parking: Arc<Parking>,
        horizon: PurgeHorizon,
        history_len: usize,
    ) -> Result<Self, StorageError> {
        Self::open_counted(dir, parking, horizon, history_len, Arc::default())
    }

    /// [`StateMachine::open`], counting into the node's `counters`.
    pub fn open_counted(
        dir: &Path,
        parking: Arc<Parking>,
        horizon: PurgeHorizon,
        history_len: usize,
        counters: Arc<Counters>,
    ) -> Result<Self, StorageError> {
        let (snapshots, loaded) =
            Snapshots::open(dir, horizon, history_len, Arc::clone(&counters))?;
        let data = loaded.unwrap_or_else(|| Data {
            table: LeaseTable::new().with_history_len(history_len),
            last_applied: None,
            membership: StoredMembership::default(),
            retired: RetiredIds::default(),
        });
        let (revisions, _) = tokio::sync::watch::channel(data.table.revision());
        let (retired, _) = tokio::sync::watch::channel(data.retired.clone());
        Ok(Self {
            shared: Arc::new(Shared {
                data: RwLock::new(data),
                apply_waiting: AtomicBool::new(false),
                parking,
                counters,
                snapshots,
                history_len,
                revisions,
                retired,
            }),
        })
    }

    pub fn shared(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }

    /// Installs a snapshot received from the leader, unless the one on disk
    /// covers as much of the log.
    async fn install(&self, meta: &SnapshotMeta, body: Vec<u8>) -> Result<(), StorageError> {
        let shared = Arc::clone(&self.shared);
        let meta = meta.clone();
        blocking(
            DiskWork::SnapshotInstall,
            self.shared.snapshots.dir(),
            move || {
                shared
                    .snapshots
                    .install(meta, body, |data| shared.replace(data))
            },
        )
        .await
    }

    fn count(&self, outcome: &Outcome) {
        let c = &self.shared.counters;
        let counter = match outcome {
            Outcome::Acquire(o)
            | Outcome::AcquireInSession(AcquireInSessionOutcome::Acquire(o)) => match o {
                AcquireOutcome::Granted(_) => &c.grants,
                AcquireOutcome::Held { .. }
                | AcquireOutcome::WaitQueueFull { .. }
                | AcquireOutcome::TokensExhausted { .. } => &c.refusals,
                AcquireOutcome::Waiting { .. } => return,
                AcquireOutcome::Ended(_) => &c.lost,
                AcquireOutcome::CapacityReached { bound, .. } => match bound {
                    CapacityBound::LiveLeases => &c.limits.live_leases,
                    CapacityBound::Waiters => &c.limits.waiters,
                    CapacityBound::LeasesPerIdentity => &c.limits.leases_per_identity,
                    CapacityBound::WaitersPerIdentity => &c.limits.waiters_per_identity,
                },
            },
            Outcome::Renew(o) => self.renew_counter(o),
            Outcome::Release(ReleaseOutcome::Released) => &c.releases,
            Outcome::Release(ReleaseOutcome::NotHolder(_)) => &c.refusals,
            Outcome::KvPut(KvPutOutcome::Applied { .. })
            | Outcome::KvDelete(KvDeleteOutcome::Applied { .. }) => &c.kv_applied,
            Outcome::KvPut(KvPutOutcome::BoundReached { bound, .. }) => match bound {
                KvBound::Keys => &c.limits.kv_keys,
                KvBound::TotalBytes => &c.limits.kv_bytes,
                // 2^64 writes: no setting to count it under.
                KvBound::Revisions => &c.kv_refused,
            },
            Outcome::KvPut(KvPutOutcome::Refused(_))
            | Outcome::KvDelete(
                KvDeleteOutcome::Refused(_) | KvDeleteOutcome::BoundReached { .. },
            ) => &c.kv_refused,
            Outcome::RenewMany(each) => {
                for o in each {
                    self.renew_counter(o).fetch_add(1, Ordering::Relaxed);
                }
                return;
            }
            Outcome::Session(SessionOutcome::Alive { .. }) => &c.keep_alives,
            Outcome::Session(SessionOutcome::Refused(_))
            | Outcome::AcquireInSession(AcquireInSessionOutcome::SessionRefused(_))
            | Outcome::CloseSession(CloseSessionOutcome::NotOwner) => &c.refusals,
            Outcome::CloseSession(CloseSessionOutcome::Closed { .. }) | Outcome::WallClockNoted => {
                return
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }

    fn renew_counter(&self, outcome: &RenewOutcome) -> &AtomicU64 {
        let c = &self.shared.counters;
        match outcome {
            RenewOutcome::Renewed { .. } => &c.renewals,
            RenewOutcome::Lost(_) => &c.lost,
            RenewOutcome::KeptBySession => &c.refusals,
        }
    }
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    /// Streams the state into a temporary file, then makes it the snapshot
    /// on disk (`Snapshots::store_built` says what openraft is handed).
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let started = std::time::Instant::now();
        let shared = Arc::clone(&self.shared);
        let written = blocking(
            DiskWork::SnapshotEncode,
            self.shared.snapshots.dir(),
            move || shared.snapshots.write(&shared.read(), started),
        )
        .await?;
        #[cfg(test)]
        self.shared.snapshots.build_paused.pass().await;
        let shared = Arc::clone(&self.shared);
        blocking(
            DiskWork::SnapshotStore,
            self.shared.snapshots.dir(),
            move || shared.snapshots.store_built(written, started),
        )
        .await
    }
}

impl RaftStateMachine<TypeConfig> for StateMachine {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let data = self.shared.read();
        Ok((data.last_applied, data.membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Outcomes>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut replies = Vec::new();
        let mut events: Vec<Event> = Vec::new();
        let revision;
        let mut retired = None;
        {
            let mut data = self.shared.write_for_apply().await;
            for entry in entries {
                data.last_applied = Some(entry.log_id);
                let term = entry.log_id.leader_id.term;
                match entry.payload {
                    EntryPayload::Blank => replies.push(Outcomes::default()),
                    EntryPayload::Membership(m) => {
                        // Decided from the log alone: the same on every
                        // replica, at every replay.
                        let change = data.retired.decide(data.membership.membership(), &m);
                        log_retirement(&change, entry.log_id.index, term);
                        if data.retired.record(&change) {
                            retired = Some(data.retired.clone());
                        }
                        data.membership = StoredMembership::new(Some(entry.log_id), m);
                        replies.push(Outcomes::default());
                    }
                    EntryPayload::Normal(batch) => {
                        let started = std::time::Instant::now();
                        let applied = data.table.apply(&batch);
                        let c = &self.shared.counters;
                        c.entries.fetch_add(1, Ordering::Relaxed);
                        // Clients' commands: the leader's own anchors aside.
                        let from_clients = batch
                            .commands
                            .iter()
                            .filter(|c| !c.is_leaders_own())
                            .count();
                        c.commands.fetch_add(from_clients as u64, Ordering::Relaxed);
                        for (command, outcome) in batch.commands.iter().zip(&applied.outcomes) {
                            self.count(outcome);
                            log_kv_refusal(command, outcome, term);
                            if let (
                                Outcome::Acquire(AcquireOutcome::Granted(g))
                                | Outcome::AcquireInSession(AcquireInSessionOutcome::Acquire(
                                    AcquireOutcome::Granted(g),
                                )),
                                Some(resource),
                                Some(owner),
                            ) = (outcome, command.resource(), command.owner_id())
                            {
                                tracing::debug!(
                                    resource = %resource,
                                    owner_id = %owner,
                                    token = g.token.get(),
                                    term,
                                    "granted"
                                );
                            }
                        }
                        for event in &applied.events {
                            match event {
                                Event::Expired {
                                    resource,
                                    owner_id: owner,
                                    token,
                                } => {
                                    c.expiries.fetch_add(1, Ordering::Relaxed);
                                    tracing::debug!(%resource, owner_id = %owner, token = token.get(), term, "lease expired");
                                }
                                Event::WaiterGranted {
                                    resource,
                                    owner_id: owner,
                                    grant,
                                } => {
                                    c.grants.fetch_add(1, Ordering::Relaxed);
                                    tracing::debug!(%resource, owner_id = %owner, token = grant.token.get(), term, "granted to waiter");
                                }
                                Event::WaitElapsed { .. } => {}
                                Event::TokensExhausted {
                                    resource, limit, ..
                                } => {
                                    tracing::error!(%resource, limit, term, "a waiter's wait ended: the token counter is at its bound, no grant is possible");
                                }
                                Event::SessionExpired { session, leases } => {
                                    c.session_expiries.fetch_add(1, Ordering::Relaxed);
                                    tracing::info!(%session, leases, term, "session lapsed; its leases ended");
                                }
                                // No owner id: the caller presented another
                                // identity's, which it should not know.
                                Event::OtherIdentity {
                                    resource,
                                    token,
                                    identity,
                                } => {
                                    tracing::info!(%resource, token = token.get(), term, identity, "refused: the lease is another identity's");
                                }
                            }
                        }
                        events.extend(applied.events);
                        replies.push(Outcomes(applied.outcomes));
                        c.apply_us.observe_duration(started.elapsed());
                    }
                }
            }
            revision = data.table.revision();
        }
        self.shared.announce_revision(revision);
        if let Some(retired) = retired {
            self.shared.announce_retired(&retired);
        }
        if !events.is_empty() {
            self.shared.parking.notify(&events);
        }
        Ok(replies)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(
        &mut self,
        meta: &SnapshotMeta,
        snapshot: Box<Cursor<Vec<u8>>>,
    ) -> Result<(), StorageError> {
        let res = self.install(meta, snapshot.into_inner()).await;
        if res.is_err() {
            self.shared.snapshots.install_failed();
        }
        res
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let shared = Arc::clone(&self.shared);
        blocking(
            DiskWork::SnapshotRead,
            self.shared.snapshots.dir(),
            move || shared.snapshots.current(),
        )
        .await
    }
}

/// Everything the state machine holds, encoded as a snapshot body, with
/// the facts a backup shows about it.
pub struct StateExport {
    pub last_applied: Option<LogId>,
    /// The stamp of the last applied entry: where the table's clock stands.
    pub cluster_time: ClusterTime,
    pub last_token: u64,
    pub live_leases: u64,
    pub body: Vec<u8>,
}

impl Shared {
    /// The whole state, read at once (for a backup).
    pub fn export(&self) -> Result<StateExport, codec::CodecError> {
        let (body, last_applied, now, last_token, live) = {
            let data = self.read();
            (
                SnapshotBody::copy_of(&data),
                data.last_applied,
                data.table.now(),
                data.table.last_token().map_or(0, Token::get),
                data.table.live_leases(),
            )
        };
        Ok(StateExport {
            last_applied,
            cluster_time: now,
            last_token,
            live_leases: u64::try_from(live).unwrap_or(u64::MAX),
            body: body.encode()?,
        })
    }
}

/// What a membership change did to the retired ids, logged where every
/// replica decides it.
fn log_retirement(change: &Retirement, index: u64, term: u64) {
    for id in &change.retired {
        tracing::info!(
            node = id,
            index,
            term,
            "node {id} retired: removed from the membership, its id is never admitted again"
        );
    }
    if !change.over_bound.is_empty() {
        tracing::error!(
            nodes = ?change.over_bound,
            index,
            term,
            bound = crate::peer::retired::MAX_RETIRED_IDS,
            "removed node ids not retired: the retired id list is full; revoke them \
             (--tls-deny nodes = [...])"
        );
    }
    if !change.named_again.is_empty() {
        tracing::error!(
            nodes = ?change.named_again,
            index,
            term,
            "a membership names retired node ids; they stay retired and their certificates \
             refused: remove them and add the nodes under new ids"
        );
    }
}

/// A refused Kv write, logged where every replica decides it. A write to
/// another resource's key is at info (a misconfigured writer, or an
/// attempt on another lock's state); the lease refusals are routine.
fn log_kv_refusal(command: &fenced_core::Command, outcome: &Outcome, term: u64) {
    let refusal = match outcome {
        Outcome::KvPut(KvPutOutcome::Refused(r))
        | Outcome::KvDelete(KvDeleteOutcome::Refused(r)) => r,
        _ => return,
    };
    let (fenced_core::Command::KvPut {
        key,
        resource,
        token,
        ..
    }
    | fenced_core::Command::KvDelete {
        key,
        resource,
        token,
        ..
    }) = command
    else {
        return;
    };
    match refusal {
        fenced_core::KvRefusal::KeyOfAnotherResource { key_resource } => tracing::info!(
            %key,
            %resource,
            %key_resource,
            token = token.get(),
            term,
            "kv write refused: the key belongs to another resource"
        ),
        fenced_core::KvRefusal::KeyHasNewerToken { key_token } => tracing::debug!(
            %key,
            %resource,
            token = token.get(),
            key_token = key_token.get(),
            term,
            "kv write refused: the key has a newer token"
        ),
        fenced_core::KvRefusal::Lease(reason) => tracing::debug!(
            %key,
            %resource,
            token = token.get(),
            reason = reason.as_str(),
            term,
            "kv write refused: not the current lease"
        ),
    }
}
