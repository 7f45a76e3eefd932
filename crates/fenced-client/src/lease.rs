//! Leases that renew themselves and say, at once, when they are lost: the
//! [`Lease`] a caller holds and the [`Keeper`] that renews every lease of
//! one client. It sits on `calls` (and `session`), never on `client`: a
//! lease renews and releases itself over the calls of the client that
//! granted it, so the keeper needs no `Client` (tests/module_graph.rs).

use std::{
    sync::{Arc, Mutex, PoisonError},
    time::Duration,
};

use fenced_core::{LostReason, OwnerId, ReleaseOutcome, RenewOutcome, Token};
use tokio::sync::{watch, Notify};
use tokio_util::sync::CancellationToken;

use crate::{
    calls::{millis, Calls, ClientError, RenewItem},
    clock::Moment,
    loss::LeaseLoss,
    session::{ended_reason, sessions_unsupported, ClientSession, SessionAnswer, SESSION_GONE},
};

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
    /// Give every lease its own expiry, renewed in batches (`RenewMany`),
    /// instead of acquiring it in the client's session (one keep-alive per
    /// interval for all of them).
    pub no_sessions: bool,
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

struct Shared {
    resource: String,
    owner: OwnerId,
    token: Token,
    ttl: Duration,
    /// The session the lease lives with: its deadline is the session's, and
    /// the keeper keeps the session alive instead of renewing the lease.
    session: Option<Arc<ClientSession>>,
    deadline: Mutex<Moment>,
    /// When the keeper renews next (earlier when other leases are due).
    next_renew: Mutex<Moment>,
    loss: watch::Sender<Option<LeaseLoss>>,
    cancel: CancellationToken,
    stop: CancellationToken,
}

impl Shared {
    /// A lease's state, to hand to [`Lease::kept`].
    fn new(
        resource: &str,
        owner: OwnerId,
        token: Token,
        ttl: Duration,
        session: Option<Arc<ClientSession>>,
        (deadline, next_renew): (Moment, Moment),
    ) -> Shared {
        let (loss, _) = watch::channel(None);
        Shared {
            resource: resource.to_string(),
            owner,
            token,
            ttl,
            session,
            deadline: Mutex::new(deadline),
            next_renew: Mutex::new(next_renew),
            loss,
            cancel: CancellationToken::new(),
            stop: CancellationToken::new(),
        }
    }

