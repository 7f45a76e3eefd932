//! The versioned-object pattern: every worker writes its result as an
//! immutable version under a fresh id, and only the small pointer naming the
//! current version is fenced. A stale worker may leave an unused version
//! behind but can never replace the current one; cleanup removes versions
//! nothing points to.

use std::{
    fmt,
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use fenced_core::{InvalidArgument, OwnerId, ResourceName, Token};
use tracing::info;
use uuid::Uuid;

use crate::{
    limits::{check_key, check_value},
    record::{decode_version, encode_version, VersionRecord, FORMAT},
    FenceStore, StoreError, Write, WriteOutcome,
};

/// The id of one immutable version of an object (a random UUID).
///
/// ```
/// use fenced_resource::VersionId;
/// let id = VersionId::random();
/// assert_eq!(VersionId::from_bytes(id.as_bytes()), Some(id));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct VersionId(Uuid);

impl VersionId {
    /// A fresh id.
    ///
    /// ```
    /// assert_ne!(fenced_resource::VersionId::random(), fenced_resource::VersionId::random());
    /// ```
    pub fn random() -> Self {
        VersionId(Uuid::new_v4())
    }

    /// The 16 bytes stored in the object's pointer.
    ///
    /// ```
    /// assert_eq!(fenced_resource::VersionId::random().as_bytes().len(), 16);
    /// ```
    pub fn as_bytes(&self) -> &[u8; 16] {
        self.0.as_bytes()
    }

    /// Reads an id back from 16 bytes; `None` for any other length.
    ///
    /// ```
    /// assert_eq!(fenced_resource::VersionId::from_bytes(b"short"), None);
    /// ```
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        Uuid::from_slice(bytes).ok().map(VersionId)
    }
}

impl fmt::Display for VersionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&self.0, f)
    }
}

impl fmt::Debug for VersionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "VersionId({})", self.0)
    }
}

fn version_key(object: &str, id: VersionId) -> Vec<u8> {
    let mut k = version_prefix(object);
    k.extend_from_slice(id.as_bytes());
    k
}

/// Keys never contain control characters, so `\0` ends the object's part.
fn version_prefix(object: &str) -> Vec<u8> {
    let mut k = object.as_bytes().to_vec();
    k.push(0);
    k
}

fn now_unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

impl FenceStore {
    /// Stores `content` as a new immutable version of `object` and returns
    /// its id. Needs no token: nothing can overwrite it. Durable on return.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = fenced_resource::FenceStore::open(dir.path())?;
    /// let id = store.put_version("report:2026-07", b"pdf bytes")?;
    /// assert_eq!(store.read_version("report:2026-07", id)?.as_deref(), Some(&b"pdf bytes"[..]));
    /// # Ok::<(), fenced_resource::StoreError>(())
    /// ```
    pub fn put_version(&self, object: &str, content: &[u8]) -> Result<VersionId, StoreError> {
        check_key(object)?;
        check_value("content", content)?;
        let id = VersionId::random();
        let record = encode_version(&VersionRecord {
            format: FORMAT,
            created_at_unix_ms: now_unix_ms(),
            content: content.to_vec(),
        });
        self.versions
            .compare_and_swap(version_key(object, id), None::<&[u8]>, Some(record))?
            .map_err(|_| StoreError::Storage(format!("version id {id} already exists; retry")))?;
        self.sync()?;
        info!(key = object, version_id = %id, bytes = content.len(), "version stored");
        Ok(id)
    }

    /// The content of one version, if it exists.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = fenced_resource::FenceStore::open(dir.path())?;
    /// assert_eq!(store.read_version("obj", fenced_resource::VersionId::random())?, None);
    /// # Ok::<(), fenced_resource::StoreError>(())
    /// ```
    pub fn read_version(&self, object: &str, id: VersionId) -> Result<Option<Vec<u8>>, StoreError> {
        check_key(object)?;
        self.versions
            .get(version_key(object, id))?
            .map(|bytes| decode_version(object, &bytes).map(|r| r.content))
            .transpose()
    }

    /// Points `object` at version `id`: a fenced write of the pointer, with
    /// every rule of [`FenceStore::write`]. The version must exist; checking
    /// that and writing the pointer happen under the key's lock, so cleanup
    /// cannot remove it in between.
    ///
    /// ```
    /// use fenced_core::{OwnerId, ResourceName, Token};
    /// use fenced_resource::{FenceStore, WriteOutcome};
    /// let dir = tempfile::tempdir()?;
    /// let store = FenceStore::open(dir.path())?;
    /// let resource = ResourceName::new("report:2026-07")?;
    /// let id = store.put_version(resource.as_str(), b"v2")?;
    /// let outcome = store.publish(resource.as_str(), &resource, Token::new(9)?, OwnerId::random(), id)?;
    /// assert!(matches!(outcome, WriteOutcome::Accepted { token: 9, .. }));
    /// assert_eq!(store.current_version(resource.as_str())?.map(|(v, _)| v), Some(id));
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn publish(
        &self,
        object: &str,
        resource: &ResourceName,
        token: Token,
        owner: OwnerId,
        id: VersionId,
    ) -> Result<WriteOutcome, StoreError> {
        let write = Write::new(
            object,
            resource.clone(),
            token,
            owner,
            id.as_bytes().to_vec(),
        );
        self.publish_write(&write)
    }

