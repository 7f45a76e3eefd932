//! One request through the gateway: authenticate, read the body (bounded),
//! build what the upstream will get, then, in a task of its own that a
//! caller's disconnect cannot cancel: take the resource's turn, answer an
//! operation already applied, check the token with the lock cluster,
//! compare and record it in the ledger (durable), forward with the derived
//! idempotency key, record the operation once the upstream took it.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use fenced_http::{
    admit_request, busy_refusal, duplicate_response, parse_headers, Admitted, Fenced, Ledger,
    Refusal, Serializer, Stage,
};
use fenced_resource::current::CurrentCheck;
use fenced_server::security::auth::{Auth, Permission, Principal};
use http::{HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};

use crate::{
    key::idempotency_key,
    metrics::{InFlight, Metrics, Outcome},
    upstream::{answer_to_caller, upstream_request, UpstreamClient},
};

/// What every request shares.
pub struct State {
    pub upstream: Uri,
    pub client: UpstreamClient,
    pub upstream_authorization: Option<HeaderValue>,
    pub auth: Arc<Auth>,
    pub cluster: Option<CurrentCheck>,
    pub ledger: Arc<dyn Ledger>,
    pub turns: Serializer,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
    /// Requests between their body and their answer, callers gone or not:
    /// a forward outlives a caller that hangs up, so connections alone do
    /// not bound them (`--max-connections` permits).
    pub forwards: Arc<tokio::sync::Semaphore>,
}

/// The bounds of one request.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// The largest request body taken, in bytes.
    pub max_body_bytes: usize,
    /// The largest upstream answer body passed back, in bytes.
    pub max_response_bytes: usize,
    /// How long a caller may take to send its body.
    pub body_timeout: Duration,
    /// The longest wait for a resource's turn.
    pub turn_wait: Duration,
    /// The longest upstream call.
    pub upstream_timeout: Duration,
}

type Answer = Response<Full<Bytes>>;

fn refused(state: &State, r: &Refusal, outcome: Outcome) -> Answer {
    state.metrics.count(outcome);
    r.response(false)
}

/// The certificate a caller's connection was opened with: its name (the
/// identity) and its DER (checked against the deny list at every request).
#[derive(Debug, Clone)]
pub struct Peer {
    pub principal: Principal,
    pub der: Vec<u8>,
}

/// Serves one request.
pub async fn handle(
    state: Arc<State>,
    req: Request<hyper::body::Incoming>,
    peer: Option<Peer>,
) -> Answer {
    let (parts, body) = req.into_parts();
    let fenced = match parse_headers(&parts.headers, true) {
        Ok(f) => f,
        Err(r) => return refused(&state, &r, Outcome::BadRequest),
    };
    let resource = fenced.resource.as_str();
    let token = fenced.token.get();
    let permission = |code: StatusCode, error: &'static str, message: String| {
        Refusal::new(code, error, Stage::Permission, message).about(resource, token)
    };
    // A certificate revoked after its connection opened serves no more
    // requests on it (keep-alive would otherwise go on).
    if let Some(p) = &peer {
        if let Err(status) = state.auth.certificate_in_force(&p.der) {
            let r = permission(
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                status.message().into(),
            );
            return refused(&state, &r, Outcome::Unauthorized);
        }
    }
    if let Err(status) = state.auth.authorize_http_on(
        &parts.headers,
        peer.as_ref().map(|p| &p.principal),
        Permission::Lock,
        "gateway forward",
        Some(resource),
    ) {
        let (code, error) = if status.code() == tonic::Code::Unauthenticated {
            (StatusCode::UNAUTHORIZED, "unauthenticated")
        } else {
            (StatusCode::FORBIDDEN, "permission_denied")
        };
        let r = permission(code, error, status.message().to_string());
        return refused(&state, &r, Outcome::Unauthorized);
    }
    // The whole body first: a caller that pauses mid-upload is checked
    // when it has finished, not when it began.
    let limits = state.limits;
    let body = match tokio::time::timeout(
        limits.body_timeout,
        Limited::new(body, limits.max_body_bytes).collect(),
    )
    .await
    {
        Ok(Ok(collected)) => collected.to_bytes(),
        Ok(Err(e)) => {
            let r = Refusal::new(
                StatusCode::PAYLOAD_TOO_LARGE,
                "body_too_large",
                Stage::Body,
                format!(
                    "body: must be at most {} bytes (max_body_bytes), or it failed: {e}",
                    limits.max_body_bytes
                ),
            )
            .about(resource, token);
            return refused(&state, &r, Outcome::BadRequest);
        }
        Err(_) => {
            let r = Refusal::new(
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                Stage::Body,
                format!(
                    "body: not received within {} ms (body_timeout_ms)",
                    limits.body_timeout.as_millis()
                ),
            )
            .about(resource, token);
            return refused(&state, &r, Outcome::BadRequest);
        }
    };
    // What the upstream gets, before anything is recorded: a request that
    // cannot be forwarded raises no token.
    let op = fenced.operation_id.as_deref().unwrap_or_default();
    let key = idempotency_key(resource, op);
    let path = parts.uri.path_and_query().map_or("/", |p| p.as_str());
    let upstream_req = match upstream_request(
        &state.upstream,
        parts.method,
        path,
        &parts.headers,
        body,
        &key,
        state.upstream_authorization.as_ref(),
    ) {
        Ok(r) => r,
        Err(e) => {
            let r = Refusal::new(StatusCode::BAD_REQUEST, "bad_path", Stage::Headers, e)
                .about(resource, token);
            return refused(&state, &r, Outcome::BadRequest);
        }
    };
    // From the turn to the upstream's answer in a task of its own: a caller
    // that hangs up must not end the turn while its request may still be
    // applied upstream.
    let state_for_task = Arc::clone(&state);
    let Ok(permit) = Arc::clone(&state.forwards).try_acquire_owned() else {
        let r = Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "busy",
            Stage::Busy,
            "as many requests as max_connections are in progress; nothing was done, retry".into(),
        )
        .about(resource, token);
        return refused(&state, &r, Outcome::Unavailable);
    };
    let task = tokio::spawn(async move {
        let _permit = permit;
        forward(state_for_task, fenced, upstream_req).await
    });
    match task.await {
        Ok(answer) => answer,
        Err(e) => {
            let r = Refusal::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                Stage::Upstream,
                format!("the forwarding task failed: {e}"),
            );
            refused(&state, &r, Outcome::UpstreamFailed)
        }
    }
}

