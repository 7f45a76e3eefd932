//! [`FenceStore`]: the fence check and the write it guards, in one atomic,
//! durable step on sled.

use std::{
    collections::HashSet,
    fs::File,
    hash::{Hash, Hasher},
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicU64, Ordering},
        Mutex, MutexGuard,
    },
};

use tracing::{info, warn};

use crate::{
    decide::{decide, Decision, KeyState},
    limits::check_key,
    record::{decode_key, encode_key},
    Current, Mode, StoreError, Write, WriteOutcome,
};

/// Writes to keys in the same stripe are serialised; a power of two.
const STRIPES: usize = 64;

/// A persisted fence store: per key, the highest accepted token, the guarded
/// value and the lock resource the key is bound to.
///
/// Each write is decided and stored in one step (a sled compare-and-swap
/// under a per-key lock) and is on disk, fsync'ed, before
/// [`FenceStore::write`] returns. Reads see only durable writes. One process
/// opens a directory at a time (sled locks it).
///
/// ```
/// use fenced_core::{OwnerId, ResourceName, Token};
/// use fenced_resource::{FenceStore, Write, WriteOutcome, RejectReason};
/// let dir = tempfile::tempdir()?;
/// let store = FenceStore::open(dir.path())?;
/// let resource = ResourceName::new("statement:account-1842:2026-07")?;
/// let (a, b) = (OwnerId::random(), OwnerId::random());
///
/// // B, the newer owner (token 42), writes first...
/// let outcome = store.write(&Write::for_resource(resource.clone(), Token::new(42)?, b, "from B"))?;
/// assert_eq!(outcome, WriteOutcome::Accepted { token: 42, version: 1 });
/// // ...then A wakes up from a pause and writes with its old token 41.
/// match store.write(&Write::for_resource(resource.clone(), Token::new(41)?, a, "from A"))? {
///     WriteOutcome::Rejected(r) => assert_eq!((r.reason, r.highest_token), (RejectReason::StaleToken, 42)),
///     other => panic!("{other:?}"),
/// }
/// assert_eq!(store.get(resource.as_str())?.unwrap().value, b"from B");
/// # Ok::<(), Box<dyn std::error::Error>>(())
/// ```
pub struct FenceStore {
    db: sled::Db,
    pub(crate) keys: sled::Tree,
    pub(crate) versions: sled::Tree,
    dir: PathBuf,
    data_file: File,
    synced_blobs: Mutex<HashSet<std::ffi::OsString>>,
    stripes: Vec<Mutex<()>>,
    default_mode: Mode,
    syncs: AtomicU64,
}

impl FenceStore {
    /// Opens (or creates) the store in `dir`; new keys use
    /// [`Mode::AllowEqual`] unless their first write names a mode.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = fenced_resource::FenceStore::open(dir.path())?;
    /// assert!(store.get("nothing-here")?.is_none());
    /// # Ok::<(), fenced_resource::StoreError>(())
    /// ```
    pub fn open(dir: impl AsRef<Path>) -> Result<Self, StoreError> {
        Self::open_with_mode(dir, Mode::AllowEqual)
    }

    /// Like [`FenceStore::open`], with the contract of new keys whose first
    /// write names none.
    ///
    /// ```
    /// use fenced_resource::{FenceStore, Mode};
    /// let dir = tempfile::tempdir()?;
    /// let store = FenceStore::open_with_mode(dir.path(), Mode::Strict)?;
    /// assert_eq!(store.default_mode(), Mode::Strict);
    /// # Ok::<(), fenced_resource::StoreError>(())
    /// ```
    pub fn open_with_mode(dir: impl AsRef<Path>, default_mode: Mode) -> Result<Self, StoreError> {
        let dir = dir.as_ref().to_path_buf();
        std::fs::create_dir_all(&dir)?;
        let db = sled::Config::new()
            .path(&dir)
            .mode(sled::Mode::HighThroughput)
            .open()?;
        let keys = db.open_tree("keys")?;
        let versions = db.open_tree("versions")?;
        let data_file = File::open(dir.join("db"))?;
        let store = FenceStore {
            db,
            keys,
            versions,
            dir,
            data_file,
            synced_blobs: Mutex::new(HashSet::new()),
            stripes: (0..STRIPES).map(|_| Mutex::new(())).collect(),
            default_mode,
            syncs: AtomicU64::new(0),
        };
        store.sync()?;
        info!(dir = %store.dir.display(), keys = store.keys.len(), "fence store open");
        Ok(store)
    }

