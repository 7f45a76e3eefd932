//! The tower layer: on every request it guards, the fencing headers are
//! read and the resource's turn is taken; an operation id already applied
//! is answered at once; the token is checked with the lock cluster, then
//! compared with and recorded in the ledger before the handler runs; the
//! turn is held until the answer's body has been sent, and a successful
//! answer records the operation id.

use std::{
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use bytes::Bytes;
use fenced_resource::current::{CurrentCheck, Refusal as ClusterRefusal};
use fenced_sql::{Contract, Verdict};
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{Either, Full};
use tower::{Layer, Service};

use crate::{
    body::{grpc_ok, Completion, TurnBody},
    headers::{parse_headers, Fenced},
    ledger::Ledger,
    refusal::{is_grpc, Refusal, Stage},
    serial::{NoTurn, Serializer},
};

/// The header the layer sets on the answer to an operation id it had
/// already applied (the handler did not run again).
pub const OUTCOME_HEADER: &str = "x-fencing-outcome";

/// The default longest wait for a resource's turn.
pub const DEFAULT_TURN_WAIT: Duration = Duration::from_secs(10);

/// The default bound on resources held or awaited at once.
pub const DEFAULT_MAX_RESOURCES: usize = 65_536;

/// Guards the routes it wraps. Build it once and clone it onto every route
/// of the service: the clones share one ledger and one table of turns
/// (two `build()`s make two tables, which do not order each other).
#[derive(Clone)]
pub struct FenceLayer {
    shared: Arc<Shared>,
}

struct Shared {
    ledger: Arc<dyn Ledger>,
    cluster: Option<CurrentCheck>,
    turns: Serializer,
    turn_wait: Duration,
    require_operation: bool,
}

/// Whether tokens are checked with the lock cluster: one must be chosen.
enum ClusterMode {
    Unset,
    Check(CurrentCheck),
    Standalone,
}

/// Settings of a [`FenceLayer`]; [`FenceLayer::builder`].
pub struct FenceLayerBuilder {
    ledger: Arc<dyn Ledger>,
    cluster: ClusterMode,
    max_resources: usize,
    turn_wait: Duration,
    require_operation: bool,
}

impl FenceLayer {
    /// A layer on `ledger`; choose [`FenceLayerBuilder::cluster_check`] or
    /// [`FenceLayerBuilder::standalone_no_cluster_check`] before
    /// [`FenceLayerBuilder::build`].
    pub fn builder(ledger: impl Ledger) -> FenceLayerBuilder {
        FenceLayerBuilder {
            ledger: Arc::new(ledger),
            cluster: ClusterMode::Unset,
            max_resources: DEFAULT_MAX_RESOURCES,
            turn_wait: DEFAULT_TURN_WAIT,
            require_operation: false,
        }
    }
}

impl FenceLayerBuilder {
    /// Asks the lock cluster that each token is its owner's current lease
    /// before the ledger's compare: a paused owner is refused from the
    /// moment a newer lease is granted, not only once the newer owner has
    /// written, and a token the cluster never issued cannot raise the
    /// ledger's highest.
    pub fn cluster_check(mut self, check: CurrentCheck) -> Self {
        self.cluster = ClusterMode::Check(check);
        self
    }

    /// Believes every token a caller sends: anyone who reaches a guarded
    /// route can then raise a resource's highest token for ever (a token
    /// of 2^63-1 refuses every real one). Only for a service whose callers
    /// are all trusted workers, or tests.
    pub fn standalone_no_cluster_check(mut self) -> Self {
        self.cluster = ClusterMode::Standalone;
        self
    }

    /// The longest a request waits for its resource's turn (1 ms to 10
    /// minutes) before a 503.
    pub fn turn_wait(mut self, wait: Duration) -> Result<Self, String> {
        if wait < Duration::from_millis(1) || wait > Duration::from_secs(600) {
            return Err(format!(
                "turn_wait: must be 1 ms to 600 s, got {} ms",
                wait.as_millis()
            ));
        }
        self.turn_wait = wait;
        Ok(self)
    }

    /// At most this many resources held or awaited at once (1 to
    /// 10,000,000); beyond, 503.
    pub fn max_resources(mut self, n: usize) -> Result<Self, String> {
        if n == 0 || n > 10_000_000 {
            return Err(format!("max_resources: must be 1 to 10000000, got {n}"));
        }
        self.max_resources = n;
        Ok(self)
    }

    /// Requires `x-fencing-operation-id` on every guarded request.
    pub fn require_operation_id(mut self, require: bool) -> Self {
        self.require_operation = require;
        self
    }

    /// The layer, once the cluster mode is chosen.
    pub fn build(self) -> Result<FenceLayer, String> {
        let cluster = match self.cluster {
            ClusterMode::Unset => {
                return Err("cluster_check: choose .cluster_check(...) or \
                            .standalone_no_cluster_check() (every caller's token believed)"
                    .into())
            }
            ClusterMode::Check(c) => Some(c),
            ClusterMode::Standalone => None,
        };
        Ok(FenceLayer {
            shared: Arc::new(Shared {
                ledger: self.ledger,
                cluster,
                turns: Serializer::new(self.max_resources),
                turn_wait: self.turn_wait,
                require_operation: self.require_operation,
            }),
        })
    }
}

impl<S> Layer<S> for FenceLayer {
    type Service = FenceService<S>;

    fn layer(&self, inner: S) -> FenceService<S> {
        FenceService {
            inner,
            shared: Arc::clone(&self.shared),
        }
    }
}

/// A service behind a [`FenceLayer`].
#[derive(Clone)]
pub struct FenceService<S> {
    inner: S,
    shared: Arc<Shared>,
}

/// What the guard decided before the effect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admitted {
    /// Run the effect.
    Run,
    /// The operation id was applied before: answer without running it.
    Duplicate,
}

