//! The HTTP/JSON API: every Lock, Kv and Cluster call as a POST of JSON on
//! the client port, beside gRPC. A call is decoded in the proto3 JSON
//! mapping and handed to the same service a gRPC call reaches, with the
//! caller's headers as its metadata and the connection's TLS identity in
//! its extensions, so authentication, permissions, forwarding and bounds
//! are gRPC's own, not a copy. docs/DECISIONS.md, "The HTTP/JSON API".
//!
//! - [`calls`]: what is served, declared once;
//! - [`request`]: content type, bounded body, the message's gRPC bound;
//! - [`reply`]: gRPC codes as HTTP statuses, the error body;
//! - [`sse`]: Watch as server-sent events;
//! - [`openapi`]: the OpenAPI document, made from `proto/`.

pub mod calls;
pub mod openapi;
pub mod reply;
pub mod request;
pub mod sse;

use std::{convert::Infallible, future::Future, pin::Pin, sync::Arc};

use axum::body::Body;
use bytes::Bytes;
use http::{header, HeaderValue, Method, StatusCode};
use serde::{de::DeserializeOwned, Serialize};
use tokio_stream::Stream;
use tonic::{metadata::MetadataMap, Code, Status};

use self::{
    calls::{Bound, Call},
    request::Refusal,
};
use super::{ClusterService, KvService, LockService};
use crate::{counters::rpc_metrics::Answered, security::auth::Auth};

/// What answers JSON calls on one node's client port.
pub struct JsonApi {
    lock: LockService,
    kv: KvService,
    cluster: ClusterService,
    auth: Arc<Auth>,
    /// The gRPC decoding bound of each kind of call.
    bounds: Bounds,
    openapi: Bytes,
}

/// The gRPC bounds the JSON API applies to its messages.
#[derive(Debug, Clone, Copy)]
pub struct Bounds {
    pub lock: usize,
    pub kv: usize,
    pub client: usize,
}

impl JsonApi {
    /// The services are the client port's (forwarded identities are not
    /// believed from them).
    pub fn new(
        lock: LockService,
        kv: KvService,
        cluster: ClusterService,
        auth: Arc<Auth>,
        bounds: Bounds,
    ) -> Result<Self, String> {
        Ok(Self {
            lock,
            kv,
            cluster,
            auth,
            bounds,
            openapi: Bytes::from(openapi::text()?),
        })
    }

    fn bound(&self, bound: Bound) -> usize {
        match bound {
            Bound::Lock => self.bounds.lock,
            Bound::Kv => self.bounds.kv,
            Bound::Client => self.bounds.client,
        }
    }

    /// The answer to one HTTP request that no gRPC service routed.
    async fn answer(&self, req: http::Request<Body>) -> http::Response<Body> {
        let (parts, body) = req.into_parts();
        if is_grpc(&parts.headers) {
            // A gRPC call to a method no service has.
            let (parts, ()) = Status::unimplemented("").into_http::<()>().into_parts();
            return http::Response::from_parts(parts, Body::empty());
        }
        let path = parts.uri.path();
        if path == openapi::PATH {
            return self.openapi(parts);
        }
        let Some(call) = Call::at(path) else {
            return refused(Refusal::new(
                StatusCode::NOT_FOUND,
                Code::NotFound,
                format!(
                    "no call at {path}; every call is listed in {}",
                    openapi::PATH
                ),
            ));
        };
        let mut answer = self.answer_call(call, parts, body).await;
        // Counted under the method it called, whatever it answered.
        if let Some(answered) = answer.extensions_mut().get_mut::<Answered>() {
            answered.method = Some(call.method());
        }
        answer
    }

    /// The answer to a request at `call`'s path.
    async fn answer_call(
        &self,
        call: Call,
        parts: http::request::Parts,
        body: Body,
    ) -> http::Response<Body> {
        if parts.method != Method::POST {
            return only(Method::POST);
        }
        let max = self.bound(call.bound());
        let body =
            match request::read_body(body, max.saturating_mul(request::JSON_BYTES_PER_PROTO_BYTE))
                .await
            {
                Ok(body) => body,
                Err(refusal) => return refused(refusal),
            };
        self.dispatch(call, parts, body).await
    }

    /// The OpenAPI document, to any caller that authenticates.
    fn openapi(&self, parts: http::request::Parts) -> http::Response<Body> {
        if parts.method != Method::GET {
            return only(Method::GET);
        }
        if let Err(status) = self.auth.authenticate(&grpc_request(parts, ())) {
            return refusal_of(&status);
        }
        response(
            (StatusCode::OK, Code::Ok),
            reply::json_headers(),
            Body::from(self.openapi.clone()),
        )
    }
}

/// A cheap handle on the node's [`JsonApi`], the client port's fallback
/// service (tonic routes every gRPC service before it).
#[derive(Clone)]
pub struct JsonService(pub Arc<JsonApi>);

