//! Leases that renew themselves and say, at once, when they are lost.

use std::{
    fmt,
    future::Future,
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use fenced_core::{LostReason, OwnerId, ReleaseOutcome, RenewOutcome, Token};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::{clock::Moment, AcquireOutcome, Client, ClientError, RenewItem};

/// How a lease's keeper renews it and how early it gives up.
///
/// ```
/// use std::time::Duration;
/// use fenced_client::LeaseOptions;
/// let opts = LeaseOptions::default();
/// let ttl = Duration::from_secs(30);
/// assert_eq!(opts.renew_interval(ttl), Duration::from_secs(10));
/// assert_eq!(opts.safety_margin(ttl), Duration::from_secs(3));
/// ```
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LeaseOptions {
    /// How often to renew; default a third of the TTL (jittered by ±10%).
    pub renew_every: Option<Duration>,
    /// Taken off the TTL for the local deadline; default a tenth of the TTL,
    /// at least 100 ms. Covers clock-rate differences between this host and
    /// the cluster's leader.
    pub margin: Option<Duration>,
    /// Renew exactly every `renew_every`, without the ±10% that keeps many
    /// clients from renewing in lockstep.
    pub no_jitter: bool,
}

impl LeaseOptions {
    pub fn renew_interval(&self, ttl: Duration) -> Duration {
        self.renew_every.unwrap_or(ttl / 3)
    }

    pub fn safety_margin(&self, ttl: Duration) -> Duration {
        self.margin
            .unwrap_or((ttl / 10).max(Duration::from_millis(100)))
            .min(ttl)
    }
}

/// Why a [`Lease`] ended for this client: the cluster's own reason when it
/// refused a renewal, or what the client saw itself.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseLoss {
    /// The cluster refused a renewal: the lease had expired, was released or
    /// was granted to a newer owner.
    Refused(LostReason),
    /// The local deadline passed without a successful renewal (the cluster
    /// was unreachable, or this process was paused). The cluster's own
    /// expiry is later, so nobody else can hold the lease yet.
    DeadlinePassed,
    /// This client released it.
    Released,
    /// A renewal failed in a way retrying cannot fix.
    Failed(String),
}

impl fmt::Display for LeaseLoss {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LeaseLoss::Refused(LostReason::Superseded { current_token }) => {
                write!(f, "renewal refused: superseded by token {current_token}")
            }
            LeaseLoss::Refused(r) => write!(f, "renewal refused: {}", r.as_str()),
            LeaseLoss::DeadlinePassed => {
                f.write_str("no successful renewal before the local deadline")
            }
            LeaseLoss::Released => f.write_str("released"),
            LeaseLoss::Failed(e) => write!(f, "renewal failed: {e}"),
        }
    }
}

struct Shared {
    resource: String,
    owner: OwnerId,
    token: Token,
    ttl: Duration,
    deadline: Mutex<Moment>,
    /// When the keeper renews next (earlier when other leases are due).
    next_renew: Mutex<Moment>,
    loss: watch::Sender<Option<LeaseLoss>>,
    cancel: CancellationToken,
    stop: CancellationToken,
}

impl Shared {
    fn deadline(&self) -> Moment {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn set_deadline(&self, d: Moment) {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner) = d;
    }

