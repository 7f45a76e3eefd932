//! The tower layer: on every request it guards, the fencing headers are
//! read, the resource's turn is taken, the token is checked against the
//! lock cluster (when set) and compared with, then recorded in, the ledger
//! before the handler runs; the turn is held until the handler answers, and
//! a 2xx answer records the operation id.

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

/// Guards the routes it wraps. Cheap to clone; every clone shares one
/// ledger and one table of turns.
#[derive(Clone)]
pub struct FenceLayer {
    shared: Arc<Shared>,
}

struct Shared {
    ledger: Arc<dyn Ledger>,
    contract: Contract,
    cluster: Option<CurrentCheck>,
    turns: Serializer,
    turn_wait: Duration,
    require_operation: bool,
}

/// Settings of a [`FenceLayer`]; [`FenceLayer::builder`].
pub struct FenceLayerBuilder {
    ledger: Arc<dyn Ledger>,
    contract: Contract,
    cluster: Option<CurrentCheck>,
    max_resources: usize,
    turn_wait: Duration,
    require_operation: bool,
}

impl FenceLayer {
    /// A layer on `ledger`, `>=` contract, no cluster check: see the
    /// builder's methods.
    pub fn builder(ledger: impl Ledger) -> FenceLayerBuilder {
        FenceLayerBuilder {
            ledger: Arc::new(ledger),
            contract: Contract::AtLeast,
            cluster: None,
            max_resources: DEFAULT_MAX_RESOURCES,
            turn_wait: DEFAULT_TURN_WAIT,
            require_operation: false,
        }
    }
}

impl FenceLayerBuilder {
    /// `>=` (one owner, many writes; the default) or `>` (one write per
    /// acquisition).
    pub fn contract(mut self, contract: Contract) -> Self {
        self.contract = contract;
        self
    }

    /// Asks the lock cluster that each token is its owner's current lease
    /// before the ledger's compare: a paused owner is refused from the
    /// moment a newer lease is granted, not only once the newer owner has
    /// written, and a token the cluster never issued cannot raise the
    /// ledger's highest.
    pub fn cluster_check(mut self, check: CurrentCheck) -> Self {
        self.cluster = Some(check);
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

    /// The layer.
    pub fn build(self) -> FenceLayer {
        FenceLayer {
            shared: Arc::new(Shared {
                ledger: self.ledger,
                contract: self.contract,
                cluster: self.cluster,
                turns: Serializer::new(self.max_resources),
                turn_wait: self.turn_wait,
                require_operation: self.require_operation,
            }),
        }
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
    /// Run the handler.
    Run,
    /// Already applied: answer without running it.
    Duplicate,
}

impl Shared {
    /// Everything before the handler, with the turn held by the caller.
    async fn admit(&self, fenced: &Fenced) -> Result<Admitted, Refusal> {
        let resource = fenced.resource.as_str();
        let token = fenced.token.get();
        if let Some(check) = &self.cluster {
            check
                .require(&fenced.resource, fenced.token, fenced.owner)
                .await
                .map_err(|r| cluster_refusal(r).about(resource, token))?;
        }
        admit_in_ledger(self.ledger.as_ref(), fenced, self.contract).await
    }
}

/// The ledger's compare-and-record as the layer and the gateway answer
/// it: run, already applied, or a refusal (409 stale, 503 ledger failed).
pub async fn admit_in_ledger(
    ledger: &dyn Ledger,
    fenced: &Fenced,
    contract: Contract,
) -> Result<Admitted, Refusal> {
    let resource = fenced.resource.as_str();
    let token = fenced.token.get();
    let fence = fenced.as_fence(contract);
    match ledger.admit(&fence).await {
        Ok(Verdict::Accepted) => Ok(Admitted::Run),
        Ok(Verdict::Duplicate) => Ok(Admitted::Duplicate),
        Ok(Verdict::Stale { highest }) => {
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
                        "{resource}: token {token} is stale: token {highest} was accepted \
                         (contract {contract}); final, do not retry with this token"
                    ),
                )
                .about(resource, token)
            })
        }
        Err(e) => {
            tracing::warn!(resource, token, error = %e, "fenced request: the ledger failed");
            Err(Refusal::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "ledger_unavailable",
                Stage::LedgerUnavailable,
                format!("{resource}: the ledger failed ({e}); nothing was done, retry"),
            )
            .about(resource, token))
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

/// The answer to an operation id already applied (200, `x-fencing-outcome:
/// already-applied`, a JSON body naming resource, token and operation id).
pub fn duplicate_response(fenced: &Fenced) -> Response<Full<Bytes>> {
    let body = serde_json::json!({
        "outcome": "already_applied",
        "resource": fenced.resource.as_str(),
        "presented_token": fenced.token.get(),
        "operation_id": fenced.operation_id,
    })
    .to_string();
    let mut r = Response::new(Full::new(Bytes::from(body)));
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
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
    type Response = Response<Either<ResBody, Full<Bytes>>>;
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
            match shared.admit(&fenced).await {
                Err(r) => return refuse(r),
                Ok(Admitted::Duplicate) => {
                    return Ok(duplicate_response(&fenced).map(Either::Right))
                }
                Ok(Admitted::Run) => {}
            }
            req.extensions_mut().insert(fenced.clone());
            let answer = inner.call(req).await?;
            if answer.status().is_success() && fenced.operation_id.is_some() {
                let fence = fenced.as_fence(shared.contract);
                if let Err(e) = shared.ledger.complete(&fence).await {
                    // The effect happened; a retry will run it again.
                    tracing::warn!(resource, token, error = %e,
                        "fenced request: the operation id was not recorded");
                }
            }
            drop(turn);
            Ok(answer.map(Either::Left))
        })
    }
}