    /// The contract of a new key whose first write names none.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = fenced_resource::FenceStore::open(dir.path())?;
    /// assert_eq!(store.default_mode(), fenced_resource::Mode::AllowEqual);
    /// # Ok::<(), fenced_resource::StoreError>(())
    /// ```
    pub fn default_mode(&self) -> Mode {
        self.default_mode
    }

    /// Decides `write` against the key's highest accepted token and, if it
    /// is accepted, stores it durably, all in one step.
    ///
    /// Expected refusals are [`WriteOutcome::Rejected`] (final) or
    /// [`WriteOutcome::AlreadyApplied`]; `Err` is bad input (nothing
    /// written) or a storage failure.
    ///
    /// ```
    /// use fenced_core::{OwnerId, ResourceName, Token};
    /// use fenced_resource::{FenceStore, Mode, Write, WriteOutcome};
    /// let dir = tempfile::tempdir()?;
    /// let store = FenceStore::open(dir.path())?;
    /// let owner = OwnerId::random();
    /// let mut w = Write::for_resource(ResourceName::new("invoice:7")?, Token::new(5)?, owner, "sent");
    /// w.mode = Some(Mode::Strict);
    /// assert_eq!(store.write(&w)?, WriteOutcome::Accepted { token: 5, version: 1 });
    /// assert_eq!(store.write(&w)?, WriteOutcome::AlreadyApplied { token: 5, version: 1 });
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn write(&self, write: &Write) -> Result<WriteOutcome, StoreError> {
        write.validate()?;
        let _key_lock = self.lock_key(&write.key);
        self.write_locked(write)
    }

    /// [`FenceStore::write`], with the key's stripe lock already held.
    pub(crate) fn write_locked(&self, write: &Write) -> Result<WriteOutcome, StoreError> {
        let old = self.keys.get(write.key.as_bytes())?;
        let current = old
            .as_ref()
            .map(|bytes| decode_key(&write.key, bytes))
            .transpose()?;
        let outcome = match decide(current.as_ref(), write, self.default_mode) {
            Decision::Invalid(e) => {
                warn!(key = %write.key, resource = %write.resource,
                    token = write.token.get(), error = %e, "write refused as invalid");
                return Err(StoreError::InvalidArgument(e));
            }
            Decision::Answer(outcome) => outcome,
            Decision::Apply(next) => self.store(write, old, &next)?,
        };
        log_outcome(write, &outcome);
        Ok(outcome)
    }

    fn store(
        &self,
        write: &Write,
        old: Option<sled::IVec>,
        next: &KeyState,
    ) -> Result<WriteOutcome, StoreError> {
        let bytes = encode_key(next);
        // The key lock makes this the only writer of the key in this
        // process; the compare-and-swap still refuses to overwrite anything
        // but the state the decision was made on.
        self.keys
            .compare_and_swap(write.key.as_bytes(), old, Some(bytes))?
            .map_err(|_| {
                StoreError::Storage(format!(
                    "key {:?} changed while the write was decided; retry",
                    write.key
                ))
            })?;
        self.sync()?;
        Ok(WriteOutcome::Accepted {
            token: next.token.get(),
            version: next.version,
        })
    }

    /// The key's current value and highest accepted token, if it exists.
    /// Never shows a write that is not yet durable.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = fenced_resource::FenceStore::open(dir.path())?;
    /// assert_eq!(store.get("k")?, None);
    /// assert!(store.get("").is_err()); // keys are 1 to 256 bytes
    /// # Ok::<(), fenced_resource::StoreError>(())
    /// ```
    pub fn get(&self, key: &str) -> Result<Option<Current>, StoreError> {
        check_key(key)?;
        let _key_lock = self.lock_key(key);
        self.get_locked(key)
    }

