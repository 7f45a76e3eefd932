//! A job label: what an acquire says it is for ("statement run 2026-07,
//! worker 3"), shown beside the lease to people (the status page,
//! Describe). Never used to decide anything, never a credential.

use std::{fmt, sync::Arc};

use serde::{Deserialize, Serialize};

use crate::{name::check_name, InvalidArgument};

/// The longest job label, in bytes of UTF-8.
pub const JOB_LABEL_MAX_BYTES: usize = 64;

/// UTF-8, 1 to [`JOB_LABEL_MAX_BYTES`] bytes, no control characters.
///
/// ```
/// use fenced_core::JobLabel;
/// assert_eq!(JobLabel::new("statements 2026-07")?.as_str(), "statements 2026-07");
/// assert!(JobLabel::new("").is_err());
/// assert!(JobLabel::new("a\u{1b}[31m").is_err());
/// # Ok::<(), fenced_core::InvalidArgument>(())
/// ```
#[derive(Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct JobLabel(Arc<str>);

/// Read as a string and validated as [`JobLabel::new`] does.
impl<'de> Deserialize<'de> for JobLabel {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        JobLabel::new(&text).map_err(serde::de::Error::custom)
    }
}

impl JobLabel {
    /// Validates `label`; the error names the field `label` and the bound.
    pub fn new(label: &str) -> Result<Self, InvalidArgument> {
        check_name("label", label, JOB_LABEL_MAX_BYTES)?;
        Ok(Self(Arc::from(label)))
    }

    /// A label from the wire, where empty means none.
    pub fn optional(label: &str) -> Result<Option<Self>, InvalidArgument> {
        if label.is_empty() {
            Ok(None)
        } else {
            Self::new(label).map(Some)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for JobLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for JobLabel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn labels_are_bounded_printable_text_and_empty_means_none() {
        assert_eq!(JobLabel::optional("").unwrap(), None);
        assert_eq!(
            JobLabel::optional("worker 3").unwrap().unwrap().as_str(),
            "worker 3"
        );
        let long = "x".repeat(JOB_LABEL_MAX_BYTES + 1);
        let err = JobLabel::new(&long).unwrap_err().to_string();
        assert!(err.contains("label") && err.contains("64"), "{err}");
        assert!(JobLabel::new(&"é".repeat(32)).is_ok());
        assert!(JobLabel::new("tab\there").is_err());
        assert!(
            JobLabel::new("\u{202e}").is_ok(),
            "format characters are not controls"
        );
    }
}
