//! The snapshot on disk, owned here alone: its file format, the one writer
//! at a time, what it covers (told to the log's purge horizon), loading it
//! at open, installing one received from the leader, and the restored state
//! a new cluster starts from. The state machine hands over its state to be
//! written and takes back the state a snapshot holds.

use std::{
    io::{Cursor, Write},
    os::unix::fs::OpenOptionsExt,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant},
};

use fenced_core::{ClusterTime, KvSnapshot, LeaseTable, TableSnapshot, TableSnapshotRef, Token};
use openraft::{AnyError, StorageIOError};
use serde::{Deserialize, Serialize};

use super::Data;
use crate::{
    codec,
    counters::Counters,
    peer::retired::RetiredIds,
    storage::checksum::{self, Damaged, FramedWriter},
    storage::data_format,
    storage::log_store::PurgeHorizon,
    types::{LogId, Snapshot, SnapshotMeta, StorageError, StoredMembership},
};

pub(crate) const SNAPSHOT_FILE: &str = "snapshot.bin";

/// The snapshot body: everything needed to resume applying after it.
#[derive(Serialize, Deserialize)]
pub(super) struct SnapshotBody {
    last_applied: Option<LogId>,
    membership: StoredMembership,
    table: TableSnapshot,
    /// The fenced store, with its own format version. After the table, so
    /// that a body written before it existed ([`SnapshotBodyV1`]) is
    /// exactly this one's bytes without it, and is told apart by its
    /// length.
    kv: KvSnapshot,
    /// The retired node ids, with their own format version; written only
    /// once an id was retired, so until then the body is byte for byte the
    /// one of the release before (which refuses the trailing list).
    #[serde(skip_serializing_if = "RetiredIds::is_empty")]
    retired: RetiredIds,
}

impl SnapshotBody {
    /// A copy of `data`, to be encoded once the state's lock is let go.
    pub(super) fn copy_of(data: &Data) -> Self {
        Self {
            last_applied: data.last_applied,
            membership: data.membership.clone(),
            table: data.table.snapshot(),
            kv: data.table.kv_snapshot(),
            retired: data.retired.clone(),
        }
    }

    pub(super) fn encode(&self) -> Result<Vec<u8>, codec::CodecError> {
        codec::encode("snapshot", self)
    }
}

/// The snapshot body as written before the fenced store existed; still
/// read, as an empty store (by [`BodySeed`] without `with_kv`).
#[cfg(test)]
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
    #[serde(skip_serializing_if = "RetiredIds::is_empty")]
    retired: &'a RetiredIds,
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

/// A snapshot of the state machine written by [`Snapshots::write`], not
/// yet the snapshot on disk: [`Snapshots::store_built`] makes it so.
pub(super) struct Written {
    meta: SnapshotMeta,
    temp: Temporary,
    /// How long reading and encoding the state took.
    encoded: Duration,
}

/// What [`Snapshots::store`] did.
enum Stored {
    Written,
    /// Nothing: the snapshot on disk already covers the log up to `durable`.
    Stale {
        durable: Option<LogId>,
    },
}

/// The snapshot on disk and its one writer at a time.
pub(super) struct Snapshots {
    /// What the snapshot on disk covers. Its body is read from the file
    /// when openraft asks for it (to send it to a follower), so the state
    /// is not kept twice in memory.
    current: Mutex<Option<SnapshotMeta>>,
    /// Held by the one task writing the snapshot file, from its temporary
    /// file to the update of `current`.
    writer: Mutex<()>,
    /// Set when the node's process is gone (the simulation's crash): no
    /// snapshot is written or put in place after it.
    halted: AtomicBool,
    snapshot_seq: AtomicU64,
    /// Numbers temporary files, so no two writes share one.
    temp_seq: AtomicU64,
    dir: PathBuf,
    /// Told when a snapshot is on disk: the log is purged only behind it.
    horizon: PurgeHorizon,
    /// The grants a loaded table remembers per resource.
    history_len: usize,
    /// The node's counters: snapshots built and installed, their size and
    /// build time.
    counters: Arc<Counters>,
    /// Where a test stops a snapshot build after it read the table.
    #[cfg(test)]
    pub(super) build_paused: pause::PausePoint,
}

impl Snapshots {
    /// Opens the snapshots kept in `dir`: removes the temporary files a
    /// crash left, loads the snapshot on disk (its state, if there is one)
    /// and tells `horizon` what it covers. Tables loaded remember
    /// `history_len` grants per resource.
    pub(super) fn open(
        dir: &Path,
        horizon: PurgeHorizon,
        history_len: usize,
        counters: Arc<Counters>,
    ) -> Result<(Self, Option<Data>), StorageError> {
        std::fs::create_dir_all(dir).map_err(snapshot_write_err)?;
        remove_temporaries(dir)?;
        let mut loaded = None;
        let mut current = None;
        let path = dir.join(SNAPSHOT_FILE);
        if path.exists() {
            // A file this build cannot read (a newer format, say) is named
            // in the error, with what was wrong with it.
            let unreadable = |e: &dyn std::fmt::Display| {
                sm_read_err(std::io::Error::other(format!("{}: {e}", path.display())))
            };
            let started = Instant::now();
            let bytes = std::fs::read(&path).map_err(|e| unreadable(&e))?;
            let read_ms = started.elapsed().as_millis();
            let content = file_content(&path, &bytes, unframed_allowed(dir)?)
                .map_err(|e| sm_read_err(std::io::Error::from(e)))?;
            let (meta, data) = decode_file(content, history_len).map_err(|e| unreadable(&e))?;
            if !checksum::is_framed(&bytes) {
                // Read once in the layout before the frame, checked by the
                // whole load above; from now on it is framed.
                rewrite_framed(dir, content)?;
                tracing::info!(file = %path.display(), "snapshot rewritten with its checksum");
            }
            let len = bytes.len();
            // Not held while the node runs: its pages go back now.
            drop(bytes);
            tracing::info!(
                last_applied = ?data.last_applied,
                leases = data.table.live_leases(),
                bytes = len,
                read_ms,
                load_ms = started.elapsed().as_millis(),
                "loaded snapshot"
            );
            loaded = Some(data);
            current = Some(meta);
        }
        horizon.snapshot_durable(loaded.as_ref().and_then(|d| d.last_applied));
        let snapshots = Self {
            current: Mutex::new(current),
            writer: Mutex::new(()),
            halted: AtomicBool::new(false),
            snapshot_seq: AtomicU64::new(0),
            temp_seq: AtomicU64::new(0),
            dir: dir.to_path_buf(),
            horizon,
            history_len,
            counters,
            #[cfg(test)]
            build_paused: pause::PausePoint::default(),
        };
        Ok((snapshots, loaded))
    }

