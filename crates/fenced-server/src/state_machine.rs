//! The replicated state machine: the lease table of fenced-core, applied in
//! log order, kept in memory and persisted as snapshots (the log behind a
//! snapshot is purged). A restart loads the snapshot and openraft re-applies
//! the committed log after it, which restores exactly the committed state.

use std::{
    io::{Cursor, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex, PoisonError, RwLock, RwLockReadGuard, RwLockWriteGuard,
    },
};

use fenced_core::{
    AcquireInSessionOutcome, AcquireOutcome, CapacityBound, ChangesAfter, CloseSessionOutcome,
    ClusterTime, Compacted, Description, Event, HistoryEntry, KvBound, KvDeleteOutcome, KvEntry,
    KvPutOutcome, KvSnapshot, LeaseTable, Outcome, ReleaseOutcome, RenewOutcome, SessionOutcome,
    TableSnapshot, TableSnapshotRef, Token, Validation,
};
use openraft::{
    storage::RaftStateMachine, AnyError, EntryPayload, OptionalSend, RaftSnapshotBuilder,
    StorageIOError,
};
use serde::{Deserialize, Serialize};

use crate::{
    clock::AppliedTime,
    codec,
    counters::Counters,
    log_store::PurgeHorizon,
    parking::Parking,
    types::{
        Entry, LogId, Outcomes, Snapshot, SnapshotMeta, StorageError, StoredMembership, TypeConfig,
    },
};

const SNAPSHOT_FILE: &str = "snapshot.bin";

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
    /// The fenced store, with its own format version. Last, so that a body
    /// written before it existed ([`SnapshotBodyV1`]) is exactly this one's
    /// bytes without it, and is told apart by its length.
    kv: KvSnapshot,
}

/// The snapshot body as written before the fenced store existed; still
/// read, as an empty store.
#[derive(Serialize, Deserialize)]
struct SnapshotBodyV1 {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    table: TableSnapshot,
}

/// [`SnapshotBody`] borrowed from the live state: the same bytes, encoded
/// straight into the snapshot file with no copy of the table.
#[derive(Serialize)]
#[serde(rename = "SnapshotBody")]
struct SnapshotBodyRef<'a> {
    last_applied: &'a Option<LogId>,
    membership: &'a StoredMembership,
    table: TableSnapshotRef<'a>,
    kv: KvSnapshot,
}

/// The layout of the snapshot file: [`write_temporary`] writes these bytes
/// with the body streamed, [`SnapshotFileRef`] reads them.
#[cfg(test)]
#[derive(Serialize, Deserialize)]
struct SnapshotFile {
    meta: SnapshotMeta,
    body: Vec<u8>,
}

/// [`SnapshotFile`] read in place: its body is not copied out of the file's
/// bytes.
#[derive(Deserialize)]
struct SnapshotFileRef<'a> {
    meta: SnapshotMeta,
    #[serde(borrow)]
    body: &'a [u8],
}

/// What goes into a snapshot file after its meta.
enum Body<'a> {
    /// Already encoded (a snapshot received from the leader, a restore).
    Encoded(&'a [u8]),
    /// Encoded from the state as it is written, never whole in memory.
    State(&'a SnapshotBodyRef<'a>),
}

/// A snapshot file written under a temporary name, not yet synced.
struct Temporary {
    path: PathBuf,
    file: std::fs::File,
    /// Bytes of the encoded body (what openraft sends to a follower).
    body_len: u64,
}

/// What [`Shared::store`] did.
enum Stored {
    Written,
    /// Nothing: the snapshot on disk already covers the log up to `durable`.
    Stale {
        durable: Option<LogId>,
    },
}

/// The state shared between the state machine and the services that read it.
pub struct Shared {
    data: RwLock<Data>,
    /// Told of every applied entry's events; owned by `node.rs`, which
    /// hands the same one to the services that park callers.
    parking: Arc<Parking>,
    /// Owned by `node.rs`; the state machine counts what it applies and
    /// snapshots.
    counters: Arc<Counters>,
    /// What the snapshot on disk covers. Its body is read from the file
    /// when openraft asks for it (to send it to a follower), so the state
    /// is not kept twice in memory.
    current: Mutex<Option<SnapshotMeta>>,
    /// Held by the one task writing the snapshot file, from its temporary
    /// file to the update of `current`.
    writer: Mutex<()>,
    snapshot_seq: AtomicU64,
    /// Numbers temporary files, so no two writes share one.
    temp_seq: AtomicU64,
    dir: PathBuf,
    /// Told when a snapshot is on disk: the log is purged only behind it.
    horizon: PurgeHorizon,
    /// The grants remembered per resource (the same on every node).
    history_len: usize,
    /// The table's latest revision, for watchers waiting for changes.
    revisions: tokio::sync::watch::Sender<u64>,
    /// Where a test stops a snapshot build after it read the table.
    #[cfg(test)]
    build_paused: pause::PausePoint,
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

    /// Validates every pair under one read of the table.
    pub fn validate_all(
        &self,
        checks: &[(fenced_core::ResourceName, Token)],
        now: ClusterTime,
    ) -> Vec<Validation> {
        let data = self.read();
        checks
            .iter()
            .map(|(r, t)| data.table.validate(r.as_str(), *t, now))
            .collect()
    }

