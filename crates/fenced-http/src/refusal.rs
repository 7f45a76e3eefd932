//! Why a guarded request was not handled, as an HTTP answer: a status and a
//! JSON body naming the resource, the presented token, the highest accepted
//! one and the stage that refused. For gRPC callers the same JSON travels
//! in `grpc-message` with a gRPC status.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::Full;
use serde::Serialize;

/// The step of the guard that refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Stage {
    /// The fencing headers are missing or out of bounds (400).
    Headers,
    /// The caller may not use this resource (403).
    Permission,
    /// The lock cluster says the token is not the owner's current lease
    /// (409).
    Cluster,
    /// The lock cluster did not answer in time: nothing was done (503).
    ClusterUnavailable,
    /// The ledger holds a higher token, or an equal one under the strict
    /// contract (409).
    Ledger,
    /// The ledger failed: nothing was done (503).
    LedgerUnavailable,
    /// Too many requests wait for the resource, or one waited too long
    /// (503).
    Busy,
    /// The body exceeds its bound (413) or did not arrive in time (408).
    Body,
    /// The upstream failed (502) or did not answer in time (504); the
    /// token stays recorded.
    Upstream,
}

/// A refusal, final for `presented_token` when the status is 409.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Refusal {
    /// The HTTP status.
    #[serde(skip)]
    pub status: StatusCode,
    /// A short code: `bad_header`, `stale_token`, `not_current`, ...
    pub error: &'static str,
    /// Where it was refused.
    pub stage: Stage,
    /// The resource, once the headers named a valid one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub resource: Option<String>,
    /// The token presented, once it was valid.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub presented_token: Option<u64>,
    /// The highest token the ledger accepted for the resource, when known.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub highest_accepted: Option<u64>,
    /// The newest token the lock cluster issued, at the cluster stage.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub current_token: Option<u64>,
    /// The whole reason, for a person.
    pub message: String,
}

impl Refusal {
    /// A header missing or out of bounds: the message starts with its name.
    pub fn bad_header(name: &'static str, reason: impl std::fmt::Display) -> Self {
        Self::new(
            StatusCode::BAD_REQUEST,
            "bad_header",
            Stage::Headers,
            format!("{name}: {reason}"),
        )
    }

    /// A refusal with no resource or token yet.
    pub fn new(status: StatusCode, error: &'static str, stage: Stage, message: String) -> Self {
        Refusal {
            status,
            error,
            stage,
            resource: None,
            presented_token: None,
            highest_accepted: None,
            current_token: None,
            message,
        }
    }

    /// The same refusal, naming the resource and the presented token.
    pub fn about(mut self, resource: &str, token: u64) -> Self {
        self.resource = Some(resource.to_string());
        self.presented_token = Some(token);
        self
    }