    fn deadline(&self) -> Moment {
        match &self.session {
            Some(session) => session.deadline(),
            None => *self.deadline.lock().unwrap_or_else(PoisonError::into_inner),
        }
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
            tracing::warn!(resource = %self.resource, token = self.token.get(), %reason, "lease lost");
            tracing::debug!(resource = %self.resource, owner_id = %self.owner, "lost lease's owner id");
        }
    }

    /// The loss, also when only the deadline says so and the keeper has not
    /// run yet (a process that was frozen sees it on its first look).
    fn check(&self) -> Result<(), LeaseLoss> {
        if let Some(reason) = self.loss.borrow().clone() {
            return Err(reason);
        }
        let ended = match &self.session {
            Some(session) => session.ended(),
            None => self
                .deadline()
                .has_passed()
                .then_some(LeaseLoss::DeadlinePassed),
        };
        if let Some(reason) = ended {
            self.lose(reason.clone());
            return Err(reason);
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
    /// The calls of the client that granted it: it is released over them.
    calls: Calls,
    /// That client's keeper, which renews it.
    keeper: Arc<Keeper>,
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
    /// A lease with its own expiry, granted by a request sent at `sent`.
    pub(crate) fn start(
        calls: Calls,
        keeper: Arc<Keeper>,
        resource: &str,
        owner: OwnerId,
        token: Token,
        ttl: Duration,
        sent: Moment,
    ) -> Lease {
        let opts = keeper.options();
        let deadline = sent.plus(ttl).minus(opts.safety_margin(ttl));
        let next_renew = sent.plus(opts.jittered(opts.renew_interval(ttl)));
        let shared = Shared::new(resource, owner, token, ttl, None, (deadline, next_renew));
        Self::kept(calls, keeper, shared)
    }

    /// A lease that lives with `session`.
    pub(crate) fn start_in(
        calls: Calls,
        keeper: Arc<Keeper>,
        resource: &str,
        owner: OwnerId,
        token: Token,
        session: Arc<ClientSession>,
    ) -> Lease {
        let (ttl, deadline) = (session.ttl, session.deadline());
        let shared = Shared::new(
            resource,
            owner,
            token,
            ttl,
            Some(session),
            (deadline, deadline),
        );
        Self::kept(calls, keeper, shared)
    }

    /// Hands the lease to the client's keeper.
    fn kept(calls: Calls, keeper: Arc<Keeper>, shared: Shared) -> Lease {
        let shared = Arc::new(shared);
        keeper.add(&calls, Arc::clone(&shared));
        Lease {
            shared,
            calls,
            keeper,
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

    /// The calls of the client that granted it (for its fenced writes).
    pub(crate) fn calls(&self) -> &Calls {
        &self.calls
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
        self.calls.release(&s.resource, s.owner, s.token).await
    }

    fn stop_keeper(&mut self) {
        self.shared.stop.cancel();
        self.keeper.wake.notify_one();
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
            let calls = self.calls.clone();
            let s = Arc::clone(&self.shared);
            rt.spawn(async move {
                let _ = calls.release(&s.resource, s.owner, s.token).await;
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

/// What a client's keeper did so far
/// ([`Client::keeper_stats`](crate::Client::keeper_stats)).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KeeperStats {
    /// Renewal calls made: session keep-alives, and batch renewals of
    /// leases without a session (each renews up to
    /// `fenced_core::MAX_RENEW_BATCH` leases in one replicated step).
    pub calls: u64,
    /// Leases renewed (each lease of a session kept alive counts).
    pub renewed: u64,
    /// Leases the cluster reported lost.
    pub lost: u64,
    /// Calls that failed (retried while the leases' deadlines allow).
    pub failed_calls: u64,
}

/// The most call latencies kept for
/// [`crate::Client::take_renewal_latencies`].
const MAX_LATENCY_SAMPLES: usize = 100_000;

/// Keeps every lease held through one [`crate::Client`] alive. A lease
/// acquired without waiting lives with the client's session for its TTL,
/// which one keep-alive per renewal interval extends, whatever the number of
/// its leases (docs/DECISIONS.md, "Sessions"). Other leases (granted after a
/// wait, or by a cluster without sessions) are renewed together: whenever
/// one is due, every one due within half its interval is renewed in the
/// same `RenewMany` call (docs/DECISIONS.md, "Batch renewal"). One task per
/// client, running while it keeps a lease.
#[derive(Default)]
pub(crate) struct Keeper {
    /// How this keeper's leases are renewed: the client's, which makes a
    /// new keeper when they change.
    options: LeaseOptions,
    state: Mutex<KeeperState>,
    /// One session is opened at a time, so concurrent acquires share it.
    opening: tokio::sync::Mutex<()>,
    pub(crate) wake: Notify,
    stats: Mutex<(KeeperStats, Vec<Duration>)>,
}

#[derive(Default)]
struct KeeperState {
    leases: Vec<Arc<Shared>>,
    /// The client's sessions, at most one per TTL in use.
    sessions: Vec<Arc<ClientSession>>,
    running: bool,
    /// The cluster answered that it has no sessions.
    no_sessions: bool,
}

/// What the keeper is to do now.
struct Due {
    /// Leases without a session to renew.
    leases: Vec<Arc<Shared>>,
    /// Sessions to keep alive, with how many leases each holds.
    sessions: Vec<(Arc<ClientSession>, u64)>,
}

/// A finished call of the keeper.
enum Done {
    Renewals(Vec<Arc<Shared>>, Vec<Answer>),
    /// A keep-alive's answer and how many leases the cluster says the
    /// session holds.
    KeepAlive(Arc<ClientSession>, Answer, Option<u64>),
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
    /// A keeper that renews by `options`.
    pub(crate) fn new(options: LeaseOptions) -> Keeper {
        Keeper {
            options,
            ..Keeper::default()
        }
    }

    pub(crate) fn options(&self) -> LeaseOptions {
        self.options
    }

    /// Keeps `lease` alive over `calls`, starting the keeper's task if it
    /// is not running.
    fn add(self: &Arc<Self>, calls: &Calls, lease: Arc<Shared>) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // A session let go while its first acquire was on the way is kept
        // again.
        if let Some(session) = &lease.session {
            if !state.sessions.iter().any(|s| Arc::ptr_eq(s, session)) {
                state.sessions.push(Arc::clone(session));
            }
        }
        state.leases.push(lease);
        if !state.running {
            state.running = true;
            tokio::spawn(keep(calls.clone(), Arc::clone(self)));
        }
        drop(state);
        self.wake.notify_one();
    }

    /// The session of `ttl` to acquire in: the open one, else a new one;
    /// `None` when the cluster has no sessions.
    pub(crate) async fn session_for(
        &self,
        calls: &Calls,
        ttl: Duration,
    ) -> Result<Option<Arc<ClientSession>>, ClientError> {
        let _one_at_a_time = self.opening.lock().await;
        {
            let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
            if state.no_sessions {
                return Ok(None);
            }
            let open = state
                .sessions
                .iter()
                .find(|s| s.ttl == ttl && s.ended().is_none());
            if let Some(session) = open {
                return Ok(Some(Arc::clone(session)));
            }
        }
        let id = fenced_core::SessionId::random();
        match calls.open_session_sent(id, ttl).await {
            Ok((SessionAnswer::Alive { .. }, sent)) => {
                let opts = self.options;
                let session = Arc::new(ClientSession::new(
                    id,
                    ttl,
                    sent.plus(ttl).minus(opts.safety_margin(ttl)),
                    sent.plus(opts.jittered(opts.renew_interval(ttl))),
                ));
                tracing::debug!(session = %id, ttl_ms = millis(ttl), "session opened");
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                state.sessions.push(Arc::clone(&session));
                Ok(Some(session))
            }
            Ok((SessionAnswer::Gone, _)) => Err(ClientError::Server(
                "open_session: a new session was answered as not open".into(),
            )),
            Err(e) if sessions_unsupported(&e) => {
                tracing::info!(error = %e, "the cluster has no sessions; leases are renewed in batches");
                let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
                state.no_sessions = true;
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }

    /// What to renew and keep alive now, or when to look again, or `None`
    /// when there is nothing left to keep (the task ends; the next lease
    /// starts one).
    fn plan(&self, opts: LeaseOptions) -> Option<Result<Due, Moment>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        // The deadline first: after a pause, never renew a lease that may
        // already belong to someone else (`check` records the loss, also
        // of every lease of a session that is over).
        state.leases.retain(|s| !s.is_over() && s.check().is_ok());
        if state.leases.is_empty() {
            state.running = false;
            return None;
        }
        let now = Moment::now();
        let held_in = |state: &KeeperState, session: &Arc<ClientSession>| {
            let n = state
                .leases
                .iter()
                .filter(|s| s.session.as_ref().is_some_and(|x| Arc::ptr_eq(x, session)))
                .count();
            u64::try_from(n).unwrap_or(u64::MAX)
        };
        let sessions: Vec<(Arc<ClientSession>, u64)> = state
            .sessions
            .iter()
            .map(|session| (Arc::clone(session), held_in(&state, session)))
            .collect();
        // A session that holds no lease when its keep-alive is due is let
        // go: it lapses on the cluster within its TTL, and the next acquire
        // opens another.
        let kept: Vec<(Arc<ClientSession>, u64)> = sessions
            .into_iter()
            .filter(|(s, n)| s.ended().is_none() && (*n > 0 || s.next_keep() > now))
            .collect();
        state.sessions = kept.iter().map(|(s, _)| Arc::clone(s)).collect();
        let due_sessions: Vec<(Arc<ClientSession>, u64)> = kept
            .iter()
            .filter(|(s, n)| *n > 0 && s.next_keep() <= now)
            .cloned()
            .collect();
        let own = || state.leases.iter().filter(|s| s.session.is_none());
        let due = own().any(|s| s.next_renew() <= now);
        if !due && due_sessions.is_empty() {
            let leases = own().map(|s| s.next_renew().min(s.deadline()));
            let sessions = kept
                .iter()
                .filter(|(_, n)| *n > 0)
                .map(|(s, _)| s.next_keep().min(s.deadline()));
            return Some(Err(leases.chain(sessions).min().unwrap_or(now)));
        }
        // Renewing early only lengthens a lease: every lease due within half
        // its interval joins this call rather than making its own.
        let leases = if due {
            own()
                .filter(|s| s.next_renew() <= now.plus(opts.renew_interval(s.ttl) / 2))
                .cloned()
                .collect()
        } else {
            Vec::new()
        };
        Some(Ok(Due {
            leases,
            sessions: due_sessions,
        }))
    }

    /// The leases kept in `session`.
    fn in_session(&self, session: &Arc<ClientSession>) -> Vec<Arc<Shared>> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .leases
            .iter()
            .filter(|s| s.session.as_ref().is_some_and(|x| Arc::ptr_eq(x, session)))
            .filter(|s| !s.is_over())
            .cloned()
            .collect()
    }

    /// The earliest local deadline of a lease still kept: the keeper tells
    /// its loss then, even while a call is on the way.
    fn first_deadline(&self) -> Option<Moment> {
        let state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state
            .leases
            .iter()
            .filter(|s| !s.is_over())
            .map(|s| s.deadline())
            .min()
    }

    /// Records the loss of every lease whose deadline has passed.
    fn check_deadlines(&self) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.leases.retain(|s| !s.is_over() && s.check().is_ok());
    }

    /// Counts a keep-alive of a session holding `leases` leases.
    fn note_keep_alive(&self, latency: Duration, answer: &Answer, leases: u64) {
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        stats.0.calls += 1;
        match answer {
            Answer::Renewed(_) => stats.0.renewed += leases,
            Answer::Lost(_) => stats.0.lost += leases,
            Answer::Retry | Answer::Failed(_) => stats.0.failed_calls += 1,
        }
        if stats.1.len() < MAX_LATENCY_SAMPLES {
            stats.1.push(latency);
        }
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

impl Keeper {
    /// What this keeper did so far.
    pub(crate) fn stats(&self) -> KeeperStats {
        self.stats.lock().unwrap_or_else(PoisonError::into_inner).0
    }

    /// The latency of each renewal call made since the last take (at most
    /// 100,000 kept).
    pub(crate) fn take_latencies(&self) -> Vec<Duration> {
        std::mem::take(&mut self.stats.lock().unwrap_or_else(PoisonError::into_inner).1)
    }
}

/// The keeper's task: sleeps until a lease is due (or its deadline comes),
/// renews every due lease in as few calls as the bounds allow, then records
/// each lease's answer; a lost lease is told to its handle at once.
async fn keep(calls: Calls, keeper: Arc<Keeper>) {
    let opts = keeper.options;
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
        let mut in_flight = tokio::task::JoinSet::new();
        for (session, leases) in due.sessions {
            let (calls, keeper) = (calls.clone(), Arc::clone(&keeper));
            in_flight.spawn(async move {
                let started = std::time::Instant::now();
                let (answer, held) = keep_alive(&calls, &session).await;
                keeper.note_keep_alive(started.elapsed(), &answer, leases);
                Done::KeepAlive(session, answer, held)
            });
        }
        for chunk in chunks(due.leases) {
            let (calls, keeper) = (calls.clone(), Arc::clone(&keeper));
            in_flight.spawn(async move {
                let started = std::time::Instant::now();
                let answers = renew_chunk(&calls, &chunk).await;
                keeper.note(started.elapsed(), &answers);
                Done::Renewals(chunk, answers)
            });
        }
        loop {
            // A deadline passing while a call is on the way is told at once.
            let deadline = keeper.first_deadline();
            let wait = deadline.map_or(Duration::from_secs(3600), |d| d.remaining());
            let done = tokio::select! {
                done = in_flight.join_next() => done,
                _ = tokio::time::sleep(wait), if deadline.is_some() => {
                    keeper.check_deadlines();
                    continue;
                }
            };
            match done {
                None => break,
                Some(Ok(Done::Renewals(chunk, answers))) => {
                    for (s, answer) in chunk.iter().zip(answers) {
                        settle(s, answer, opts);
                    }
                }
                Some(Ok(Done::KeepAlive(session, answer, held))) => {
                    settle_session(&session, answer, opts);
                    let kept = keeper.in_session(&session);
                    if held.is_some_and(|n| n < kept.len() as u64) {
                        find_ended(&calls, &session, kept).await;
                    }
                }
                Some(Err(_)) => {}
            }
        }
    }
}

/// Tells each of `kept` (leases of `session`) whether it ended without
/// this client (released or superseded by someone holding its owner id and
/// token), as a renewal would have: the cluster counted fewer leases in the
/// session than the client keeps. One `ValidateTokens` read per 256 leases.
async fn find_ended(calls: &Calls, session: &ClientSession, kept: Vec<Arc<Shared>>) {
    for chunk in kept.chunks(fenced_core::MAX_VALIDATE_BATCH) {
        let checks: Vec<(&str, Token)> = chunk
            .iter()
            .map(|s| (s.resource.as_str(), s.token))
            .collect();
        match calls.validate_tokens(&checks).await {
            Ok(resp) => {
                for (s, v) in chunk.iter().zip(&resp.results) {
                    if let Some(reason) = ended_reason(v) {
                        s.lose(LeaseLoss::Refused(reason));
                    }
                }
            }
            Err(e) => {
                tracing::warn!(session = %session.id, error = %e,
                    "the session holds fewer leases than this client keeps, and which ended cannot be read");
                return;
            }
        }
    }
}

/// One keep-alive of `session`, within its deadline; with the number of
/// leases the cluster says it holds.
async fn keep_alive(calls: &Calls, session: &ClientSession) -> (Answer, Option<u64>) {
    let budget = session.deadline().remaining();
    match calls.keep_alive_sent(session.id, budget).await {
        Ok((SessionAnswer::Alive { leases }, sent)) => (Answer::Renewed(sent), Some(leases)),
        Ok((SessionAnswer::Gone, _)) => (Answer::Lost(LostReason::Expired), None),
        Err(e) if e.is_transient() => {
            tracing::debug!(session = %session.id, error = %e, "keep-alive failed; retrying");
            (Answer::Retry, None)
        }
        Err(e) => (Answer::Failed(e.to_string()), None),
    }
}

/// Records a keep-alive's answer: a new deadline for the session and every
/// lease in it, or the end of all of them (told to each lease by the
/// keeper's next look).
fn settle_session(session: &ClientSession, answer: Answer, opts: LeaseOptions) {
    let ttl = session.ttl;
    match answer {
        Answer::Renewed(sent) => {
            session.extend(sent.plus(ttl).minus(opts.safety_margin(ttl)));
            session.set_next_keep(sent.plus(opts.jittered(opts.renew_interval(ttl))));
            tracing::debug!(session = %session.id, "session kept alive");
        }
        Answer::Lost(_) => session.end(SESSION_GONE),
        Answer::Retry => session.set_next_keep(Moment::now().plus(Duration::from_millis(100))),
        Answer::Failed(e) => session.end(LeaseLoss::Failed(e)),
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
async fn renew_chunk(calls: &Calls, chunk: &[Arc<Shared>]) -> Vec<Answer> {
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
    match calls.renew_many_sent(&items, budget).await {
        Ok((outcomes, sent)) => outcomes
            .into_iter()
            .map(|o| match o {
                RenewOutcome::Renewed { .. } => Answer::Renewed(sent),
                RenewOutcome::Lost(reason) => Answer::Lost(reason),
                RenewOutcome::KeptBySession => Answer::Failed(KEPT_BY_SESSION.into()),
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
                let (calls, s) = (calls.clone(), Arc::clone(s));
                each.spawn(async move {
                    let budget = s.deadline().remaining();
                    let r = calls
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

/// A lease of a session is never renewed on its own: its keeper keeps the
/// session alive instead (the server refuses such a renew).
pub(crate) const KEPT_BY_SESSION: &str = "renew: the lease is kept by its session";

fn single_answer(r: Result<(RenewOutcome, Moment), ClientError>) -> Answer {
    match r {
        Ok((RenewOutcome::Renewed { .. }, sent)) => Answer::Renewed(sent),
        Ok((RenewOutcome::Lost(reason), _)) => Answer::Lost(reason),
        Ok((RenewOutcome::KeptBySession, _)) => Answer::Failed(KEPT_BY_SESSION.into()),
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

/// The keeper's rules, without a cluster: what is renewed when, what a
/// renewal's answer does to a lease, how due leases are cut into calls.
#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const TTL: Duration = Duration::from_secs(30);
    const STEADY: LeaseOptions = LeaseOptions {
        renew_every: None,
        margin: None,
        no_jitter: true,
        no_sessions: false,
    };

    fn lease(resource: &str, deadline: Moment, next_renew: Moment) -> Arc<Shared> {
        let (loss, _) = watch::channel(None);
        Arc::new(Shared {
            resource: resource.to_string(),
            owner: OwnerId::random(),
            token: Token::new(1).unwrap(),
            ttl: TTL,
            session: None,
            deadline: Mutex::new(deadline),
            next_renew: Mutex::new(next_renew),
            loss,
            cancel: CancellationToken::new(),
            stop: CancellationToken::new(),
        })
    }

    fn keeper_of(leases: &[Arc<Shared>]) -> Keeper {
        let keeper = Keeper::default();
        {
            let mut state = keeper.state.lock().unwrap();
            state.leases = leases.to_vec();
            state.running = true;
        }
        keeper
    }

    fn names(leases: &[Arc<Shared>]) -> Vec<&str> {
        leases.iter().map(|s| s.resource.as_str()).collect()
    }

    #[test]
    fn a_lease_past_its_deadline_is_lost_never_renewed_and_the_keeper_stops() {
        let now = Moment::now();
        let late = lease(
            "late",
            now.minus(Duration::from_secs(1)),
            now.minus(Duration::from_secs(2)),
        );
        let keeper = keeper_of(std::slice::from_ref(&late));
        assert!(keeper.plan(STEADY).is_none(), "nothing left to keep");
        assert!(!keeper.state.lock().unwrap().running);
        assert_eq!(late.check(), Err(LeaseLoss::DeadlinePassed));
        assert!(late.cancel.is_cancelled(), "the work is told to stop");
    }

    #[test]
    fn with_nothing_due_the_keeper_looks_again_at_the_earliest_renewal_or_deadline() {
        let now = Moment::now();
        let soon = now.plus(Duration::from_secs(3));
        let keeper = keeper_of(&[
            lease(
                "a",
                now.plus(Duration::from_secs(20)),
                now.plus(Duration::from_secs(5)),
            ),
            lease("b", now.plus(Duration::from_secs(20)), soon),
            // A deadline before its next renewal: looked at by the deadline.
            lease(
                "c",
                now.plus(Duration::from_secs(4)),
                now.plus(Duration::from_secs(9)),
            ),
        ]);
        match keeper.plan(STEADY) {
            Some(Err(at)) => assert_eq!(at, soon),
            Some(Ok(due)) => panic!("renewed early: {:?}", names(&due.leases)),
            None => panic!("the keeper stopped with leases to keep"),
        }
    }

    #[test]
    fn a_due_lease_takes_along_those_due_within_half_an_interval() {
        // TTL 30 s: renewed every 10 s, so those due within 5 s join.
        let now = Moment::now();
        let deadline = now.plus(Duration::from_secs(20));
        let keeper = keeper_of(&[
            lease("due", deadline, now.minus(Duration::from_millis(1))),
            lease("joins", deadline, now.plus(Duration::from_secs(4))),
            lease("waits", deadline, now.plus(Duration::from_secs(6))),
        ]);
        let Some(Ok(due)) = keeper.plan(STEADY) else {
            panic!("nothing due");
        };
        assert_eq!(names(&due.leases), ["due", "joins"]);
        assert!(due.sessions.is_empty());
    }

    #[test]
    fn a_renewal_times_the_lease_from_its_send_and_never_shortens_it() {
        let now = Moment::now();
        let s = lease(
            "a",
            now.plus(Duration::from_secs(5)),
            now.minus(Duration::from_millis(1)),
        );
        settle(&s, Answer::Renewed(now), STEADY);
        // 30 s from the send, less the 3 s margin; next renewal 10 s on.
        assert_eq!(s.deadline(), now.plus(Duration::from_secs(27)));
        assert_eq!(s.next_renew(), now.plus(Duration::from_secs(10)));
        // An answer to an older send cannot pull the deadline back.
        settle(
            &s,
            Answer::Renewed(now.minus(Duration::from_secs(20))),
            STEADY,
        );
        assert_eq!(s.deadline(), now.plus(Duration::from_secs(27)));
        assert!(s.check().is_ok());
    }

    #[test]
    fn a_refusal_or_a_failure_ends_the_lease_with_its_reason_and_a_retry_does_not() {
        let now = Moment::now();
        let far = now.plus(Duration::from_secs(20));
        let refused = lease("refused", far, now);
        let newer = LostReason::Superseded {
            current_token: Token::new(2).unwrap(),
        };
        settle(&refused, Answer::Lost(newer), STEADY);
        assert_eq!(refused.check(), Err(LeaseLoss::Refused(newer)));
        assert!(refused.cancel.is_cancelled());

        let failed = lease("failed", far, now);
        settle(&failed, Answer::Failed("permission denied".into()), STEADY);
        assert_eq!(
            failed.check(),
            Err(LeaseLoss::Failed("permission denied".into()))
        );

        let retried = lease("retried", far, now);
        settle(&retried, Answer::Retry, STEADY);
        assert!(retried.check().is_ok());
        assert!(
            retried.next_renew() > now,
            "tried again shortly, not at once"
        );
        assert!(retried.next_renew() <= Moment::now().plus(Duration::from_millis(100)));
    }

    #[test]
    fn due_leases_are_cut_into_calls_within_the_servers_bounds() {
        let now = Moment::now();
        let many: Vec<Arc<Shared>> = (0..fenced_core::MAX_RENEW_BATCH + 1)
            .map(|i| lease(&format!("r{i}"), now, now))
            .collect();
        let calls = chunks(many);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0].len(), fenced_core::MAX_RENEW_BATCH);

        let long = "x".repeat(fenced_core::RESOURCE_NAME_MAX_BYTES);
        let heavy: Vec<Arc<Shared>> = (0..fenced_core::MAX_RENEW_BATCH)
            .map(|_| lease(&long, now, now))
            .collect();
        for call in chunks(heavy) {
            let bytes: usize = call.iter().map(|s| s.resource.len() + 32).sum();
            assert!(bytes <= fenced_core::MAX_RENEW_BATCH_BYTES, "{bytes}");
        }
        assert!(chunks(Vec::new()).is_empty());
    }
}
