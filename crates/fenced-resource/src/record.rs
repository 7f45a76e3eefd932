//! The persisted form of a key's state: a protobuf message (prost) with a
//! format version, checked field by field when read back.

use std::collections::VecDeque;

use fenced_core::{OwnerId, ResourceName, Token};
use prost::Message;

use crate::{
    decide::{KeyState, Remembered},
    Mode, StoreError,
};

/// The format of records written by this version.
pub(crate) const FORMAT: u32 = 1;

#[derive(Clone, PartialEq, prost::Message)]
struct KeyRecord {
    #[prost(uint32, tag = "1")]
    format: u32,
    #[prost(string, tag = "2")]
    resource: String,
    #[prost(int32, tag = "3")]
    mode: i32,
    #[prost(uint64, tag = "4")]
    token: u64,
    #[prost(bytes = "vec", tag = "5")]
    owner_id: Vec<u8>,
    #[prost(uint64, tag = "6")]
    version: u64,
    #[prost(uint64, optional, tag = "7")]
    sequence: Option<u64>,
    #[prost(bytes = "vec", tag = "8")]
    value: Vec<u8>,
    #[prost(message, repeated, tag = "9")]
    remembered: Vec<RememberedRecord>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct RememberedRecord {
    #[prost(string, tag = "1")]
    idempotency_key: String,
    #[prost(fixed64, tag = "2")]
    fingerprint: u64,
    #[prost(uint64, tag = "3")]
    token: u64,
    #[prost(uint64, tag = "4")]
    version: u64,
}

/// An immutable version of a versioned object.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct VersionRecord {
    #[prost(uint32, tag = "1")]
    pub format: u32,
    /// Wall-clock milliseconds since the epoch when written; used only to
    /// spare recent unpublished versions from cleanup.
    #[prost(uint64, tag = "2")]
    pub created_at_unix_ms: u64,
    #[prost(bytes = "vec", tag = "3")]
    pub content: Vec<u8>,
}

pub(crate) fn encode_key(state: &KeyState) -> Vec<u8> {
    KeyRecord {
        format: FORMAT,
        resource: state.resource.as_str().to_string(),
        mode: state.mode.code(),
        token: state.token.get(),
        owner_id: state.owner.as_bytes().to_vec(),
        version: state.version,
        sequence: state.sequence,
        value: state.value.clone(),
        remembered: state
            .remembered
            .iter()
            .map(|r| RememberedRecord {
                idempotency_key: r.idempotency_key.clone(),
                fingerprint: r.fingerprint,
                token: r.token,
                version: r.version,
            })
            .collect(),
    }
    .encode_to_vec()
}

pub(crate) fn decode_key(key: &str, bytes: &[u8]) -> Result<KeyState, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        key: key.to_string(),
        reason,
    };
    let r = KeyRecord::decode(bytes).map_err(|e| corrupt(format!("not a key record: {e}")))?;
    if r.format != FORMAT {
        return Err(corrupt(format!(
            "format {} is not {FORMAT}, the one this build reads",
            r.format
        )));
    }
    let state = KeyState {
        resource: ResourceName::new(&r.resource).map_err(|e| corrupt(e.to_string()))?,
        mode: Mode::from_code(r.mode).ok_or_else(|| corrupt(format!("unknown mode {}", r.mode)))?,
        token: Token::new(r.token).map_err(|e| corrupt(e.to_string()))?,
        owner: OwnerId::from_bytes(&r.owner_id).map_err(|e| corrupt(e.to_string()))?,
        version: r.version,
        sequence: r.sequence,
        value: r.value,
        remembered: r
            .remembered
            .into_iter()
            .map(|m| Remembered {
                idempotency_key: m.idempotency_key,
                fingerprint: m.fingerprint,
                token: m.token,
                version: m.version,
            })
            .collect::<VecDeque<_>>(),
    };
    if state.version == 0 {
        return Err(corrupt("version 0 for an existing key".into()));
    }
    Ok(state)
}

pub(crate) fn encode_version(record: &VersionRecord) -> Vec<u8> {
    record.encode_to_vec()
}

pub(crate) fn decode_version(key: &str, bytes: &[u8]) -> Result<VersionRecord, StoreError> {
    let r = VersionRecord::decode(bytes).map_err(|e| StoreError::Corrupt {
        key: key.to_string(),
        reason: format!("not a version record: {e}"),
    })?;
    if r.format != FORMAT {
        return Err(StoreError::Corrupt {
            key: key.to_string(),
            reason: format!("version record format {} is not {FORMAT}", r.format),
        });
    }
    Ok(r)
}
