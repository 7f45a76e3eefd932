//! The gRPC health protocol (`grpc.health.v1`) for load balancers and
//! orchestrators, fed by openraft's metrics; and the client side of it, for
//! `fenced healthcheck`.
//!
//! The overall service (`""`) and the lock and cluster services are SERVING
//! only while this node is a member of a cluster that has a leader it knows
//! of: that is when a request sent here can be answered. A leader counts only
//! while a quorum has acknowledged it recently: openraft does not make a
//! leader cut off from its followers step down, and such a leader cannot
//! commit anything. The `liveness`
//! service is SERVING for as long as the process answers at all, so a
//! liveness probe does not restart nodes that merely lost their quorum.

use std::{
    sync::{atomic::Ordering::Relaxed, Arc},
    time::{Duration, Instant},
};

use openraft::ServerState;
use tokio_util::sync::CancellationToken;
use tonic::transport::{Certificate, ClientTlsConfig, Endpoint, Identity};
use tonic_health::{
    pb::{health_check_response, health_client::HealthClient, HealthCheckRequest},
    server::HealthReporter,
    ServingStatus,
};

use crate::{
    counters::Counters,
    security::tls::TlsSettings,
    types::{Node, NodeId, Raft},
};

/// Services that are SERVING only while a leader is known.
pub const READY_SERVICES: [&str; 3] = ["", "fenced.v1.Lock", "fenced.v1.Cluster"];
/// The service that is SERVING while the process runs.
pub const LIVENESS_SERVICE: &str = "liveness";

/// How often the statuses are re-evaluated when Raft reports nothing new.
const RECHECK: Duration = Duration::from_millis(200);

/// What the health of a node is decided from.
struct View {
    state: ServerState,
    /// `(term, leader id)` while a leader is known.
    leader: Option<(u64, NodeId)>,
    member: bool,
    /// As leader: when a quorum last acknowledged this node.
    quorum_ack: Option<Instant>,
}

impl View {
    fn of(m: &openraft::RaftMetrics<NodeId, Node>, id: NodeId) -> Self {
        let now = Instant::now();
        Self {
            state: m.state,
            leader: m.current_leader.map(|l| (m.current_term, l)),
            member: m.membership_config.membership().get_node(&id).is_some(),
            quorum_ack: m
                .millis_since_quorum_ack
                .map(|ms| now.checked_sub(Duration::from_millis(ms)).unwrap_or(now)),
        }
    }

    /// Whether a request sent to this node can be answered.
    fn ready(&self, quorum_timeout: Duration) -> bool {
        let leader_ok = match self.state {
            ServerState::Leader => self
                .quorum_ack
                .is_some_and(|t| t.elapsed() <= quorum_timeout),
            ServerState::Shutdown => false,
            _ => true,
        };
        leader_ok && self.leader.is_some() && self.member
    }
}

/// Keeps the health statuses in step with Raft and counts leader changes,
/// until `stop` is cancelled or Raft shuts down. As leader, this node is
/// SERVING only while a quorum acknowledged it within `quorum_timeout`.
pub async fn watch(
    raft: Raft,
    id: NodeId,
    reporter: HealthReporter,
    counters: Arc<Counters>,
    quorum_timeout: Duration,
    stop: CancellationToken,
) {
    reporter
        .set_service_status(LIVENESS_SERVICE, ServingStatus::Serving)
        .await;
    let mut metrics = raft.metrics();
    let mut recheck = tokio::time::interval(RECHECK);
    recheck.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut view = View::of(&metrics.borrow_and_update(), id);
    let mut last_serving = None;
    let mut last_leader: Option<(u64, NodeId)> = None;
    loop {
        let serving = view.ready(quorum_timeout);
        if view.leader.is_some() && view.leader != last_leader {
            counters.leader_changes.fetch_add(1, Relaxed);
            last_leader = view.leader;
        }
        if last_serving != Some(serving) {
            let status = if serving {
                ServingStatus::Serving
            } else {
                ServingStatus::NotServing
            };
            for service in READY_SERVICES {
                reporter.set_service_status(service, status).await;
            }
            tracing::info!(node = id, serving, "health status");
            last_serving = Some(serving);
        }
        tokio::select! {
            _ = stop.cancelled() => break,
            changed = metrics.changed() => {
                if changed.is_err() {
                    break;
                }
                view = View::of(&metrics.borrow_and_update(), id);
            }
            _ = recheck.tick() => {}
        }
    }
    for service in READY_SERVICES.into_iter().chain([LIVENESS_SERVICE]) {
        reporter
            .set_service_status(service, ServingStatus::NotServing)
            .await;
    }
}

/// An error with its causes, `outer: inner: ...`.
fn causes(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut last = text.clone();
    let mut source = e.source();
    while let Some(cause) = source {
        let this = cause.to_string();
        // Some layers repeat their inner error's message word for word.
        if this != last {
            text = format!("{text}: {this}");
        }
        last = this;
        source = cause.source();
    }
    text
}

/// A status as the health protocol reports it.
pub type CheckedStatus = health_check_response::ServingStatus;

/// Asks `endpoint` (host:port) for the health of `service`; the whole call
/// takes at most `timeout`. With `tls`, over TLS showing that certificate
/// (a node's own will do on both of its ports).
pub async fn check(
    endpoint: &str,
    service: &str,
    timeout: Duration,
    tls: Option<&TlsSettings>,
) -> Result<CheckedStatus, String> {
    let call = async {
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut channel = Endpoint::from_shared(format!("{scheme}://{endpoint}"))
            .map_err(|e| format!("endpoint: {endpoint:?} is not host:port ({e})"))?;
        if let Some(t) = tls {
            let read =
                |p: &std::path::Path| std::fs::read(p).map_err(|e| format!("{}: {e}", p.display()));
            channel = channel
                .tls_config(
                    ClientTlsConfig::new()
                        .ca_certificate(Certificate::from_pem(read(&t.ca)?))
                        .identity(Identity::from_pem(read(&t.cert)?, read(&t.key)?)),
                )
                .map_err(|e| format!("TLS: {}", causes(&e)))?;
        }
        let channel = channel
            .connect_timeout(timeout)
            .timeout(timeout)
            .connect()
            .await
            .map_err(|e| format!("cannot connect to {endpoint}: {}", causes(&e)))?;
        let reply = HealthClient::new(channel)
            .check(HealthCheckRequest {
                service: service.to_string(),
            })
            .await
            .map_err(|e| format!("{endpoint}: {}", e.message()))?;
        let status = reply.into_inner().status;
        CheckedStatus::try_from(status)
            .map_err(|_| format!("{endpoint}: unknown serving status {status}"))
    };
    tokio::time::timeout(timeout, call)
        .await
        .map_err(|_| format!("{endpoint}: no answer within {} ms", timeout.as_millis()))?
}
