//! Fenced writes: a small key-value store kept in the replicated state
//! machine beside the lease table.
//!
//! A put (or delete) names a resource, an owner id and a token, and is
//! applied only if that owner and token are the resource's current,
//! unexpired holder at the cluster time of the log entry that carries it.
//! The decision is made in [`crate::LeaseTable::apply`], in log order with
//! the grants, so a put is linearized with them: once a newer grant is
//! committed, no put with an older token can ever be applied.

use std::{borrow::Borrow, collections::BTreeMap, fmt, sync::Arc};

use serde::{de, Deserialize, Deserializer, Serialize, Serializer};

use crate::{
    name::{check_name, utf8},
    InvalidArgument, KvDeleteOutcome, KvPutOutcome, LostReason, ResourceName, SnapshotError, Token,
};

/// The longest key, in bytes of UTF-8.
pub const KV_KEY_MAX_BYTES: usize = 512;

/// The largest value, in bytes.
pub const KV_VALUE_MAX_BYTES: usize = 64 * 1024;

/// The version of [`KvSnapshot`]'s layout. Bump it when the layout changes.
pub const KV_SNAPSHOT_FORMAT_VERSION: u32 = 1;

/// A key of the fenced store: UTF-8, 1 to [`KV_KEY_MAX_BYTES`] bytes, no
/// control characters (the rule resource names follow, with a longer bound).
///
/// ```
/// use fenced_core::KvKey;
/// assert_eq!(KvKey::new("orders/1842/state")?.as_str(), "orders/1842/state");
/// assert_eq!(KvKey::new("").unwrap_err().field(), "key");
/// # Ok::<(), fenced_core::InvalidArgument>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct KvKey(Arc<str>);

/// Written as the string it holds (the bytes `String` would give), from
/// the shared text in place: a snapshot writes every name, and copying
/// each into a new `String` first showed in a profile of snapshot builds.
impl Serialize for KvKey {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl KvKey {
    /// Validates `key`; the error names the field `key` and the bound.
    pub fn new(key: &str) -> Result<Self, InvalidArgument> {
        check_name("key", key, KV_KEY_MAX_BYTES)?;
        Ok(Self(Arc::from(key)))
    }

    /// Validates raw bytes from the wire: they must also be UTF-8.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, InvalidArgument> {
        Self::new(utf8("key", bytes)?)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for KvKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for KvKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for KvKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl TryFrom<String> for KvKey {
    type Error = InvalidArgument;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(&s)
    }
}

impl From<KvKey> for String {
    fn from(k: KvKey) -> String {
        k.0.to_string()
    }
}

/// A value of the fenced store: 0 to [`KV_VALUE_MAX_BYTES`] bytes. Checked
/// when built and again when decoded from a log entry or a snapshot.
///
/// ```
/// use fenced_core::{KvValue, KV_VALUE_MAX_BYTES};
/// assert_eq!(KvValue::new(b"paid".to_vec())?.as_bytes(), b"paid");
/// let err = KvValue::new(vec![0; KV_VALUE_MAX_BYTES + 1]).unwrap_err();
/// assert_eq!(err.to_string(), "value: must be at most 65536 bytes, got 65537");
/// # Ok::<(), fenced_core::InvalidArgument>(())
/// ```
#[derive(Clone, PartialEq, Eq)]
pub struct KvValue(Arc<[u8]>);

impl KvValue {
    pub fn new(bytes: impl Into<Arc<[u8]>>) -> Result<Self, InvalidArgument> {
        let bytes = bytes.into();
        if bytes.len() > KV_VALUE_MAX_BYTES {
            return Err(InvalidArgument::new(
                "value",
                format!(
                    "must be at most {KV_VALUE_MAX_BYTES} bytes, got {}",
                    bytes.len()
                ),
            ));
        }
        Ok(Self(bytes))
    }

    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Debug for KvValue {
    // Values may be anything (and large): their length only.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "KvValue({} bytes)", self.0.len())
    }
}

// As one byte string, not a sequence of numbers: a 64 KiB value is one copy
// in the log codec, not 65,536 calls.
impl Serialize for KvValue {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_bytes(&self.0)
    }
}

