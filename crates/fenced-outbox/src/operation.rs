//! What a worker records: one HTTP request to make on its behalf, with the
//! bounds every field is checked against before anything reaches the
//! database.

use hyper::{header::HeaderValue, Uri};

use crate::OutboxError;

/// The longest destination URL, in bytes.
pub const DESTINATION_MAX_BYTES: usize = 2048;
/// The largest payload, in bytes (1 MiB).
pub const PAYLOAD_MAX_BYTES: usize = 1024 * 1024;
/// The longest idempotency key, in bytes: the same bound as fenced-sql's
/// operation ids, as the key is the guard's operation id.
pub const IDEMPOTENCY_KEY_MAX_BYTES: usize = fenced_sql::OPERATION_ID_MAX_BYTES;
/// The longest content type, in bytes.
pub const CONTENT_TYPE_MAX_BYTES: usize = 128;
/// The content type an operation gets unless it says otherwise.
pub const DEFAULT_CONTENT_TYPE: &str = "application/json";

/// The HTTP method of an operation: both are idempotent under an
/// idempotency key at the destination, which is what delivery at least
/// once needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Method {
    Post,
    Put,
}

impl Method {
    /// The name stored and sent.
    ///
    /// ```
    /// assert_eq!(fenced_outbox::Method::Put.as_str(), "PUT");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Method::Post => "POST",
            Method::Put => "PUT",
        }
    }

    /// Reads a stored method back.
    ///
    /// ```
    /// use fenced_outbox::Method;
    /// assert_eq!(Method::parse("POST").ok(), Some(Method::Post));
    /// assert!(Method::parse("GET").is_err());
    /// ```
    pub fn parse(s: &str) -> Result<Method, OutboxError> {
        match s {
            "POST" => Ok(Method::Post),
            "PUT" => Ok(Method::Put),
            other => Err(OutboxError::invalid(
                "method",
                format!("must be POST or PUT, got {:?}", shorten(other)),
            )),
        }
    }
}

/// One operation to deliver: where, how, what, and the key the destination
/// deduplicates retries by (sent as the `Idempotency-Key` header).
///
/// ```
/// use fenced_outbox::{Method, Operation};
/// let op = Operation::post("https://api.example.com/v1/charges", b"{\"amount\":1842}", "charge-1842");
/// assert_eq!(op.method, Method::Post);
/// assert!(op.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Operation<'a> {
    /// An `http://` or `https://` URL with a host (1 to 2048 bytes, no
    /// user name or password in it).
    pub destination: &'a str,
    pub method: Method,
    /// The `Content-Type` header (1 to 128 bytes of visible ASCII).
    pub content_type: &'a str,
    /// The request body (at most 1 MiB).
    pub payload: &'a [u8],
    /// The `Idempotency-Key` header and the guard's operation id (1 to 128
    /// bytes of visible ASCII); unique per resource.
    pub idempotency_key: &'a str,
}

impl<'a> Operation<'a> {
    /// A `POST` of `payload` as [`DEFAULT_CONTENT_TYPE`].
    pub fn post(destination: &'a str, payload: &'a [u8], idempotency_key: &'a str) -> Self {
        Operation {
            destination,
            method: Method::Post,
            content_type: DEFAULT_CONTENT_TYPE,
            payload,
            idempotency_key,
        }
    }

    /// Checks every field against its bound; the error names the field and
    /// the bound.
    ///
    /// ```
    /// use fenced_outbox::Operation;
    /// let e = Operation::post("https://api.example.com/", b"{}", "").validate().unwrap_err();
    /// assert_eq!(e.to_string(), "idempotency_key: must be 1 to 128 bytes, got 0");
    /// let e = Operation::post("ftp://example.com/", b"{}", "k").validate().unwrap_err();
    /// assert!(e.to_string().starts_with("destination: must be an http:// or https:// URL"));
    /// ```
    pub fn validate(&self) -> Result<(), OutboxError> {
        check_destination(self.destination)?;
        header_text(
            "content_type",
            self.content_type,
            CONTENT_TYPE_MAX_BYTES,
            true,
        )?;
        header_text(
            "idempotency_key",
            self.idempotency_key,
            IDEMPOTENCY_KEY_MAX_BYTES,
            false,
        )?;
        if self.payload.len() > PAYLOAD_MAX_BYTES {
            return Err(OutboxError::invalid(
                "payload",
                format!(
                    "must be at most {PAYLOAD_MAX_BYTES} bytes, got {}",
                    self.payload.len()
                ),
            ));
        }
        Ok(())
    }
}