    fn next_renew(&self) -> Moment {
        *self
            .next_renew
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    fn set_next_renew(&self, at: Moment) {
        *self
            .next_renew
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = at;
    }

    /// Whether the keeper is done with it (released, dropped or lost).
    fn is_over(&self) -> bool {
        self.stop.is_cancelled() || self.loss.borrow().is_some()
    }

    /// Fires the cancellation token, then records the loss once and says so:
    /// whoever sees the recorded loss also sees the token fired.
    fn lose(&self, reason: LeaseLoss) {
        self.cancel.cancel();
        let first = self.loss.send_if_modified(|current| {
            if current.is_none() {
                *current = Some(reason.clone());
                true
            } else {
                false
            }
        });
        if first && reason != LeaseLoss::Released {
            tracing::warn!(resource = %self.resource, owner_id = %self.owner, token = self.token.get(), %reason, "lease lost");
        }
    }

    /// The loss, also when only the deadline says so and the keeper has not
    /// run yet (a process that was frozen sees it on its first look).
    fn check(&self) -> Result<(), LeaseLoss> {
        if let Some(reason) = self.loss.borrow().clone() {
            return Err(reason);
        }
        if self.deadline().has_passed() {
            self.lose(LeaseLoss::DeadlinePassed);
            return Err(LeaseLoss::DeadlinePassed);
        }
        Ok(())
    }
}

/// A lease on a resource, held and renewed in the background until it is
/// released, dropped or lost.
///
/// Carry [`Lease::token`] with every write it protects. Stop the work when
/// [`Lease::cancellation`] fires, and call [`Lease::check`] right before a
/// write: it fails as soon as the local deadline has passed, even before the
/// background keeper has run (for example just after the process was frozen).
///
/// ```no_run
/// # async fn demo() -> Result<(), fenced_client::ClientError> {
/// use std::time::Duration;
/// let client = fenced_client::Client::new(fenced_client::DEV_ENDPOINTS)?;
/// let lease = client.lock("billing:2026-07", Duration::from_secs(30), Duration::from_secs(10)).await?;
/// let token = lease.token();
/// // ... do the work, writing with `token`; stop when `lease.cancellation()` fires ...
/// lease.release().await?;
/// # Ok(()) }
/// ```
pub struct Lease {
    shared: Arc<Shared>,
    client: Client,
    released: bool,
}

/// A cheap, cloneable view of a lease for the work it protects.
#[derive(Clone)]
pub struct LeaseHandle {
    shared: Arc<Shared>,
}

impl LeaseHandle {
    pub fn resource(&self) -> &str {
        &self.shared.resource
    }

    pub fn owner_id(&self) -> OwnerId {
        self.shared.owner
    }

    pub fn token(&self) -> Token {
        self.shared.token
    }

    /// Fires when the lease is lost or released.
    pub fn cancellation(&self) -> CancellationToken {
        self.shared.cancel.clone()
    }

    /// `Ok` while the lease is held by the local deadline; the reason otherwise.
    pub fn check(&self) -> Result<(), LeaseLoss> {
        self.shared.check()
    }
}

impl Lease {
    fn start(
        client: Client,
        resource: &str,
        owner: OwnerId,
        token: Token,
        ttl: Duration,
        sent: Moment,
    ) -> Lease {
        let opts = client.lease_options();
        let (loss, _) = watch::channel(None);
        let shared = Arc::new(Shared {
            resource: resource.to_string(),
            owner,
            token,
            ttl,
            deadline: Mutex::new(sent.plus(ttl).minus(opts.safety_margin(ttl))),
            next_renew: Mutex::new(sent.plus(opts.jittered(opts.renew_interval(ttl)))),
            loss,
            cancel: CancellationToken::new(),
            stop: CancellationToken::new(),
        });
        client.keeper().add(&client, Arc::clone(&shared));
        Lease {
            shared,
            client,
            released: false,
        }
    }

    pub fn resource(&self) -> &str {
        &self.shared.resource
    }

    /// The owner id of this acquisition.
    pub fn owner_id(&self) -> OwnerId {
        self.shared.owner
    }

    /// The fencing token: carry it with every protected write.
    pub fn token(&self) -> Token {
        self.shared.token
    }

    pub(crate) fn client(&self) -> &Client {
        &self.client
    }

    pub fn ttl(&self) -> Duration {
        self.shared.ttl
    }

    /// Time left before the local deadline (which falls before the
    /// cluster's expiry); zero once it has passed.
    pub fn remaining(&self) -> Duration {
        self.shared.deadline().remaining()
    }