    /// The directory the snapshots are kept in.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// From now on nothing is written: what a crash leaves of a write
    /// that had not begun.
    pub(super) fn halt(&self) {
        self.halted.store(true, Ordering::SeqCst);
    }

    fn refuse_if_halted(&self) -> Result<(), StorageError> {
        if self.halted.load(Ordering::SeqCst) {
            return Err(snapshot_write_err(std::io::Error::other(
                "the node stopped: no snapshot is written",
            )));
        }
        Ok(())
    }

    /// The last log id the snapshot on disk covers.
    pub(super) fn durable_last(&self) -> Option<LogId> {
        self.current
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .as_ref()
            .and_then(|meta| meta.last_log_id)
    }

    /// The snapshot on disk, read from its file (the file's own meta, which
    /// is the one its body goes with). Blocking.
    pub(super) fn current(&self) -> Result<Option<Snapshot>, StorageError> {
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
        let mut bytes = std::fs::read(&path).map_err(sm_read_err)?;
        // Framed since the open: a file damaged since is not sent.
        let content =
            checksum::unframe(&path, &bytes).map_err(|e| sm_read_err(std::io::Error::from(e)))?;
        let file: SnapshotFileRef =
            codec::decode_borrowed("snapshot file", content).map_err(sm_read_err)?;
        // The body is sent from the file's own buffer, not a copy: a copy
        // held twice the snapshot (about 200 MB with a million leases) for
        // as long as a follower took to receive it.
        let start = (file.body.as_ptr() as usize).saturating_sub(bytes.as_ptr() as usize);
        let (meta, len) = (file.meta, file.body.len());
        bytes.truncate(start.saturating_add(len));
        bytes.drain(..start);
        Ok(Some(Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(bytes)),
        }))
    }

    /// Makes `temp` the snapshot on disk and in memory, and runs `durable`
    /// (an install puts its state in place there), unless the snapshot
    /// already there covers at least as much of the log. Blocking: call it
    /// off the runtime thread.
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
        durable: impl FnOnce(),
    ) -> Result<Stored, StorageError> {
        let _writer = self.writer.lock().unwrap_or_else(PoisonError::into_inner);
        self.refuse_if_halted()?;
        let on_disk = self.durable_last();
        // CANARY (planted in a `canaries` build, `canary::on`): a snapshot
        // built while a newer one was installed replaces it.
        let refuse_older = !fenced_core::canary::on(fenced_core::canary::Canary::OlderSnapshotWins);
        if refuse_older && meta.last_log_id <= on_disk {
            drop(temp.file);
            std::fs::remove_file(&temp.path).map_err(snapshot_write_err)?;
            // Lets a purge held back for a refused install go ahead.
            self.horizon.snapshot_durable(on_disk);
            return Ok(Stored::Stale { durable: on_disk });
        }
        make_durable(&self.dir, temp)?;
        durable();
        let last = meta.last_log_id;
        *self.current.lock().unwrap_or_else(PoisonError::into_inner) = Some(meta);
        self.horizon.snapshot_durable(last);
        Ok(Stored::Written)
    }

    /// Writes `data` into a temporary snapshot file, reading the table in
    /// place (the caller holds the state's read lock, so applying waits
    /// meanwhile; a copy of a million leases would take about as long and
    /// twice the memory). `started` is when the build began. Blocking.
    pub(super) fn write(&self, data: &Data, started: Instant) -> Result<Written, StorageError> {
        self.refuse_if_halted()?;
        let body = SnapshotBodyRef {
            last_applied: &data.last_applied,
            membership: &data.membership,
            table: data.table.snapshot_ref(),
            kv: data.table.kv_snapshot(),
            retired: &data.retired,
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
        Ok(Written {
            meta,
            temp,
            encoded: started.elapsed(),
        })
    }

    /// Makes a snapshot [`Snapshots::write`] wrote the snapshot on disk,
    /// unless a newer one was installed meanwhile. openraft 0.9 uses only
    /// the meta of a built snapshot (its state machine worker answers the
    /// build with `snap.meta`); the body returned is empty, and followers
    /// are sent the file's body by [`Snapshots::current`]. Blocking.
    pub(super) fn store_built(
        &self,
        written: Written,
        started: Instant,
    ) -> Result<Snapshot, StorageError> {
        let Written {
            meta,
            temp,
            encoded,
        } = written;
        let bytes = temp.body_len;
        let stored = self.store(meta.clone(), temp, || {})?;
        let built = Snapshot {
            meta,
            snapshot: Box::new(Cursor::new(Vec::new())),
        };
        match stored {
            Stored::Written => {
                let c = &self.counters;
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

    /// Installs a snapshot received from the leader, unless the one on disk
    /// covers as much of the log: its file becomes the snapshot on disk,
    /// and `replace` is handed its state while the writer lock is held (so
    /// a build finishing meanwhile is measured against it). Blocking.
    pub(super) fn install(
        &self,
        meta: SnapshotMeta,
        body: Vec<u8>,
        replace: impl FnOnce(Data),
    ) -> Result<(), StorageError> {
        self.refuse_if_halted()?;
        let data = decode_body(&body, self.history_len)?;
        let seq = self.temp_seq.fetch_add(1, Ordering::Relaxed);
        let temp = write_temporary(&self.dir, seq, &meta, &Body::Encoded(&body))?;
        let bytes = temp.body_len;
        drop(body);
        match self.store(meta.clone(), temp, || replace(data))? {
            Stored::Written => {
                let c = &self.counters;
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

    /// An install failed: a purge openraft made for it must not wait for it.
    pub(super) fn install_failed(&self) {
        self.horizon.snapshot_failed();
    }
}

fn sm_read_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::read_state_machine(AnyError::new(&e)).into()
}

fn snapshot_write_err(e: impl std::error::Error + 'static) -> StorageError {
    StorageIOError::write_snapshot(None, AnyError::new(&e)).into()
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

/// Whether the snapshot in the state dir `dir` may be a file written
/// before the checksum frame: only in a data dir of a layout before
/// [`data_format::FRAMED`] (the data dir is the state dir's parent).
fn unframed_allowed(dir: &Path) -> Result<bool, StorageError> {
    let data_dir = dir.parent().unwrap_or(dir);
    let version = data_format::check(data_dir).map_err(sm_read_err)?;
    Ok(version.is_none_or(|v| v < data_format::FRAMED))
}

/// What the snapshot file `path` holds inside its frame, checked; a file of
/// the layout before the frame is its own content where `unframed` allows
/// it. A file is taken for framed when its first byte or the seven after
/// it are the magic's (one flipped bit leaves one of them whole), or when
/// it is shorter than the magic (no snapshot of either layout is).
fn file_content<'a>(path: &Path, bytes: &'a [u8], unframed: bool) -> Result<&'a [u8], Damaged> {
    let framed = bytes.len() < checksum::HEADER_LEN
        || bytes.first() == checksum::MAGIC.first()
        || bytes.get(1..checksum::HEADER_LEN) == checksum::MAGIC.get(1..);
    // Left to the codec, which names a version it does not read.
    if !framed && unframed {
        return Ok(bytes);
    }
    if bytes.first() == Some(&codec::FORMAT_VERSION) {
        return Err(Damaged::new(
            path,
            0,
            format!(
                "no checksum frame, which every file of data format {} on has",
                data_format::FRAMED
            ),
        ));
    }
    checksum::unframe(path, bytes)
}

/// `fenced check`'s verdict on the snapshot file `path` holding `bytes`:
/// its frame, then everything a load checks; `unframed` as for a load.
pub(crate) fn check_snapshot_file(
    path: &Path,
    bytes: &[u8],
    unframed: bool,
) -> Result<String, String> {
    let content = file_content(path, bytes, unframed).map_err(|e| e.to_string())?;
    let (meta, data) = decode_file(content, fenced_core::MAX_HISTORY_PER_RESOURCE)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let framed = if checksum::is_framed(bytes) {
        "matches its CRC"
    } else {
        "written before the checksum frame (the node adds it at its next start)"
    };
    Ok(format!(
        "{framed}; last log id {}, {} live leases",
        meta.last_log_id
            .map_or_else(|| "none".to_string(), |l| l.to_string()),
        data.table.live_leases()
    ))
}

/// Puts `content` (a snapshot file of the layout before the frame, just
/// loaded) in its frame on disk, atomically.
fn rewrite_framed(dir: &Path, content: &[u8]) -> Result<(), StorageError> {
    // Temporaries of this open were removed; none is written yet.
    let (path, file) = create_temporary(dir, u64::MAX)?;
    let mut out = FramedWriter::new(std::io::BufWriter::with_capacity(1 << 20, file))
        .map_err(snapshot_write_err)?;
    out.write_all(content).map_err(snapshot_write_err)?;
    let file = finish(out)?;
    make_durable(
        dir,
        Temporary {
            path,
            file,
            body_len: 0,
        },
    )
}

/// Decodes a snapshot file as a node loads it at open: its meta and the
/// state its body holds. The error says what was wrong with the bytes.
fn decode_file(bytes: &[u8], history_len: usize) -> Result<(SnapshotMeta, Data), String> {
    let file: SnapshotFileRef =
        codec::decode_borrowed("snapshot file", bytes).map_err(|e| e.to_string())?;
    let data = decode_body(file.body, history_len).map_err(|e| e.to_string())?;
    Ok((file.meta, data))
}

/// The meta and table of a snapshot file's bytes, decoded as a node loads
/// them at open (for [`crate::testing::fuzzing`]).
pub(crate) fn file_table(
    bytes: &[u8],
    history_len: usize,
) -> Result<(SnapshotMeta, LeaseTable), String> {
    decode_file(bytes, history_len).map(|(meta, data)| (meta, data.table))
}

/// The layouts of a snapshot body, oldest first: each adds a field at the
/// end of the one before.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Layout {
    /// Before the fenced store ([`SnapshotBodyV1`]).
    Table,
    /// With the fenced store.
    Kv,
    /// With the retired node ids (written once an id was retired).
    Retired,
}

impl Layout {
    fn fields(self) -> usize {
        match self {
            Self::Table => 3,
            Self::Kv => 4,
            Self::Retired => 5,
        }
    }
}

/// Reads a snapshot body of any layout this build knows, newest first: a
/// body is refused by every other layout's decoder (it lacks a field one
/// needs, or has bytes trailing behind the other's last), so none is
/// misread. A body no layout reads is refused with the newest layout's
/// reason. The table is built as it is decoded (see [`BodySeed`]).
fn decode_body(bytes: &[u8], history_len: usize) -> Result<Data, StorageError> {
    let seed = |layout| BodySeed {
        history_len,
        layout,
    };
    codec::decode_seed("snapshot", bytes, seed(Layout::Retired))
        .or_else(|newest| {
            codec::decode_seed("snapshot", bytes, seed(Layout::Kv))
                .or_else(|_| codec::decode_seed("snapshot", bytes, seed(Layout::Table)))
                .map_err(|_| newest)
        })
        .map_err(sm_read_err)
}

/// Decodes a [`SnapshotBody`] of `layout` straight into the state it holds:
/// the table is built record by record from the bytes
/// ([`fenced_core::TableSeed`]), never held decoded beside them.
struct BodySeed {
    history_len: usize,
    layout: Layout,
}

const BODY_FIELDS: &[&str] = &["last_applied", "membership", "table", "kv", "retired"];

impl<'de> serde::de::DeserializeSeed<'de> for BodySeed {
    type Value = Data;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Data, D::Error> {
        let fields = &BODY_FIELDS[..self.layout.fields()];
        d.deserialize_struct("SnapshotBody", fields, self)
    }
}

impl<'de> serde::de::Visitor<'de> for BodySeed {
    type Value = Data;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a snapshot body")
    }

    fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Data, A::Error> {
        use serde::de::Error;
        let missing = |i| A::Error::invalid_length(i, &"the fields of a snapshot body");
        let last_applied = seq.next_element()?.ok_or_else(|| missing(0))?;
        let membership = seq.next_element()?.ok_or_else(|| missing(1))?;
        let seed = fenced_core::TableSeed {
            history_len: self.history_len,
        };
        let mut table = seq.next_element_seed(seed)?.ok_or_else(|| missing(2))?;
        if self.layout >= Layout::Kv {
            let kv: KvSnapshot = seq.next_element()?.ok_or_else(|| missing(3))?;
            table.restore_kv(kv).map_err(A::Error::custom)?;
        }
        let retired = if self.layout >= Layout::Retired {
            seq.next_element()?.ok_or_else(|| missing(4))?
        } else {
            RetiredIds::default()
        };
        Ok(Data {
            table,
            last_applied,
            membership,
            retired,
        })
    }
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
    let (path, file) = create_temporary(dir, seq)?;
    let mut out = FramedWriter::new(std::io::BufWriter::with_capacity(1 << 20, file))
        .map_err(snapshot_write_err)?;
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
    let file = finish(out)?;
    Ok(Temporary {
        path,
        file,
        body_len: body_len as u64,
    })
}

/// Creates the temporary snapshot file number `seq` (0600: the snapshot
/// holds every live owner id).
fn create_temporary(dir: &Path, seq: u64) -> Result<(PathBuf, std::fs::File), StorageError> {
    let path = dir.join(format!("{SNAPSHOT_FILE}.{seq}.tmp"));
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(&path)
        .map_err(snapshot_write_err)?;
    Ok((path, file))
}

/// Closes a framed snapshot file: its trailer, then what is buffered.
fn finish(
    out: FramedWriter<std::io::BufWriter<std::fs::File>>,
) -> Result<std::fs::File, StorageError> {
    out.finish()
        .map_err(snapshot_write_err)?
        .into_inner()
        .map_err(|e| snapshot_write_err(e.into_error()))
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

/// What a restored state holds.
#[derive(Debug, Clone, Copy)]
pub struct RestoredState {
    pub cluster_time: ClusterTime,
    /// Every token granted from now on is above it.
    pub last_token: u64,
    pub live_leases: u64,
}

impl RestoredState {
    fn of(table: &LeaseTable) -> Self {
        Self {
            cluster_time: table.now(),
            last_token: table.last_token().map_or(0, Token::get),
            live_leases: u64::try_from(table.live_leases()).unwrap_or(u64::MAX),
        }
    }
}

/// What an exported body holds, checked as a load would check it.
pub fn inspect_export(body: &[u8]) -> Result<RestoredState, StorageError> {
    let data = decode_body(body, fenced_core::MAX_HISTORY_PER_RESOURCE)?;
    Ok(RestoredState::of(&data.table))
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
    data.table
        .raise_token_floor(token_floor)
        .map_err(snapshot_write_err)?;
    let restored = RestoredState::of(&data.table);
    // The ids the operator names in the new cluster are its members again;
    // every other retired id stays retired.
    let retired = data.retired.without_members(membership.membership());
    let body = SnapshotBody {
        last_applied: Some(at),
        membership: membership.clone(),
        table: data.table.snapshot(),
        kv: data.table.kv_snapshot(),
        retired,
    };
    let meta = SnapshotMeta {
        last_log_id: Some(at),
        last_membership: membership,
        snapshot_id: format!("restored-{}", at.index),
    };
    let body = body.encode().map_err(snapshot_write_err)?;
    std::fs::create_dir_all(dir).map_err(snapshot_write_err)?;
    let temp = write_temporary(dir, 0, &meta, &Body::Encoded(&body))?;
    make_durable(dir, temp)?;
    Ok(restored)
}

/// A point where a test holds a task until it lets it go.
#[cfg(test)]
pub(super) mod pause {
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
            retired: RetiredIds::default(),
        };
        let meta = SnapshotMeta {
            last_log_id: Some(last),
            last_membership: membership,
            snapshot_id: format!("leader-{}", last.index),
        };
        let bytes = codec::encode("snapshot", &body).unwrap();
        (meta, Box::new(Cursor::new(bytes)))
    }

    /// A snapshot file holding `table` up to `last`, and its body (what an
    /// export holds).
    pub fn file_holding(table: &LeaseTable, last: LogId) -> (Vec<u8>, Vec<u8>) {
        let (meta, _) = snapshot_at(last);
        let body = SnapshotBody {
            last_applied: Some(last),
            membership: meta.last_membership.clone(),
            table: table.snapshot(),
            kv: table.kv_snapshot(),
            retired: RetiredIds::default(),
        };
        let body = codec::encode("snapshot", &body).unwrap();
        let file = SnapshotFile {
            meta,
            body: body.clone(),
        };
        (codec::encode("snapshot file", &file).unwrap(), body)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use fenced_core::{AcquireInSessionOutcome, AcquireOutcome, KvPutOutcome, Outcome};
    use openraft::{
        storage::{RaftLogStorage, RaftStateMachine},
        CommittedLeaderId, RaftLogReader, RaftSnapshotBuilder,
    };

    use super::*;
    use crate::{
        state_machine::parking::Parking,
        state_machine::StateMachine,
        storage::log_store::{
            testing::{log_with_blanks, log_with_payloads, open_state as open, restart},
            LogStore,
        },
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

    /// A snapshot encode's stand-in: a thread that holds a read of the
    /// state for `how_long`; returns once it holds it.
    fn encode_for(sm: &StateMachine, how_long: std::time::Duration) -> std::thread::JoinHandle<()> {
        let shared = Arc::clone(&sm.shared);
        let (held, is_held) = std::sync::mpsc::channel();
        let encode = std::thread::spawn(move || {
            let _state = shared.read();
            held.send(()).unwrap();
            std::thread::sleep(how_long);
        });
        is_held.recv().unwrap();
        encode
    }

    /// A snapshot's encode reads the state on a blocking thread for as long
    /// as it takes; an apply meanwhile waits for it without holding the
    /// runtime thread, which keeps sending heartbeats and answering the
    /// leader (blocked, it let an election happen).
    #[tokio::test(flavor = "current_thread")]
    async fn an_apply_waiting_for_a_snapshot_encode_leaves_the_runtime_thread_free() {
        use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
        let dir = tempfile::tempdir().unwrap();
        let (mut log, mut sm) = node(dir.path()).await;
        let entries = log.try_get_log_entries(11..=12).await.unwrap();

        let encode = encode_for(&sm, std::time::Duration::from_millis(300));
        let ticks = Arc::new(AtomicU64::new(0));
        let ticker = tokio::spawn({
            let ticks = Arc::clone(&ticks);
            async move {
                loop {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    ticks.fetch_add(1, Relaxed);
                }
            }
        });
        let started = std::time::Instant::now();
        sm.apply(entries).await.unwrap();
        let waited = started.elapsed();
        encode.join().unwrap();
        ticker.abort();

        assert!(
            waited >= std::time::Duration::from_millis(200),
            "the apply waited for the encode: {waited:?}"
        );
        let ticks = ticks.load(Relaxed);
        assert!(
            ticks >= 20,
            "the runtime thread ran another task {ticks} times in {waited:?}"
        );
        assert_eq!(sm.shared.read().last_applied.map(|l| l.index), Some(12));
    }

    /// A read from a blocking thread (lease listing, digest) made while an
    /// apply waits lets the apply in first, so a run of such reads cannot
    /// keep the apply out; an apply that never comes holds it 100 ms at most.
    #[tokio::test(flavor = "current_thread")]
    async fn a_blocking_read_lets_a_waiting_apply_in_first_and_waits_for_no_stuck_one() {
        use std::time::Duration;
        let dir = tempfile::tempdir().unwrap();
        let (mut log, mut sm) = node(dir.path()).await;
        let entries = log.try_get_log_entries(11..=12).await.unwrap();

        let encode = encode_for(&sm, Duration::from_millis(60));
        let shared = Arc::clone(&sm.shared);
        let listing = std::thread::spawn(move || {
            while !shared
                .apply_waiting
                .load(std::sync::atomic::Ordering::Acquire)
            {
                std::thread::sleep(Duration::from_millis(1));
            }
            shared.read_behind_apply().last_applied.map(|l| l.index)
        });
        sm.apply(entries).await.unwrap();
        encode.join().unwrap();
        assert_eq!(
            listing.join().unwrap(),
            Some(12),
            "the read came after the apply that was waiting"
        );

        sm.shared
            .apply_waiting
            .store(true, std::sync::atomic::Ordering::Release);
        let started = std::time::Instant::now();
        let applied = sm.shared.read_behind_apply().last_applied.map(|l| l.index);
        let waited = started.elapsed();
        assert_eq!(applied, Some(12));
        assert!(
            (Duration::from_millis(100)..Duration::from_secs(2)).contains(&waited),
            "a stuck apply held the read {waited:?}, not about 100 ms"
        );
    }

    #[tokio::test]
    async fn an_older_build_finishing_after_a_newer_install_is_discarded() {
        let dir = tempfile::tempdir().unwrap();
        let (mut log, mut sm) = node(dir.path()).await;

        // A build reads the table at 10 and stops before it writes.
        let (reached, resume) = sm.shared.snapshots.build_paused.arm();
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

    /// A halted node (the simulation's crash) puts no snapshot in place,
    /// not even one whose build had begun: the disk stays as it was.
    #[tokio::test]
    async fn a_halted_node_writes_no_snapshot() {
        let dir = tempfile::tempdir().unwrap();
        let (_log, mut sm) = node(dir.path()).await;
        let before = current_last(&mut sm).await;

        let (reached, resume) = sm.shared.snapshots.build_paused.arm();
        let mut builder = sm.get_snapshot_builder().await;
        let build = tokio::spawn(async move { builder.build_snapshot().await });
        reached.await.expect("the build reaches its pause point");
        sm.shared.halt_writes();
        drop(resume);
        assert!(
            build.await.unwrap().is_err(),
            "a build finished after the halt"
        );

        let (meta, body) = snapshot_at(20);
        assert!(
            sm.install_snapshot(&meta, body).await.is_err(),
            "an install went ahead after the halt"
        );
        assert_eq!(current_last(&mut sm).await, before);
        assert_eq!(sm.shared.snapshot_on_disk(), before);
    }

    fn membership() -> StoredMembership {
        StoredMembership::new(
            None,
            openraft::Membership::new(vec![std::collections::BTreeSet::from([1])], None),
        )
    }

    /// The encoded snapshot body of `table`, applied up to `applied`.
    fn encoded_body(table: &LeaseTable, applied: u64) -> Vec<u8> {
        let body = SnapshotBody {
            last_applied: Some(log_id(applied)),
            membership: membership(),
            table: table.snapshot(),
            kv: table.kv_snapshot(),
            retired: RetiredIds::default(),
        };
        codec::encode("snapshot", &body).unwrap()
    }

    /// A table with a lease on `job` and, when `put`, a fenced value under it.
    fn table_with(put: bool) -> LeaseTable {
        table_and_owner(put).0
    }

    /// [`table_with`], and the owner id of the lease on `job`.
    fn table_and_owner(put: bool) -> (LeaseTable, fenced_core::OwnerId) {
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
        (table, owner)
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
        assert!(data.retired.is_empty());
    }

    /// A membership of voters `ids`.
    fn voters(ids: &[u64]) -> openraft::Membership<u64, crate::types::Node> {
        let nodes: std::collections::BTreeMap<u64, crate::types::Node> = ids
            .iter()
            .map(|i| (*i, crate::types::Node::default()))
            .collect();
        openraft::Membership::new(vec![ids.iter().copied().collect()], nodes)
    }

    /// [`encoded_body`] with `retired`.
    fn body_with_retired(table: &LeaseTable, retired: &[u64]) -> Vec<u8> {
        let body = SnapshotBody {
            last_applied: Some(log_id(9)),
            membership: membership(),
            table: table.snapshot(),
            kv: table.kv_snapshot(),
            retired: RetiredIds::from_ids(retired.iter().copied()).unwrap(),
        };
        codec::encode("snapshot", &body).unwrap()
    }

    #[test]
    fn retired_ids_round_trip_and_a_body_without_them_has_none() {
        let table = table_with(true);
        let bytes = body_with_retired(&table, &[5, 2]);
        let data = decode_body(&bytes, fenced_core::DEFAULT_HISTORY_PER_RESOURCE).unwrap();
        assert_eq!(data.retired.ids(), &[2, 5].into());
        assert_eq!(data.table.kv(), table.kv());
        // None retired: the body of the release before, byte for byte.
        let none = body_with_retired(&table, &[]);
        assert_eq!(none, encoded_body(&table, 9));
        let data = decode_body(&none, fenced_core::DEFAULT_HISTORY_PER_RESOURCE).unwrap();
        assert!(data.retired.is_empty());
        // Cut short or lengthened, it is refused.
        for bad in [&bytes[..bytes.len() - 1], &[&bytes[..], &[0]].concat()[..]] {
            assert!(decode_body(bad, fenced_core::DEFAULT_HISTORY_PER_RESOURCE).is_err());
        }
    }

    #[test]
    fn a_damaged_or_oversized_retired_list_is_refused_by_name() {
        #[derive(Serialize)]
        struct RawRetired {
            format_version: u32,
            ids: Vec<u64>,
        }
        #[derive(Serialize)]
        struct RawBody {
            last_applied: Option<LogId>,
            membership: StoredMembership,
            table: TableSnapshot,
            kv: KvSnapshot,
            retired: RawRetired,
        }
        let table = table_with(false);
        let refusal = |format_version, ids| {
            let body = RawBody {
                last_applied: Some(log_id(9)),
                membership: membership(),
                table: table.snapshot(),
                kv: table.kv_snapshot(),
                retired: RawRetired {
                    format_version,
                    ids,
                },
            };
            let bytes = codec::encode("snapshot", &body).unwrap();
            let e = decode_body(&bytes, fenced_core::DEFAULT_HISTORY_PER_RESOURCE);
            e.err().expect("refused").to_string()
        };
        let max = crate::peer::retired::MAX_RETIRED_IDS as u64;
        let full: Vec<u64> = (1..=max).collect();
        let bytes = body_with_retired(&table, &full);
        let data = decode_body(&bytes, fenced_core::DEFAULT_HISTORY_PER_RESOURCE).unwrap();
        assert_eq!(data.retired.len(), crate::peer::retired::MAX_RETIRED_IDS);
        let e = refusal(1, (1..=max + 1).collect());
        assert!(
            e.contains("retired node ids: 4097 ids, at most 4096"),
            "{e}"
        );
        let e = refusal(1, vec![7, 3]);
        assert!(
            e.contains("retired node ids: not in increasing order"),
            "{e}"
        );
        let e = refusal(2, vec![3]);
        assert!(e.contains("retired node ids: format version 2"), "{e}");
    }

    #[tokio::test]
    async fn a_restored_state_keeps_the_retired_ids_its_new_cluster_does_not_name() {
        let dir = tempfile::tempdir().unwrap();
        let body = body_with_retired(&table_with(false), &[2, 5]);
        let new_cluster = StoredMembership::new(Some(log_id(100)), voters(&[1, 2, 3]));
        write_restored_state(
            &dir.path().join("state"),
            &body,
            log_id(100),
            new_cluster,
            1,
        )
        .unwrap();
        let log = open_log(dir.path());
        let sm = open(dir.path(), &log);
        assert_eq!(sm.shared.retired_ids().ids(), &[5].into());
    }

    #[tokio::test]
    async fn removed_ids_are_retired_by_replay_and_carried_in_a_snapshot() {
        use openraft::EntryPayload;
        let dir = tempfile::tempdir().unwrap();
        let with_learner = |ids: &[u64]| {
            let nodes: std::collections::BTreeMap<u64, crate::types::Node> = ids
                .iter()
                .chain(&[4])
                .map(|i| (*i, crate::types::Node::default()))
                .collect();
            openraft::Membership::new(vec![ids.iter().copied().collect()], nodes)
        };
        // 1, 2, 3; 4 added as a learner; 2 removed; then 4.
        let changes = [
            voters(&[1, 2, 3]),
            with_learner(&[1, 2, 3]),
            with_learner(&[1, 3]),
            voters(&[1, 3]),
        ];
        let payloads: Vec<_> = changes.into_iter().map(EntryPayload::Membership).collect();
        drop(log_with_payloads(&dir.path().join("raft-log"), &payloads).await);
        // Replayed from the log alone: no snapshot yet.
        let (log, mut sm) = restart(dir.path()).await;
        assert_eq!(sm.shared.retired_ids().ids(), &[2, 4].into());
        assert_eq!(sm.shared.subscribe_retired().borrow().ids(), &[2, 4].into());
        let mut builder = sm.get_snapshot_builder().await;
        builder.build_snapshot().await.unwrap();
        drop((log, sm, builder));
        // Loaded from the snapshot alone (nothing replayed).
        let log = open_log(dir.path());
        let sm = open(dir.path(), &log);
        assert_eq!(sm.shared.retired_ids().ids(), &[2, 4].into());
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
        let bytes = encoded_body(&table, 11);
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

    /// A lease and a waiter of named identities come back theirs from the
    /// bincode body a node writes: another identity is still refused, and
    /// the per-identity bound still counts them.
    #[test]
    fn identities_round_trip_through_a_snapshot_body() {
        use fenced_core::{
            Batch, Capacity, CapacityBound, Command, IdentityBounds, OwnerId, ReleaseOutcome,
            ResourceName,
        };
        let bounds = IdentityBounds {
            max_leases_per_identity: 1,
            max_waiters_per_identity: 1,
        };
        let acquire = |who: &str, resource: &str, owner, wait_ms| {
            Command::AcquireBounded {
                resource: ResourceName::new(resource).unwrap(),
                owner_id: owner,
                ttl_ms: 60_000,
                wait_ms,
                capacity: Capacity::UNBOUNDED,
            }
            .as_identity(who, bounds)
        };
        let (a, b) = (OwnerId::random(), OwnerId::random());
        let mut table = LeaseTable::new();
        table.apply(&Batch {
            stamp: ClusterTime::from_millis(5),
            commands: vec![
                acquire("alice", "job", a, 0),
                acquire("bob", "job", b, 30_000),
            ],
        });
        let token = table.holder("job").unwrap().1.token;
        let bytes = encoded_body(&table, 3);
        let mut data = decode_body(&bytes, fenced_core::DEFAULT_HISTORY_PER_RESOURCE).unwrap();
        assert_eq!(data.table.snapshot(), table.snapshot());
        let release = |who: &str| {
            Command::Release {
                resource: ResourceName::new("job").unwrap(),
                owner_id: a,
                token,
            }
            .as_identity(who, bounds)
        };
        let applied = data.table.apply(&Batch {
            stamp: ClusterTime::from_millis(6),
            commands: vec![
                release("bob"),
                acquire("alice", "other", OwnerId::random(), 0),
                release("alice"),
            ],
        });
        assert!(matches!(
            applied.outcomes[0],
            Outcome::Release(ReleaseOutcome::NotHolder(_))
        ));
        assert_eq!(
            applied.outcomes[1],
            Outcome::Acquire(AcquireOutcome::CapacityReached {
                bound: CapacityBound::LeasesPerIdentity,
                limit: 1
            })
        );
        assert_eq!(
            applied.outcomes[2],
            Outcome::Release(ReleaseOutcome::Released)
        );
        // Bob's waiter was handed the lease, as bob's.
        assert_eq!(data.table.holder("job").unwrap().0, b);
        data.table.check_invariants().unwrap();
    }

    /// A node remembering more grants than the default (32 here) loads
    /// its own snapshot with all of them; a load used to check them against
    /// the default 16 and refuse the file.
    #[test]
    fn a_history_longer_than_the_default_survives_a_load() {
        use fenced_core::{Batch, Command, OwnerId, ResourceName};
        let mut table = LeaseTable::new().with_history_len(32);
        for at in 0..20 {
            table.apply(&Batch {
                stamp: ClusterTime::from_millis(at * 20),
                commands: vec![Command::Acquire {
                    resource: ResourceName::new("r").unwrap(),
                    owner_id: OwnerId::random(),
                    ttl_ms: 10,
                    wait_ms: 0,
                }],
            });
        }
        let bytes = encoded_body(&table, 20);
        let data = decode_body(&bytes, 32).unwrap();
        assert_eq!(data.table.history("r", 64).len(), 20);
        assert_eq!(data.table.snapshot(), table.snapshot());
    }

    #[test]
    fn the_fenced_store_round_trips_through_a_snapshot_body() {
        let table = table_with(true);
        let bytes = encoded_body(&table, 9);
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

    /// The store as the release before tombstones wrote it: format 1,
    /// three fields.
    #[derive(Serialize)]
    struct KvSnapshotV1 {
        format_version: u32,
        revision: u64,
        entries: Vec<(fenced_core::KvKey, fenced_core::KvEntry)>,
    }

    #[test]
    fn a_store_without_tombstones_is_written_and_read_in_format_1() {
        let table = table_with(true);
        let entry = table.kv().get("job/state").unwrap().clone();
        #[derive(Serialize)]
        struct BodyWithV1Kv {
            last_applied: Option<LogId>,
            membership: StoredMembership,
            table: TableSnapshot,
            kv: KvSnapshotV1,
        }
        let old = BodyWithV1Kv {
            last_applied: Some(log_id(9)),
            membership: membership(),
            table: table.snapshot(),
            kv: KvSnapshotV1 {
                format_version: 1,
                revision: 1,
                entries: vec![(fenced_core::KvKey::new("job/state").unwrap(), entry)],
            },
        };
        let old_bytes = codec::encode("snapshot", &old).unwrap();
        // Byte for byte what a node of the release before writes and reads.
        assert_eq!(encoded_body(&table, 9), old_bytes);
        let data = decode_body(&old_bytes, fenced_core::DEFAULT_HISTORY_PER_RESOURCE).unwrap();
        assert_eq!(data.table.kv(), table.kv());
    }

    #[test]
    fn a_tombstone_and_its_key_resource_survive_a_snapshot_body() {
        use fenced_core::{Batch, Command, KvKey, ResourceName, Token};
        let (mut table, owner) = table_and_owner(true);
        let applied = table.apply(&Batch {
            stamp: ClusterTime::from_millis(6),
            commands: vec![Command::KvDelete {
                key: KvKey::new("job/state").unwrap(),
                resource: ResourceName::new("job").unwrap(),
                owner_id: owner,
                token: Token::new(1).unwrap(),
            }],
        });
        assert!(matches!(
            applied.outcomes[0],
            Outcome::KvDelete(fenced_core::KvDeleteOutcome::Applied { existed: true, .. })
        ));
        assert_eq!(table.kv_snapshot().format_version(), 2);
        let bytes = encoded_body(&table, 10);
        let data = decode_body(&bytes, fenced_core::DEFAULT_HISTORY_PER_RESOURCE).unwrap();
        assert_eq!(data.table.kv(), table.kv());
        let tomb = data.table.kv().tombstone("job/state").unwrap();
        assert_eq!((tomb.resource.as_str(), tomb.token.get()), ("job", 1));
        assert!(data.table.kv().get("job/state").is_none());
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
                    retired: data.retired.clone(),
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
        // In its checksum frame since data format 2.
        assert_eq!(on_disk, checksum::frame(&want));
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
        let path = dir.path().join("state").join(SNAPSHOT_FILE);
        let bytes = std::fs::read(&path).unwrap();
        let file: SnapshotFile =
            codec::decode("snapshot file", checksum::unframe(&path, &bytes).unwrap()).unwrap();
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
                    let snapshots = &shared.snapshots;
                    let seq = snapshots.temp_seq.fetch_add(1, Ordering::Relaxed);
                    let temp = write_temporary(
                        &snapshots.dir,
                        seq,
                        &file.meta,
                        &Body::Encoded(&file.body),
                    )
                    .expect("every writer writes");
                    snapshots
                        .store(file.meta.clone(), temp, || {})
                        .expect("every writer succeeds");
                    writing.fetch_sub(1, Ordering::SeqCst);
                });
            }
            // A reader sees a whole file whenever it looks.
            while writing.load(Ordering::SeqCst) > 0 {
                if let Ok(bytes) = std::fs::read(&path) {
                    let content = checksum::unframe(&path, &bytes).expect("a whole file");
                    check(&codec::decode("snapshot file", content).expect("a whole file"));
                }
            }
        });
        let bytes = std::fs::read(&path).unwrap();
        let content = checksum::unframe(&path, &bytes).expect("a whole file");
        let file: SnapshotFile = codec::decode("snapshot file", content).expect("a whole file");
        check(&file);
        assert_eq!(file.meta.last_log_id, Some(log_id(16)), "the newest wins");
        assert_eq!(shared.snapshots.durable_last(), Some(log_id(16)));
        let names: Vec<_> = std::fs::read_dir(dir.path().join("state"))
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [SNAPSHOT_FILE], "no temporary file is left");
    }

    /// The error a damaged snapshot file gives at open: it names the file,
    /// an offset in it and the next step, and no state is loaded.
    fn refused_at_open(dir: &Path, log: &LogStore, bytes: &[u8]) -> String {
        let path = dir.join("state").join(SNAPSHOT_FILE);
        std::fs::write(&path, bytes).unwrap();
        let e = StateMachine::open(&dir.join("state"), Parking::new(4), log.purge_horizon(), 16)
            .err()
            .expect("a damaged snapshot is refused");
        let text = e.to_string();
        assert!(
            text.contains(&format!("{}: damaged at offset", path.display()))
                && text.contains("A damaged node"),
            "{text}"
        );
        text
    }

    /// One bit flipped in each byte of the file (every bit of the first 64,
    /// which hold the header, the meta and the membership with the peers'
    /// addresses), and the file cut at every length: each is refused by
    /// name, none loaded.
    #[tokio::test]
    async fn a_damaged_snapshot_is_refused_by_name_and_nothing_loads() {
        let dir = tempfile::tempdir().unwrap();
        let (log, mut sm) = node(dir.path()).await;
        sm.shared.write().table = table_with(true);
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        drop(sm);
        let path = dir.path().join("state").join(SNAPSHOT_FILE);
        let good = std::fs::read(&path).unwrap();
        assert!(good.len() > 200, "{} bytes", good.len());
        for i in 0..good.len() {
            let bits: Vec<u8> = if i < 64 {
                (0..8).collect()
            } else {
                vec![(i % 8) as u8]
            };
            for bit in bits {
                let mut bad = good.clone();
                bad[i] ^= 1 << bit;
                refused_at_open(dir.path(), &log, &bad);
            }
        }
        for cut in 0..good.len() {
            refused_at_open(dir.path(), &log, &good[..cut]);
        }
        // The good file still loads.
        std::fs::write(&path, &good).unwrap();
        let sm = open(dir.path(), &log);
        assert_eq!(sm.shared.read().table.kv(), table_with(true).kv());
    }

    /// A snapshot damaged while the node runs is not sent to a follower.
    #[tokio::test]
    async fn a_snapshot_damaged_after_the_open_is_not_sent() {
        let dir = tempfile::tempdir().unwrap();
        let (_log, mut sm) = node(dir.path()).await;
        sm.get_snapshot_builder()
            .await
            .build_snapshot()
            .await
            .unwrap();
        let path = dir.path().join("state").join(SNAPSHOT_FILE);
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 4;
        std::fs::write(&path, &bytes).unwrap();
        let e = sm.get_current_snapshot().await.expect_err("refused");
        assert!(e.to_string().contains("damaged at offset"), "{e}");
    }
}

