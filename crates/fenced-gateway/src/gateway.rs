//! One request through the gateway: authenticate, read the body (bounded),
//! take the resource's turn, check the token with the lock cluster, compare
//! and record it in the ledger (durable), forward with the derived
//! idempotency key, record the operation once the upstream took it.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use fenced_http::{
    admit_in_ledger, busy_refusal, cluster_refusal, duplicate_response, parse_headers, Admitted,
    Contract, Ledger, Refusal, Serializer, Stage,
};
use fenced_resource::current::CurrentCheck;
use fenced_server::auth::{Auth, Permission, Principal};
use http::{HeaderValue, Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};

use crate::{
    key::idempotency_key,
    metrics::{Metrics, Outcome},
    upstream::{upstream_request, UpstreamClient},
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
    pub contract: Contract,
    pub limits: Limits,
    pub metrics: Arc<Metrics>,
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

/// Serves one request.
pub async fn handle(
    state: Arc<State>,
    req: Request<hyper::body::Incoming>,
    peer: Option<Principal>,
) -> Answer {
    let (parts, body) = req.into_parts();
    let fenced = match parse_headers(&parts.headers, true) {
        Ok(f) => f,
        Err(r) => return refused(&state, &r, Outcome::BadRequest),
    };
    let resource = fenced.resource.as_str();
    let token = fenced.token.get();
    if let Err(status) = state.auth.authorize_http_on(
        &parts.headers,
        peer.as_ref(),
        Permission::Lock,
        "gateway forward",
        Some(resource),
    ) {
        let (code, error, stage) = if status.code() == tonic_unauthenticated() {
            (
                StatusCode::UNAUTHORIZED,
                "unauthenticated",
                Stage::Permission,
            )
        } else {
            (
                StatusCode::FORBIDDEN,
                "permission_denied",
                Stage::Permission,
            )
        };
        let r =
            Refusal::new(code, error, stage, status.message().to_string()).about(resource, token);
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
    if let Some(check) = &state.cluster {
        if let Err(r) = check
            .require(&fenced.resource, fenced.token, fenced.owner)
            .await
        {
            let r = cluster_refusal(r).about(resource, token);
            let outcome = if r.status == StatusCode::CONFLICT {
                Outcome::Stale
            } else {
                Outcome::Unavailable
            };
            return refused(&state, &r, outcome);
        }
    }
    match admit_in_ledger(state.ledger.as_ref(), &fenced, state.contract).await {
        Ok(Admitted::Run) => {}
        Ok(Admitted::Duplicate) => {
            state.metrics.count(Outcome::Duplicate);
            return duplicate_response(&fenced);
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
    let fence = fenced.as_fence(state.contract);
    let op = fenced.operation_id.as_deref().unwrap_or_default();
    let key = idempotency_key(resource, token, op);
    let path = parts
        .uri
        .path_and_query()
        .map_or("/", |p| p.as_str())
        .to_string();
    let upstream_req = match upstream_request(
        &state.upstream,
        parts.method,
        &path,
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
    state.metrics.in_flight(true);
    let started = std::time::Instant::now();
    let sent = tokio::time::timeout(limits.upstream_timeout, async {
        let answer = state
            .client
            .request(upstream_req)
            .await
            .map_err(|e| e.to_string())?;
        let (head, body) = answer.into_parts();
        let body = Limited::new(body, limits.max_response_bytes)
            .collect()
            .await
            .map_err(|e| format!("the answer's body failed or exceeded max_response_bytes: {e}"))?
            .to_bytes();
        Ok::<_, String>(Response::from_parts(head, Full::new(body)))
    })
    .await;
    state.metrics.in_flight(false);
    state.metrics.upstream(started.elapsed());
    let answer = match sent {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            tracing::warn!(resource, token, error = %e, "gateway: the upstream failed");
            let r = Refusal::new(
                StatusCode::BAD_GATEWAY,
                "upstream_failed",
                Stage::Upstream,
                format!("{resource}: the upstream failed ({e}); retry with the same operation id"),
            )
            .about(resource, token);
            return refused(&state, &r, Outcome::UpstreamFailed);
        }
        Err(_) => {
            let r = Refusal::new(
                StatusCode::GATEWAY_TIMEOUT,
                "upstream_timeout",
                Stage::Upstream,
                format!(
                    "{resource}: no upstream answer within {} ms (upstream_timeout_ms); retry \
                     with the same operation id",
                    limits.upstream_timeout.as_millis()
                ),
            )
            .about(resource, token);
            return refused(&state, &r, Outcome::UpstreamFailed);
        }
    };
    if answer.status().is_success() {
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

fn tonic_unauthenticated() -> tonic::Code {
    tonic::Code::Unauthenticated
}