    /// Fires when the lease is lost or released.
    pub fn cancellation(&self) -> CancellationToken {
        self.shared.cancel.clone()
    }

    /// `Ok` while the lease is held by the local deadline; the reason otherwise.
    pub fn check(&self) -> Result<(), LeaseLoss> {
        self.shared.check()
    }

    /// Waits until the lease is lost or released, and says why.
    pub async fn lost(&self) -> LeaseLoss {
        let mut rx = self.shared.loss.subscribe();
        loop {
            if let Some(reason) = rx.borrow_and_update().clone() {
                return reason;
            }
            if rx.changed().await.is_err() {
                return LeaseLoss::Released;
            }
        }
    }

    /// A view of the lease to hand to the work it protects.
    pub fn handle(&self) -> LeaseHandle {
        LeaseHandle {
            shared: Arc::clone(&self.shared),
        }
    }

    /// Stops renewing and releases the lease, reporting what the cluster said.
    pub async fn release(mut self) -> Result<ReleaseOutcome, ClientError> {
        self.released = true;
        self.stop_keeper();
        self.shared.lose(LeaseLoss::Released);
        let s = &self.shared;
        self.client.release(&s.resource, s.owner, s.token).await
    }

    fn stop_keeper(&mut self) {
        self.shared.stop.cancel();
        self.client.keeper().wake.notify_one();
    }
}

impl Drop for Lease {
    /// Best effort: stops renewing and, inside a tokio runtime, releases in
    /// the background. Call [`Lease::release`] to know the outcome.
    fn drop(&mut self) {
        if self.released {
            return;
        }
        self.stop_keeper();
        self.shared.lose(LeaseLoss::Released);
        if let Ok(rt) = tokio::runtime::Handle::try_current() {
            let client = self.client.clone();
            let s = Arc::clone(&self.shared);
            rt.spawn(async move {
                let _ = client.release(&s.resource, s.owner, s.token).await;
            });
        }
    }
}

impl LeaseOptions {
    fn jittered(&self, d: Duration) -> Duration {
        if self.no_jitter {
            return d;
        }
        // ±10%, from the clock's nanoseconds: enough to spread many keepers.
        let r = f64::from(Moment::now().subsec_nanos() % 2001) / 1000.0 - 1.0;
        d.mul_f64(1.0 + 0.1 * r)
    }
}

/// What a client's keeper did so far ([`Client::keeper_stats`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeeperStats {
    /// Renewal calls made (each renews up to `fenced_core::MAX_RENEW_BATCH`
    /// leases in one replicated step).
    pub calls: u64,
    /// Leases renewed.
    pub renewed: u64,
    /// Leases the cluster reported lost.
    pub lost: u64,
    /// Calls that failed (retried while the leases' deadlines allow).
    pub failed_calls: u64,
}

/// The most call latencies kept for [`Client::take_renewal_latencies`].
const MAX_LATENCY_SAMPLES: usize = 100_000;

/// Renews every lease held through one [`Client`], together: whenever one
/// lease is due, every lease due within half its interval is renewed in the
/// same `RenewMany` call, so a client's leases settle into one call per
/// renewal interval, whatever their number (docs/DECISIONS.md, "Batch
/// renewal"). One task per client, running while it keeps a lease.
#[derive(Default)]
pub(crate) struct Keeper {
    state: Mutex<KeeperState>,
    pub(crate) wake: Notify,
    stats: Mutex<(KeeperStats, Vec<Duration>)>,
}

#[derive(Default)]
struct KeeperState {
    leases: Vec<Arc<Shared>>,
    running: bool,
}

/// A renewal's answer for one lease.
enum Answer {
    Renewed(Moment),
    Lost(LostReason),
    /// A transient failure: try again shortly, while the deadline allows.
    Retry,
    Failed(String),
}

impl Keeper {
    fn add(&self, client: &Client, lease: Arc<Shared>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.leases.push(lease);
        if !state.running {
            state.running = true;
            tokio::spawn(keep(client.clone()));
        }
        drop(state);
        self.wake.notify_one();
    }