    /// [`FenceStore::publish`] with every option of a [`Write`]; its value
    /// must be the 16 bytes of a [`VersionId`] of `write.key`.
    ///
    /// ```
    /// use fenced_core::{OwnerId, ResourceName, Token};
    /// use fenced_resource::{FenceStore, Write};
    /// let dir = tempfile::tempdir()?;
    /// let store = FenceStore::open(dir.path())?;
    /// let r = ResourceName::new("obj")?;
    /// let w = Write::for_resource(r, Token::new(1)?, OwnerId::random(), b"not a version id".to_vec());
    /// assert!(store.publish_write(&w).is_err());
    /// # Ok::<(), Box<dyn std::error::Error>>(())
    /// ```
    pub fn publish_write(&self, write: &Write) -> Result<WriteOutcome, StoreError> {
        write.validate()?;
        let id = VersionId::from_bytes(&write.value).ok_or_else(|| {
            InvalidArgument::new("value", "must be a version id (16 bytes) for a pointer")
        })?;
        let _key_lock = self.lock_key(&write.key);
        if !self.versions.contains_key(version_key(&write.key, id))? {
            return Err(InvalidArgument::new(
                "value",
                format!(
                    "version {id} of {:?} does not exist (never stored, or removed by cleanup); store it again",
                    write.key
                ),
            )
            .into());
        }
        self.write_locked(write)
    }

    /// The version `object` points to, with its content.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = fenced_resource::FenceStore::open(dir.path())?;
    /// assert_eq!(store.current_version("report")?, None);
    /// # Ok::<(), fenced_resource::StoreError>(())
    /// ```
    pub fn current_version(
        &self,
        object: &str,
    ) -> Result<Option<(VersionId, Vec<u8>)>, StoreError> {
        check_key(object)?;
        let _key_lock = self.lock_key(object);
        let Some(pointer) = self.get_locked(object)? else {
            return Ok(None);
        };
        let id = VersionId::from_bytes(&pointer.value).ok_or_else(|| StoreError::Corrupt {
            key: object.to_string(),
            reason: "the pointer does not hold a version id".into(),
        })?;
        let content = self
            .read_version(object, id)?
            .ok_or_else(|| StoreError::Corrupt {
                key: object.to_string(),
                reason: format!("the pointer names version {id}, which is missing"),
            })?;
        Ok(Some((id, content)))
    }

    /// Removes the versions of `object` that the pointer does not name and
    /// that are older than `min_age` (so a version stored but not yet
    /// published survives a while). Returns how many were removed.
    ///
    /// A publish of a removed version is refused, never dangling: it names
    /// the missing version, and the worker stores its result again.
    ///
    /// ```
    /// use std::time::Duration;
    /// let dir = tempfile::tempdir()?;
    /// let store = fenced_resource::FenceStore::open(dir.path())?;
    /// store.put_version("obj", b"never published")?;
    /// assert_eq!(store.remove_unreferenced_versions("obj", Duration::ZERO)?, 1);
    /// # Ok::<(), fenced_resource::StoreError>(())
    /// ```
    pub fn remove_unreferenced_versions(
        &self,
        object: &str,
        min_age: Duration,
    ) -> Result<usize, StoreError> {
        check_key(object)?;
        let _key_lock = self.lock_key(object);
        let current = self
            .get_locked(object)?
            .and_then(|c| VersionId::from_bytes(&c.value));
        let min_age_ms = u64::try_from(min_age.as_millis()).unwrap_or(u64::MAX);
        let cutoff_unix_ms = now_unix_ms().saturating_sub(min_age_ms);
        let mut removed = 0;
        for entry in self.versions.scan_prefix(version_prefix(object)) {
            let (k, bytes) = entry?;
            let id = VersionId::from_bytes(&k[k.len().saturating_sub(16)..]);
            if id.is_some() && id == current {
                continue;
            }
            let record = decode_version(object, &bytes)?;
            if record.created_at_unix_ms > cutoff_unix_ms {
                continue;
            }
            self.versions.remove(k)?;
            removed += 1;
        }
        if removed > 0 {
            self.sync()?;
            info!(key = object, removed, "unreferenced versions removed");
        }
        Ok(removed)
    }
}