/// The guard, with the resource's turn held by the caller: an applied
/// operation id first (so an owner whose lease ended still learns its
/// operation happened), then the cluster check when given, then the
/// ledger's compare-and-record (`>=`; a lower token is a 409, a failed
/// ledger a 503).
pub async fn admit_request(
    ledger: &dyn Ledger,
    cluster: Option<&CurrentCheck>,
    fenced: &Fenced,
) -> Result<Admitted, Refusal> {
    let resource = fenced.resource.as_str();
    let token = fenced.token.get();
    let unavailable = |e: fenced_sql::GuardError| {
        tracing::warn!(resource, token, error = %e, "fenced request: the ledger failed");
        Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "ledger_unavailable",
            Stage::LedgerUnavailable,
            format!("{resource}: the ledger failed ({e}); nothing was done, retry"),
        )
        .about(resource, token)
    };
    if let Some(op) = &fenced.operation_id {
        if ledger.applied(resource, op).await.map_err(unavailable)? {
            return Ok(Admitted::Duplicate);
        }
    }
    if let Some(check) = cluster {
        check
            .require(&fenced.resource, fenced.token, fenced.owner)
            .await
            .map_err(|r| cluster_refusal(r).about(resource, token))?;
    }
    let fence = fenced.as_fence(Contract::AtLeast);
    match ledger.admit(&fence).await.map_err(unavailable)? {
        Verdict::Accepted => Ok(Admitted::Run),
        Verdict::Duplicate => Ok(Admitted::Duplicate),
        Verdict::Stale { highest } => {
            tracing::info!(
                resource,
                token,
                highest,
                "fenced request refused: stale token"
            );
            Err(Refusal {
                highest_accepted: Some(highest),
                ..Refusal::new(
                    StatusCode::CONFLICT,
                    "stale_token",
                    Stage::Ledger,
                    format!(
                        "{resource}: token {token} is stale: token {highest} was accepted; \
                         final, do not retry with this token"
                    ),
                )
                .about(resource, token)
            })
        }
    }
}

/// The cluster check's refusal as an HTTP one.
pub fn cluster_refusal(r: ClusterRefusal) -> Refusal {
    match r {
        ClusterRefusal::NotCurrent {
            current_token,
            message,
            ..
        } => Refusal {
            current_token: Some(current_token),
            ..Refusal::new(StatusCode::CONFLICT, "not_current", Stage::Cluster, message)
        },
        ClusterRefusal::Unavailable(m) | ClusterRefusal::Exhausted(m) => Refusal::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "cluster_unavailable",
            Stage::ClusterUnavailable,
            m,
        ),
    }
}

