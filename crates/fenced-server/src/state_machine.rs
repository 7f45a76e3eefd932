//! The replicated state machine: the lease table of fenced-core, applied in
//! log order, kept in memory and persisted as snapshots (the log behind a
//! snapshot is purged). A restart loads the snapshot and openraft re-applies
//! the committed log after it, which restores exactly the committed state.

use std::{
    io::{Cursor, Write},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
    },
};

use fenced_core::{ClusterTime, Description, Event, LeaseTable, Outcome, TableSnapshot};
use openraft::{
    storage::RaftStateMachine, AnyError, EntryPayload, OptionalSend, RaftSnapshotBuilder,
    StorageIOError,
};
use serde::{Deserialize, Serialize};

use crate::{
    codec,
    metrics::{self, Histogram},
    parking::Parking,
    types::{
        Entry, LogId, Outcomes, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
    },
};

const SNAPSHOT_FILE: &str = "snapshot.bin";

/// What this node has done so far, for metrics and benchmarks.
#[derive(Debug)]
pub struct Counters {
    pub entries: AtomicU64,
    pub commands: AtomicU64,
    pub grants: AtomicU64,
    pub refusals: AtomicU64,
    pub renewals: AtomicU64,
    pub lost: AtomicU64,
    pub releases: AtomicU64,
    pub expiries: AtomicU64,
    /// New leaders (id or term) this node has seen, the first one included.
    pub leader_changes: AtomicU64,
    /// Commands per log entry this node proposed as leader.
    pub batch_commands: Histogram,
    /// Microseconds to apply one entry of commands to the lease table.
    pub apply_us: Histogram,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            entries: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            grants: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            renewals: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            expiries: AtomicU64::new(0),
            leader_changes: AtomicU64::new(0),
            batch_commands: Histogram::new(metrics::BATCH_BOUNDS),
            apply_us: Histogram::new(metrics::LATENCY_US_BOUNDS),
        }
    }
}

struct Data {
    table: LeaseTable,
    last_applied: Option<LogId>,
    membership: StoredMembership,
}

/// The snapshot body: everything needed to resume applying after it.
#[derive(Serialize, Deserialize)]
struct SnapshotBody {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    table: TableSnapshot,
}

#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta,
    body: Vec<u8>,
}

/// The state shared between the state machine and the services that read it.
pub struct Shared {
    data: RwLock<Data>,
    pub parking: Arc<Parking>,
    pub counters: Counters,
    current: Mutex<Option<(SnapshotMeta, Vec<u8>)>>,
    snapshot_seq: AtomicU64,
    dir: PathBuf,
}

impl Shared {
    fn read(&self) -> RwLockReadGuard<'_, Data> {
        self.data.read().unwrap_or_else(PoisonError::into_inner)
    }

    fn write(&self) -> RwLockWriteGuard<'_, Data> {
        self.data.write().unwrap_or_else(PoisonError::into_inner)
    }

    /// The cluster time of the latest applied entry.
    pub fn now(&self) -> ClusterTime {
        self.read().table.now()
    }

    pub fn describe(&self, resource: &str, now: ClusterTime) -> Description {
        self.read().table.describe(resource, now)
    }

    pub fn next_wakeup(&self) -> Option<ClusterTime> {
        self.read().table.next_wakeup()
    }

    pub fn last_applied(&self) -> Option<LogId> {
        self.read().last_applied
    }

    pub fn live_leases(&self) -> usize {
        self.read().table.live_leases()
    }

    pub fn last_token(&self) -> u64 {
        self.read().table.last_token()
    }

    /// A copy of the whole lease table (for [`digest`], computed off the
    /// runtime thread) and the last entry applied to it, read together.
    pub fn table_snapshot(&self) -> (Option<LogId>, TableSnapshot) {
        let data = self.read();
        (data.last_applied, data.table.snapshot())
    }
}

/// A digest (FNV-1a 64) of a lease table, equal on replicas that applied the
/// same log. A pass over every byte of the table: call it off the runtime
/// thread.
pub fn digest(snapshot: &TableSnapshot) -> u64 {
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

fn sm_read_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::read_state_machine(AnyError::new(&e)).into()
}

fn snapshot_write_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_snapshot(None, AnyError::new(&e)).into()
}

impl StateMachine {
    /// Opens the state machine kept in `dir`, loading its last snapshot.
    pub fn open(dir: &Path, parking: Arc<Parking>) -> Result<Self, StorageError> {
        std::fs::create_dir_all(dir).map_err(snapshot_write_err)?;
        let mut data = Data {
            table: LeaseTable::new(),
            last_applied: None,
            membership: StoredMembership::default(),
        };
        let mut current = None;
        let path = dir.join(SNAPSHOT_FILE);
        if path.exists() {
            let bytes = std::fs::read(&path).map_err(sm_read_err)?;
            let file: SnapshotFile = codec::decode("snapshot file", &bytes).map_err(sm_read_err)?;
            data = decode_body(&file.body)?;
            tracing::info!(
                last_applied = ?data.last_applied,
                leases = data.table.live_leases(),
                "loaded snapshot"
            );
            current = Some((file.meta, file.body));
        }
        Ok(Self {
            shared: Arc::new(Shared {
                data: RwLock::new(data),
                parking,
                counters: Counters::default(),
                current: Mutex::new(current),
                snapshot_seq: AtomicU64::new(0),
                dir: dir.to_path_buf(),
            }),
        })
    }