    pub(crate) fn get_locked(&self, key: &str) -> Result<Option<Current>, StoreError> {
        Ok(self.state_locked(key)?.map(|s| s.current(key)))
    }

    pub(crate) fn state_locked(&self, key: &str) -> Result<Option<KeyState>, StoreError> {
        self.keys
            .get(key.as_bytes())?
            .map(|bytes| decode_key(key, &bytes))
            .transpose()
    }

    /// How many times the store has made its data durable (sled flush plus
    /// fsync). Every accepted write adds at least one.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = fenced_resource::FenceStore::open(dir.path())?;
    /// assert!(store.syncs() >= 1); // opening syncs once
    /// # Ok::<(), fenced_resource::StoreError>(())
    /// ```
    pub fn syncs(&self) -> u64 {
        self.syncs.load(Ordering::Relaxed)
    }

    /// Serialises writes (and reads) of one key.
    pub(crate) fn lock_key(&self, key: &str) -> MutexGuard<'_, ()> {
        let mut h = std::collections::hash_map::DefaultHasher::new();
        key.hash(&mut h);
        let stripe = &self.stripes[(h.finish() as usize) % STRIPES];
        // The lock guards no data, so a panic elsewhere cannot leave it
        // inconsistent: a poisoned lock is as good as a clean one.
        stripe
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Makes everything written so far durable.
    ///
    /// sled 0.34's `flush` ends with `sync_file_range`, which neither
    /// flushes the file's metadata nor the drive's write cache, and sled
    /// writes large items to files under `blobs/` without syncing them. So
    /// after the flush this fsyncs the data file (`fdatasync` of the inode
    /// sled wrote through its own handle), every blob file not synced
    /// before, and the directories whose entries changed.
    pub(crate) fn sync(&self) -> Result<(), StoreError> {
        self.db.flush()?;
        self.data_file.sync_data()?;
        let blobs = self.dir.join("blobs");
        if blobs.is_dir() {
            let mut synced = self
                .synced_blobs
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            let mut new_entries = false;
            for entry in std::fs::read_dir(&blobs)? {
                let entry = entry?;
                let name = entry.file_name();
                if synced.contains(&name) {
                    continue;
                }
                match File::open(entry.path()) {
                    Ok(f) => f.sync_all()?,
                    // sled removed a blob it no longer needs.
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                    Err(e) => return Err(e.into()),
                }
                synced.insert(name);
                new_entries = true;
            }
            if new_entries {
                File::open(&blobs)?.sync_all()?;
            }
            // Forget blobs sled has since removed.
            if synced.len() > 4096 {
                synced.retain(|name| blobs.join(name).exists());
            }
        }
        File::open(&self.dir)?.sync_all()?;
        self.syncs.fetch_add(1, Ordering::Relaxed);
        Ok(())
    }
}

/// The owner id is a capability (with the token it renews and releases the
/// lease), so it is logged at debug level only.
fn log_outcome(write: &Write, outcome: &WriteOutcome) {
    let op = write.operation_id.as_deref().unwrap_or("-");
    tracing::debug!(key = %write.key, owner = %write.owner, token = write.token.get(), operation_id = op, "write by");
    match outcome {
        WriteOutcome::Accepted { version, .. } => info!(
            key = %write.key, resource = %write.resource,
            token = write.token.get(), version, operation_id = op, "write accepted"
        ),
        WriteOutcome::AlreadyApplied { version, .. } => info!(
            key = %write.key, resource = %write.resource,
            token = write.token.get(), version, operation_id = op, "write already applied"
        ),
        WriteOutcome::Rejected(r) => warn!(
            key = %write.key, resource = %write.resource,
            token = write.token.get(), highest_token = r.highest_token,
            reason = r.reason.as_str(), operation_id = op, "write rejected: {r}"
        ),
    }
}