/// The refusal for a turn not given.
pub fn busy_refusal(no: &NoTurn, resource: &str, token: u64) -> Refusal {
    let message = match no {
        NoTurn::Full(n) => {
            format!("{resource}: {n} resources are in use (max_resources); nothing was done, retry")
        }
        NoTurn::Waited(w) => format!(
            "{resource}: its turn did not come within {} ms (turn_wait); nothing was done, retry",
            w.as_millis()
        ),
    };
    Refusal::new(
        StatusCode::SERVICE_UNAVAILABLE,
        "busy",
        Stage::Busy,
        message,
    )
    .about(resource, token)
}

/// The answer to an operation id already applied: HTTP 200 with
/// `x-fencing-outcome: already-applied` and a JSON body naming resource,
/// token and operation id; for gRPC, ALREADY_EXISTS with that JSON as its
/// message.
pub fn duplicate_response(fenced: &Fenced, grpc: bool) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "outcome": "already_applied",
        "resource": fenced.resource.as_str(),
        "presented_token": fenced.token.get(),
        "operation_id": fenced.operation_id,
    })
    .to_string();
    let mut r = if grpc {
        crate::refusal::grpc_answer(6, &body)
    } else {
        let mut r = Response::new(Full::new(Bytes::from(body)));
        r.headers_mut().insert(
            http::header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        r
    };
    r.headers_mut()
        .insert(OUTCOME_HEADER, HeaderValue::from_static("already-applied"));
    r
}

type BoxFuture<T> = std::pin::Pin<Box<dyn std::future::Future<Output = T> + Send>>;

impl<S, ReqBody, ResBody> Service<Request<ReqBody>> for FenceService<S>
where
    S: Service<Request<ReqBody>, Response = Response<ResBody>> + Clone + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    ReqBody: Send + 'static,
    ResBody: Send + 'static,
{
    type Response = Response<Either<TurnBody<ResBody>, Full<Bytes>>>;
    type Error = S::Error;
    type Future = BoxFuture<Result<Self::Response, S::Error>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut req: Request<ReqBody>) -> Self::Future {
        // The clone that was polled ready serves this request.
        let fresh = self.inner.clone();
        let mut inner = std::mem::replace(&mut self.inner, fresh);
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            let grpc = is_grpc(req.headers());
            let refuse = |r: Refusal| Ok(r.response(grpc).map(Either::Right));
            let fenced = match parse_headers(req.headers(), shared.require_operation) {
                Ok(f) => f,
                Err(r) => return refuse(r),
            };
            let resource = fenced.resource.as_str();
            let token = fenced.token.get();
            let turn = match shared.turns.turn(resource, shared.turn_wait).await {
                Ok(turn) => turn,
                Err(no) => return refuse(busy_refusal(&no, resource, token)),
            };
            match admit_request(shared.ledger.as_ref(), shared.cluster.as_ref(), &fenced).await {
                Err(r) => return refuse(r),
                Ok(Admitted::Duplicate) => {
                    return Ok(duplicate_response(&fenced, grpc).map(Either::Right))
                }
                Ok(Admitted::Run) => {}
            }
            req.extensions_mut().insert(fenced.clone());
            let answer = inner.call(req).await?;
            let completion = Completion {
                ledger: Arc::clone(&shared.ledger),
                fenced: fenced.clone(),
            };
            let has_op = fenced.operation_id.is_some();
            // An HTTP answer's status says whether the effect happened; a
            // gRPC call's says so in its trailers (or a trailers-only head).
            let on_grpc_ok = if grpc && has_op && !grpc_ok(answer.headers()) {
                Some(completion)
            } else {
                let done = if grpc {
                    grpc_ok(answer.headers())
                } else {
                    answer.status().is_success()
                };
                if done && has_op {
                    let fence = fenced.as_fence(Contract::AtLeast);
                    if let Err(e) = shared.ledger.complete(&fence).await {
                        // The effect happened; a retry will run it again.
                        tracing::warn!(resource, token, error = %e,
                            "fenced request: the operation id was not recorded");
                    }
                }
                None
            };
            Ok(answer.map(|b| Either::Left(TurnBody::new(b, turn, on_grpc_ok))))
        })
    }
}
