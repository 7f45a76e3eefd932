//! The one place that turns persisted and transported values into bytes.
//!
//! Every encoding starts with a format version byte, so a newer build can tell
//! an old file or message from its own and an unknown one is refused, not
//! misread. The body is bincode 2 (pinned: its 3.0 release is an empty
//! tombstone) through serde, with a fixed, explicit configuration.

use serde::{de::DeserializeOwned, Deserialize, Serialize};

/// The current format of everything this module writes.
pub const FORMAT_VERSION: u8 = 1;

/// Bytes that cannot be decoded.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    #[error("empty input: no format version byte")]
    Empty,
    #[error("format version {found} is not supported (this build reads {supported})")]
    Version { found: u8, supported: u8 },
    #[error("malformed {what}: {source}")]
    Decode {
        what: &'static str,
        source: bincode::error::DecodeError,
    },
    #[error("cannot encode {what}: {source}")]
    Encode {
        what: &'static str,
        source: bincode::error::EncodeError,
    },
    #[error("malformed {what}: {trailing} trailing bytes")]
    Trailing { what: &'static str, trailing: usize },
}

fn config() -> impl bincode::config::Config {
    bincode::config::standard()
        .with_little_endian()
        .with_variable_int_encoding()
        .with_limit::<{ 1 << 30 }>()
}

/// Encodes `value` behind the format version byte.
pub fn encode<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, CodecError> {
    let mut out = vec![FORMAT_VERSION];
    bincode::serde::encode_into_std_write(value, &mut out, config())
        .map_err(|source| CodecError::Encode { what, source })?;
    Ok(out)
}

/// Encodes `value` into `out` without the version byte (a part of a larger
/// encoding that has one): the bytes [`encode`] puts after it.
pub fn encode_part<T: Serialize, W: std::io::Write>(
    what: &'static str,
    value: &T,
    out: &mut W,
) -> Result<usize, CodecError> {
    bincode::serde::encode_into_std_write(value, out, config())
        .map_err(|source| CodecError::Encode { what, source })
}

/// How many bytes [`encode_part`] writes for `value` (an encoding pass into
/// nothing: what a streamed length prefix needs).
pub fn encoded_part_len<T: Serialize>(what: &'static str, value: &T) -> Result<usize, CodecError> {
    encode_part(what, value, &mut std::io::sink())
}

/// Decodes what [`encode`] wrote; refuses other versions and trailing bytes.
pub fn decode<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    decode_with(what, bytes, |body| {
        bincode::serde::decode_from_slice(body, config())
    })
}

/// [`decode`] into a value that borrows from `bytes` (a large byte field
/// read in place, not copied).
pub fn decode_borrowed<'a, T: Deserialize<'a>>(
    what: &'static str,
    bytes: &'a [u8],
) -> Result<T, CodecError> {
    decode_with(what, bytes, |body| {
        bincode::serde::borrow_decode_from_slice(body, config())
    })
}

/// [`decode_borrowed`] through `seed`: a value built as it is decoded.
pub fn decode_seed<'a, S: serde::de::DeserializeSeed<'a>>(
    what: &'static str,
    bytes: &'a [u8],
    seed: S,
) -> Result<S::Value, CodecError> {
    decode_with(what, bytes, |body| {
        bincode::serde::seed_decode_from_slice(seed, body, config())
    })
}

/// The frame the decoders check: the version byte in front, no bytes
/// left over behind what `decode_body` read.
fn decode_with<'a, T>(
    what: &'static str,
    bytes: &'a [u8],
    decode_body: impl FnOnce(&'a [u8]) -> Result<(T, usize), bincode::error::DecodeError>,
) -> Result<T, CodecError> {
    let (&version, body) = bytes.split_first().ok_or(CodecError::Empty)?;
    if version != FORMAT_VERSION {
        return Err(CodecError::Version {
            found: version,
            supported: FORMAT_VERSION,
        });
    }
    let (value, read) = decode_body(body).map_err(|source| CodecError::Decode { what, source })?;
    if read != body.len() {
        return Err(CodecError::Trailing {
            what,
            trailing: body.len() - read,
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use fenced_core::{Batch, ClusterTime, Command, OwnerId, ResourceName};

    fn batch() -> Batch {
        Batch {
            stamp: ClusterTime::from_millis(7),
            commands: vec![Command::Acquire {
                resource: ResourceName::new("r").unwrap(),
                owner_id: OwnerId::random(),
                ttl_ms: 1_000,
                wait_ms: 0,
            }],
        }
    }

    #[test]
    fn a_batch_round_trips() {
        let b = batch();
        let bytes = encode("batch", &b).unwrap();
        assert_eq!(decode::<Batch>("batch", &bytes).unwrap(), b);
    }

    #[test]
    fn another_version_is_refused() {
        let mut bytes = encode("batch", &batch()).unwrap();
        bytes[0] = 9;
        assert!(matches!(
            decode::<Batch>("batch", &bytes),
            Err(CodecError::Version { found: 9, .. })
        ));
    }

    #[test]
    fn garbage_is_an_error_not_a_panic() {
        for junk in [
            &b""[..],
            &[1],
            &[1, 0xff, 0xff, 0xff],
            &[1, 3, 0, 0, 0, 0, 0, 0],
        ] {
            assert!(decode::<Batch>("batch", junk).is_err());
        }
        let mut bytes = encode("batch", &batch()).unwrap();
        bytes.push(0);
        assert!(matches!(
            decode::<Batch>("batch", &bytes),
            Err(CodecError::Trailing { .. })
        ));
    }

    #[test]
    fn names_are_written_as_the_strings_they_hold() {
        // Snapshots and log entries on disk hold names and keys as
        // strings: writing them in place must give the same bytes.
        for text in [
            "r",
            "statement:account-1842:2026-07",
            "é/ü",
            &"x".repeat(200),
        ] {
            let as_string = encode("name", &text.to_string()).unwrap();
            let name = ResourceName::new(text).unwrap();
            assert_eq!(encode("name", &name).unwrap(), as_string);
            assert_eq!(decode::<ResourceName>("name", &as_string).unwrap(), name);
            let key = fenced_core::KvKey::new(text).unwrap();
            assert_eq!(encode("key", &key).unwrap(), as_string);
            assert_eq!(
                decode::<fenced_core::KvKey>("key", &as_string).unwrap(),
                key
            );
        }
    }

    #[test]
    fn an_invalid_resource_name_on_disk_is_refused() {
        // A name is validated when it is decoded, not trusted.
        let bytes = encode("name", &"bad\nname".to_string()).unwrap();
        assert!(decode::<ResourceName>("name", &bytes).is_err());
    }
}
