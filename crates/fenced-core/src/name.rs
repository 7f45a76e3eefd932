use std::{borrow::Borrow, fmt, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::InvalidArgument;

/// The longest resource name, in bytes of UTF-8.
pub const RESOURCE_NAME_MAX_BYTES: usize = 200;

/// The name of one protected operation, e.g. `statement:account-1842:2026-07`.
///
/// UTF-8, 1 to [`RESOURCE_NAME_MAX_BYTES`] bytes, no control characters.
/// Cheap to clone: the lease table keeps it in several indexes.
///
/// ```
/// use fenced_core::ResourceName;
/// let name = ResourceName::new("statement:account-1842:2026-07")?;
/// assert_eq!(name.as_str(), "statement:account-1842:2026-07");
/// assert!(ResourceName::new("a\nb").is_err());
/// # Ok::<(), fenced_core::InvalidArgument>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ResourceName(Arc<str>);

/// Read as a string and validated as [`ResourceName::new`] does, from the
/// input in place where the format lends it: a snapshot holds a name per
/// record, and a `String` made first for each showed in loads.
impl<'de> Deserialize<'de> for ResourceName {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = ResourceName;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a resource name")
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<ResourceName, E> {
                ResourceName::new(v).map_err(E::custom)
            }
        }
        deserializer.deserialize_str(Visitor)
    }
}

/// Written as the string it holds (the bytes `String` would give), from
/// the shared text in place: a snapshot writes every name, and copying
/// each into a new `String` first showed in a profile of snapshot builds.
impl Serialize for ResourceName {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl ResourceName {
    /// Validates `name`; the error names the field `resource` and the bound.
    pub fn new(name: &str) -> Result<Self, InvalidArgument> {
        check_name("resource", name, RESOURCE_NAME_MAX_BYTES)?;
        Ok(Self(Arc::from(name)))
    }

    /// Validates raw bytes from the wire: they must also be UTF-8.
    pub fn from_bytes(bytes: &[u8]) -> Result<Self, InvalidArgument> {
        Self::new(utf8("resource", bytes)?)
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// The rule every name of the API follows: UTF-8 (checked by the type),
/// 1 to `max` bytes, no control characters. Errors name `field`.
pub(crate) fn check_name(
    field: &'static str,
    name: &str,
    max: usize,
) -> Result<(), InvalidArgument> {
    let len = name.len();
    if len == 0 || len > max {
        return Err(InvalidArgument::new(
            field,
            format!("must be 1 to {max} bytes of UTF-8, got {len}"),
        ));
    }
    // ASCII (nearly every name): its control characters are bytes below
    // 0x20 and 0x7f, and a byte's position is its character's.
    let control = if name.is_ascii() {
        name.bytes().position(|b| b < 0x20 || b == 0x7f)
    } else {
        name.chars().position(char::is_control)
    };
    if let Some(pos) = control {
        return Err(InvalidArgument::new(
            field,
            format!("must not contain control characters, found one at character {pos}"),
        ));
    }
    Ok(())
}

/// Raw bytes from the wire as UTF-8; the error names `field` and the offset.
pub(crate) fn utf8<'a>(field: &'static str, bytes: &'a [u8]) -> Result<&'a str, InvalidArgument> {
    std::str::from_utf8(bytes).map_err(|e| {
        InvalidArgument::new(
            field,
            format!("must be UTF-8, invalid byte at offset {}", e.valid_up_to()),
        )
    })
}

impl Borrow<str> for ResourceName {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for ResourceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl TryFrom<String> for ResourceName {
    type Error = InvalidArgument;
    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(&s)
    }
}

impl From<ResourceName> for String {
    fn from(n: ResourceName) -> String {
        n.0.to_string()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn the_ascii_check_refuses_what_char_calls_control() {
        for b in 0u8..128 {
            let c = char::from(b);
            let refused = ResourceName::new(&format!("ab{c}d")).is_err();
            assert_eq!(refused, c.is_control(), "byte {b:#x}");
        }
        let err = ResourceName::new("ab\u{85}d").unwrap_err();
        assert!(err.to_string().contains("at character 2"), "{err}");
        let err = ResourceName::new("ab\u{7f}").unwrap_err();
        assert!(err.to_string().contains("at character 2"), "{err}");
        // Read from a string in place, validated the same.
        let name: ResourceName = serde_json::from_str("\"jobs/a\"").unwrap();
        assert_eq!(name.as_str(), "jobs/a");
        assert!(serde_json::from_str::<ResourceName>("\"a\\u0001\"").is_err());
    }
}
