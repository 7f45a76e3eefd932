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
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Deserialize)]
#[serde(try_from = "String")]
pub struct ResourceName(Arc<str>);

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
    if let Some(pos) = name.chars().position(char::is_control) {
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
