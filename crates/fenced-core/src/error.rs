use std::fmt;

/// A request field that is outside its bounds.
///
/// The message always names the field and the bound, so it can be returned to
/// the client as it is (gRPC `INVALID_ARGUMENT`).
///
/// ```
/// use fenced_core::ResourceName;
/// let err = ResourceName::new("").unwrap_err();
/// assert_eq!(err.field(), "resource");
/// assert!(err.to_string().starts_with("resource: "));
/// ```
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub struct InvalidArgument {
    field: &'static str,
    reason: String,
}

impl InvalidArgument {
    /// A new error for `field`; `reason` says which bound was broken.
    pub fn new(field: &'static str, reason: impl Into<String>) -> Self {
        Self {
            field,
            reason: reason.into(),
        }
    }

    /// The request field at fault, as spelled in the API (`resource`, `ttl_ms`, ...).
    pub fn field(&self) -> &'static str {
        self.field
    }
}

impl fmt::Display for InvalidArgument {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.field, self.reason)
    }
}