/// The destination parsed: scheme http or https, a host, no credentials.
pub(crate) fn check_destination(destination: &str) -> Result<Uri, OutboxError> {
    if destination.is_empty() || destination.len() > DESTINATION_MAX_BYTES {
        return Err(OutboxError::invalid(
            "destination",
            format!(
                "must be 1 to {DESTINATION_MAX_BYTES} bytes, got {}",
                destination.len()
            ),
        ));
    }
    let bad = |why: &str| {
        OutboxError::invalid(
            "destination",
            format!(
                "must be an http:// or https:// URL with a host{why}, got {:?}",
                shorten(destination)
            ),
        )
    };
    let uri: Uri = destination.parse().map_err(|_| bad(""))?;
    if !matches!(uri.scheme_str(), Some("http" | "https")) {
        return Err(bad(""));
    }
    let authority = uri.authority().ok_or_else(|| bad(""))?;
    if authority.as_str().contains('@') {
        // Credentials in a URL end up in logs and in last_error.
        return Err(bad(" and no user name or password"));
    }
    if authority.host().is_empty() {
        return Err(bad(""));
    }
    Ok(uri)
}

/// A header's text: 1 to `max` bytes of visible ASCII (and spaces where
/// `spaces`), which any HTTP/1.1 server takes as is.
fn header_text(
    field: &'static str,
    value: &str,
    max: usize,
    spaces: bool,
) -> Result<(), OutboxError> {
    if value.is_empty() || value.len() > max {
        return Err(OutboxError::invalid(
            field,
            format!("must be 1 to {max} bytes, got {}", value.len()),
        ));
    }
    let allowed = |b: u8| b.is_ascii_graphic() || (spaces && b == b' ');
    if !value.bytes().all(allowed) || HeaderValue::from_str(value).is_err() {
        return Err(OutboxError::invalid(
            field,
            format!(
                "must be visible ASCII{}, got {:?}",
                if spaces { " or spaces" } else { "" },
                shorten(value)
            ),
        ));
    }
    Ok(())
}

/// At most the first 64 characters of `s`, for an error message.
pub(crate) fn shorten(s: &str) -> String {
    let mut out: String = s.chars().take(64).collect();
    if out.len() < s.len() {
        out.push('…');
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn field_of(e: OutboxError) -> &'static str {
        match e {
            OutboxError::Invalid { field, .. } => field,
            other => panic!("not Invalid: {other}"),
        }
    }

    #[test]
    fn every_bound_names_its_field() {
        let payload = vec![0u8; PAYLOAD_MAX_BYTES + 1];
        let long_key = "k".repeat(IDEMPOTENCY_KEY_MAX_BYTES + 1);
        let long_url = format!("https://example.com/{}", "a".repeat(DESTINATION_MAX_BYTES));
        let cases: Vec<(Operation<'_>, &str, &str)> = vec![
            (
                Operation::post("https://x/", &payload, "k"),
                "payload",
                "must be at most 1048576 bytes, got 1048577",
            ),
            (
                Operation::post("https://x/", b"", ""),
                "idempotency_key",
                "must be 1 to 128 bytes, got 0",
            ),
            (
                Operation::post("https://x/", b"", &long_key),
                "idempotency_key",
                "must be 1 to 128 bytes, got 129",
            ),
            (
                Operation::post("https://x/", b"", "a key"),
                "idempotency_key",
                "must be visible ASCII",
            ),
            (
                Operation::post("", b"", "k"),
                "destination",
                "must be 1 to 2048 bytes, got 0",
            ),
            (
                Operation::post(&long_url, b"", "k"),
                "destination",
                "must be 1 to 2048 bytes",
            ),
            (
                Operation::post("not a url", b"", "k"),
                "destination",
                "must be an http:// or https:// URL",
            ),
            (
                Operation::post("/relative", b"", "k"),
                "destination",
                "must be an http:// or https:// URL",
            ),
            (
                Operation::post("ftp://x/", b"", "k"),
                "destination",
                "must be an http:// or https:// URL",
            ),
            (
                Operation::post("https://u:p@x/", b"", "k"),
                "destination",
                "no user name or password",
            ),
            (
                Operation {
                    content_type: "",
                    ..Operation::post("https://x/", b"", "k")
                },
                "content_type",
                "must be 1 to 128 bytes, got 0",
            ),
        ];
        for (op, field, reason) in cases {
            let e = op.validate().unwrap_err();
            let text = e.to_string();
            assert_eq!(field_of(e), field, "{op:?}");
            assert!(text.contains(reason), "{text:?} lacks {reason:?}");
        }
    }

    #[test]
    fn the_bounds_themselves_pass() {
        let payload = vec![0u8; PAYLOAD_MAX_BYTES];
        let key = "k".repeat(IDEMPOTENCY_KEY_MAX_BYTES);
        let url = format!(
            "http://127.0.0.1:8080/{}",
            "a".repeat(DESTINATION_MAX_BYTES - 22)
        );
        assert_eq!(url.len(), DESTINATION_MAX_BYTES);
        let op = Operation {
            method: Method::Put,
            content_type: "application/json; charset=utf-8",
            ..Operation::post(&url, &payload, &key)
        };
        assert!(op.validate().is_ok());
    }
}
