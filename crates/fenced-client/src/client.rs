//! The public face of the crate: a [`Client`] is the calls layer
//! (`calls`: endpoints, credentials, retries, one method per RPC) plus the
//! keeper of the leases it grants (`lease`). Taking a lease (`acquire`,
//! `lock`, `with_lease`) lives here, the one place that sees both: the
//! keeper and the sessions below import nothing from this module
//! (tests/module_graph.rs).

use std::{future::Future, sync::Arc, time::Duration};

use fenced_core::{OwnerId, ReleaseOutcome, RenewOutcome, Token};
use fenced_proto::v1;

use crate::{
    calls::{unavailable_message, AcquireOutcome, Calls, ClientError, Dated, RenewItem, Settings},
    give_back::GiveBackIfDropped,
    lease::{Keeper, KeeperStats, Lease, LeaseHandle, LeaseOptions, KEPT_BY_SESSION},
    loss::LeaseLoss,
    session::{InSession, SESSION_GONE},
    tls::TlsOptions,
};

/// The default addresses of `fenced dev`.
pub const DEV_ENDPOINTS: [&str; 3] = ["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"];

/// A connection to a fenced cluster. Cheap to clone: clones share the
/// connections.
#[derive(Clone)]
pub struct Client {
    /// The endpoints, credentials and retries every call goes through.
    calls: Calls,
    /// Renews every lease granted through this client, together.
    keeper: Arc<Keeper>,
}