    pub fn history(&self, resource: &str, limit: usize) -> Vec<HistoryEntry> {
        self.read().table.history(resource, limit)
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
        self.read().table.leases(prefix, now, limit)
    }

    pub fn last_token(&self) -> u64 {
        self.read().table.last_token()
    }

    /// Clients queued in the table for a held resource.
    pub fn waiters(&self) -> usize {
        self.read().table.waiters()
    }

    /// The last log id the snapshot on disk covers.
    fn durable_last(&self) -> Option<LogId> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(|meta| meta.last_log_id)
    }

    /// The snapshot on disk, read from its file (the file's own meta, which
    /// is the one its body goes with).
    fn current_snapshot(&self) -> Result<Option<Snapshot>, StorageError> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let known = self
            .current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        if !known {
            return Ok(None);
        }
        let path = self.dir.join(SNAPSHOT_FILE);
        let bytes = std::fs::read(&path).map_err(sm_read_err)?;
        let file: SnapshotFileRef =
            codec::decode_borrowed("snapshot file", &bytes).map_err(sm_read_err)?;
        Ok(Some(Snapshot {
            meta: file.meta,
            snapshot: Box::new(Cursor::new(file.body.to_vec())),
        }))
    }

    /// Makes `file` the snapshot on disk and in memory (and `data` the
    /// state, for an install), unless the snapshot already there covers at
    /// least as much of the log. Blocking: call it off the runtime thread.
    ///
    /// openraft 0.9 builds a snapshot in a task of its own while it installs
    /// one it received, so two writers can meet here. One at a time holds
    /// the writer lock from the comparison to the update of `current`; an
    /// older snapshot never replaces a newer one on disk, where the log may
    /// already be purged up to the newer one.
    fn store(
        &self,
        meta: SnapshotMeta,
        temp: Temporary,
        data: Option<Data>,
    ) -> Result<Stored, StorageError> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        let durable = self.durable_last();
        if meta.last_log_id <= durable {
            drop(temp.file);
            std::fs::remove_file(&temp.path).map_err(snapshot_write_err)?;
            // Lets a purge held back for a refused install go ahead.
            self.horizon.snapshot_durable(durable);
            return Ok(Stored::Stale { durable });
        }
        make_durable(&self.dir, temp)?;
        if let Some(data) = data {
            let revision = data.table.revision();
            *self.write() = data;
            self.announce_revision(revision);
        }
        let last = meta.last_log_id;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(meta);
        self.horizon.snapshot_durable(last);
        Ok(Stored::Written)
    }

    /// Writes the state as it is now into a temporary snapshot file, reading
    /// the table in place under the read lock (applying waits meanwhile; a
    /// copy of a million leases would take about as long and twice the
    /// memory). Returns the file and the meta of what it holds. Blocking.
    fn write_state(&self) -> Result<(SnapshotMeta, Temporary), StorageError> {
        let data = self.read();
        let body = SnapshotBodyRef {
            last_applied: &data.last_applied,
            membership: &data.membership,
            table: data.table.snapshot_ref(),
            kv: data.table.kv_snapshot(),
        };
        let seq = self.snapshot_seq.fetch_add(1, Ordering::Relaxed);
        let last_applied = data.last_applied;
        let meta = SnapshotMeta {
            last_log_id: last_applied,
            last_membership: data.membership.clone(),
            snapshot_id: format!(
                "{}-{}-{seq}",
                last_applied.map_or(0, |l| l.leader_id.term),
                last_applied.map_or(0, |l| l.index)
            ),
        };
        let temp_seq = self.temp_seq.fetch_add(1, Ordering::Relaxed);
        let temp = write_temporary(&self.dir, temp_seq, &meta, &Body::State(&body))?;
        Ok((meta, temp))
    }

    /// A copy of the whole lease table and fenced store (for [`digest`],
    /// computed off the runtime thread) and the last entry applied to them,
    /// read together.
    pub fn table_snapshot(&self) -> (Option<LogId>, (TableSnapshot, KvSnapshot)) {
        let data = self.read();
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

fn sm_read_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::read_state_machine(AnyError::new(&e)).into()
}

fn snapshot_write_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_snapshot(None, AnyError::new(&e)).into()
}

/// Runs `f` on a blocking thread.
async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, StorageError> + Send + 'static,
) -> Result<T, StorageError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| StorageError::from(StorageIOError::write_snapshot(None, AnyError::error(e))))?
}

/// Whether `name` is a temporary snapshot file (of this or an older build).
fn is_temporary(name: &str) -> bool {
    name.starts_with(SNAPSHOT_FILE) && name.ends_with(".tmp")
}