    pub fn shared(&self) -> Arc<Shared> {
        Arc::clone(&self.shared)
    }

    fn count(&self, outcome: &Outcome) {
        let c = &self.shared.counters;
        let counter = match outcome {
            Outcome::Granted(_) => &c.grants,
            Outcome::Held { .. } | Outcome::WaitQueueFull { .. } => &c.refusals,
            Outcome::Waiting { .. } => return,
            Outcome::Renewed { .. } => &c.renewals,
            Outcome::Lost(_) => &c.lost,
            Outcome::Released => &c.releases,
            Outcome::NotHolder(_) => &c.refusals,
        };
        counter.fetch_add(1, Ordering::Relaxed);
    }
}

fn decode_body(bytes: &[u8]) -> Result<Data, StorageError> {
    let body: SnapshotBody = codec::decode("snapshot", bytes).map_err(sm_read_err)?;
    let table = LeaseTable::from_snapshot(body.table).map_err(sm_read_err)?;
    Ok(Data {
        table,
        last_applied: body.last_applied,
        membership: body.membership,
    })
}

/// Writes the snapshot file atomically: temp file, fsync, rename, fsync dir.
fn persist(dir: &Path, file: &SnapshotFile) -> Result<(), StorageError> {
    let bytes = codec::encode("snapshot file", file).map_err(snapshot_write_err)?;
    let tmp = dir.join(format!("{SNAPSHOT_FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp).map_err(snapshot_write_err)?;
    f.write_all(&bytes).map_err(snapshot_write_err)?;
    f.sync_all().map_err(snapshot_write_err)?;
    drop(f);
    std::fs::rename(&tmp, dir.join(SNAPSHOT_FILE)).map_err(snapshot_write_err)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(snapshot_write_err)?;
    Ok(())
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let (body, last_applied, membership) = {
            let data = self.shared.read();
            let body = SnapshotBody {
                last_applied: data.last_applied,
                membership: data.membership.clone(),
                table: data.table.snapshot(),
            };
            (body, data.last_applied, data.membership.clone())
        };
        let bytes = codec::encode("snapshot", &body).map_err(snapshot_write_err)?;
        let seq = self.shared.snapshot_seq.fetch_add(1, Ordering::Relaxed);
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: membership,
            snapshot_id: format!(
                "{}-{}-{seq}",
                last_applied.map_or(0, |l| l.leader_id.term),
                last_applied.map_or(0, |l| l.index)
            ),
        };
        let file = SnapshotFile {
            meta: meta.clone(),
            body: bytes.clone(),
        };
        let dir = self.shared.dir.clone();
        tokio::task::spawn_blocking(move || persist(&dir, &file))
            .await
            .map_err(|e| {
                StorageError::from(StorageIOError::write_snapshot(None, AnyError::error(e)))
            })??;
        tracing::info!(snapshot_id = %meta.snapshot_id, bytes = bytes.len(), "snapshot built");
        *self
            .shared
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        })
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
        {
            let mut data = self.shared.write();
            for entry in entries {
                data.last_applied = Some(entry.log_id);
                let term = entry.log_id.leader_id.term;
                match entry.payload {
                    EntryPayload::Blank => replies.push(Outcomes::default()),
                    EntryPayload::Membership(m) => {
                        data.membership = StoredMembership::new(Some(entry.log_id), m);
                        replies.push(Outcomes::default());
                    }
                    EntryPayload::Normal(batch) => {
                        let started = std::time::Instant::now();
                        let applied = data.table.apply(&batch);
                        let c = &self.shared.counters;
                        c.entries.fetch_add(1, Ordering::Relaxed);
                        c.commands
                            .fetch_add(batch.commands.len() as u64, Ordering::Relaxed);
                        for (command, outcome) in batch.commands.iter().zip(&applied.outcomes) {
                            self.count(outcome);
                            if let Outcome::Granted(g) = outcome {
                                tracing::debug!(
                                    resource = %command.resource(),
                                    owner = %command.owner(),
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
                                    owner,
                                    token,
                                } => {
                                    c.expiries.fetch_add(1, Ordering::Relaxed);
                                    tracing::debug!(%resource, %owner, token = token.get(), term, "lease expired");
                                }
                                Event::WaiterGranted {
                                    resource,
                                    owner,
                                    grant,
                                } => {
                                    c.grants.fetch_add(1, Ordering::Relaxed);
                                    tracing::debug!(%resource, %owner, token = grant.token.get(), term, "granted to waiter");
                                }
                                Event::WaitElapsed { .. } => {}
                            }
                        }
                        events.extend(applied.events);
                        replies.push(Outcomes(applied.outcomes));
                        c.apply_us.observe_duration(started.elapsed());
                    }
                }
            }
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
        let body = snapshot.into_inner();
        let data = decode_body(&body)?;
        let file = SnapshotFile {
            meta: meta.clone(),
            body,
        };
        let dir = self.shared.dir.clone();
        let file = tokio::task::spawn_blocking(move || persist(&dir, &file).map(|()| file))
            .await
            .map_err(|e| {
                StorageError::from(StorageIOError::write_snapshot(None, AnyError::error(e)))
            })??;
        tracing::info!(snapshot_id = %meta.snapshot_id, "snapshot installed");
        *self.shared.write() = data;
        *self
            .shared
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some((file.meta, file.body));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let current = self
            .shared
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        Ok(current.map(|(meta, bytes)| Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        }))
    }
}
