//! Fenced writes: a small key-value store kept in the replicated state
//! machine beside the lease table.
//!
//! A put (or delete) names a resource, an owner id and a token, and is
//! applied only if that owner and token are the resource's current,
//! unexpired holder at the cluster time of the log entry that carries it.
//! The decision is made in [`crate::LeaseTable::apply`], in log order with
//! the grants, so a put is linearized with them: once a newer grant is
//! committed, no put with an older token can ever be applied.
//!
//! A key belongs to the resource whose lease first wrote it, for good: only
//! that resource's current holder writes or deletes it. A delete leaves a
//! tombstone with the key's resource and token, so neither is forgotten and
//! a key's token never goes back.

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
/// 1: the revision and the entries; 2: and the tombstones after them.
pub const KV_SNAPSHOT_FORMAT_VERSION: u32 = 2;

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
    /// The store's revision counter would pass `u64::MAX`.
    Revisions,
}

impl KvBound {
    /// The setting's name, as spelled in the server's configuration.
    pub fn setting(self) -> &'static str {
        match self {
            KvBound::Keys => "kv_max_keys",
            KvBound::TotalBytes => "kv_max_total_bytes",
            KvBound::Revisions => "kv revision",
        }
    }
}

/// Why the fencing rule refused a put or delete. Final for that token:
/// retrying it with the same token cannot succeed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KvRefusal {
    /// The owner id and token are not the resource's current, unexpired
    /// holder.
    Lease(LostReason),
    /// The key was last written (or deleted) with a higher token: a key's
    /// tokens never go backwards.
    KeyHasNewerToken { key_token: Token },
    /// The key belongs to another resource (the one whose lease first wrote
    /// it); only that resource's holder writes it.
    KeyOfAnotherResource { key_resource: ResourceName },
}

impl KvRefusal {
    /// The reason as one word: `expired`, `released`, `superseded`,
    /// `unknown`, `key_has_newer_token`.
    pub fn as_str(&self) -> &'static str {
        match self {
            KvRefusal::Lease(reason) => reason.as_str(),
            KvRefusal::KeyHasNewerToken { .. } => "key_has_newer_token",
            KvRefusal::KeyOfAnotherResource { .. } => "key_of_another_resource",
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

/// What a delete leaves of a key: whose it is and the token it was deleted
/// with, so that neither goes back. Reads as no value.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvTombstone {
    pub resource: ResourceName,
    /// The token the delete carried.
    pub token: Token,
    /// The store's revision when the delete was applied.
    pub revision: u64,
}

/// The fenced key-value store. Pure and deterministic like the lease table
/// that owns it; only [`crate::LeaseTable::apply`] changes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KvStore {
    entries: BTreeMap<KvKey, KvEntry>,
    /// Deleted keys; never in `entries` at the same time. They count
    /// toward the bounds: a key and its bytes each.
    tombstones: BTreeMap<KvKey, KvTombstone>,
    /// Bytes of keys plus values, over all keys, and of tombstoned keys.
    total_bytes: u64,
    /// Counts applied puts and deletes; never goes backwards.
    revision: u64,
}

fn entry_bytes(key: &KvKey, value: &KvValue) -> u64 {
    as_u64(key.as_str().len()).saturating_add(as_u64(value.len()))
}

fn tombstone_bytes(key: &KvKey) -> u64 {
    as_u64(key.as_str().len())
}

