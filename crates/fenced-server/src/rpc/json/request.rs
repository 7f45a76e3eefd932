//! A JSON request before any service sees it: the content type (a browser
//! form cannot pose as one), a bounded body, and a message no larger than
//! the same call over gRPC may be.

use bytes::Bytes;
use http::{header, HeaderMap, StatusCode};
use http_body_util::{BodyExt, Limited};
use serde::de::DeserializeOwned;
use tonic::Code;

/// How many times a message's gRPC bound its JSON may take: base64 adds a
/// third to bytes, names and quoted 64-bit numbers add more.
pub const JSON_BYTES_PER_PROTO_BYTE: usize = 4;

/// Why a request is answered before it reaches a service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refusal {
    pub status: StatusCode,
    pub code: Code,
    pub message: String,
}

impl Refusal {
    pub fn new(status: StatusCode, code: Code, message: impl Into<String>) -> Self {
        Self {
            status,
            code,
            message: message.into(),
        }
    }
}

/// A body must say it is JSON. A cross-site form or `fetch` without a
/// preflight can only send `text/plain`, form or multipart bodies, so a
/// browser holding a client certificate cannot be made to call fenced.
/// An empty body (a call with every field at its default) needs no type.
pub fn check_content_type(headers: &HeaderMap, body: &[u8]) -> Result<(), Refusal> {
    if body.is_empty() {
        return Ok(());
    }
    let given = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let essence = given.split(';').next().unwrap_or("").trim();
    if essence.eq_ignore_ascii_case(super::reply::JSON) {
        Ok(())
    } else {
        Err(Refusal::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            Code::InvalidArgument,
            format!("content-type: must be application/json, not {given:?}"),
        ))
    }
}

/// Reads a body of at most `max` bytes; a longer one is refused whole.
pub async fn read_body<B>(body: B, max: usize) -> Result<Bytes, Refusal>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<Box<dyn std::error::Error + Send + Sync>>,
{
    match Limited::new(body, max).collect().await {
        Ok(collected) => Ok(collected.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large(max)),
        Err(e) => Err(Refusal::new(
            StatusCode::BAD_REQUEST,
            Code::InvalidArgument,
            format!("request body: could not be read: {e}"),
        )),
    }
}

fn too_large(max: usize) -> Refusal {
    Refusal::new(
        StatusCode::PAYLOAD_TOO_LARGE,
        Code::ResourceExhausted,
        format!("request body: at most {max} bytes"),
    )
}

/// The message a body holds (`{}` when empty), in the proto3 JSON mapping:
/// unknown fields are refused, so a misspelt field is an error, not a
/// default. The message must encode within `proto_max` bytes, the bound
/// the same call has over gRPC.
pub fn decode<M>(body: &[u8], proto_max: usize) -> Result<M, Refusal>
where
    M: DeserializeOwned + prost::Message + Default,
{
    let message: M = if body.is_empty() {
        M::default()
    } else {
        serde_json::from_slice(body).map_err(|e| {
            Refusal::new(
                StatusCode::BAD_REQUEST,
                Code::InvalidArgument,
                format!(
                    "request body: not a fenced.v1.{} in JSON: {e}",
                    name_of::<M>()
                ),
            )
        })?
    };
    if message.encoded_len() > proto_max {
        return Err(Refusal::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            Code::ResourceExhausted,
            format!(
                "request: at most {proto_max} bytes once encoded as protobuf, not {}",
                message.encoded_len()
            ),
        ));
    }
    Ok(message)
}

/// The message's name without its Rust path.
fn name_of<M>() -> &'static str {
    let full = std::any::type_name::<M>();
    full.rsplit("::").next().unwrap_or(full)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use fenced_proto::v1;
    use http::HeaderValue;

    use super::*;

    fn typed(value: &'static str) -> HeaderMap {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_TYPE, HeaderValue::from_static(value));
        headers
    }

    /// Attack: a page in an operator's browser posts a form to fenced; the
    /// browser would present the operator's client certificate.
    #[test]
    fn a_body_a_browser_form_can_send_is_refused() {
        for kind in [
            "text/plain",
            "application/x-www-form-urlencoded",
            "multipart/form-data; boundary=x",
        ] {
            let refused = check_content_type(&typed(kind), b"{}").unwrap_err();
            assert_eq!(refused.status, StatusCode::UNSUPPORTED_MEDIA_TYPE, "{kind}");
            assert!(refused.message.contains("application/json"), "{refused:?}");
        }
        assert!(check_content_type(&HeaderMap::new(), b"{}").is_err());
        assert!(check_content_type(&typed("application/json"), b"{}").is_ok());
        assert!(check_content_type(&typed("Application/JSON; charset=utf-8"), b"{}").is_ok());
        assert!(check_content_type(&HeaderMap::new(), b"").is_ok());
    }

    #[test]
    fn a_misspelt_field_is_refused_naming_the_message() {
        let refused =
            decode::<v1::AcquireRequest>(br#"{"resource":"YQ==","ttl":5}"#, 1024).unwrap_err();
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
        assert!(
            refused.message.contains("fenced.v1.AcquireRequest"),
            "{refused:?}"
        );
        assert!(refused.message.contains("ttl"), "{refused:?}");
    }

    #[test]
    fn proto_names_and_json_names_both_decode() {
        let camel: v1::AcquireRequest = decode(
            br#"{"resource":"YQ==","ttlMs":"5000","ownerId":"AAECAw=="}"#,
            1024,
        )
        .unwrap();
        let snake: v1::AcquireRequest = decode(
            br#"{"resource":"YQ==","ttl_ms":5000,"owner_id":"AAECAw=="}"#,
            1024,
        )
        .unwrap();
        assert_eq!(camel, snake);
        assert_eq!(camel.ttl_ms, 5000);
        assert_eq!(camel.resource, b"a");
        assert_eq!(camel.owner_id, [0, 1, 2, 3]);
        let empty: v1::StatusRequest = decode(b"", 16).unwrap();
        assert_eq!(empty, v1::StatusRequest::default());
    }

    #[test]
    fn a_message_over_the_grpc_bound_is_refused_naming_it() {
        let name = "bmFtZQ".repeat(20);
        let body = format!(r#"{{"resource":"{name}"}}"#);
        let refused = decode::<v1::AcquireRequest>(body.as_bytes(), 64).unwrap_err();
        assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert!(refused.message.contains("at most 64 bytes"), "{refused:?}");
    }

    #[tokio::test]
    async fn a_body_over_its_bound_is_refused_whole() {
        let body = http_body_util::Full::new(Bytes::from(vec![b' '; 65]));
        let refused = read_body(body, 64).await.unwrap_err();
        assert_eq!(refused.status, StatusCode::PAYLOAD_TOO_LARGE);
        assert_eq!(refused.message, "request body: at most 64 bytes");
        let body = http_body_util::Full::new(Bytes::from(vec![b' '; 64]));
        assert_eq!(read_body(body, 64).await.unwrap().len(), 64);
    }
}
