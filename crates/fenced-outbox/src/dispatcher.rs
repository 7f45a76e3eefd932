//! The dispatcher: one active instance per name, by a fenced lease; it
//! delivers pending operations in sequence order and records each outcome
//! under its own token.

use std::{sync::Arc, time::Duration};

use fenced_client::{Client, ClientError, Lease};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn, Instrument};

use crate::{
    decide::{after_attempt, superseded, Mark, RetryPolicy},
    metrics::Metrics,
    store::stale_of,
    Deliver, DispatcherFence, MarkOutcome, OutboxError, Pending, Store,
};

/// The prefix of the dispatcher's lock resource: `outbox-dispatcher:<name>`.
pub const RESOURCE_PREFIX: &str = "outbox-dispatcher:";

/// How long one wait for the lease lasts on the server before the standby
/// asks again (and sees a shutdown).
const STANDBY_WAIT: Duration = Duration::from_secs(5);
/// The pause after the cluster or the database failed.
const FAILURE_PAUSE: Duration = Duration::from_secs(1);

/// How a dispatcher runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// The dispatcher's name: one active dispatcher per name.
    pub name: String,
    /// The TTL of its lease: how soon a standby takes over from a
    /// dispatcher that died.
    pub lease_ttl: Duration,
    /// How often an idle active dispatcher looks for due operations.
    pub poll_interval: Duration,
    /// Most operations taken per look.
    pub batch: u32,
    pub retry: RetryPolicy,
}

impl Settings {
    /// `name`, a 10 s lease, a 200 ms poll, batches of 32, the default
    /// retry policy.
    pub fn new(name: &str) -> Settings {
        Settings {
            name: name.to_string(),
            lease_ttl: Duration::from_secs(10),
            poll_interval: Duration::from_millis(200),
            batch: 32,
            retry: RetryPolicy::default(),
        }
    }

    /// The lock resource, `outbox-dispatcher:<name>`.
    ///
    /// ```
    /// assert_eq!(fenced_outbox::Settings::new("billing").resource(), "outbox-dispatcher:billing");
    /// ```
    pub fn resource(&self) -> String {
        format!("{RESOURCE_PREFIX}{}", self.name)
    }

    /// Checks the name and the batch; the error names the field.
    pub fn validate(&self) -> Result<(), OutboxError> {
        let max = fenced_sql::RESOURCE_MAX_BYTES.saturating_sub(RESOURCE_PREFIX.len());
        if self.name.is_empty() || self.name.len() > max {
            return Err(OutboxError::invalid(
                "name",
                format!("must be 1 to {max} bytes, got {}", self.name.len()),
            ));
        }
        if self.batch == 0 {
            return Err(OutboxError::invalid("batch", "must be at least 1, got 0"));
        }
        Ok(())
    }
}