/// Whose a key is and its latest token, live or deleted.
struct KeyMark<'a> {
    resource: &'a ResourceName,
    token: Token,
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

    /// How many keys the store holds a value for.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// A deleted key's tombstone.
    pub fn tombstone(&self, key: &str) -> Option<&KvTombstone> {
        self.tombstones.get(key)
    }

    /// How many deleted keys the store remembers.
    pub fn tombstones(&self) -> usize {
        self.tombstones.len()
    }

    /// Keys with a value plus tombstones: what [`KvBounds::max_keys`] bounds.
    pub fn key_count(&self) -> u64 {
        as_u64(self.entries.len()).saturating_add(as_u64(self.tombstones.len()))
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Bytes of keys plus values, over all keys, and of tombstoned keys
    /// (what [`KvBounds::max_total_bytes`] bounds).
    pub fn total_bytes(&self) -> u64 {
        self.total_bytes
    }

    /// The revision of the latest applied put or delete (0 before any).
    pub fn revision(&self) -> u64 {
        self.revision
    }

    fn mark(&self, key: &str) -> Option<KeyMark<'_>> {
        if let Some(e) = self.entries.get(key) {
            return Some(KeyMark {
                resource: &e.resource,
                token: e.token,
            });
        }
        self.tombstones.get(key).map(|t| KeyMark {
            resource: &t.resource,
            token: t.token,
        })
    }

    /// The fencing rule, in this order: the key must be the write's
    /// resource's (or no one's yet), its last token must not be newer than
    /// the write's, and `holder` (from [`crate::LeaseTable`]) must say the
    /// write's owner and token hold the resource now. The key's own checks
    /// come first so that a refusal names what the key has.
    fn fence(
        &self,
        holder: Result<(), LostReason>,
        key: &KvKey,
        resource: &ResourceName,
        token: Token,
    ) -> Result<(), KvRefusal> {
        if let Some(mark) = self.mark(key.as_str()) {
            if mark.resource != resource {
                return Err(KvRefusal::KeyOfAnotherResource {
                    key_resource: mark.resource.clone(),
                });
            }
            if mark.token > token {
                return Err(KvRefusal::KeyHasNewerToken {
                    key_token: mark.token,
                });
            }
        }
        holder.map_err(KvRefusal::Lease)
    }

    /// The revision after this one; `None` at the end of the counter.
    fn next_revision(&self) -> Option<u64> {
        self.revision.checked_add(1)
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
        if let Err(refusal) = self.fence(holder, key, resource, token) {
            return KvPutOutcome::Refused(refusal);
        }
        let live = self.entries.get(key).map(|e| entry_bytes(key, &e.value));
        let previous = live.or_else(|| self.tombstones.get(key).map(|_| tombstone_bytes(key)));
        if previous.is_none() && self.key_count() >= bounds.max_keys {
            return KvPutOutcome::BoundReached {
                bound: KvBound::Keys,
                limit: bounds.max_keys,
            };
        }
        // The count covers `previous`, so the subtraction cannot go below 0.
        let total = self
            .total_bytes
            .saturating_sub(previous.unwrap_or(0))
            .checked_add(entry_bytes(key, value))
            .filter(|&t| t <= bounds.max_total_bytes);
        let Some(total) = total else {
            return KvPutOutcome::BoundReached {
                bound: KvBound::TotalBytes,
                limit: bounds.max_total_bytes,
            };
        };
        let Some(revision) = self.next_revision() else {
            return KvPutOutcome::BoundReached {
                bound: KvBound::Revisions,
                limit: u64::MAX,
            };
        };
        self.revision = revision;
        self.total_bytes = total;
        self.tombstones.remove(key);
        self.entries.insert(
            key.clone(),
            KvEntry {
                value: value.clone(),
                resource: resource.clone(),
                token,
                revision,
            },
        );
        KvPutOutcome::Applied {
            revision,
            existed: live.is_some(),
        }
    }

    /// Removes `key`'s value under the same rule as a put, leaving a
    /// tombstone with the delete's token. Deleting a key without a value
    /// is applied and changes nothing (the revision stays).
    pub(crate) fn delete(
        &mut self,
        holder: Result<(), LostReason>,
        key: &KvKey,
        resource: &ResourceName,
        token: Token,
    ) -> KvDeleteOutcome {
        if let Err(refusal) = self.fence(holder, key, resource, token) {
            return KvDeleteOutcome::Refused(refusal);
        }
        if !self.entries.contains_key(key) {
            return KvDeleteOutcome::Applied {
                revision: self.revision,
                existed: false,
            };
        }
        let Some(revision) = self.next_revision() else {
            return KvDeleteOutcome::BoundReached {
                bound: KvBound::Revisions,
                limit: u64::MAX,
            };
        };
        let Some(old) = self.entries.remove(key) else {
            return KvDeleteOutcome::Applied {
                revision: self.revision,
                existed: false,
            };
        };
        // A tombstone keeps the key's bytes, not the value's.
        self.total_bytes = self
            .total_bytes
            .saturating_sub(entry_bytes(key, &old.value))
            .saturating_add(tombstone_bytes(key));
        self.revision = revision;
        self.tombstones.insert(
            key.clone(),
            KvTombstone {
                resource: old.resource,
                token,
                revision,
            },
        );
        KvDeleteOutcome::Applied {
            revision,
            existed: true,
        }
    }

    /// Checks that the byte count matches the entries and tombstones, no
    /// key is both, and none is newer than the store's revision.
    pub fn check_invariants(&self) -> Result<(), String> {
        let in_range = |key: &KvKey, revision: u64| {
            if revision > self.revision || revision == 0 {
                return Err(format!(
                    "key {key}: revision {revision} outside 1..={}",
                    self.revision
                ));
            }
            Ok(())
        };
        let mut total = 0u64;
        for (key, e) in &self.entries {
            total = total.saturating_add(entry_bytes(key, &e.value));
            in_range(key, e.revision)?;
        }
        for (key, t) in &self.tombstones {
            total = total.saturating_add(tombstone_bytes(key));
            in_range(key, t.revision)?;
            if self.entries.contains_key(key) {
                return Err(format!("key {key} has a value and a tombstone"));
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

    /// The whole store in its persisted form: format 1 while there is no
    /// tombstone (what a node of the release before tombstones reads, so a
    /// mixed cluster keeps exchanging snapshots until the first delete),
    /// format 2 with them.
    pub fn snapshot(&self) -> KvSnapshot {
        let format_version = if self.tombstones.is_empty() { 1 } else { 2 };
        KvSnapshot {
            format_version,
            revision: self.revision,
            entries: self
                .entries
                .iter()
                .map(|(k, e)| (k.clone(), e.clone()))
                .collect(),
            tombstones: self
                .tombstones
                .iter()
                .map(|(k, t)| (k.clone(), t.clone()))
                .collect(),
        }
    }

    /// Rebuilds a store from a snapshot, refusing an unknown format or
    /// contents that break an invariant.
    pub fn from_snapshot(snapshot: KvSnapshot) -> Result<Self, SnapshotError> {
        if snapshot.format_version == 0 || snapshot.format_version > KV_SNAPSHOT_FORMAT_VERSION {
            return Err(SnapshotError::Version {
                found: snapshot.format_version,
                supported: KV_SNAPSHOT_FORMAT_VERSION,
            });
        }
        if snapshot.format_version < 2 && !snapshot.tombstones.is_empty() {
            return Err(SnapshotError::Invariant(
                "a format 1 kv snapshot has tombstones".into(),
            ));
        }
        let mut store = KvStore {
            revision: snapshot.revision,
            ..KvStore::new()
        };
        for (key, entry) in snapshot.entries {
            store.total_bytes = store
                .total_bytes
                .saturating_add(entry_bytes(&key, &entry.value));
            if store.entries.insert(key.clone(), entry).is_some() {
                return Err(SnapshotError::Invariant(format!("key {key} appears twice")));
            }
        }
        for (key, tombstone) in snapshot.tombstones {
            store.total_bytes = store.total_bytes.saturating_add(tombstone_bytes(&key));
            if store.tombstones.insert(key.clone(), tombstone).is_some() {
                return Err(SnapshotError::Invariant(format!(
                    "tombstone of key {key} appears twice"
                )));
            }
        }
        store.check_invariants().map_err(SnapshotError::Invariant)?;
        Ok(store)
    }
}

/// The whole store in a form that serializes, tagged with its format
/// version ([`KV_SNAPSHOT_FORMAT_VERSION`]). Format 1 ends after the
/// entries; its reader stops there (bincode reads fields in order), so a
/// format 1 body still loads, with no tombstones.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvSnapshot {
    format_version: u32,
    revision: u64,
    entries: Vec<(KvKey, KvEntry)>,
    tombstones: Vec<(KvKey, KvTombstone)>,
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

const SNAPSHOT_FIELDS: &[&str] = &["format_version", "revision", "entries", "tombstones"];

impl Serialize for KvSnapshot {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct;
        let with_tombstones = self.format_version >= 2;
        let fields = if with_tombstones { 4 } else { 3 };
        let mut s = serializer.serialize_struct("KvSnapshot", fields)?;
        s.serialize_field("format_version", &self.format_version)?;
        s.serialize_field("revision", &self.revision)?;
        s.serialize_field("entries", &self.entries)?;
        if with_tombstones {
            s.serialize_field("tombstones", &self.tombstones)?;
        }
        s.end()
    }
}

impl<'de> Deserialize<'de> for KvSnapshot {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_struct("KvSnapshot", SNAPSHOT_FIELDS, SnapshotVisitor)
    }
}