/// The turn, the guard, the upstream call and the record of the operation.
async fn forward(state: Arc<State>, fenced: Fenced, req: Request<Full<Bytes>>) -> Answer {
    let resource = fenced.resource.as_str();
    let token = fenced.token.get();
    let limits = state.limits;
    let turn = match state.turns.turn(resource, limits.turn_wait).await {
        Ok(t) => t,
        Err(no) => {
            return refused(
                &state,
                &busy_refusal(&no, resource, token),
                Outcome::Unavailable,
            )
        }
    };
    match admit_request(state.ledger.as_ref(), state.cluster.as_ref(), &fenced).await {
        Ok(Admitted::Run) => {}
        Ok(Admitted::Duplicate) => {
            state.metrics.count(Outcome::Duplicate);
            return duplicate_response(&fenced, false);
        }
        Err(r) => {
            let outcome = if r.status == StatusCode::CONFLICT {
                Outcome::Stale
            } else {
                Outcome::Unavailable
            };
            return refused(&state, &r, outcome);
        }
    }
    let in_flight = InFlight::start(&state.metrics);
    let started = std::time::Instant::now();
    let sent = tokio::time::timeout(limits.upstream_timeout, async {
        let answer = state.client.request(req).await.map_err(|e| e.to_string())?;
        let (head, body) = answer.into_parts();
        let body = Limited::new(body, limits.max_response_bytes)
            .collect()
            .await
            .map_err(|e| format!("the answer's body failed or exceeded max_response_bytes: {e}"))?
            .to_bytes();
        Ok::<_, String>(answer_to_caller(head, body))
    })
    .await;
    drop(in_flight);
    state.metrics.upstream(started.elapsed());
    let in_doubt = |code: StatusCode, error: &'static str, what: String| {
        tracing::warn!(resource, token, error = %what, "gateway: the upstream's answer is unknown");
        Refusal::new(
            code,
            error,
            Stage::Upstream,
            format!(
                "{resource}: {what}; the upstream may or may not have applied it: retry with \
                 the same operation id (the same idempotency key)"
            ),
        )
        .about(resource, token)
    };
    let answer = match sent {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            let r = in_doubt(
                StatusCode::BAD_GATEWAY,
                "upstream_failed",
                format!("the upstream failed ({e})"),
            );
            return refused(&state, &r, Outcome::UpstreamFailed);
        }
        Err(_) => {
            let r = in_doubt(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                format!(
                    "no upstream answer within {} ms (upstream_timeout_ms)",
                    limits.upstream_timeout.as_millis()
                ),
            );
            return refused(&state, &r, Outcome::UpstreamFailed);
        }
    };
    if answer.status().is_success() {
        let fence = fenced.as_fence(fenced_http::Contract::AtLeast);
        if let Err(e) = state.ledger.complete(&fence).await {
            tracing::warn!(resource, token, error = %e, "gateway: the operation id was not recorded");
        }
        state.metrics.count(Outcome::Forwarded);
    } else {
        state.metrics.count(Outcome::UpstreamRefused);
    }
    drop(turn);
    answer
}
