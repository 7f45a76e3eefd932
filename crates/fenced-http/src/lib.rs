//! Fencing for your own HTTP service.
//!
//! A lease from fenced tells a worker it may start; the service that applies
//! its request must refuse a worker that paused past its lease. Wrap the
//! routes that apply effects in a [`FenceLayer`] (a tower layer: axum,
//! hyper through `tower::ServiceBuilder`, tonic's `Server::layer`):
//!
//! 1. each request must carry `x-fencing-resource`, `x-fencing-token` and
//!    `x-fencing-owner` (and, for retries, `x-fencing-operation-id`);
//!    anything missing or out of bounds is a 400 naming the header;
//! 2. the resource's turn is taken, and held until the answer's body has
//!    been sent: one guarded request per resource at a time in this process,
//!    so an older token's handler never runs while or after a newer one's;
//!    an operation id already applied is answered `already_applied` at once;
//! 3. optionally the lock cluster confirms the token is its owner's current
//!    lease ([`FenceLayerBuilder::cluster_check`]): a paused owner is
//!    refused as soon as a newer lease exists;
//! 4. the ledger ([`SqliteLedger`], [`PostgresLedger`]) compares the token
//!    with the highest it accepted and records it, durably, before the
//!    handler runs (`>=`: one owner may send many requests); a lower token
//!    is a 409 whose JSON names the resource, the presented token, the
//!    highest accepted and the stage;
//! 5. the handler runs with the [`Fenced`] request extension; a 2xx answer
//!    (gRPC: status OK in the trailers) records the operation id, and a
//!    retry of it is answered `already_applied` without running the handler.
//!
//! ```no_run
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use fenced_http::{FenceLayer, SqliteLedger};
//! let ledger = SqliteLedger::open(std::path::Path::new("/var/lib/app/fences.db"))?;
//! let layer = FenceLayer::builder(ledger).standalone_no_cluster_check().build()?;
//! // axum: Router::new().route("/statements", post(handler)).layer(layer)
//! # let _ = layer; Ok(()) }
//! ```

mod body;
mod headers;
mod layer;
mod ledger;
mod refusal;
mod serial;

pub use body::TurnBody;
pub use fenced_sql::{Contract, Verdict};
pub use headers::{
    parse_headers, Fenced, OPERATION_HEADER, OWNER_HEADER, RESOURCE_HEADER, TOKEN_HEADER, TOKEN_MAX,
};
pub use layer::{
    admit_request, busy_refusal, cluster_refusal, duplicate_response, Admitted, FenceLayer,
    FenceLayerBuilder, FenceService, DEFAULT_MAX_RESOURCES, DEFAULT_TURN_WAIT, OUTCOME_HEADER,
};
pub use ledger::{Ledger, LedgerFuture, PostgresLedger, SqliteLedger, POSTGRES_SESSIONS_MAX};
pub use refusal::{grpc_answer, is_grpc, Refusal, Stage};
pub use serial::{NoTurn, Serializer, Turn};