impl<'de> Deserialize<'de> for KvValue {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Bytes;
        impl<'de> de::Visitor<'de> for Bytes {
            type Value = Vec<u8>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, "at most {KV_VALUE_MAX_BYTES} bytes")
            }
            fn visit_bytes<E: de::Error>(self, v: &[u8]) -> Result<Vec<u8>, E> {
                Ok(v.to_vec())
            }
            fn visit_byte_buf<E: de::Error>(self, v: Vec<u8>) -> Result<Vec<u8>, E> {
                Ok(v)
            }
            fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u8>, A::Error> {
                let mut out = Vec::new();
                while let Some(b) = seq.next_element()? {
                    if out.len() == KV_VALUE_MAX_BYTES {
                        return Err(de::Error::invalid_length(out.len() + 1, &self));
                    }
                    out.push(b);
                }
                Ok(out)
            }
        }
        let bytes = deserializer.deserialize_byte_buf(Bytes)?;
        KvValue::new(bytes).map_err(de::Error::custom)
    }
}

/// How much the whole store may hold. Carried by every put
/// ([`crate::Command::KvPut`]) from the leader's settings, so a refusal is
/// decided from the log alone and every replica decides the same.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvBounds {
    pub max_keys: u64,
    /// Bytes of keys plus values, over all keys.
    pub max_total_bytes: u64,
}

/// Which [`KvBounds`] bound refused a put.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvBound {
    Keys,
    TotalBytes,
}

impl KvBound {
    /// The setting's name, as spelled in the server's configuration.
    pub fn setting(self) -> &'static str {
        match self {
            KvBound::Keys => "kv_max_keys",
            KvBound::TotalBytes => "kv_max_total_bytes",
        }
    }
}

/// Why the fencing rule refused a put or delete. Final for that token:
/// retrying it with the same token cannot succeed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvRefusal {
    /// The owner id and token are not the resource's current, unexpired
    /// holder.
    Lease(LostReason),
    /// The key was last written with a higher token (under another
    /// resource): a key's tokens never go backwards.
    KeyHasNewerToken { key_token: Token },
}

impl KvRefusal {
    /// The reason as one word: `expired`, `released`, `superseded`,
    /// `unknown`, `key_has_newer_token`.
    pub fn as_str(&self) -> &'static str {
        match self {
            KvRefusal::Lease(reason) => reason.as_str(),
            KvRefusal::KeyHasNewerToken { .. } => "key_has_newer_token",
        }
    }
}

/// One key's value and the write that put it there.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvEntry {
    pub value: KvValue,
    /// The resource whose lease the write was fenced by.
    pub resource: ResourceName,
    /// The token the write carried.
    pub token: Token,
    /// The store's revision when the write was applied.
    pub revision: u64,
}

/// The fenced key-value store. Pure and deterministic like the lease table
/// that owns it; only [`crate::LeaseTable::apply`] changes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvStore {
    entries: BTreeMap<KvKey, KvEntry>,
    /// Bytes of keys plus values, over all keys.
    total_bytes: u64,
    /// Counts applied puts and deletes; never goes backwards.
    revision: u64,
}

fn entry_bytes(key: &KvKey, value: &KvValue) -> u64 {
    as_u64(key.as_str().len() + value.len())
}

fn as_u64(n: usize) -> u64 {
    u64::try_from(n).unwrap_or(u64::MAX)
}

impl KvStore {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn get(&self, key: &str) -> Option<&KvEntry> {
        self.entries.get(key)
    }

    /// How many keys the store holds.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of keys plus values, over all keys (what
    /// [`KvBounds::max_total_bytes`] bounds).
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// The revision of the latest applied put or delete (0 before any).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    /// The fencing rule: `holder` says whether the write's owner and token
    /// hold the resource now (from [`crate::LeaseTable`]); the key's last
    /// token must not be newer than the write's.
    fn fence(
        &self,
        holder: Result<(), LostReason>,
        key: &KvKey,
        token: Token,
    ) -> Result<(), KvRefusal> {
        holder.map_err(KvRefusal::Lease)?;
        match self.entries.get(key) {
            Some(e) if e.token > token => Err(KvRefusal::KeyHasNewerToken { key_token: e.token }),
            _ => Ok(()),
        }
    }