impl Client {
    /// Connects (lazily) to the given `host:port` endpoints.
    pub fn new<I, S>(endpoints: I) -> Result<Self, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Self::with_tls(endpoints, None)
    }

    /// Like [`Client::new`]; with `tls`, `https://` endpoints are accepted
    /// (and plain `host:port` ones mean `https://`).
    pub fn with_tls<I, S>(endpoints: I, tls: Option<&TlsOptions>) -> Result<Self, ClientError>
    where
        I: IntoIterator<Item = S>,
        S: AsRef<str>,
    {
        Ok(Self::over(
            Calls::new(endpoints, tls)?,
            LeaseOptions::default(),
        ))
    }

    /// A client over `calls` with a keeper of its own: a keeper renews with
    /// one set of options, so a client with other options needs another.
    fn over(calls: Calls, lease_options: LeaseOptions) -> Self {
        Self {
            calls,
            keeper: Arc::new(Keeper::new(lease_options)),
        }
    }

    /// A client on the same connections with other settings (and a keeper
    /// of its own).
    fn with_settings(&self, change: impl FnOnce(&mut Settings)) -> Self {
        Self::over(self.calls.with_settings(change), self.keeper.options())
    }

    /// How long one call may take in all, retries included (default 10 s).
    pub fn with_call_timeout(self, timeout: Duration) -> Self {
        self.with_settings(|s| s.call_timeout = timeout)
    }

    /// Fail a call at once, with [`ClientError::Unavailable`], when every
    /// endpoint refused the connection (nothing listens there), instead of
    /// retrying until the call timeout. For tools a person waits on; a
    /// worker rides out a restart better with the default, off.
    pub fn with_fail_fast(self, on: bool) -> Self {
        self.with_settings(|s| s.fail_fast = on)
    }

    /// Sends `label` with every acquire: what the job is, for people (the
    /// status page and Describe show it beside the lease; it decides
    /// nothing). UTF-8, at most 64 bytes, no control characters; the error
    /// names the bound.
    pub fn with_job_label(self, label: &str) -> Result<Self, ClientError> {
        let label = fenced_core::JobLabel::new(label)
            .map_err(|e| ClientError::InvalidArgument(e.to_string()))?;
        Ok(self.with_settings(|s| s.job_label = label.as_str().to_string()))
    }

    /// How the leases this client grants are renewed (see [`LeaseOptions`]).
    pub fn with_lease_options(self, lease_options: LeaseOptions) -> Self {
        Self::over(self.calls.with_settings(|_| {}), lease_options)
    }

    /// Sends `authorization: Bearer <token>` on every call. Fails when the
    /// token cannot travel in metadata (it is not visible ASCII), or would
    /// travel in plaintext to an endpoint that is not loopback (naming it).
    pub fn with_token(self, token: &str) -> Result<Self, ClientError> {
        Ok(Self::over(
            self.calls.with_token(token)?,
            self.keeper.options(),
        ))
    }

    /// The calls layer, for the methods other modules add to `Client`.
    pub(crate) fn calls(&self) -> &Calls {
        &self.calls
    }

    /// The endpoints this client was given.
    pub fn endpoints(&self) -> Vec<String> {
        self.calls.endpoints()
    }

    /// One acquire call, without a keeper: the lease is yours to renew. Waits
    /// up to `wait` on the server if the resource is held. Retries after an
    /// ambiguous failure use the same `owner_id`, so a lost reply yields the same
    /// grant, never a second token. Most code wants [`Client::acquire`] or
    /// [`Client::lock`], which return a self-renewing [`crate::Lease`].
    pub async fn acquire_once(
        &self,
        resource: &str,
        owner_id: OwnerId,
        ttl: Duration,
        wait: Duration,
    ) -> Result<AcquireOutcome, ClientError> {
        self.calls
            .acquire_sent(resource, owner_id, ttl, wait)
            .await
            .map(|(o, _)| o)
    }

    /// Extends the lease held with (`owner_id`, `token`); the token stays.
    pub async fn renew(
        &self,
        resource: &str,
        owner_id: OwnerId,
        token: Token,
        ttl: Duration,
    ) -> Result<RenewOutcome, ClientError> {
        self.renew_dated(resource, owner_id, token, ttl)
            .await
            .map(|d| d.outcome)
    }

    /// [`Client::renew`], with the times of the answer (for an audit line).
    pub async fn renew_dated(
        &self,
        resource: &str,
        owner_id: OwnerId,
        token: Token,
        ttl: Duration,
    ) -> Result<Dated<RenewOutcome>, ClientError> {
        self.calls
            .renew_sent_dated(resource, owner_id, token, ttl, self.calls.call_timeout())
            .await
            .map(|(d, _)| d)
    }

    /// Extends many leases in one call and one replicated step, each as
    /// [`Client::renew`] would: one outcome per lease, in order. At most
    /// `fenced_core::MAX_RENEW_BATCH` leases per call. A lease kept by a
    /// [`crate::Lease`] needs no call: the client's keeper renews all of
    /// them this way.
    pub async fn renew_many(
        &self,
        leases: &[RenewItem<'_>],
    ) -> Result<Vec<RenewOutcome>, ClientError> {
        self.calls
            .renew_many_sent(leases, self.calls.call_timeout())
            .await
            .map(|(o, _)| o)
    }

    /// Ends the lease held with (`owner_id`, `token`).
    pub async fn release(
        &self,
        resource: &str,
        owner_id: OwnerId,
        token: Token,
    ) -> Result<ReleaseOutcome, ClientError> {
        self.calls.release(resource, owner_id, token).await
    }

    /// [`Client::release`], with the times of the answer (for an audit
    /// line).
    pub async fn release_dated(
        &self,
        resource: &str,
        owner_id: OwnerId,
        token: Token,
    ) -> Result<Dated<ReleaseOutcome>, ClientError> {
        self.calls.release_dated(resource, owner_id, token).await
    }

    /// The state of `resource` (linearizable).
    pub async fn describe(&self, resource: &str) -> Result<v1::DescribeResponse, ClientError> {
        self.calls.describe(resource).await
    }

    /// Whether `token` is still the current lease of `resource`
    /// (linearizable).
    pub async fn validate_token(
        &self,
        resource: &str,
        token: Token,
    ) -> Result<v1::ValidateTokenResponse, ClientError> {
        self.calls.validate_token(resource, token).await
    }

    /// [`Client::validate_token`] for many pairs, answered at one point.
    pub async fn validate_tokens(
        &self,
        checks: &[(&str, Token)],
    ) -> Result<v1::ValidateTokensResponse, ClientError> {
        self.calls.validate_tokens(checks).await
    }

    /// The last grants of `resource`, newest first (`limit` 0: all kept).
    pub async fn history(
        &self,
        resource: &str,
        limit: u32,
    ) -> Result<v1::HistoryResponse, ClientError> {
        self.calls.history(resource, limit).await
    }

    /// Opens a watch stream on the first node that accepts it, starting
    /// after `from_revision` (0: from now). The stream has no deadline; to
    /// resume after it breaks, call again with the last revision received
    /// (any node serves the same revisions).
    pub async fn watch(
        &self,
        prefix: &str,
        from_revision: u64,
    ) -> Result<tonic::Streaming<v1::WatchResponse>, ClientError> {
        self.calls.watch(prefix, from_revision).await
    }

    /// The status of the first node that answers.
    pub async fn status(&self) -> Result<v1::StatusResponse, ClientError> {
        self.calls.status().await
    }

    /// A backup of the cluster's state, streamed from the leader after a
    /// linearizable read (admin role): its summary and the file's bytes,
    /// checked against the summary's length. Followers are skipped like
    /// any node that is not the leader. At most `max_bytes` are accepted.
    pub async fn save_snapshot(
        &self,
        max_bytes: u64,
    ) -> Result<(v1::SnapshotSummary, Vec<u8>), ClientError> {
        self.calls.save_snapshot(max_bytes).await
    }

    /// The status of every endpoint, each on its own (no retries).
    pub async fn status_of_each(&self) -> Vec<(String, Result<v1::StatusResponse, ClientError>)> {
        self.calls.status_each().await.0
    }

    /// [`Client::status_of_each`], or the error when no endpoint answered:
    /// a refusal (TLS, authentication) as it is, otherwise
    /// [`ClientError::Unavailable`] naming every endpoint tried.
    pub async fn status_of_each_answered(
        &self,
    ) -> Result<Vec<(String, Result<v1::StatusResponse, ClientError>)>, ClientError> {
        let (mut each, attempts) = self.calls.status_each().await;
        if each.iter().any(|(_, r)| r.is_ok()) {
            return Ok(each);
        }
        // A refusal (TLS, authentication, ...) says more than "no answer".
        let refusal = each
            .iter()
            .position(|(_, r)| !matches!(r, Err(ClientError::Unavailable(_))));
        match refusal.map(|i| each.swap_remove(i).1) {
            Some(Err(e)) => Err(e),
            _ => Err(ClientError::Unavailable(unavailable_message(&attempts))),
        }
    }

    /// What this client's keeper did so far.
    pub fn keeper_stats(&self) -> KeeperStats {
        self.keeper.stats()
    }

    /// The latency of each renewal call the keeper made since the last
    /// take (at most 100,000 kept).
    pub fn take_renewal_latencies(&self) -> Vec<Duration> {
        self.keeper.take_latencies()
    }
}