impl tower::Service<http::Request<Body>> for JsonService {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(
        &mut self,
        _: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Infallible>> {
        std::task::Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let api = Arc::clone(&self.0);
        Box::pin(async move { Ok(api.answer(req).await) })
    }
}

fn is_grpc(headers: &http::HeaderMap) -> bool {
    headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/grpc"))
}

/// The request a gRPC call would have made: the body's message, the HTTP
/// headers as metadata (`authorization` among them), and the connection's
/// details (its TLS certificates) as extensions.
fn as_grpc<M>(
    parts: http::request::Parts,
    body: &[u8],
    max: usize,
) -> Result<tonic::Request<M>, Refusal>
where
    M: DeserializeOwned + prost::Message + Default,
{
    request::check_content_type(&parts.headers, body)?;
    let message = request::decode::<M>(body, max)?;
    Ok(grpc_request(parts, message))
}

/// `message` as a gRPC call would carry it over this HTTP request's
/// connection: the headers as metadata, the connection's details as
/// extensions.
fn grpc_request<M>(parts: http::request::Parts, message: M) -> tonic::Request<M> {
    tonic::Request::from_parts(
        MetadataMap::from_headers(parts.headers),
        parts.extensions,
        message,
    )
}

/// Decodes the request, makes the call, and answers with `ok` or the
/// refusal.
async fn call_with<Req, Out, F, Fut>(
    parts: http::request::Parts,
    body: &[u8],
    max: usize,
    call: F,
    ok: impl FnOnce(http::HeaderMap, Out) -> http::Response<Body>,
) -> http::Response<Body>
where
    Req: DeserializeOwned + prost::Message + Default,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Out>, Status>>,
{
    let request = match as_grpc::<Req>(parts, body, max) {
        Ok(request) => request,
        Err(refusal) => return refused(refusal),
    };
    match call(request).await {
        Ok(answer) => {
            let (metadata, out, _) = answer.into_parts();
            ok(metadata.into_headers(), out)
        }
        Err(status) => refusal_of(&status),
    }
}

/// A unary call: one JSON answer.
async fn unary<Req, Resp, F, Fut>(
    parts: http::request::Parts,
    body: &[u8],
    max: usize,
    call: F,
) -> http::Response<Body>
where
    Req: DeserializeOwned + prost::Message + Default,
    Resp: Serialize,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<Resp>, Status>>,
{
    call_with(
        parts,
        body,
        max,
        call,
        |metadata, message: Resp| match reply::to_json(&message) {
            Ok(json) => {
                let mut headers = reply::json_headers();
                reply::add_metadata(&mut headers, metadata);
                response((StatusCode::OK, Code::Ok), headers, Body::from(json))
            }
            Err(e) => refusal_of(&Status::internal(format!("the answer did not encode: {e}"))),
        },
    )
    .await
}

/// A server stream: server-sent events.
async fn stream<Req, Resp, S, F, Fut>(
    parts: http::request::Parts,
    body: &[u8],
    max: usize,
    call: F,
) -> http::Response<Body>
where
    Req: DeserializeOwned + prost::Message + Default,
    Resp: Serialize + Send + 'static,
    S: Stream<Item = Result<Resp, Status>> + Send + 'static,
    F: FnOnce(tonic::Request<Req>) -> Fut,
    Fut: Future<Output = Result<tonic::Response<S>, Status>>,
{
    call_with(parts, body, max, call, |metadata, messages: S| {
        let mut headers = http::HeaderMap::new();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static(sse::EVENT_STREAM),
        );
        headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
        reply::add_metadata(&mut headers, metadata);
        response(
            (StatusCode::OK, Code::Ok),
            headers,
            Body::from_stream(sse::events(messages)),
        )
    })
    .await
}

/// An answer with its HTTP status, and the gRPC code it stands for in the
/// node's per-call metrics ([`Answered`]; the method is set by
/// [`JsonApi::answer`] once the path named one).
fn response(
    (status, code): (StatusCode, Code),
    headers: http::HeaderMap,
    body: Body,
) -> http::Response<Body> {
    let mut response = http::Response::new(body);
    *response.status_mut() = status;
    *response.headers_mut() = headers;
    response
        .extensions_mut()
        .insert(Answered { method: None, code });
    response
}

/// A refusal by a service, with its metadata (the leader hints).
fn refusal_of(status: &Status) -> http::Response<Body> {
    let mut headers = reply::json_headers();
    reply::add_metadata(&mut headers, status.metadata().clone().into_headers());
    response(
        (reply::http_status(status.code()), status.code()),
        headers,
        Body::from(reply::error_body(status.code(), status.message())),
    )
}

/// A refusal before any service saw the request.
fn refused(refusal: Refusal) -> http::Response<Body> {
    response(
        (refusal.status, refusal.code),
        reply::json_headers(),
        Body::from(reply::error_body(refusal.code, &refusal.message)),
    )
}

/// 405, naming the one method the path takes.
fn only(method: Method) -> http::Response<Body> {
    let mut answer = refused(Refusal::new(
        StatusCode::METHOD_NOT_ALLOWED,
        Code::Unimplemented,
        format!("method: this path takes only {method}"),
    ));
    if let Ok(value) = HeaderValue::from_str(method.as_str()) {
        answer.headers_mut().insert(header::ALLOW, value);
    }
    answer
}