    /// The leases to renew now, or when to look again, or `None` when there
    /// is nothing left to keep (the task ends; the next lease starts one).
    fn plan(&self, opts: LeaseOptions) -> Option<Result<Vec<Arc<Shared>>, Moment>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // The deadline first: after a pause, never renew a lease that may
        // already belong to someone else (`check` records the loss).
        state.leases.retain(|s| !s.is_over() && s.check().is_ok());
        if state.leases.is_empty() {
            state.running = false;
            return None;
        }
        let now = Moment::now();
        let due = state.leases.iter().any(|s| s.next_renew() <= now);
        if !due {
            let wake = state
                .leases
                .iter()
                .map(|s| s.next_renew().min(s.deadline()));
            return Some(Err(wake.min().unwrap_or(now)));
        }
        // Renewing early only lengthens a lease: every lease due within half
        // its interval joins this call rather than making its own.
        Some(Ok(state
            .leases
            .iter()
            .filter(|s| s.next_renew() <= now.plus(opts.renew_interval(s.ttl) / 2))
            .cloned()
            .collect()))
    }

    fn note(&self, latency: Duration, answers: &[Answer]) {
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        stats.0.calls += 1;
        for a in answers {
            match a {
                Answer::Renewed(_) => stats.0.renewed += 1,
                Answer::Lost(_) => stats.0.lost += 1,
                Answer::Retry | Answer::Failed(_) => {}
            }
        }
        if matches!(answers.first(), Some(Answer::Retry | Answer::Failed(_))) {
            stats.0.failed_calls += 1;
        }
        if stats.1.len() < MAX_LATENCY_SAMPLES {
            stats.1.push(latency);
        }
    }
}

impl Client {
    /// What this client's keeper did so far.
    pub fn keeper_stats(&self) -> KeeperStats {
        self.keeper()
            .stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .0
    }

    /// The latency of each renewal call the keeper made since the last
    /// take (at most 100,000 kept).
    pub fn take_renewal_latencies(&self) -> Vec<Duration> {
        std::mem::take(
            &mut self
                .keeper()
                .stats
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .1,
        )
    }
}

/// The keeper's task: sleeps until a lease is due (or its deadline comes),
/// renews every due lease in as few calls as the bounds allow, then records
/// each lease's answer; a lost lease is told to its handle at once.
async fn keep(client: Client) {
    let keeper = client.keeper();
    let opts = client.lease_options();
    loop {
        let due = match keeper.plan(opts) {
            None => return,
            Some(Err(wake)) => {
                tokio::select! {
                    _ = tokio::time::sleep(wake.remaining()) => {}
                    _ = keeper.wake.notified() => {}
                }
                continue;
            }
            Some(Ok(due)) => due,
        };
        let mut calls = tokio::task::JoinSet::new();
        for chunk in chunks(due) {
            let client = client.clone();
            calls.spawn(async move {
                let started = std::time::Instant::now();
                let answers = renew_chunk(&client, &chunk).await;
                client.keeper().note(started.elapsed(), &answers);
                (chunk, answers)
            });
        }
        while let Some(done) = calls.join_next().await {
            let Ok((chunk, answers)) = done else {
                continue;
            };
            for (s, answer) in chunk.iter().zip(answers) {
                settle(s, answer, opts);
            }
        }
    }
}

/// The due leases in calls within the server's bounds: at most
/// `MAX_RENEW_BATCH` leases weighing at most `MAX_RENEW_BATCH_BYTES`.
fn chunks(due: Vec<Arc<Shared>>) -> Vec<Vec<Arc<Shared>>> {
    let mut out: Vec<Vec<Arc<Shared>>> = Vec::new();
    let mut weight = 0;
    for s in due {
        let w = s.resource.len() + 32;
        match out.last_mut() {
            Some(last)
                if last.len() < fenced_core::MAX_RENEW_BATCH
                    && weight + w <= fenced_core::MAX_RENEW_BATCH_BYTES =>
            {
                weight += w;
                last.push(s);
            }
            _ => {
                weight = w;
                out.push(vec![s]);
            }
        }
    }
    out
}