/// Snapshot files written by earlier builds still load.
#[cfg(test)]
mod old_formats {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use fenced_core::{OwnerId, Token, TokenState};
    use openraft::storage::RaftStateMachine;

    use super::*;
    use crate::{
        state_machine::parking::Parking, state_machine::StateMachine, storage::log_store::LogStore,
    };

    /// A snapshot of the layout before the checksum frame loads once, and
    /// is rewritten in its frame with the same content.
    #[tokio::test]
    async fn an_unframed_snapshot_loads_and_is_rewritten_framed() {
        let dir = tempfile::tempdir().unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        let path = state.join(SNAPSHOT_FILE);
        std::fs::write(&path, V1).unwrap();
        let log = LogStore::open(&dir.path().join("raft-log")).unwrap();
        let open = || StateMachine::open(&state, Parking::new(4), log.purge_horizon(), 16);
        let mut sm = open().unwrap();
        let framed = std::fs::read(&path).unwrap();
        assert_eq!(checksum::unframe(&path, &framed).unwrap(), V1);
        let names: Vec<_> = std::fs::read_dir(&state)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, [SNAPSHOT_FILE], "no temporary file is left");
        let (applied, _) = sm.applied_state().await.unwrap();
        drop(sm);
        let (again, _) = open().unwrap().applied_state().await.unwrap();
        assert_eq!(applied, again);
        assert_eq!(again.map(|l| l.index), Some(3));
    }

    /// In a data dir of format 2 every snapshot is framed: one without its
    /// frame is refused by name.
    #[tokio::test]
    async fn an_unframed_snapshot_in_a_framed_data_dir_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        crate::storage::data_format::write(dir.path()).unwrap();
        let state = dir.path().join("state");
        std::fs::create_dir_all(&state).unwrap();
        std::fs::write(state.join(SNAPSHOT_FILE), V1).unwrap();
        let log = LogStore::open(&dir.path().join("raft-log")).unwrap();
        let e = StateMachine::open(&state, Parking::new(4), log.purge_horizon(), 16)
            .err()
            .expect("refused")
            .to_string();
        assert!(
            e.contains("snapshot.bin: damaged at offset 0") && e.contains("no checksum frame"),
            "{e}"
        );
        assert_eq!(std::fs::read(state.join(SNAPSHOT_FILE)).unwrap(), V1);
    }

    /// The snapshot file of a build before format 2 (table format 1): a
    /// lease on jobs/a (owner 01..01, token 1, granted at 1000 ms for 60 s)
    /// with a waiter, jobs/b released (owner 02..02, token 2), applied up
    /// to index 3.
    const V1: &[u8] = include_bytes!("../../testdata/snapshot-v1.bin");

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
        assert!(shared.dated_history("jobs/a", 16).is_empty());
        // Its next snapshot is format 2, and loads as such.
        let (_, (table, _kv)) = shared.table_snapshot();
        assert_eq!(table.format_version(), fenced_core::SNAPSHOT_FORMAT_VERSION);
        let bytes = codec::encode("table", &table).unwrap();
        let again: TableSnapshot = codec::decode("table", &bytes).unwrap();
        assert!(LeaseTable::from_snapshot(again).is_ok());
    }
}