/// The token of a grant, or the answer for a resource held by another.
fn granted(
    resource: &str,
    outcome: AcquireOutcome,
) -> Result<Result<Token, Acquired>, ClientError> {
    match outcome {
        AcquireOutcome::Granted { token, .. } => Ok(Ok(token)),
        AcquireOutcome::Held {
            current_token,
            remaining_ms,
        } => Ok(Err(Acquired::Held {
            current_token,
            remaining_ms,
        })),
        // The owner id is fresh, so only a retry of this very attempt can
        // find it spent: it was granted and lost before the reply came.
        AcquireOutcome::Ended { reason } => Err(ClientError::AttemptEnded {
            resource: resource.to_string(),
            reason: reason.as_str().to_string(),
        }),
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
        // Without a wait, in the client's session of this TTL; a session
        // found gone is replaced once.
        if wait.is_zero() && !self.keeper.options().no_sessions {
            for _ in 0..2 {
                let Some(session) = self.keeper.session_for(&self.calls, ttl).await? else {
                    break;
                };
                let owner = OwnerId::random();
                let give_back = GiveBackIfDropped::arm(&self.calls, resource, owner, ttl, wait);
                match self
                    .calls
                    .acquire_in_session_sent(resource, owner, session.id)
                    .await?
                {
                    (InSession::Gone, _) => {
                        give_back.disarm();
                        session.end(SESSION_GONE);
                    }
                    (InSession::Outcome(outcome), _) => {
                        let token = granted(resource, outcome)?;
                        let acquired = match token {
                            Ok(token) => Acquired::Granted(Lease::start_in(
                                self.calls.clone(),
                                Arc::clone(&self.keeper),
                                resource,
                                owner,
                                token,
                                session,
                            )),
                            Err(held) => held,
                        };
                        give_back.disarm();
                        return Ok(acquired);
                    }
                }
            }
        }
        let owner = OwnerId::random();
        let give_back = GiveBackIfDropped::arm(&self.calls, resource, owner, ttl, wait);
        let (outcome, sent) = self.calls.acquire_sent(resource, owner, ttl, wait).await?;
        let token = match granted(resource, outcome)? {
            Ok(token) => token,
            Err(held) => {
                give_back.disarm();
                return Ok(held);
            }
        };
        // A grant that came after waiting is timed from a request sent long
        // ago; one renewal now times it from a fresh request.
        let margin = self.keeper.options().safety_margin(ttl);
        let sent = if sent.plus(margin / 4).has_passed() {
            match self
                .calls
                .renew_sent(resource, owner, token, ttl, ttl)
                .await?
            {
                (RenewOutcome::Renewed { .. }, renewed) => renewed,
                (RenewOutcome::Lost(reason), _) => {
                    return Err(ClientError::LeaseLost {
                        resource: resource.to_string(),
                        token,
                        reason: LeaseLoss::Refused(reason).to_string(),
                    })
                }
                (RenewOutcome::KeptBySession, _) => {
                    return Err(ClientError::Server(KEPT_BY_SESSION.into()))
                }
            }
        } else {
            sent
        };
        let lease = Lease::start(
            self.calls.clone(),
            Arc::clone(&self.keeper),
            resource,
            owner,
            token,
            ttl,
            sent,
        );
        give_back.disarm();
        Ok(Acquired::Granted(lease))
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