    /// The JSON body.
    ///
    /// ```
    /// use fenced_http::{Refusal, Stage};
    /// let r = Refusal::new(http::StatusCode::CONFLICT, "stale_token", Stage::Ledger, "late".into())
    ///     .about("statement:7", 4);
    /// assert_eq!(r.json(), r#"{"error":"stale_token","stage":"ledger","resource":"statement:7","presented_token":4,"message":"late"}"#);
    /// ```
    pub fn json(&self) -> String {
        // Serializing plain strings and numbers cannot fail; say so if it did.
        serde_json::to_string(self).unwrap_or_else(|e| {
            format!(r#"{{"error":"internal","message":"refusal not encoded: {e}"}}"#)
        })
    }

    /// The answer: for gRPC (`content-type: application/grpc...`) a
    /// trailers-only response with the gRPC status and the JSON as its
    /// message; else the HTTP status and the JSON body.
    pub fn response(&self, grpc: bool) -> Response<Full<Bytes>> {
        let body = self.json();
        let mut response = if grpc {
            grpc_answer(grpc_code(self.status), &body)
        } else {
            let mut r = Response::new(Full::new(Bytes::from(body)));
            *r.status_mut() = self.status;
            r.headers_mut().insert(
                header::CONTENT_TYPE,
                HeaderValue::from_static("application/json"),
            );
            r
        };
        if self.status == StatusCode::SERVICE_UNAVAILABLE {
            response
                .headers_mut()
                .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        }
        response
    }
}

impl std::fmt::Display for Refusal {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// A trailers-only gRPC answer: `status` and `message` (percent-encoded)
/// in the head, no body.
pub fn grpc_answer(status: u16, message: &str) -> Response<Full<Bytes>> {
    let mut r = Response::new(Full::new(Bytes::new()));
    let headers = r.headers_mut();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/grpc"),
    );
    headers.insert("grpc-status", HeaderValue::from(status));
    if let Ok(v) = HeaderValue::from_str(&percent_encode(message)) {
        headers.insert("grpc-message", v);
    }
    r
}

/// Whether a request is gRPC, by its content type.
pub fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// The gRPC status of an HTTP refusal: INVALID_ARGUMENT, PERMISSION_DENIED,
/// FAILED_PRECONDITION (a stale token: final, not to retry), UNAVAILABLE,
/// RESOURCE_EXHAUSTED.
fn grpc_code(status: StatusCode) -> u16 {
    match status {
        StatusCode::BAD_REQUEST => 3,
        StatusCode::FORBIDDEN => 7,
        StatusCode::UNAUTHORIZED => 16,
        StatusCode::CONFLICT => 9,
        StatusCode::PAYLOAD_TOO_LARGE => 8,
        StatusCode::SERVICE_UNAVAILABLE | StatusCode::BAD_GATEWAY => 14,
        StatusCode::GATEWAY_TIMEOUT | StatusCode::REQUEST_TIMEOUT => 4,
        _ => 13,
    }
}

/// `grpc-message` is percent-encoded (the gRPC HTTP/2 protocol): every byte
/// outside printable ASCII, and `%` itself.
fn percent_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        if (0x20..=0x7e).contains(&b) && b != b'%' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_answers_carry_the_json_and_status() {
        let r = Refusal::new(
            StatusCode::CONFLICT,
            "stale_token",
            Stage::Ledger,
            "statement:7: token 4 is stale".into(),
        )
        .about("statement:7", 4);
        let r = Refusal {
            highest_accepted: Some(5),
            ..r
        };
        let answer = r.response(false);
        assert_eq!(answer.status(), StatusCode::CONFLICT);
        assert_eq!(
            answer
                .headers()
                .get(header::CONTENT_TYPE)
                .map(|v| v.as_bytes()),
            Some(&b"application/json"[..])
        );
        let json: serde_json::Value = serde_json::from_str(&r.json()).unwrap_or_default();
        assert_eq!(json["resource"], "statement:7");
        assert_eq!(json["presented_token"], 4);
        assert_eq!(json["highest_accepted"], 5);
        assert_eq!(json["stage"], "ledger");
    }

    #[test]
    fn grpc_answers_are_trailers_only_with_an_encoded_message() {
        let r = Refusal::bad_header("x-fencing-token", "must be 1 % ü");
        let answer = r.response(true);
        assert_eq!(answer.status(), StatusCode::OK);
        assert_eq!(
            answer.headers().get("grpc-status").map(|v| v.as_bytes()),
            Some(&b"3"[..])
        );
        let message = answer
            .headers()
            .get("grpc-message")
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default();
        assert!(message.contains("must be 1 %25 %C3%BC"), "{message}");
        let busy = Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            Stage::Busy,
            "wait".into(),
        );
        assert_eq!(
            busy.response(true)
                .headers()
                .get("grpc-status")
                .map(|v| v.as_bytes()),
            Some(&b"14"[..])
        );
        assert!(busy
            .response(false)
            .headers()
            .contains_key(header::RETRY_AFTER));
    }
}