/// The time a node's load of a large snapshot takes, decoding and building
/// the table (what `loaded snapshot` logs as `load_ms`): a measurement that
/// prints its figures, not a check. `FENCED_LOAD_LEASES` leases (a million
/// by default), one acquire each, as `fenced-bench --scenarios million`
/// fills them. Run in release:
/// `cargo test --release -p fenced-server --lib -- --ignored --nocapture snapshot_load_time`.
#[cfg(test)]
mod load_timing {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use fenced_core::{Batch, Command, OwnerId, ResourceName};

    use super::*;
    use crate::storage::log_store::LogStore;

    #[test]
    #[ignore = "a measurement: run it in release with --nocapture"]
    fn snapshot_load_time() {
        let leases: u64 = std::env::var("FENCED_LOAD_LEASES")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(1_000_000);
        let dir = tempfile::tempdir().unwrap();
        let log = LogStore::open(&dir.path().join("raft-log")).unwrap();
        let state = dir.path().join("state");
        let history = fenced_core::DEFAULT_HISTORY_PER_RESOURCE;
        let counters = Arc::<Counters>::default();
        let (snapshots, _) =
            Snapshots::open(&state, log.purge_horizon(), history, counters.clone()).unwrap();
        let mut table = LeaseTable::new();
        let started = Instant::now();
        for (batch, stamp) in (0..leases).collect::<Vec<_>>().chunks(4096).zip(1..) {
            let commands = batch
                .iter()
                .map(|i| Command::Acquire {
                    resource: ResourceName::new(&format!("million-5f3a9c:{i:08}")).unwrap(),
                    owner_id: OwnerId::random(),
                    ttl_ms: 3_600_000,
                    wait_ms: 0,
                })
                .collect();
            table.apply(&Batch {
                stamp: ClusterTime::from_millis(stamp),
                commands,
            });
        }
        assert_eq!(table.live_leases() as u64, leases);
        let filled = started.elapsed();
        let data = Data {
            table,
            last_applied: Some(openraft::LogId::new(
                openraft::CommittedLeaderId::new(1, 1),
                1,
            )),
            membership: StoredMembership::default(),
            retired: RetiredIds::default(),
        };
        let started = Instant::now();
        let written = snapshots.write(&data, started).unwrap();
        snapshots.store_built(written, started).unwrap();
        let wrote = started.elapsed();
        drop((data, snapshots));
        let bytes = std::fs::metadata(state.join(SNAPSHOT_FILE)).unwrap().len();
        let mut loads = Vec::new();
        for _ in 0..3 {
            let started = Instant::now();
            let (_, loaded) =
                Snapshots::open(&state, log.purge_horizon(), history, counters.clone()).unwrap();
            loads.push(started.elapsed());
            assert_eq!(loaded.unwrap().table.live_leases() as u64, leases);
        }
        loads.sort();
        println!(
            "{leases} leases: filled in {filled:.2?}, snapshot of {bytes} bytes written in \
             {wrote:.2?}, loaded (read, decode, build) in {:.2?} (median of 3; min {:.2?})",
            loads[1], loads[0]
        );
    }
}