/// Removes temporary files a crash left behind; no writer runs yet.
fn remove_temporaries(dir: &Path) -> Result<(), StorageError> {
    for entry in std::fs::read_dir(dir).map_err(sm_read_err)? {
        let entry = entry.map_err(sm_read_err)?;
        if entry.file_name().to_str().is_some_and(is_temporary) {
            tracing::info!(file = ?entry.path(), "removing a stale temporary snapshot");
            std::fs::remove_file(entry.path()).map_err(snapshot_write_err)?;
        }
    }
    Ok(())
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
        std::fs::create_dir_all(dir).map_err(snapshot_write_err)?;
        remove_temporaries(dir)?;
        let mut data = Data {
            table: LeaseTable::new().with_history_len(history_len),
            last_applied: None,
            membership: StoredMembership::default(),
        };
        let mut current = None;
        let path = dir.join(SNAPSHOT_FILE);
        if path.exists() {
            // A file this build cannot read (a newer format, say) is named
            // in the error, with what was wrong with it.
            let unreadable = |e: &dyn std::fmt::Display| {
                sm_read_err(std::io::Error::other(format!("{}: {e}", path.display())))
            };
            let started = std::time::Instant::now();
            let bytes = std::fs::read(&path).map_err(|e| unreadable(&e))?;
            let read_ms = started.elapsed().as_millis();
            let file: SnapshotFileRef =
                codec::decode_borrowed("snapshot file", &bytes).map_err(|e| unreadable(&e))?;
            data = decode_body(file.body, history_len).map_err(|e| unreadable(&e))?;
            tracing::info!(
                last_applied = ?data.last_applied,
                leases = data.table.live_leases(),
                bytes = bytes.len(),
                read_ms,
                load_ms = started.elapsed().as_millis(),
                "loaded snapshot"
            );
            current = Some(file.meta);
        }
        horizon.snapshot_durable(data.last_applied);
        let (revisions, _) = tokio::sync::watch::channel(data.table.revision());
        Ok(Self {
            shared: Arc::new(Shared {
                data: RwLock::new(data),
                parking,
                counters,
                current: Mutex::new(current),
                writer: Mutex::new(()),
                snapshot_seq: AtomicU64::new(0),
                temp_seq: AtomicU64::new(0),
                dir: dir.to_path_buf(),
                horizon,
                history_len,
                revisions,
                #[cfg(test)]
                build_paused: pause::PausePoint::default(),
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
        let owned_meta = meta.clone();
        let (stored, bytes) = blocking(move || {
            let data = decode_body(&body, shared.history_len)?;
            let seq = shared.temp_seq.fetch_add(1, Ordering::Relaxed);
            let temp = write_temporary(&shared.dir, seq, &owned_meta, &Body::Encoded(&body))?;
            let bytes = temp.body_len;
            drop(body);
            Ok((shared.store(owned_meta, temp, Some(data))?, bytes))
        })
        .await?;
        match stored {
            Stored::Written => {
                let c = &self.shared.counters;
                c.snapshots_installed.fetch_add(1, Ordering::Relaxed);
                c.snapshot_bytes.store(bytes, Ordering::Relaxed);
                tracing::info!(snapshot_id = %meta.snapshot_id, "snapshot installed");
            }
            Stored::Stale { durable } => tracing::warn!(
                snapshot_id = %meta.snapshot_id,
                snapshot = ?meta.last_log_id,
                durable = ?durable,
                "snapshot install ignored: the one on disk covers as much of the log"
            ),
        }
        Ok(())
    }

    fn count(&self, outcome: &Outcome) {
        let c = &self.shared.counters;
        let counter = match outcome {
            Outcome::Acquire(o)
            | Outcome::AcquireInSession(AcquireInSessionOutcome::Acquire(o)) => match o {
                AcquireOutcome::Granted(_) => &c.grants,
                AcquireOutcome::Held { .. } | AcquireOutcome::WaitQueueFull { .. } => &c.refusals,
                AcquireOutcome::Waiting { .. } => return,
                AcquireOutcome::Ended(_) => &c.lost,
                AcquireOutcome::CapacityReached { bound, .. } => match bound {
                    CapacityBound::LiveLeases => &c.limits.live_leases,
                    CapacityBound::Waiters => &c.limits.waiters,
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
            },
            Outcome::KvPut(KvPutOutcome::Refused(_))
            | Outcome::KvDelete(KvDeleteOutcome::Refused(_)) => &c.kv_refused,
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
            Outcome::CloseSession(CloseSessionOutcome::Closed { .. }) => return,
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

/// Reads a snapshot body of this build's layout or of the one before the
/// fenced store: each is refused by the other's decoder (one lacks the
/// store's bytes, the other has them trailing), so neither is misread.
fn decode_snapshot_body(bytes: &[u8]) -> Result<SnapshotBody, codec::CodecError> {
    codec::decode::<SnapshotBody>("snapshot", bytes).or_else(|current| {
        match codec::decode::<SnapshotBodyV1>("snapshot", bytes) {
            Ok(v1) => Ok(SnapshotBody {
                last_applied: v1.last_applied,
                membership: v1.membership,
                table: v1.table,
                kv: KvSnapshot::default(),
            }),
            Err(_) => Err(current),
        }
    })
}

fn decode_body(bytes: &[u8], history_len: usize) -> Result<Data, StorageError> {
    let body = decode_snapshot_body(bytes).map_err(sm_read_err)?;
    let mut table = LeaseTable::from_snapshot(body.table)
        .map_err(sm_read_err)?
        .with_history_len(history_len);
    table.restore_kv(body.kv).map_err(sm_read_err)?;
    Ok(Data {
        table,
        last_applied: body.last_applied,
        membership: body.membership,
    })
}

/// Writes a snapshot file under a temporary name (number `seq`): the
/// bytes of `codec::encode` of a [`SnapshotFile`], with the body streamed
/// (its length is counted by an encoding pass first). Not yet synced: see
/// [`make_durable`].
fn write_temporary(
    dir: &Path,
    seq: u64,
    meta: &SnapshotMeta,
    body: &Body,
) -> Result<Temporary, StorageError> {
    let body_len = match body {
        Body::Encoded(bytes) => bytes.len(),
        Body::State(state) => {
            1 + codec::encoded_part_len("snapshot", state).map_err(snapshot_write_err)?
        }
    };
    let path = dir.join(format!("{SNAPSHOT_FILE}.{seq}.tmp"));
    // 0600: the snapshot holds every live owner id.
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(snapshot_write_err)?;
    let mut out = std::io::BufWriter::with_capacity(1 << 20, file);
    out.write_all(&[codec::FORMAT_VERSION])
        .map_err(snapshot_write_err)?;
    codec::encode_part("snapshot file", meta, &mut out).map_err(snapshot_write_err)?;
    // A byte vector is its length, then its bytes.
    codec::encode_part("snapshot file", &(body_len as u64), &mut out)
        .map_err(snapshot_write_err)?;
    match body {
        Body::Encoded(bytes) => out.write_all(bytes).map_err(snapshot_write_err)?,
        Body::State(state) => {
            out.write_all(&[codec::FORMAT_VERSION])
                .map_err(snapshot_write_err)?;
            let written =
                codec::encode_part("snapshot", state, &mut out).map_err(snapshot_write_err)?;
            if written + 1 != body_len {
                return Err(snapshot_write_err(std::io::Error::other(format!(
                    "snapshot body: counted {body_len} bytes, wrote {}",
                    written + 1
                ))));
            }
        }
    }
    let file = out
        .into_inner()
        .map_err(|e| snapshot_write_err(e.into_error()))?;
    Ok(Temporary {
        path,
        file,
        body_len: body_len as u64,
    })
}

/// Makes a temporary snapshot file the snapshot on disk, atomically:
/// fsync, rename, fsync of the directory.
fn make_durable(dir: &Path, temp: Temporary) -> Result<(), StorageError> {
    temp.file.sync_all().map_err(snapshot_write_err)?;
    drop(temp.file);
    std::fs::rename(&temp.path, dir.join(SNAPSHOT_FILE)).map_err(snapshot_write_err)?;
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(snapshot_write_err)?;
    Ok(())
}

impl RaftSnapshotBuilder<TypeConfig> for StateMachine {
    /// Streams the state into a temporary file, then makes it the snapshot
    /// on disk. openraft 0.9 uses only the meta of a built snapshot (its
    /// state machine worker answers the build with `snap.meta`); the body
    /// returned is empty, and followers are sent the file's body by
    /// [`RaftStateMachine::get_current_snapshot`].
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let started = std::time::Instant::now();
        let shared = Arc::clone(&self.shared);
        let (meta, temp) = blocking(move || shared.write_state()).await?;
        let encoded = started.elapsed();
        #[cfg(test)]
        self.shared.build_paused.pass().await;
        let bytes = temp.body_len;
        let shared = Arc::clone(&self.shared);
        let stored_meta = meta.clone();
        let stored = blocking(move || shared.store(stored_meta, temp, None)).await?;
        let built = Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(Vec::new())),
        };
        match stored {
            Stored::Written => {
                let c = &self.shared.counters;
                c.snapshots_built.fetch_add(1, Ordering::Relaxed);
                c.snapshot_bytes.store(bytes, Ordering::Relaxed);
                c.snapshot_build_us.observe_duration(started.elapsed());
                tracing::info!(
                    snapshot_id = %built.meta.snapshot_id,
                    bytes,
                    encode_ms = encoded.as_millis(),
                    total_ms = started.elapsed().as_millis(),
                    "snapshot built"
                );
                Ok(built)
            }
            Stored::Stale { durable } => {
                // A newer snapshot was installed while this one was built.
                tracing::info!(
                    snapshot_id = %built.meta.snapshot_id,
                    built = ?built.meta.last_log_id,
                    durable = ?durable,
                    "snapshot build discarded: the one on disk is newer"
                );
                let current = self
                    .shared
                    .current
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner)
                    .clone();
                Ok(match current {
                    Some(meta) => Snapshot {
                        meta,
                        snapshot: Box::new(Cursor::new(Vec::new())),
                    },
                    None => built,
                })
            }
        }
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
                                Event::SessionExpired { session, leases } => {
                                    c.session_expiries.fetch_add(1, Ordering::Relaxed);
                                    tracing::info!(%session, leases, term, "session lapsed; its leases ended");
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
            // A purge openraft made for this snapshot must not wait for it.
            self.shared.horizon.snapshot_failed();
        }
        res
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let shared = Arc::clone(&self.shared);
        blocking(move || shared.current_snapshot()).await
    }
}

/// A point where a test holds a task until it lets it go.
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

/// What a restored state holds.
#[derive(Debug, Clone, Copy)]
pub struct RestoredState {
    pub cluster_time: ClusterTime,
    /// Every token granted from now on is above it.
    pub last_token: u64,
    pub live_leases: u64,
}

impl Shared {
    /// The whole state, read at once (for a backup).
    pub fn export(&self) -> Result<StateExport, codec::CodecError> {
        let (body, now, last_token, live) = {
            let data = self.read();
            let body = SnapshotBody {
                last_applied: data.last_applied,
                membership: data.membership.clone(),
                table: data.table.snapshot(),
                kv: data.table.kv_snapshot(),
            };
            (
                body,
                data.table.now(),
                data.table.last_token(),
                data.table.live_leases(),
            )
        };
        Ok(StateExport {
            last_applied: body.last_applied,
            cluster_time: now,
            last_token,
            live_leases: u64::try_from(live).unwrap_or(u64::MAX),
            body: codec::encode("snapshot", &body)?,
        })
    }
}

/// What an exported body holds, checked as a load would check it.
pub fn inspect_export(body: &[u8]) -> Result<RestoredState, StorageError> {
    let data = decode_body(body, fenced_core::MAX_HISTORY_PER_RESOURCE)?;
    Ok(RestoredState {
        cluster_time: data.table.now(),
        last_token: data.table.last_token(),
        live_leases: u64::try_from(data.table.live_leases()).unwrap_or(u64::MAX),
    })
}

/// Writes, in `dir`, the snapshot a new cluster starts from: the state of
/// an exported `body` with every token from now on above `token_floor`, as
/// if applied up to `at` and with `membership` (a new cluster's). Leases
/// keep their expiry in cluster time, which the new cluster's clock starts
/// from (the last entry's stamp), so each keeps the time it had left.
pub fn write_restored_state(
    dir: &Path,
    body: &[u8],
    at: LogId,
    membership: StoredMembership,
    token_floor: u64,
) -> Result<RestoredState, StorageError> {
    let mut data = decode_body(body, fenced_core::MAX_HISTORY_PER_RESOURCE)?;
    data.table.raise_token_floor(token_floor);
    let restored = RestoredState {
        cluster_time: data.table.now(),
        last_token: data.table.last_token(),
        live_leases: u64::try_from(data.table.live_leases()).unwrap_or(u64::MAX),
    };
    let body = SnapshotBody {
        last_applied: Some(at),
        membership: membership.clone(),
        table: data.table.snapshot(),
        kv: data.table.kv_snapshot(),
    };
    let meta = SnapshotMeta {
        last_log_id: Some(at),
        last_membership: membership,
        snapshot_id: format!("restored-{}", at.index),
    };
    let body = codec::encode("snapshot", &body).map_err(snapshot_write_err)?;
    std::fs::create_dir_all(dir).map_err(snapshot_write_err)?;
    let temp = write_temporary(dir, 0, &meta, &Body::Encoded(&body))?;
    make_durable(dir, temp)?;
    Ok(restored)
}

#[cfg(test)]
pub(crate) mod pause {
    use std::sync::{Mutex, PoisonError};

    use tokio::sync::oneshot;

    #[derive(Default)]
    pub struct PausePoint {
        armed: Mutex<Option<(oneshot::Sender<()>, oneshot::Receiver<()>)>>,
    }

    impl PausePoint {
        /// The next task to pass stops here: the first receiver hears that
        /// it arrived, and dropping or sending on the sender lets it go on.
        pub fn arm(&self) -> (oneshot::Receiver<()>, oneshot::Sender<()>) {
            let (reached_tx, reached_rx) = oneshot::channel();
            let (resume_tx, resume_rx) = oneshot::channel();
            *self.armed.lock().unwrap_or_else(PoisonError::into_inner) =
                Some((reached_tx, resume_rx));
            (reached_rx, resume_tx)
        }

        pub async fn pass(&self) {
            let armed = self
                .armed
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .take();
            if let Some((reached, resume)) = armed {
                let _ = reached.send(());
                let _ = resume.await;
            }
        }
    }
}

/// Snapshots for tests of other modules.
#[cfg(test)]
pub(crate) mod testing {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use openraft::Membership;

    use super::*;

    /// A snapshot of an empty table that covers the log up to `last`.
    pub fn snapshot_at(last: LogId) -> (SnapshotMeta, Box<Cursor<Vec<u8>>>) {
        let membership = StoredMembership::new(
            None,
            Membership::new(vec![std::collections::BTreeSet::from([1])], None),
        );
        let body = SnapshotBody {
            last_applied: Some(last),
            membership: membership.clone(),
            table: LeaseTable::new().snapshot(),
            kv: KvSnapshot::default(),
        };
        let meta = SnapshotMeta {
            last_log_id: Some(last),
            last_membership: membership,
            snapshot_id: format!("leader-{}", last.index),
        };
        let bytes = codec::encode("snapshot", &body).unwrap();
        (meta, Box::new(Cursor::new(bytes)))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use openraft::{storage::RaftLogStorage, CommittedLeaderId, RaftLogReader};

    use super::*;
    use crate::log_store::{
        testing::{log_with_blanks, open_state as open, restart},
        LogStore,
    };

    fn log_id(index: u64) -> LogId {
        LogId::new(CommittedLeaderId::new(1, 1), index)
    }

    fn snapshot_at(index: u64) -> (SnapshotMeta, Box<Cursor<Vec<u8>>>) {
        testing::snapshot_at(log_id(index))
    }

    fn open_log(dir: &Path) -> LogStore {
        LogStore::open(&dir.join("raft-log")).expect("open log")
    }

    async fn current_last(sm: &mut StateMachine) -> Option<LogId> {
        sm.get_current_snapshot()
            .await
            .unwrap()
            .and_then(|s| s.meta.last_log_id)
    }

    /// A node with blank entries 1..=25 committed, applied up to 10.
    async fn node(dir: &Path) -> (LogStore, StateMachine) {
        let mut log = log_with_blanks(&dir.join("raft-log"), 25, 25).await;
        let mut sm = open(dir, &log);
        let entries = log.try_get_log_entries(1..=10).await.unwrap();
        sm.apply(entries).await.unwrap();
        (log, sm)
    }

    #[tokio::test]
    async fn an_older_build_finishing_after_a_newer_install_is_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, mut sm) = node(dir.path()).await;

        // A build reads the table at 10 and stops before it writes.
        let (reached, resume) = sm.shared.build_paused.arm();
        let mut builder = sm.get_snapshot_builder().await;
        let build = tokio::spawn(async move { builder.build_snapshot().await });
        reached.await.expect("the build reaches its pause point");

        // Meanwhile the leader's snapshot at 20 is installed, and openraft
        // purges the log up to it.
        let (meta, body) = snapshot_at(20);
        sm.install_snapshot(&meta, body).await.unwrap();
        log.purge(log_id(20)).await.unwrap();
        assert_eq!(current_last(&mut sm).await, Some(log_id(20)));

        drop(resume);
        let built = build.await.unwrap().unwrap();
        assert_eq!(
            built.meta.last_log_id,
            Some(log_id(20)),
            "the build reports the newer snapshot"
        );
        assert_eq!(
            current_last(&mut sm).await,
            Some(log_id(20)),
            "the older build replaced the newer snapshot in memory"
        );
        assert_eq!(sm.shared.last_applied(), Some(log_id(20)));
        drop((log, sm));

        // A restart sees the newer snapshot, which covers the purged log.
        let log = open_log(dir.path());
        let mut sm = open(dir.path(), &log);
        assert_eq!(
            sm.applied_state().await.unwrap().0,
            Some(log_id(20)),
            "the older build replaced the newer snapshot on disk"
        );
        assert_eq!(current_last(&mut sm).await, Some(log_id(20)));
        drop((log, sm));
        let (_log, mut sm) = restart(dir.path()).await;
        assert_eq!(sm.applied_state().await.unwrap().0, Some(log_id(25)));
    }

    fn membership() -> StoredMembership {
        StoredMembership::new(
            None,
            openraft::Membership::new(vec![std::collections::BTreeSet::from([1])], None),
        )
    }

    /// A table with a lease on `job` and, when `put`, a fenced value under it.
    fn table_with(put: bool) -> LeaseTable {
        use fenced_core::{Batch, Command, KvBounds, KvKey, KvValue, OwnerId, ResourceName};
        let mut table = LeaseTable::new();
        let owner = OwnerId::random();
        let resource = ResourceName::new("job").unwrap();
        let mut commands = vec![Command::Acquire {
            resource: resource.clone(),
            owner_id: owner,
            ttl_ms: 60_000,
            wait_ms: 0,
        }];
        if put {
            commands.push(Command::KvPut {
                key: KvKey::new("job/state").unwrap(),
                value: KvValue::new(vec![7u8; 1000]).unwrap(),
                resource,
                owner_id: owner,
                token: fenced_core::Token::new(1).unwrap(),
                bounds: KvBounds {
                    max_keys: 10,
                    max_total_bytes: 1 << 20,
                },
            });
        }
        let applied = table.apply(&Batch {
            stamp: ClusterTime::from_millis(5),
            commands,
        });
        assert!(applied.outcomes.iter().all(|o| matches!(
            o,
            Outcome::Acquire(AcquireOutcome::Granted(_))
                | Outcome::KvPut(KvPutOutcome::Applied { .. })
        )));
        table
    }

    #[test]
    fn a_snapshot_body_from_before_the_fenced_store_loads_with_an_empty_store() {
        let table = table_with(false);
        let old = SnapshotBodyV1 {
            last_applied: Some(log_id(7)),
            membership: membership(),
            table: table.snapshot(),
        };
        let data = decode_body(
            &codec::encode("snapshot", &old).unwrap(),
            fenced_core::DEFAULT_HISTORY_PER_RESOURCE,
        )
        .unwrap();
        assert_eq!(data.last_applied, Some(log_id(7)));
        assert_eq!(data.table.snapshot(), table.snapshot());
        assert!(data.table.kv().is_empty());
    }

    #[test]
    fn sessions_round_trip_through_a_snapshot_body() {
        use fenced_core::{Batch, Command, OwnerId, ResourceName, SessionId};
        let mut table = table_with(false);
        let session = SessionId::random();
        let applied = table.apply(&Batch {
            stamp: ClusterTime::from_millis(10),
            commands: vec![
                Command::OpenSession {
                    session,
                    identity: "app".into(),
                    ttl_ms: 20_000,
                    bounds: fenced_core::Limits::default().session_bounds(),
                },
                Command::AcquireInSession {
                    resource: ResourceName::new("kept").unwrap(),
                    owner_id: OwnerId::random(),
                    session,
                    identity: "app".into(),
                    capacity: fenced_core::Capacity::UNBOUNDED,
                },
            ],
        });
        assert!(matches!(
            applied.outcomes[1],
            Outcome::AcquireInSession(AcquireInSessionOutcome::Acquire(AcquireOutcome::Granted(_)))
        ));
        let body = SnapshotBody {
            last_applied: Some(log_id(11)),
            membership: membership(),
            table: table.snapshot(),
            kv: table.kv_snapshot(),
        };
        let bytes = codec::encode("snapshot", &body).unwrap();
        let mut data = decode_body(&bytes, fenced_core::DEFAULT_HISTORY_PER_RESOURCE).unwrap();
        assert_eq!(data.table.snapshot(), table.snapshot());
        assert_eq!(
            data.table.session(session),
            Some((ClusterTime::from_millis(20_010), 1))
        );
        assert_eq!(data.table.live_leases(), 2);
        // The restored session lapses with its lease, the other lease stays.
        data.table.apply(&Batch {
            stamp: ClusterTime::from_millis(20_010),
            commands: vec![],
        });
        assert_eq!(data.table.live_leases(), 1);
        assert!(
            !data
                .table
                .describe("kept", ClusterTime::from_millis(20_010))
                .held
        );
    }

    #[test]
    fn the_fenced_store_round_trips_through_a_snapshot_body() {
        let table = table_with(true);
        let body = SnapshotBody {
            last_applied: Some(log_id(9)),
            membership: membership(),
            table: table.snapshot(),
            kv: table.kv_snapshot(),
        };
        let bytes = codec::encode("snapshot", &body).unwrap();
        let data = decode_body(&bytes, fenced_core::DEFAULT_HISTORY_PER_RESOURCE).unwrap();
        assert_eq!(data.table.kv(), table.kv());
        assert_eq!(
            data.table.kv().get("job/state").unwrap().value.as_bytes(),
            &[7u8; 1000][..]
        );
        // Cut short inside the store, or with bytes after it: refused, not
        // misread as the older layout.
        for bad in [&bytes[..bytes.len() - 1], &[&bytes[..], &[0]].concat()[..]] {
            assert!(decode_body(bad, fenced_core::DEFAULT_HISTORY_PER_RESOURCE).is_err());
        }
    }

    #[tokio::test]
    async fn a_built_snapshot_carries_the_fenced_store_across_a_restart() {
        let dir = tempfile::tempdir().unwrap();
        let (log, mut sm) = node(dir.path()).await;
        sm.shared.write().table = table_with(true);
        let mut builder = sm.get_snapshot_builder().await;
        builder.build_snapshot().await.unwrap();
        let want = sm.shared.read().table.kv().clone();
        drop((log, sm, builder));
        let log = open_log(dir.path());
        let sm = open(dir.path(), &log);
        assert_eq!(sm.shared.read().table.kv(), &want);
        assert_eq!(want.len(), 1);
    }

    /// The streamed file is byte for byte the encoding of the snapshot
    /// file this build wrote before it streamed (a whole body in memory),
    /// so every reader of that layout reads it; and what the state machine
    /// hands a follower is that body.
    #[tokio::test]
    async fn a_streamed_snapshot_file_is_the_encoded_file_of_before() {
        let dir = tempfile::tempdir().unwrap();
        let (_log, mut sm) = node(dir.path()).await;
        sm.shared.write().table = table_with(true);
        let mut builder = sm.get_snapshot_builder().await;
        let built = builder.build_snapshot().await.unwrap();
        let body = {
            let data = sm.shared.read();
            codec::encode(
                "snapshot",
                &SnapshotBody {
                    last_applied: data.last_applied,
                    membership: data.membership.clone(),
                    table: data.table.snapshot(),
                    kv: data.table.kv_snapshot(),
                },
            )
            .unwrap()
        };
        let want = codec::encode(
            "snapshot file",
            &SnapshotFile {
                meta: built.meta.clone(),
                body: body.clone(),
            },
        )
        .unwrap();
        let on_disk = std::fs::read(dir.path().join("state").join(SNAPSHOT_FILE)).unwrap();
        assert_eq!(on_disk, want);
        let sent = sm.get_current_snapshot().await.unwrap().unwrap();
        assert_eq!(sent.meta, built.meta);
        assert_eq!(sent.snapshot.into_inner(), body);
    }

    #[tokio::test]
    async fn a_stale_install_is_ignored() {
        let dir = tempfile::tempdir().unwrap();
        let (_log, mut sm) = node(dir.path()).await;
        let (meta, body) = snapshot_at(20);
        sm.install_snapshot(&meta, body).await.unwrap();
        let (meta, body) = snapshot_at(15);
        sm.install_snapshot(&meta, body).await.unwrap();
        assert_eq!(current_last(&mut sm).await, Some(log_id(20)));
        assert_eq!(sm.shared.last_applied(), Some(log_id(20)));
        let bytes = std::fs::read(dir.path().join("state").join(SNAPSHOT_FILE)).unwrap();
        let file: SnapshotFile = codec::decode("snapshot file", &bytes).unwrap();
        assert_eq!(file.meta.last_log_id, Some(log_id(20)));
    }

    #[tokio::test]
    async fn the_snapshot_file_is_readable_by_its_owner_only() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (_log, mut sm) = node(dir.path()).await;
        let (meta, body) = snapshot_at(20);
        sm.install_snapshot(&meta, body).await.unwrap();
        let mode = std::fs::metadata(dir.path().join("state").join(SNAPSHOT_FILE))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "mode {mode:o}");
    }

    #[tokio::test]
    async fn stale_temporaries_are_removed_at_open() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        for name in ["snapshot.bin.tmp", "snapshot.bin.7.tmp", "other.tmp"] {
            std::fs::write(state.join(name), b"partial").unwrap();
        }
        let log = open_log(dir.path());
        let _sm = open(dir.path(), &log);
        let mut left: Vec<String> = std::fs::read_dir(&state)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        assert_eq!(left, ["other.tmp"]);
    }

    #[tokio::test]
    async fn concurrent_writers_never_leave_a_mixed_file() {
        let dir = tempfile::tempdir().unwrap();
        let log = open_log(dir.path());
        let shared = open(dir.path(), &log).shared();
        let path = dir.path().join("state").join(SNAPSHOT_FILE);
        let files: Vec<SnapshotFile> = (1..=16u8)
            .map(|i| {
                let (meta, _) = snapshot_at(u64::from(i));
                // Bodies of different sizes, so a mix of two is detectable.
                let body = vec![i; 256 * 1024 + 4096 * usize::from(i)];
                SnapshotFile { meta, body }
            })
            .collect();
        let check = |file: &SnapshotFile| {
            let want = files
                .iter()
                .find(|f| f.meta.snapshot_id == file.meta.snapshot_id)
                .expect("one of the written snapshots");
            assert_eq!(file.body, want.body, "the body is one writer's");
        };
        let writing = std::sync::atomic::AtomicUsize::new(files.len());
        std::thread::scope(|s| {
            for file in &files {
                let (shared, writing) = (&shared, &writing);
                s.spawn(move || {
                    let seq = shared.temp_seq.fetch_add(1, Ordering::Relaxed);
                    let temp =
                        write_temporary(&shared.dir, seq, &file.meta, &Body::Encoded(&file.body))
                            .expect("every writer writes");
                    shared
                        .store(file.meta.clone(), temp, None)
                        .expect("every writer succeeds");
                    writing.fetch_sub(1, Ordering::SeqCst);
                });
            }
            // A reader sees a whole file whenever it looks.
            while writing.load(Ordering::SeqCst) > 0 {
                if let Ok(bytes) = std::fs::read(&path) {
                    check(&codec::decode("snapshot file", &bytes).expect("a whole file"));
                }
            }
        });
        let bytes = std::fs::read(&path).unwrap();
        let file: SnapshotFile = codec::decode("snapshot file", &bytes).expect("a whole file");
        check(&file);
        assert_eq!(file.meta.last_log_id, Some(log_id(16)), "the newest wins");
        assert_eq!(shared.durable_last(), Some(log_id(16)));
        let names: Vec<_> = std::fs::read_dir(dir.path().join("state"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [SNAPSHOT_FILE], "no temporary file is left");
    }
}

