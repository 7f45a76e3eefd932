//! Bounds on every field a writer controls. A field outside its bound is an
//! [`InvalidArgument`] naming the field and the bound; nothing is written.

use fenced_core::InvalidArgument;

/// The longest key, in bytes of UTF-8.
///
/// ```
/// assert_eq!(fenced_resource::KEY_MAX_BYTES, 256);
/// ```
pub const KEY_MAX_BYTES: usize = 256;

/// The largest guarded value (and the largest immutable version), in bytes.
///
/// ```
/// assert_eq!(fenced_resource::VALUE_MAX_BYTES, 1024 * 1024);
/// ```
pub const VALUE_MAX_BYTES: usize = 1024 * 1024;

/// The longest idempotency key, in bytes of UTF-8.
///
/// ```
/// assert_eq!(fenced_resource::IDEMPOTENCY_KEY_MAX_BYTES, 128);
/// ```
pub const IDEMPOTENCY_KEY_MAX_BYTES: usize = 128;

/// The longest operation id, in bytes of UTF-8.
///
/// ```
/// assert_eq!(fenced_resource::OPERATION_ID_MAX_BYTES, 128);
/// ```
pub const OPERATION_ID_MAX_BYTES: usize = 128;

/// How many idempotency keys a key remembers (the most recent accepted
/// writes). A retry older than that is decided afresh against the fence.
///
/// ```
/// assert_eq!(fenced_resource::IDEMPOTENCY_RECORDS_PER_KEY, 128);
/// ```
pub const IDEMPOTENCY_RECORDS_PER_KEY: usize = 128;

/// Checks a text field: 1 to `max` bytes of UTF-8, no control characters.
pub(crate) fn check_text(
    field: &'static str,
    text: &str,
    max: usize,
) -> Result<(), InvalidArgument> {
    let len = text.len();
    if len == 0 || len > max {
        return Err(InvalidArgument::new(
            field,
            format!("must be 1 to {max} bytes of UTF-8, got {len}"),
        ));
    }
    if let Some(pos) = text.chars().position(char::is_control) {
        return Err(InvalidArgument::new(
            field,
            format!("must not contain control characters, found one at character {pos}"),
        ));
    }
    Ok(())
}

/// Checks a key (`key`).
pub(crate) fn check_key(key: &str) -> Result<(), InvalidArgument> {
    check_text("key", key, KEY_MAX_BYTES)
}

/// Checks a value's size (`value`).
pub(crate) fn check_value(field: &'static str, value: &[u8]) -> Result<(), InvalidArgument> {
    if value.len() > VALUE_MAX_BYTES {
        return Err(InvalidArgument::new(
            field,
            format!(
                "must be at most {VALUE_MAX_BYTES} bytes, got {}",
                value.len()
            ),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn bounds_name_the_field_and_the_bound() {
        let err = check_key(&"k".repeat(KEY_MAX_BYTES + 1)).unwrap_err();
        assert_eq!(err.field(), "key");
        assert!(err.to_string().contains("256"), "{err}");
        assert!(check_key(&"k".repeat(KEY_MAX_BYTES)).is_ok());
        assert_eq!(check_key("").unwrap_err().field(), "key");
        assert_eq!(check_key("a\u{7}b").unwrap_err().field(), "key");
        let err = check_value("value", &vec![0; VALUE_MAX_BYTES + 1]).unwrap_err();
        assert!(err.to_string().contains("1048576"), "{err}");
        assert!(check_value("value", &vec![0; VALUE_MAX_BYTES]).is_ok());
    }
}
