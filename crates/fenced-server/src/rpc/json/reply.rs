//! How a gRPC answer reads over HTTP: the status code a gRPC code maps to
//! (the mapping grpc-gateway and etcd's gateway use), the error body, and
//! the answer's metadata (the leader hints) as response headers.

use http::{header, HeaderMap, HeaderValue, StatusCode};
use tonic::Code;

/// The content type of every JSON answer.
pub const JSON: &str = "application/json";

/// The HTTP status a gRPC code is answered with.
pub fn http_status(code: Code) -> StatusCode {
    match code {
        Code::Ok => StatusCode::OK,
        Code::InvalidArgument | Code::FailedPrecondition | Code::OutOfRange => {
            StatusCode::BAD_REQUEST
        }
        Code::Unauthenticated => StatusCode::UNAUTHORIZED,
        Code::PermissionDenied => StatusCode::FORBIDDEN,
        Code::NotFound => StatusCode::NOT_FOUND,
        Code::AlreadyExists | Code::Aborted => StatusCode::CONFLICT,
        Code::ResourceExhausted => StatusCode::TOO_MANY_REQUESTS,
        Code::Cancelled => StatusCode::from_u16(499).unwrap_or(StatusCode::BAD_REQUEST),
        Code::Unimplemented => StatusCode::NOT_IMPLEMENTED,
        Code::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        Code::DeadlineExceeded => StatusCode::GATEWAY_TIMEOUT,
        Code::Unknown | Code::Internal | Code::DataLoss => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

/// The name of a gRPC code as the proto3 JSON mapping of
/// `google.rpc.Code` spells it.
pub fn code_name(code: Code) -> &'static str {
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// The body of a refusal: `{"code": 3, "status": "INVALID_ARGUMENT",
/// "message": "..."}`, the gRPC code by number and by name.
pub fn error_body(code: Code, message: &str) -> Vec<u8> {
    serde_json::json!({
        "code": code as i32,
        "status": code_name(code),
        "message": message,
    })
    .to_string()
    .into_bytes()
}

/// Headers with only the JSON content type.
pub fn json_headers() -> HeaderMap {
    let mut headers = HeaderMap::new();
    headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(JSON));
    headers
}

/// Copies an answer's gRPC metadata (the leader hints) into `headers`,
/// leaving out what only gRPC framing means.
pub fn add_metadata(headers: &mut HeaderMap, metadata: HeaderMap) {
    for (name, value) in &metadata {
        let framing = name.as_str().starts_with("grpc-")
            || name == header::CONTENT_TYPE
            || name == header::CONTENT_LENGTH;
        if !framing {
            headers.append(name.clone(), value.clone());
        }
    }
}

/// The suffix of a field that holds the leader's wall clock in ms since the
/// Unix epoch (`wall_time_unix_ms`, `granted_at_unix_ms`, ...).
const UNIX_MS: &str = "UnixMs";

/// The name the JSON API gives a wall-clock field's date: `wallTimeUnixMs`
/// is also `wallTime`, `grantedAtUnixMs` also `grantedAt`.
pub fn date_field(name: &str) -> Option<&str> {
    name.strip_suffix(UNIX_MS).filter(|n| !n.is_empty())
}

/// A message as JSON, with each wall-clock field also as an RFC 3339 date
/// (UTC, ms) beside it, for people reading the answer: the proto3 JSON
/// mapping plus these read-only fields (docs/openapi.json lists them).
pub fn to_json<M: serde::Serialize>(message: &M) -> Result<Vec<u8>, serde_json::Error> {
    let mut value = serde_json::to_value(message)?;
    add_dates(&mut value);
    serde_json::to_vec(&value)
}

fn add_dates(value: &mut serde_json::Value) {
    match value {
        serde_json::Value::Object(map) => {
            let dates: Vec<(String, String)> = map
                .iter()
                .filter_map(|(name, v)| {
                    let date = date_field(name)?;
                    let ms: u64 = match v {
                        serde_json::Value::String(s) => s.parse().ok()?,
                        other => other.as_u64()?,
                    };
                    (ms > 0).then(|| (date.to_string(), rfc3339(ms)))
                })
                .collect();
            for v in map.values_mut() {
                add_dates(v);
            }
            for (name, date) in dates {
                map.insert(name, serde_json::Value::String(date));
            }
        }
        serde_json::Value::Array(items) => items.iter_mut().for_each(add_dates),
        _ => {}
    }
}

/// `2026-12-06T17:01:02.345Z`.
fn rfc3339(unix_ms: u64) -> String {
    let at = std::time::UNIX_EPOCH + std::time::Duration::from_millis(unix_ms);
    humantime::format_rfc3339_millis(at).to_string()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    #[test]
    fn refusals_map_to_the_status_a_json_client_expects() {
        assert_eq!(http_status(Code::Ok), StatusCode::OK);
        assert_eq!(http_status(Code::InvalidArgument), StatusCode::BAD_REQUEST);
        assert_eq!(http_status(Code::Unauthenticated), StatusCode::UNAUTHORIZED);
        assert_eq!(http_status(Code::PermissionDenied), StatusCode::FORBIDDEN);
        assert_eq!(
            http_status(Code::ResourceExhausted),
            StatusCode::TOO_MANY_REQUESTS
        );
        assert_eq!(
            http_status(Code::Unavailable),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            http_status(Code::DeadlineExceeded),
            StatusCode::GATEWAY_TIMEOUT
        );
        assert_eq!(http_status(Code::Cancelled).as_u16(), 499);
        // Only a fault of the server's reads as a 5xx.
        for code in [
            Code::InvalidArgument,
            Code::FailedPrecondition,
            Code::OutOfRange,
            Code::NotFound,
            Code::AlreadyExists,
            Code::Aborted,
            Code::PermissionDenied,
            Code::Unauthenticated,
            Code::ResourceExhausted,
            Code::Cancelled,
        ] {
            assert!(http_status(code).is_client_error(), "{code:?}");
        }
    }

    #[test]
    fn an_error_body_names_the_code_by_number_and_name() {
        let body: serde_json::Value =
            serde_json::from_slice(&error_body(Code::FailedPrecondition, "stale \"token\""))
                .unwrap();
        assert_eq!(body["code"], 9);
        assert_eq!(body["status"], "FAILED_PRECONDITION");
        assert_eq!(body["message"], "stale \"token\"");
    }

    #[test]
    fn wall_clock_fields_are_also_dates_at_every_depth() {
        let reply = fenced_proto::v1::HistoryResponse {
            entries: vec![fenced_proto::v1::HistoryEntry {
                token: 1,
                granted_at_unix_ms: 1_800_000_000_123,
                ..Default::default()
            }],
            cluster_time_ms: 5,
            wall_time_unix_ms: 1_800_000_001_000,
        };
        let json: serde_json::Value = serde_json::from_slice(&to_json(&reply).unwrap()).unwrap();
        assert_eq!(json["wallTimeUnixMs"], "1800000001000");
        assert_eq!(json["wallTime"], "2027-01-15T08:00:01.000Z");
        assert_eq!(json["entries"][0]["grantedAt"], "2027-01-15T08:00:00.123Z");
        // Unknown (0, left out by the mapping): no date either.
        assert!(json["entries"][0].get("endedAt").is_none(), "{json}");
        assert_eq!(date_field("grantedAtUnixMs"), Some("grantedAt"));
        assert_eq!(date_field("UnixMs"), None);
        assert_eq!(date_field("clusterTimeMs"), None);
    }

    #[test]
    fn grpc_framing_headers_are_not_copied() {
        let mut metadata = HeaderMap::new();
        metadata.insert("grpc-status", HeaderValue::from_static("0"));
        metadata.insert("content-type", HeaderValue::from_static("application/grpc"));
        metadata.insert("x-fenced-leader", HeaderValue::from_static("127.0.0.1:1"));
        let mut headers = json_headers();
        add_metadata(&mut headers, metadata);
        assert_eq!(headers.get("content-type").unwrap(), JSON);
        assert!(headers.get("grpc-status").is_none());
        assert_eq!(headers.get("x-fenced-leader").unwrap(), "127.0.0.1:1");
    }
}