/// One `RenewMany` for the chunk, within the earliest of its deadlines. A
/// call refused whole (a permission revoked on one resource, a server
/// without `RenewMany`) is made again lease by lease, so each lease gets the
/// answer a renewal of its own gets.
async fn renew_chunk(client: &Client, chunk: &[Arc<Shared>]) -> Vec<Answer> {
    let budget = chunk
        .iter()
        .map(|s| s.deadline().remaining())
        .min()
        .unwrap_or_default();
    let items: Vec<RenewItem<'_>> = chunk
        .iter()
        .map(|s| RenewItem {
            resource: &s.resource,
            owner_id: s.owner,
            token: s.token,
            ttl: s.ttl,
        })
        .collect();
    match client.renew_many_sent(&items, budget).await {
        Ok((outcomes, sent)) => outcomes
            .into_iter()
            .map(|o| match o {
                RenewOutcome::Renewed { .. } => Answer::Renewed(sent),
                RenewOutcome::Lost(reason) => Answer::Lost(reason),
            })
            .collect(),
        Err(e) if e.is_transient() => {
            tracing::debug!(leases = chunk.len(), error = %e, "renewal failed; retrying");
            chunk.iter().map(|_| Answer::Retry).collect()
        }
        Err(e) if chunk.len() > 1 => {
            tracing::info!(leases = chunk.len(), error = %e,
                "batch renewal refused; renewing the leases one by one");
            let mut each = tokio::task::JoinSet::new();
            for (i, s) in chunk.iter().enumerate() {
                let (client, s) = (client.clone(), Arc::clone(s));
                each.spawn(async move {
                    let budget = s.deadline().remaining();
                    let r = client
                        .renew_sent(&s.resource, s.owner, s.token, s.ttl, budget)
                        .await;
                    (i, single_answer(r))
                });
            }
            let mut answers: Vec<Answer> = chunk.iter().map(|_| Answer::Retry).collect();
            while let Some(done) = each.join_next().await {
                if let Ok((i, answer)) = done {
                    if let Some(slot) = answers.get_mut(i) {
                        *slot = answer;
                    }
                }
            }
            answers
        }
        Err(e) => vec![Answer::Failed(e.to_string())],
    }
}

fn single_answer(r: Result<(RenewOutcome, Moment), ClientError>) -> Answer {
    match r {
        Ok((RenewOutcome::Renewed { .. }, sent)) => Answer::Renewed(sent),
        Ok((RenewOutcome::Lost(reason), _)) => Answer::Lost(reason),
        Err(e) if e.is_transient() => Answer::Retry,
        Err(e) => Answer::Failed(e.to_string()),
    }
}

/// Records one lease's answer: a new deadline and next renewal, or its loss.
fn settle(s: &Shared, answer: Answer, opts: LeaseOptions) {
    match answer {
        Answer::Renewed(sent) => {
            let deadline = sent.plus(s.ttl).minus(opts.safety_margin(s.ttl));
            s.set_deadline(deadline.max(s.deadline()));
            s.set_next_renew(sent.plus(opts.jittered(opts.renew_interval(s.ttl))));
            tracing::debug!(resource = %s.resource, token = s.token.get(), "lease renewed");
        }
        Answer::Lost(reason) => s.lose(LeaseLoss::Refused(reason)),
        Answer::Retry => s.set_next_renew(Moment::now().plus(Duration::from_millis(100))),
        Answer::Failed(e) => s.lose(LeaseLoss::Failed(e)),
    }
}

/// The answer to [`Client::acquire`].
pub enum Acquired {
    Granted(Lease),
    /// Another owner holds the resource.
    Held {
        current_token: Token,
        remaining_ms: u64,
    },
}