/// Why a dispatcher stopped for good.
#[derive(Debug, thiserror::Error)]
pub enum DispatchError {
    #[error(transparent)]
    Outbox(#[from] OutboxError),
    /// The cluster refused in a way waiting cannot fix (credentials, TLS,
    /// an endpoint).
    #[error("cluster: {0}")]
    Cluster(#[from] ClientError),
    #[error("the database connection is closed")]
    DatabaseClosed,
}

/// Why an active period ended.
#[derive(Debug)]
enum Leave {
    Shutdown,
    /// The lease is lost (the newer dispatcher delivers the rest).
    Lost,
    /// A mark was refused: a newer dispatcher marked since.
    Superseded(u64),
}

/// What to do after one operation.
enum Step {
    Next,
    /// Stop this batch; look again after the poll interval.
    Pause,
    Leave(Leave),
}

/// The dispatcher: a fenced lease on `outbox-dispatcher:<name>`, then the
/// delivery loop while it holds it.
pub struct Dispatcher<D> {
    client: Client,
    store: Store,
    deliver: D,
    settings: Settings,
    metrics: Arc<Metrics>,
}

impl<D: Deliver> Dispatcher<D> {
    pub fn new(
        client: Client,
        store: Store,
        deliver: D,
        settings: Settings,
    ) -> Result<Dispatcher<D>, OutboxError> {
        settings.validate()?;
        Ok(Dispatcher {
            client,
            store,
            deliver,
            settings,
            metrics: Arc::new(Metrics::default()),
        })
    }

    /// Its counters and state, for `/metrics`.
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// Waits for the lease, delivers while it holds it, waits again when it
    /// is lost; returns when `shutdown` fires (releasing the lease) or on
    /// an error waiting cannot fix.
    pub async fn run(&self, shutdown: CancellationToken) -> Result<(), DispatchError> {
        let resource = self.settings.resource();
        let mut term: u64 = 0;
        loop {
            if shutdown.is_cancelled() {
                return Ok(());
            }
            let lock = self
                .client
                .lock(&resource, self.settings.lease_ttl, STANDBY_WAIT);
            tokio::pin!(lock);
            let taken = tokio::select! {
                biased;
                _ = shutdown.cancelled() => {
                    // A request already sent may still be granted: dropping
                    // it would leave a lease nobody releases, held for its
                    // whole TTL. The wait is bounded, so see it through and
                    // give back whatever it brought.
                    if let Ok(lease) = lock.await {
                        release(lease).await;
                    }
                    return Ok(());
                }
                taken = &mut lock => taken,
            };
            match taken {
                Ok(lease) => {
                    term = term.saturating_add(1);
                    let span = tracing::info_span!(
                        "dispatcher",
                        resource = %resource,
                        token = lease.token().get(),
                        term
                    );
                    self.active(lease, &shutdown).instrument(span).await?;
                }
                Err(ClientError::NotGranted { current_token, .. }) => {
                    debug!(%resource, current_token = current_token.get(), "standing by");
                }
                Err(
                    e @ (ClientError::InvalidArgument(_)
                    | ClientError::Unauthenticated(_)
                    | ClientError::PermissionDenied(_)
                    | ClientError::Endpoint { .. }
                    | ClientError::Tls(_)),
                ) => return Err(e.into()),
                Err(e) => {
                    warn!(%resource, error = %e, "could not ask for the lease; trying again");
                    pause(FAILURE_PAUSE, &shutdown).await;
                }
            }
        }
    }

    /// One period as the active dispatcher.
    async fn active(
        &self,
        lease: Lease,
        shutdown: &CancellationToken,
    ) -> Result<(), DispatchError> {
        let fence = DispatcherFence {
            resource: lease.resource().to_string(),
            token: lease.token().get(),
            owner_id: lease.owner_id().to_string(),
        };
        debug!(owner_id = %fence.owner_id, "lease granted");
        match self.store.claim(&fence).await {
            Ok(verdict) => {
                if let Some(highest) = stale_of(verdict) {
                    // The database saw a newer token than the cluster just
                    // granted (another cluster, or one restored from an old
                    // backup, against this database): nothing may be marked.
                    tracing::error!(
                        highest,
                        "the database holds a newer dispatcher token than this grant; standing down"
                    );
                    release(lease).await;
                    pause(FAILURE_PAUSE, shutdown).await;
                    return Ok(());
                }
            }
            Err(e) => {
                warn!(error = %e, "could not claim the outbox; letting the lease go");
                release(lease).await;
                pause(FAILURE_PAUSE, shutdown).await;
                return Ok(());
            }
        }
        info!("active: delivering");
        self.metrics.set_active(Some(fence.token));
        let leave = self.deliver_while_held(&lease, &fence, shutdown).await;
        self.metrics.set_active(None);
        match leave {
            Ok(Leave::Shutdown) => {
                info!("shutting down: releasing the lease");
                release(lease).await;
            }
            Ok(Leave::Lost) => warn!(reason = ?lease.check().err(), "lease lost: standing by"),
            Ok(Leave::Superseded(highest)) => {
                warn!(
                    highest,
                    "a mark was refused: a newer dispatcher took over; standing by"
                );
            }
            Err(e) => return Err(e),
        }
        Ok(())
    }

    async fn deliver_while_held(
        &self,
        lease: &Lease,
        fence: &DispatcherFence,
        shutdown: &CancellationToken,
    ) -> Result<Leave, DispatchError> {
        let lost = lease.cancellation();
        loop {
            if shutdown.is_cancelled() {
                return Ok(Leave::Shutdown);
            }
            if lease.check().is_err() {
                return Ok(Leave::Lost);
            }
            if self.store.is_closed() {
                return Err(DispatchError::DatabaseClosed);
            }
            let batch = match self.store.ready(self.settings.batch).await {
                Ok(batch) => batch,
                Err(e) => {
                    warn!(error = %e, "could not read the outbox");
                    Vec::new()
                }
            };
            let mut paused = batch.is_empty();
            for op in &batch {
                match self.one(lease, fence, op).await {
                    Step::Next => {}
                    Step::Pause => {
                        paused = true;
                        break;
                    }
                    Step::Leave(why) => return Ok(why),
                }
            }
            if paused {
                tokio::select! {
                    _ = shutdown.cancelled() => {}
                    _ = lost.cancelled() => {}
                    _ = tokio::time::sleep(self.settings.poll_interval) => {}
                }
            }
        }
    }

    /// Delivers one operation (or skips it as superseded) and marks it.
    async fn one(&self, lease: &Lease, fence: &DispatcherFence, op: &Pending) -> Step {
        let lost = lease.cancellation();
        if lease.check().is_err() {
            return Step::Leave(Leave::Lost);
        }
        let mark = if let Some(newer) = superseded(op.token, op.earlier_max_token) {
            Mark::Superseded { newer }
        } else {
            let outcome = tokio::select! {
                biased;
                // Abandoned: still pending, the next dispatcher sends it again.
                _ = lost.cancelled() => return Step::Leave(Leave::Lost),
                outcome = self.deliver.deliver(op) => outcome,
            };
            if lease.check().is_err() {
                return Step::Leave(Leave::Lost);
            }
            let attempt = op.attempts.saturating_add(1);
            after_attempt(&outcome, attempt, &self.settings.retry, fastrand::f64())
        };
        match self.store.mark(fence, op.sequence, &mark).await {
            Ok(MarkOutcome::Marked) => {
                self.metrics.count(&mark);
                let state = mark.state();
                let attempts = op.attempts.saturating_add(u32::from(mark.counts_attempt()));
                match &mark {
                    Mark::Delivered => {
                        info!(sequence = op.sequence, op.resource = %op.resource, op.token = op.token, key = %op.idempotency_key, attempts, "delivered")
                    }
                    Mark::Retry { delay, error } => {
                        info!(sequence = op.sequence, op.resource = %op.resource, op.token = op.token, key = %op.idempotency_key, attempts, ?delay, %error, "will retry")
                    }
                    Mark::Failed { reason } => {
                        warn!(sequence = op.sequence, op.resource = %op.resource, op.token = op.token, key = %op.idempotency_key, attempts, %reason, "failed")
                    }
                    Mark::Superseded { newer } => {
                        warn!(sequence = op.sequence, op.resource = %op.resource, op.token = op.token, key = %op.idempotency_key, newer, "superseded: not delivered")
                    }
                }
                debug!(sequence = op.sequence, state, "marked");
                Step::Next
            }
            Ok(MarkOutcome::NotPending) => {
                debug!(sequence = op.sequence, "no longer pending: left as it is");
                Step::Next
            }
            Ok(MarkOutcome::Stale { highest }) => Step::Leave(Leave::Superseded(highest)),
            Err(e) => {
                warn!(sequence = op.sequence, error = %e, "could not mark; it stays pending");
                Step::Pause
            }
        }
    }
}

async fn release(lease: Lease) {
    if let Err(e) = lease.release().await {
        warn!(error = %e, "releasing the lease failed (it expires by its TTL)");
    }
}

async fn pause(d: Duration, shutdown: &CancellationToken) {
    tokio::select! {
        _ = shutdown.cancelled() => {}
        _ = tokio::time::sleep(d) => {}
    }
}