    pub(crate) fn put(
        &mut self,
        holder: Result<(), LostReason>,
        key: &KvKey,
        value: &KvValue,
        resource: &ResourceName,
        token: Token,
        bounds: KvBounds,
    ) -> KvPutOutcome {
        if let Err(refusal) = self.fence(holder, key, token) {
            return KvPutOutcome::Refused(refusal);
        }
        let previous = self.entries.get(key).map(|e| entry_bytes(key, &e.value));
        if previous.is_none() && as_u64(self.entries.len()) >= bounds.max_keys {
            return KvPutOutcome::BoundReached {
                bound: KvBound::Keys,
                limit: bounds.max_keys,
            };
        }
        let total = (self.total_bytes - previous.unwrap_or(0)) + entry_bytes(key, value);
        if total > bounds.max_total_bytes {
            return KvPutOutcome::BoundReached {
                bound: KvBound::TotalBytes,
                limit: bounds.max_total_bytes,
            };
        }
        self.revision += 1;
        self.total_bytes = total;
        self.entries.insert(
            key.clone(),
            KvEntry {
                value: value.clone(),
                resource: resource.clone(),
                token,
                revision: self.revision,
            },
        );
        KvPutOutcome::Applied {
            revision: self.revision,
            existed: previous.is_some(),
        }
    }

    /// Removes `key` under the same rule as a put. Deleting a missing key
    /// is applied and changes nothing (the revision stays).
    pub(crate) fn delete(
        &mut self,
        holder: Result<(), LostReason>,
        key: &KvKey,
        token: Token,
    ) -> KvDeleteOutcome {
        if let Err(refusal) = self.fence(holder, key, token) {
            return KvDeleteOutcome::Refused(refusal);
        }
        let Some(old) = self.entries.remove(key) else {
            return KvDeleteOutcome::Applied {
                revision: self.revision,
                existed: false,
            };
        };
        self.total_bytes -= entry_bytes(key, &old.value);
        self.revision += 1;
        KvDeleteOutcome::Applied {
            revision: self.revision,
            existed: true,
        }
    }

    /// Checks that the byte count matches the entries and no entry is newer
    /// than the store's revision.
    pub fn check_invariants(&self) -> Result<(), String> {
        let mut total = 0u64;
        for (key, e) in &self.entries {
            total += entry_bytes(key, &e.value);
            if e.revision > self.revision || e.revision == 0 {
                return Err(format!(
                    "key {key}: revision {} outside 1..={}",
                    e.revision, self.revision
                ));
            }
        }
        if total != self.total_bytes {
            return Err(format!(
                "kv byte count {} does not match the entries ({total})",
                self.total_bytes
            ));
        }
        Ok(())
    }

    /// The whole store in its persisted form.
    pub fn snapshot(&self) -> KvSnapshot {
        KvSnapshot {
            format_version: KV_SNAPSHOT_FORMAT_VERSION,
            revision: self.revision,
            entries: self
                .entries
                .iter()
                .map(|(k, e)| (k.clone(), e.clone()))
                .collect(),
        }
    }

    /// Rebuilds a store from a snapshot, refusing an unknown format or
    /// contents that break an invariant.
    pub fn from_snapshot(snapshot: KvSnapshot) -> Result<Self, SnapshotError> {
        if snapshot.format_version != KV_SNAPSHOT_FORMAT_VERSION {
            return Err(SnapshotError::Version {
                found: snapshot.format_version,
                supported: KV_SNAPSHOT_FORMAT_VERSION,
            });
        }
        let mut store = KvStore {
            revision: snapshot.revision,
            ..KvStore::new()
        };
        for (key, entry) in snapshot.entries {
            store.total_bytes += entry_bytes(&key, &entry.value);
            if store.entries.insert(key.clone(), entry).is_some() {
                return Err(SnapshotError::Invariant(format!("key {key} appears twice")));
            }
        }
        store.check_invariants().map_err(SnapshotError::Invariant)?;
        Ok(store)
    }
}

/// The whole store in a form that serializes, tagged with its format
/// version ([`KV_SNAPSHOT_FORMAT_VERSION`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvSnapshot {
    format_version: u32,
    revision: u64,
    entries: Vec<(KvKey, KvEntry)>,
}

impl Default for KvSnapshot {
    /// An empty store: what a snapshot written before the store existed holds.
    fn default() -> Self {
        KvStore::new().snapshot()
    }
}

impl KvSnapshot {
    pub fn format_version(&self) -> u32 {
        self.format_version
    }
}