impl Client {
    /// Tries once to take the lease; a grant comes back as a self-renewing
    /// [`Lease`].
    pub async fn acquire(&self, resource: &str, ttl: Duration) -> Result<Acquired, ClientError> {
        self.take(resource, ttl, Duration::ZERO).await
    }

    /// Takes the lease, waiting on the server up to `wait` while it is held
    /// (first come, first served). [`ClientError::NotGranted`] when the wait
    /// ends first; nothing is left behind then.
    pub async fn lock(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Lease, ClientError> {
        match self.take(resource, ttl, wait).await? {
            Acquired::Granted(lease) => Ok(lease),
            Acquired::Held {
                current_token,
                remaining_ms,
            } => Err(ClientError::NotGranted {
                resource: resource.to_string(),
                current_token,
                remaining_ms,
            }),
        }
    }

    async fn take(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Duration,
    ) -> Result<Acquired, ClientError> {
        let owner = OwnerId::random();
        let (token, sent) = match self.acquire_sent(resource, owner, ttl, wait).await? {
            (AcquireOutcome::Granted { token, .. }, sent) => (token, sent),
            (
                AcquireOutcome::Held {
                    current_token,
                    remaining_ms,
                },
                _,
            ) => {
                return Ok(Acquired::Held {
                    current_token,
                    remaining_ms,
                })
            }
            // The owner id is fresh, so only a retry of this very attempt can
            // find it spent: it was granted and lost before the reply came.
            (AcquireOutcome::Ended { reason }, _) => {
                return Err(ClientError::AttemptEnded {
                    resource: resource.to_string(),
                    reason: reason.as_str().to_string(),
                })
            }
        };
        // A grant that came after waiting is timed from a request sent long
        // ago; one renewal now times it from a fresh request.
        let margin = self.lease_options().safety_margin(ttl);
        let sent = if sent.plus(margin / 4).has_passed() {
            match self.renew_sent(resource, owner, token, ttl, ttl).await? {
                (RenewOutcome::Renewed { .. }, renewed) => renewed,
                (RenewOutcome::Lost(reason), _) => {
                    return Err(ClientError::LeaseLost {
                        resource: resource.to_string(),
                        token,
                        reason: LeaseLoss::Refused(reason).to_string(),
                    })
                }
            }
        } else {
            sent
        };
        Ok(Acquired::Granted(Lease::start(
            self.clone(),
            resource,
            owner,
            token,
            ttl,
            sent,
        )))
    }

    /// Takes the lease (waiting up to `wait`), runs `work` with a handle to
    /// it, then releases it. If the lease is lost first, `work` is dropped at
    /// its next await point and the loss is returned as
    /// [`ClientError::LeaseLost`].
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), fenced_client::ClientError> {
    /// use std::time::Duration;
    /// let client = fenced_client::Client::new(fenced_client::DEV_ENDPOINTS)?;
    /// let rows = client
    ///     .with_lease("import:customers", Duration::from_secs(30), Duration::from_secs(5), |lease| async move {
    ///         // write with lease.token(); check lease.check() before each write
    ///         lease.token()
    ///     })
    ///     .await?;
    /// # Ok(()) }
    /// ```
    pub async fn with_lease<F, Fut, T>(
        &self,
        resource: &str,
        ttl: Duration,
        wait: Duration,
        work: F,
    ) -> Result<T, ClientError>
    where
        F: FnOnce(LeaseHandle) -> Fut,
        Fut: Future<Output = T>,
    {
        let lease = self.lock(resource, ttl, wait).await?;
        let handle = lease.handle();
        let outcome = tokio::select! {
            out = work(handle) => Ok(out),
            reason = lease.lost() => Err(reason),
        };
        match outcome {
            Ok(out) => {
                lease.release().await?;
                Ok(out)
            }
            Err(reason) => Err(ClientError::LeaseLost {
                resource: resource.to_string(),
                token: lease.token(),
                reason: reason.to_string(),
            }),
        }
    }
}