/// Snapshot files written by earlier builds still load.
#[cfg(test)]
mod old_formats {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use fenced_core::{OwnerId, Token, TokenState};

    use super::*;
    use crate::log_store::LogStore;

    /// The snapshot file of a build before format 2 (table format 1): a
    /// lease on jobs/a (owner 01..01, token 1, granted at 1000 ms for 60 s)
    /// with a waiter, jobs/b released (owner 02..02, token 2), applied up
    /// to index 3.
    const V1: &[u8] = include_bytes!("../testdata/snapshot-v1.bin");

    #[tokio::test]
    async fn a_table_format_1_snapshot_loads_and_carries_on() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join(SNAPSHOT_FILE), V1).unwrap();
        let log = LogStore::open(&dir.path().join("raft-log")).unwrap();
        let mut sm = StateMachine::open(&state, Parking::new(4), log.purge_horizon(), 16).unwrap();
        let (applied, _) = sm.applied_state().await.unwrap();
        assert_eq!(applied.map(|l| l.index), Some(3));
        let shared = sm.shared();
        let at = ClusterTime::from_millis(5_000);
        let a = shared.validate("jobs/a", Token::new(1).unwrap(), at);
        assert_eq!(
            a.state,
            TokenState::Current {
                remaining_ms: 56_000
            }
        );
        assert_eq!(shared.describe("jobs/a", at).waiters, 1);
        let b = shared.validate("jobs/b", Token::new(2).unwrap(), at);
        assert_eq!(b.state, TokenState::Released);
        assert!(shared.holds("jobs/a", OwnerId::from_bytes(&[1; 16]).unwrap()));
        assert_eq!(shared.revision(), 0, "format 1 kept no changes");
        assert!(shared.history("jobs/a", 16).is_empty());
        // Its next snapshot is format 2, and loads as such.
        let (_, (table, _kv)) = shared.table_snapshot();
        assert_eq!(table.format_version(), fenced_core::SNAPSHOT_FORMAT_VERSION);
        let bytes = codec::encode("table", &table).unwrap();
        let again: TableSnapshot = codec::decode("table", &bytes).unwrap();
        assert!(LeaseTable::from_snapshot(again).is_ok());
    }
}