struct SnapshotVisitor;

/// Self-describing formats name the fields; format 1 lacks `tombstones`.
#[derive(Deserialize)]
struct NamedSnapshot {
    format_version: u32,
    revision: u64,
    entries: Vec<(KvKey, KvEntry)>,
    #[serde(default)]
    tombstones: Vec<(KvKey, KvTombstone)>,
}

impl<'de> de::Visitor<'de> for SnapshotVisitor {
    type Value = KvSnapshot;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a kv store snapshot")
    }

    fn visit_seq<A: de::SeqAccess<'de>>(self, mut seq: A) -> Result<KvSnapshot, A::Error> {
        let missing = |i| de::Error::invalid_length(i, &"the fields of its format version");
        let format_version: u32 = seq.next_element()?.ok_or_else(|| missing(0))?;
        let revision = seq.next_element()?.ok_or_else(|| missing(1))?;
        let entries = seq.next_element()?.ok_or_else(|| missing(2))?;
        let tombstones = if format_version >= 2 {
            seq.next_element()?.ok_or_else(|| missing(3))?
        } else {
            Vec::new()
        };
        Ok(KvSnapshot {
            format_version,
            revision,
            entries,
            tombstones,
        })
    }

    fn visit_map<A: de::MapAccess<'de>>(self, map: A) -> Result<KvSnapshot, A::Error> {
        let n = NamedSnapshot::deserialize(de::value::MapAccessDeserializer::new(map))?;
        Ok(KvSnapshot {
            format_version: n.format_version,
            revision: n.revision,
            entries: n.entries,
            tombstones: n.tombstones,
        })
    }
}
