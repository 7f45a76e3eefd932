use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use fenced_core::{LostReason, OwnerId, ReleaseOutcome, RenewOutcome, Token};
use fenced_proto::{
    lost_reason_from_wire,
    v1::{
        self, acquire_response, cluster_client::ClusterClient, lock_client::LockClient,
        maintenance_client::MaintenanceClient, release_response, renew_response,
    },
};
use tonic::{
    metadata::{Ascii, MetadataValue},
    transport::Channel,
    Code, Status,
};

use crate::{
    clock::Moment,
    leader::{Endpoint, Endpoints},
    lease::Keeper,
    tls::{self, TlsOptions},
    transport, LeaseOptions,
};

/// The longest one attempt may take (beyond a blocking acquire's wait)
/// before the call is retried, on the next node: a node that lost touch with
/// the cluster must not hold a caller for the whole call budget.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);

/// The default addresses of `fenced dev`.
pub const DEV_ENDPOINTS: [&str; 3] = ["127.0.0.1:7101", "127.0.0.1:7102", "127.0.0.1:7103"];

/// The longest pause between two attempts. An election takes about the
/// leader lease plus a check (1-1.5 s with the default timeouts); a client
/// asleep in a longer pause when the new leader appears only adds to the
/// outage (a 500 ms cap made S6's grants resume 1.9 s after a kill, 0.9 s
/// after the election). Ten attempts a second per waiting client is little
/// next to what a cluster serves (etcd's client retries every 25 ms).
const RETRY_BACKOFF_MAX: Duration = Duration::from_millis(100);

/// What went wrong with a call. Expected refusals are not errors.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request was refused as malformed; the message names the field.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// The server did not accept the credentials: no token, or an unknown
    /// or revoked one.
    #[error("authentication failed: {0}")]
    Unauthenticated(String),
    /// The caller is known but not allowed this call; the message names the
    /// resource and the prefixes granted.
    #[error("{0}")]
    PermissionDenied(String),
    /// A bound was reached (waiters per resource, pending proposals, live
    /// leases or waiters in the whole cluster); the message names the setting.
    #[error("limit reached: {0}")]
    ResourceExhausted(String),
    /// No node could give an answer before the deadline. For an acquire the
    /// outcome is unknown: retry with the SAME owner id.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// An endpoint is not a valid address.
    #[error("endpoint {endpoint}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    /// TLS failed (a certificate refused either way, a wrong CA); the
    /// message says what to check. Not retried.
    #[error("{0}")]
    Tls(String),
    /// Any other failure reported by the server.
    #[error("server error: {0}")]
    Server(String),
    /// The lease was lost while its work ran.
    #[error("lease on {resource} (token {token}) lost: {reason}")]
    LeaseLost {
        resource: String,
        token: Token,
        reason: String,
    },
    /// The acquisition attempt's lease ended before its grant reached this
    /// client (a retry after a lost reply arrived too late): nothing is held.
    #[error(
        "acquire on {resource}: the attempt's lease already ended ({reason}); nothing is held"
    )]
    AttemptEnded { resource: String, reason: String },
    /// `lock` waited `wait` and the resource was still held.
    #[error("not granted within the wait: {resource} is held by token {current_token} for {remaining_ms} ms more")]
    NotGranted {
        resource: String,
        current_token: Token,
        remaining_ms: u64,
    },
}

impl ClientError {
    /// Whether trying again later may succeed (the cluster was unreachable or
    /// busy), as opposed to a request that is wrong as it stands.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Unavailable(_) | ClientError::ResourceExhausted(_)
        )
    }
}

/// What to do after an authentication refusal.
pub const TOKEN_HINT: &str = "pass a bearer token (fencectl --token, --token-file or \
    FENCED_TOKEN; the Rust client's Client::with_token); an operator makes one with \
    `fenced auth new-token` and adds its sha256 to the nodes' auth_tokens file";
/// What to do after a permission refusal.
pub const PERMISSION_HINT: &str = "an operator grants roles (lock, read, admin) on resource \
    prefixes in the nodes' auth_policy file";
/// What to do when no node answered at all.
pub const NO_CLUSTER_HINT: &str = "is a cluster running? start one with `fenced dev`, or \
    point --endpoints (FENCED_ENDPOINTS) at its nodes";

fn classify(status: Status) -> Result<Status, ClientError> {
    match status.code() {
        Code::InvalidArgument => Err(ClientError::InvalidArgument(status.message().to_string())),
        Code::Unauthenticated => Err(ClientError::Unauthenticated(format!(
            "{}; {TOKEN_HINT}",
            status
                .message()
                .trim_start_matches("authentication failed: ")
        ))),
        Code::PermissionDenied => Err(ClientError::PermissionDenied(format!(
            "{}; {PERMISSION_HINT}",
            status.message()
        ))),
        Code::ResourceExhausted => {
            Err(ClientError::ResourceExhausted(status.message().to_string()))
        }
        // Worth another try, on this or another node.
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::Unknown
        | Code::Cancelled => Ok(status),
        _ => Err(ClientError::Server(format!(
            "{:?}: {}",
            status.code(),
            status.message()
        ))),
    }
}

/// How a call to one endpoint failed, for the error that names them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Nothing answered: the connection failed or broke (the text says how).
    NoAnswer(String),
    /// The node answered, but could not serve the call (no leader, say).
    Refused(String),
}

impl Attempt {
    /// Tells apart a status the node sent from one the client made because
    /// the connection failed (it carries the transport error as source).
    pub(crate) fn of(status: &Status) -> Attempt {
        match std::error::Error::source(status) {
            None => Attempt::Refused(status.message().to_string()),
            Some(source) => {
                // The innermost cause says it best ("Connection refused").
                let mut cause: &dyn std::error::Error = source;
                while let Some(next) = cause.source() {
                    cause = next;
                }
                Attempt::NoAnswer(short_cause(&cause.to_string()))
            }
        }
    }
}

/// Whether the connection was refused: nothing listens at the address (a
/// node that is down), unlike a timeout, which a partition also gives.
pub(crate) fn connection_refused(status: &Status) -> bool {
    let mut cause = std::error::Error::source(status);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        cause = e.source();
    }
    false
}

/// "Connection refused (os error 111)" as "connection refused".
fn short_cause(text: &str) -> String {
    let text = text.split(" (os error").next().unwrap_or(text).trim();
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => "no answer".into(),
    }
}

/// The message of an [`ClientError::Unavailable`] after every endpoint
/// failed: which endpoints were tried, what each said, and what to do.
pub(crate) fn unavailable_message(attempts: &[(String, Option<Attempt>)]) -> String {
    let tried: Vec<&str> = attempts.iter().map(|(e, _)| e.as_str()).collect();
    let no_answer: Vec<&String> = attempts
        .iter()
        .filter_map(|(_, a)| match a {
            Some(Attempt::NoAnswer(why)) => Some(why),
            _ => None,
        })
        .collect();
    if no_answer.len() == attempts.len() {
        let mut causes = no_answer.clone();
        causes.sort();
        causes.dedup();
        let causes: Vec<&str> = causes.iter().map(|c| c.as_str()).collect();
        return format!(
            "no node answered at {} ({}): {NO_CLUSTER_HINT}",
            tried.join(", "),
            causes.join("; ")
        );
    }
    let each: Vec<String> = attempts
        .iter()
        .map(|(endpoint, a)| match a {
            Some(Attempt::Refused(why)) => format!("{endpoint}: {why}"),
            Some(Attempt::NoAnswer(why)) => format!("{endpoint}: no answer ({why})"),
            None => format!("{endpoint}: not tried in time"),
        })
        .collect();
    format!(
        "no node could serve the call ({}); it may succeed once a majority of the \
         members runs and has elected a leader",
        each.join("; ")
    )
}

/// The answer of the Acquire call: its three final cases (a server waits
/// out a queued acquire itself, and answers a full queue or table with
/// [`ClientError::ResourceExhausted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The lease is yours: carry `token` with every protected write.
    Granted {
        token: Token,
        expires_at_ms: u64,
        ttl_ms: u64,
        cluster_time_ms: u64,
        /// The leader's wall clock at the grant, ms since the Unix epoch:
        /// for logs and audits, never for timing the lease. 0 when unknown
        /// (the first second of a new cluster).
        wall_time_unix_ms: u64,
    },
    /// Another owner holds it.
    Held {
        current_token: Token,
        remaining_ms: u64,
    },
    /// This owner id's lease on the resource already ended (`reason`): owner
    /// ids are single-use per attempt, so nothing was granted. Typically a
    /// retry that came after the attempt was over. Start a new attempt with a
    /// new owner id.
    Ended { reason: LostReason },
}

/// One lease of a [`Client::renew_many`] call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenewItem<'a> {
    pub resource: &'a str,
    pub owner_id: OwnerId,
    pub token: Token,
    pub ttl: Duration,
}

/// A token from an answer: tokens start at 1, so 0 is a broken answer.
pub(crate) fn answered_token(rpc: &str, field: &str, value: u64) -> Result<Token, ClientError> {
    Token::new(value)
        .map_err(|_| ClientError::Server(format!("{rpc}: the answer's {field} is 0, not a token")))
}

fn renew_outcome(resp: v1::RenewResponse) -> Result<RenewOutcome, ClientError> {
    match resp.outcome {
        Some(renew_response::Outcome::Renewed(r)) => Ok(RenewOutcome::Renewed {
            expires_at: fenced_core::ClusterTime::from_millis(r.expires_at_ms),
            ttl_ms: r.ttl_ms,
        }),
        Some(renew_response::Outcome::Lost(l)) => Ok(RenewOutcome::Lost(lost_reason_from_wire(
            l.reason,
            l.current_token,
        ))),
        None => Err(ClientError::Server("renew: empty response".into())),
    }
}

/// A connection to a fenced cluster. Cheap to clone: clones share the
/// connections.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    /// Shared by clones made with the `with_*` builders too.
    endpoints: Arc<Endpoints>,
    /// Where the next call goes first: the leader, once an answer named it.
    next: AtomicUsize,
    settings: Settings,
    /// Renews every lease granted through this client, together.
    keeper: Keeper,
}

/// What the `with_*` builders set.
#[derive(Clone)]
struct Settings {
    call_timeout: Duration,
    lease_options: LeaseOptions,
    /// `Bearer <token>`, sent as `authorization` on every call.
    bearer: Option<MetadataValue<Ascii>>,
    /// Whether the endpoints are `https://`: a token goes to a plaintext
    /// one only on loopback.
    tls: bool,
    /// Give up at once when every endpoint refused the connection.
    fail_fast: bool,
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
        let connector = transport::Connector {
            tls: tls
                .map(TlsOptions::connector)
                .transpose()
                .map_err(ClientError::Tls)?,
        };
        let scheme = if tls.is_some() { "https" } else { "http" };
        let mut list = Vec::new();
        for e in endpoints {
            let e = e.as_ref().trim().to_string();
            if e.is_empty() {
                continue;
            }
            let url = if e.contains("://") {
                e.clone()
            } else {
                format!("{scheme}://{e}")
            };
            if !url.starts_with(&format!("{scheme}://")) {
                return Err(ClientError::Endpoint {
                    endpoint: e,
                    reason: if tls.is_some() {
                        "only https:// endpoints with TLS options".into()
                    } else {
                        "only http:// endpoints (host:port) without TLS options \
                         (https:// needs a CA: TlsOptions, fencectl --cacert)"
                            .into()
                    },
                });
            }
            // The connector does the TLS (see transport::Connector).
            let url = url.replacen("https://", "http://", 1);
            let channel = Channel::from_shared(url)
                .map_err(|err| ClientError::Endpoint {
                    endpoint: e.clone(),
                    reason: err.to_string(),
                })?
                .connect_timeout(transport::CONNECT_TIMEOUT)
                .connect_with_connector_lazy(connector.clone());
            list.push(Endpoint::new(e, channel));
        }
        if list.is_empty() {
            return Err(ClientError::Endpoint {
                endpoint: String::new(),
                reason: "no endpoint given".into(),
            });
        }
        Ok(Self {
            inner: Arc::new(Inner {
                endpoints: Arc::new(Endpoints::new(list)),
                next: AtomicUsize::new(0),
                settings: Settings {
                    call_timeout: Duration::from_secs(10),
                    lease_options: LeaseOptions::default(),
                    bearer: None,
                    tls: tls.is_some(),
                    fail_fast: false,
                },
                keeper: Keeper::default(),
            }),
        })
    }

    /// A client on the same connections with other settings (and a keeper
    /// of its own).
    fn with_settings(&self, change: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = self.inner.settings.clone();
        change(&mut settings);
        Self {
            inner: Arc::new(Inner {
                endpoints: Arc::clone(&self.inner.endpoints),
                next: AtomicUsize::new(0),
                settings,
                keeper: Keeper::default(),
            }),
        }
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

    /// How the leases this client grants are renewed (see [`LeaseOptions`]).
    pub fn with_lease_options(self, lease_options: LeaseOptions) -> Self {
        self.with_settings(|s| s.lease_options = lease_options)
    }

    /// Sends `authorization: Bearer <token>` on every call. Fails when the
    /// token cannot travel in metadata (it is not visible ASCII), or would
    /// travel in plaintext to an endpoint that is not loopback (naming it).
    pub fn with_token(self, token: &str) -> Result<Self, ClientError> {
        if !self.inner.settings.tls {
            for e in self.inner.endpoints.iter() {
                if let Some(reason) = tls::plaintext_token_refusal(&e.name) {
                    return Err(ClientError::Endpoint {
                        endpoint: e.name.clone(),
                        reason,
                    });
                }
            }
        }
        let bearer = MetadataValue::try_from(format!("Bearer {}", token.trim()))
            .map_err(|_| ClientError::InvalidArgument("token: must be printable ASCII".into()))?;
        Ok(self.with_settings(|s| s.bearer = Some(bearer)))
    }

    pub(crate) fn lease_options(&self) -> LeaseOptions {
        self.inner.settings.lease_options
    }

    pub(crate) fn keeper(&self) -> &Keeper {
        &self.inner.keeper
    }

    /// The endpoints this client was given.
    pub fn endpoints(&self) -> Vec<String> {
        self.inner
            .endpoints
            .iter()
            .map(|e| e.name.clone())
            .collect()
    }

    /// Calls `f` on endpoints until one answers or `budget` runs out,
    /// pausing 25 ms after the first failure, doubling to
    /// [`RETRY_BACKOFF_MAX`], each pause with up to a quarter more as jitter.
    /// The first attempt goes to the leader when an answer named it (see
    /// `leader`), a retry to the leader an error named, else to the next
    /// endpoint. Returns the answer and the moment the answered attempt was
    /// sent.
    pub(crate) async fn with_retries<T, F, Fut>(
        &self,
        budget: Duration,
        mut f: F,
    ) -> Result<(tonic::Response<T>, Moment), ClientError>
    where
        F: FnMut(Channel, Duration) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
    {
        let endpoints = &self.inner.endpoints;
        let deadline = Instant::now() + budget;
        let mut backoff = Duration::from_millis(25);
        // Each endpoint's last failure, for the error if none answers.
        let mut attempts: Vec<(String, Option<Attempt>)> =
            endpoints.iter().map(|e| (e.name.clone(), None)).collect();
        // Which endpoints refused the connection at their last attempt.
        let mut refused = vec![false; attempts.len()];
        loop {
            let i = self.inner.next.load(Ordering::Relaxed) % endpoints.len();
            let endpoint = endpoints.get(i);
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(ClientError::Unavailable(unavailable_message(&attempts)));
            }
            let sent = Moment::now();
            match f(endpoint.channel.clone(), left).await {
                Ok(v) => {
                    if let Some(leader) = endpoints.learn(i, v.metadata()) {
                        self.follow(i, leader);
                    }
                    return Ok((v, sent));
                }
                Err(status) => {
                    if let Some(tls) = tls::failure(&status) {
                        return Err(ClientError::Tls(tls));
                    }
                    let hinted = endpoints.learn(i, status.metadata());
                    let status = match classify(status) {
                        Ok(status) => status,
                        Err(e) => {
                            // The node answered: its hint is as good as ever.
                            if let Some(leader) = hinted {
                                self.follow(i, leader);
                            }
                            return Err(e);
                        }
                    };
                    endpoints.failed(i);
                    if let Some(r) = refused.get_mut(i) {
                        *r = connection_refused(&status);
                    }
                    let attempt = Attempt::of(&status);
                    let next = hinted.filter(|j| *j != i).unwrap_or(i + 1);
                    tracing::debug!(endpoint = %endpoint.name, error = ?attempt, next = %endpoints.get(next).name, "retrying");
                    attempts[i].1 = Some(attempt);
                    self.inner.next.store(next, Ordering::Relaxed);
                    if self.inner.settings.fail_fast && refused.iter().all(|r| *r) {
                        return Err(ClientError::Unavailable(unavailable_message(&attempts)));
                    }
                }
            }
            // Jitter keeps many clients from retrying in lockstep.
            let jitter = backoff.mul_f64(f64::from(sent.subsec_nanos() % 1000) / 4000.0);
            let pause = (backoff + jitter).min(deadline.saturating_duration_since(Instant::now()));
            tokio::time::sleep(pause).await;
            backoff = (backoff * 2).min(RETRY_BACKOFF_MAX);
        }
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
        self.acquire_sent(resource, owner_id, ttl, wait)
            .await
            .map(|(o, _)| o)
    }

    pub(crate) async fn acquire_sent(
        &self,
        resource: &str,
        owner_id: OwnerId,
        ttl: Duration,
        wait: Duration,
    ) -> Result<(AcquireOutcome, Moment), ClientError> {
        let started = Instant::now();
        let (resp, sent) = self
            .with_retries(self.inner.settings.call_timeout + wait, |ch, left| {
                // A retry waits only for what is left of the caller's wait.
                let wait_left = wait.saturating_sub(started.elapsed());
                let req = v1::AcquireRequest {
                    resource: resource.as_bytes().to_vec(),
                    owner_id: owner_id.as_bytes().to_vec(),
                    ttl_ms: millis(ttl),
                    wait_ms: millis(wait_left),
                };
                let req = self.request(req, left.min(wait_left + ATTEMPT_TIMEOUT));
                async move { LockClient::new(ch).acquire(req).await }
            })
            .await?;
        let outcome = acquire_outcome(resp.into_inner())?
            .ok_or_else(|| ClientError::Server("acquire: a session's answer".into()))?;
        Ok((outcome, sent))
    }

    /// Extends the lease held with (`owner_id`, `token`); the token stays.
    pub async fn renew(
        &self,
        resource: &str,
        owner_id: OwnerId,
        token: Token,
        ttl: Duration,
    ) -> Result<RenewOutcome, ClientError> {
        self.renew_sent(
            resource,
            owner_id,
            token,
            ttl,
            self.inner.settings.call_timeout,
        )
        .await
        .map(|(o, _)| o)
    }

    pub(crate) async fn renew_sent(
        &self,
        resource: &str,
        owner_id: OwnerId,
        token: Token,
        ttl: Duration,
        budget: Duration,
    ) -> Result<(RenewOutcome, Moment), ClientError> {
        let req = v1::RenewRequest {
            resource: resource.as_bytes().to_vec(),
            owner_id: owner_id.as_bytes().to_vec(),
            token: token.get(),
            ttl_ms: millis(ttl),
        };
        let (resp, sent) = self
            .with_retries(budget, |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { LockClient::new(ch).renew(req).await }
            })
            .await?;
        Ok((renew_outcome(resp.into_inner())?, sent))
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
        self.renew_many_sent(leases, self.inner.settings.call_timeout)
            .await
            .map(|(o, _)| o)
    }

    pub(crate) async fn renew_many_sent(
        &self,
        leases: &[RenewItem<'_>],
        budget: Duration,
    ) -> Result<(Vec<RenewOutcome>, Moment), ClientError> {
        let req = v1::RenewManyRequest {
            leases: leases
                .iter()
                .map(|l| v1::RenewRequest {
                    resource: l.resource.as_bytes().to_vec(),
                    owner_id: l.owner_id.as_bytes().to_vec(),
                    token: l.token.get(),
                    ttl_ms: millis(l.ttl),
                })
                .collect(),
        };
        let (resp, sent) = self
            .with_retries(budget, |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { LockClient::new(ch).renew_many(req).await }
            })
            .await?;
        let results = resp.into_inner().results;
        if results.len() != leases.len() {
            return Err(ClientError::Server(format!(
                "renew_many: {} results for {} leases",
                results.len(),
                leases.len()
            )));
        }
        let outcomes = results
            .into_iter()
            .map(renew_outcome)
            .collect::<Result<_, _>>()?;
        Ok((outcomes, sent))
    }

    /// Ends the lease held with (`owner_id`, `token`).
    pub async fn release(
        &self,
        resource: &str,
        owner_id: OwnerId,
        token: Token,
    ) -> Result<ReleaseOutcome, ClientError> {
        let req = v1::ReleaseRequest {
            resource: resource.as_bytes().to_vec(),
            owner_id: owner_id.as_bytes().to_vec(),
            token: token.get(),
        };
        let resp = self
            .with_retries(self.inner.settings.call_timeout, |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { LockClient::new(ch).release(req).await }
            })
            .await?
            .0
            .into_inner();
        match resp.outcome {
            Some(release_response::Outcome::Released(_)) => Ok(ReleaseOutcome::Released),
            Some(release_response::Outcome::NotHolder(n)) => Ok(ReleaseOutcome::NotHolder(
                lost_reason_from_wire(n.reason, n.current_token),
            )),
            None => Err(ClientError::Server("release: empty response".into())),
        }
    }

    /// The state of `resource` (linearizable).
    pub async fn describe(&self, resource: &str) -> Result<v1::DescribeResponse, ClientError> {
        let req = v1::DescribeRequest {
            resource: resource.as_bytes().to_vec(),
            allow_stale: false,
        };
        Ok(self
            .with_retries(self.inner.settings.call_timeout, |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { LockClient::new(ch).describe(req).await }
            })
            .await?
            .0
            .into_inner())
    }

    /// Whether `token` is still the current lease of `resource`
    /// (linearizable).
    pub async fn validate_token(
        &self,
        resource: &str,
        token: Token,
    ) -> Result<v1::ValidateTokenResponse, ClientError> {
        let req = v1::ValidateTokenRequest {
            resource: resource.as_bytes().to_vec(),
            token: token.get(),
            owner_id: Vec::new(),
        };
        Ok(self
            .with_retries(self.inner.settings.call_timeout, |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { LockClient::new(ch).validate_token(req).await }
            })
            .await?
            .0
            .into_inner())
    }

    /// [`Client::validate_token`] for many pairs, answered at one point.
    pub async fn validate_tokens(
        &self,
        checks: &[(&str, Token)],
    ) -> Result<v1::ValidateTokensResponse, ClientError> {
        let req = v1::ValidateTokensRequest {
            checks: checks
                .iter()
                .map(|(r, t)| v1::ValidateTokenRequest {
                    resource: r.as_bytes().to_vec(),
                    token: t.get(),
                    owner_id: Vec::new(),
                })
                .collect(),
        };
        Ok(self
            .with_retries(self.inner.settings.call_timeout, |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { LockClient::new(ch).validate_tokens(req).await }
            })
            .await?
            .0
            .into_inner())
    }

    /// The last grants of `resource`, newest first (`limit` 0: all kept).
    pub async fn history(
        &self,
        resource: &str,
        limit: u32,
    ) -> Result<v1::HistoryResponse, ClientError> {
        let req = v1::HistoryRequest {
            resource: resource.as_bytes().to_vec(),
            limit,
        };
        Ok(self
            .with_retries(self.inner.settings.call_timeout, |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { LockClient::new(ch).history(req).await }
            })
            .await?
            .0
            .into_inner())
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
        let req = v1::WatchRequest {
            prefix: prefix.as_bytes().to_vec(),
            from_revision,
        };
        Ok(self
            .with_retries(self.inner.settings.call_timeout, |ch, _| {
                let mut req = tonic::Request::new(req.clone());
                if let Some(bearer) = &self.inner.settings.bearer {
                    req.metadata_mut().insert("authorization", bearer.clone());
                }
                async move { LockClient::new(ch).watch(req).await }
            })
            .await?
            .0
            .into_inner())
    }

    /// The status of the first node that answers.
    pub async fn status(&self) -> Result<v1::StatusResponse, ClientError> {
        Ok(self
            .with_retries(self.inner.settings.call_timeout, |ch, left| {
                let req = self.request(v1::StatusRequest::default(), left.min(ATTEMPT_TIMEOUT));
                async move { ClusterClient::new(ch).status(req).await }
            })
            .await?
            .0
            .into_inner())
    }

    /// A backup of the cluster's state, streamed from the leader after a
    /// linearizable read (admin role): its summary and the file's bytes,
    /// checked against the summary's length. Followers are skipped like
    /// any node that is not the leader. At most `max_bytes` are accepted.
    pub async fn save_snapshot(
        &self,
        max_bytes: u64,
    ) -> Result<(v1::SnapshotSummary, Vec<u8>), ClientError> {
        Ok(self
            .with_retries(self.inner.settings.call_timeout, |ch, left| {
                let req = self.request(v1::SaveSnapshotRequest {}, left);
                async move {
                    let (metadata, mut stream, extensions) = MaintenanceClient::new(ch)
                        .save_snapshot(req)
                        .await?
                        .into_parts();
                    let summary = stream
                        .message()
                        .await?
                        .and_then(|c| c.summary)
                        .ok_or_else(|| Status::internal("snapshot save: no summary"))?;
                    if summary.total_bytes > max_bytes {
                        return Err(Status::internal(format!(
                            "snapshot save: {} bytes, more than the bound {max_bytes}",
                            summary.total_bytes
                        )));
                    }
                    let mut bytes = Vec::with_capacity(
                        usize::try_from(summary.total_bytes).unwrap_or(usize::MAX),
                    );
                    while let Some(chunk) = stream.message().await? {
                        if (bytes.len() + chunk.data.len()) as u64 > summary.total_bytes {
                            return Err(Status::internal(
                                "snapshot save: more bytes than the summary announced",
                            ));
                        }
                        bytes.extend_from_slice(&chunk.data);
                    }
                    if bytes.len() as u64 != summary.total_bytes {
                        // Cut short: worth another try.
                        return Err(Status::unavailable(format!(
                            "snapshot save: stream ended after {} of {} bytes",
                            bytes.len(),
                            summary.total_bytes
                        )));
                    }
                    // The answer's metadata, so a leader it names is learnt.
                    Ok(tonic::Response::from_parts(
                        metadata,
                        (summary, bytes),
                        extensions,
                    ))
                }
            })
            .await?
            .0
            .into_inner())
    }

    /// The status of every endpoint, each on its own (no retries).
    pub async fn status_of_each(&self) -> Vec<(String, Result<v1::StatusResponse, ClientError>)> {
        self.status_each().await.0
    }

    /// [`Client::status_of_each`], or the error when no endpoint answered:
    /// a refusal (TLS, authentication) as it is, otherwise
    /// [`ClientError::Unavailable`] naming every endpoint tried.
    pub async fn status_of_each_answered(
        &self,
    ) -> Result<Vec<(String, Result<v1::StatusResponse, ClientError>)>, ClientError> {
        let (mut each, attempts) = self.status_each().await;
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

    async fn status_each(
        &self,
    ) -> (
        Vec<(String, Result<v1::StatusResponse, ClientError>)>,
        Vec<(String, Option<Attempt>)>,
    ) {
        let mut out = Vec::new();
        let mut attempts = Vec::new();
        for (i, e) in self.inner.endpoints.iter().enumerate() {
            let name = &e.name;
            let req = self.request(v1::StatusRequest::default(), Duration::from_secs(2));
            let mut attempt = None;
            let r = ClusterClient::new(e.channel.clone())
                .status(req)
                .await
                .map(|r| {
                    // Learns which node each endpoint is; follows no hint.
                    let _ = self.inner.endpoints.learn(i, r.metadata());
                    r.into_inner()
                })
                .map_err(|s| match tls::failure(&s) {
                    Some(tls) => ClientError::Tls(tls),
                    None => match classify(s) {
                        Err(refused) => refused,
                        Ok(s) => {
                            let a = Attempt::of(&s);
                            let e = unavailable_message(&[(name.clone(), Some(a.clone()))]);
                            attempt = Some(a);
                            ClientError::Unavailable(e)
                        }
                    },
                });
            attempts.push((name.clone(), attempt));
            out.push((name.clone(), r));
        }
        (out, attempts)
    }
}

/// An acquire's answer; `None` when it says the session it named is gone.
pub(crate) fn acquire_outcome(
    resp: v1::AcquireResponse,
) -> Result<Option<AcquireOutcome>, ClientError> {
    let outcome = match resp.outcome {
        Some(acquire_response::Outcome::Granted(g)) => AcquireOutcome::Granted {
            token: answered_token("acquire", "token", g.token)?,
            expires_at_ms: g.expires_at_ms,
            ttl_ms: g.ttl_ms,
            cluster_time_ms: resp.cluster_time_ms,
            wall_time_unix_ms: resp.wall_time_unix_ms,
        },
        Some(acquire_response::Outcome::Held(h)) => AcquireOutcome::Held {
            current_token: answered_token("acquire", "current_token", h.current_token)?,
            remaining_ms: h.remaining_ms,
        },
        Some(acquire_response::Outcome::Ended(e)) => AcquireOutcome::Ended {
            reason: lost_reason_from_wire(e.reason, e.current_token),
        },
        Some(acquire_response::Outcome::SessionGone(_)) => return Ok(None),
        None => return Err(ClientError::Server("acquire: empty response".into())),
    };
    Ok(Some(outcome))
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Client {
    pub(crate) fn call_timeout(&self) -> Duration {
        self.inner.settings.call_timeout
    }

    /// Sends the next calls to endpoint `leader`, which the answer on
    /// endpoint `answered` named as the leader.
    fn follow(&self, answered: usize, leader: usize) {
        let previous = self.inner.next.swap(leader, Ordering::Relaxed) % self.inner.endpoints.len();
        if previous != leader {
            tracing::debug!(
                from = %self.inner.endpoints.get(answered).name,
                leader = %self.inner.endpoints.get(leader).name,
                "following the leader"
            );
        }
    }

    /// A request with the call's timeout and this client's credentials.
    pub(crate) fn request<T>(&self, msg: T, timeout: Duration) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        req.set_timeout(timeout);
        if let Some(bearer) = &self.inner.settings.bearer {
            req.metadata_mut().insert("authorization", bearer.clone());
        }
        req
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fenced_proto::v1::cluster_server::{Cluster, ClusterServer};
    use std::sync::atomic::AtomicU64;
    use tonic::{Request, Response};

    /// A node that answers Status only, naming itself and a leader.
    struct FakeNode {
        id: u64,
        leader_hint: String,
        calls: Arc<AtomicU64>,
    }

    #[tonic::async_trait]
    impl Cluster for FakeNode {
        async fn status(
            &self,
            _req: Request<v1::StatusRequest>,
        ) -> Result<Response<v1::StatusResponse>, Status> {
            self.calls.fetch_add(1, Ordering::SeqCst);
            let mut resp = Response::new(v1::StatusResponse {
                node_id: self.id,
                ..Default::default()
            });
            let md = resp.metadata_mut();
            md.insert(crate::leader::NODE_HEADER, MetadataValue::from(self.id));
            let hint = MetadataValue::try_from(self.leader_hint.as_str())
                .map_err(|_| Status::internal("hint"))?;
            md.insert(crate::leader::LEADER_HEADER, hint);
            Ok(resp)
        }
        async fn add_learner(
            &self,
            _req: Request<v1::AddLearnerRequest>,
        ) -> Result<Response<v1::MembershipResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }
        async fn change_membership(
            &self,
            _req: Request<v1::ChangeMembershipRequest>,
        ) -> Result<Response<v1::MembershipResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }
        async fn remove_node(
            &self,
            _req: Request<v1::RemoveNodeRequest>,
        ) -> Result<Response<v1::MembershipResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }
        async fn promote_learner(
            &self,
            _req: Request<v1::PromoteLearnerRequest>,
        ) -> Result<Response<v1::MembershipResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }
        async fn list_members(
            &self,
            _req: Request<v1::ListMembersRequest>,
        ) -> Result<Response<v1::ListMembersResponse>, Status> {
            Err(Status::unimplemented("fake"))
        }
    }

    /// Serves a fake node on a fresh loopback port; returns its address
    /// and its call counter.
    async fn fake_node(id: u64, leader_hint: String) -> std::io::Result<(String, Arc<AtomicU64>)> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?.to_string();
        let calls = Arc::new(AtomicU64::new(0));
        let node = FakeNode {
            id,
            leader_hint,
            calls: Arc::clone(&calls),
        };
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(ClusterServer::new(node))
                .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener)),
        );
        Ok((addr, calls))
    }

    /// A loopback address nothing listens on.
    async fn dead_address() -> std::io::Result<String> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        Ok(listener.local_addr()?.to_string())
    }

    fn next_of(client: &Client) -> usize {
        client.inner.next.load(Ordering::Relaxed) % client.inner.endpoints.len()
    }

    #[tokio::test]
    async fn the_client_moves_to_the_leader_an_answer_names(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let (leader, leader_calls) = fake_node(2, String::new()).await?;
        let (follower, follower_calls) = fake_node(1, format!("2,{leader}")).await?;
        let client = Client::new([follower.as_str(), leader.as_str()])?;
        client.status().await?;
        assert_eq!(next_of(&client), 1, "the hint named endpoint 1");
        for _ in 0..3 {
            client.status().await?;
        }
        assert_eq!(follower_calls.load(Ordering::SeqCst), 1);
        assert_eq!(leader_calls.load(Ordering::SeqCst), 3);
        Ok(())
    }

    #[tokio::test]
    async fn a_hint_naming_an_address_not_configured_is_ignored(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let elsewhere = dead_address().await?;
        let (a, a_calls) = fake_node(1, format!("3,{elsewhere}")).await?;
        let (b, _) = fake_node(2, format!("3,{elsewhere}")).await?;
        let client = Client::new([a.as_str(), b.as_str()])?;
        for _ in 0..3 {
            client.status().await?;
            assert_eq!(next_of(&client), 0, "stays on the endpoint that answers");
        }
        assert_eq!(a_calls.load(Ordering::SeqCst), 3);
        Ok(())
    }

    #[tokio::test]
    async fn a_hint_to_a_node_that_does_not_answer_falls_back_to_the_list(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dead = dead_address().await?;
        let (a, a_calls) = fake_node(1, format!("2,{dead}")).await?;
        let client = Client::new([a.as_str(), dead.as_str()])?;
        client.status().await?;
        assert_eq!(next_of(&client), 1, "the hint is followed once");
        // The hinted node refuses: the call is answered by the list, and
        // the same hint is not followed back to the dead node.
        client.status().await?;
        assert_eq!(a_calls.load(Ordering::SeqCst), 2);
        assert_eq!(next_of(&client), 0, "the dead leader is held off");
        client.status().await?;
        assert_eq!(a_calls.load(Ordering::SeqCst), 3);
        assert_eq!(next_of(&client), 0);
        Ok(())
    }

    /// With fail-fast on, a cluster where nothing listens is reported at
    /// once, not after the call timeout.
    #[tokio::test]
    async fn fail_fast_gives_up_at_once_when_every_endpoint_refuses(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dead = [dead_address().await?, dead_address().await?];
        let client = Client::new(&dead)?
            .with_call_timeout(Duration::from_secs(10))
            .with_fail_fast(true);
        let started = Instant::now();
        let err = client.describe("x").await.err();
        assert!(
            matches!(&err, Some(ClientError::Unavailable(m)) if m.contains("connection refused")),
            "{err:?}"
        );
        assert!(
            started.elapsed() < Duration::from_secs(1),
            "{:?}",
            started.elapsed()
        );
        Ok(())
    }

    /// Fail-fast is about refusals only: one endpoint that answers still
    /// serves the call, and a node that accepts but stays silent (a
    /// partition looks the same) is waited on up to the call timeout.
    #[tokio::test]
    async fn fail_fast_still_uses_a_live_endpoint_and_waits_on_a_silent_one(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dead = dead_address().await?;
        let (live, calls) = fake_node(1, String::new()).await?;
        let client = Client::new([dead.as_str(), live.as_str()])?.with_fail_fast(true);
        client.status().await?;
        assert_eq!(calls.load(Ordering::SeqCst), 1);

        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let silent_addr = silent.local_addr()?.to_string();
        let client = Client::new([dead.as_str(), silent_addr.as_str()])?
            .with_call_timeout(Duration::from_millis(1500))
            .with_fail_fast(true);
        let started = Instant::now();
        let err = client.status().await.err();
        assert!(matches!(err, Some(ClientError::Unavailable(_))), "{err:?}");
        assert!(
            started.elapsed() >= Duration::from_millis(1400),
            "a silent node is not a refusal: {:?}",
            started.elapsed()
        );
        drop(silent);
        Ok(())
    }

    fn endpoint_error(endpoints: &[&str]) -> Option<String> {
        match Client::new(endpoints) {
            Err(ClientError::Endpoint { endpoint, reason }) => {
                Some(format!("{endpoint}: {reason}"))
            }
            Err(other) => Some(format!("unexpected error {other}")),
            Ok(_) => None,
        }
    }

    #[test]
    fn an_unavailable_cluster_names_every_endpoint_and_the_next_step() {
        let refused = || Some(Attempt::NoAnswer("connection refused".into()));
        let none = unavailable_message(&[
            ("127.0.0.1:7101".into(), refused()),
            ("127.0.0.1:7102".into(), refused()),
        ]);
        assert_eq!(
            none,
            format!(
                "no node answered at 127.0.0.1:7101, 127.0.0.1:7102 (connection refused): \
                 {NO_CLUSTER_HINT}"
            )
        );
        let some = unavailable_message(&[
            (
                "127.0.0.1:7101".into(),
                Some(Attempt::Refused(
                    "node 1 has no leader: 1 of 3 members reachable".into(),
                )),
            ),
            ("127.0.0.1:7102".into(), refused()),
            ("127.0.0.1:7103".into(), None),
        ]);
        assert!(
            some.contains("127.0.0.1:7101: node 1 has no leader: 1 of 3 members reachable")
                && some.contains("127.0.0.1:7102: no answer (connection refused)")
                && some.contains("127.0.0.1:7103: not tried in time"),
            "{some}"
        );
        assert_eq!(
            short_cause("Connection refused (os error 111)"),
            "connection refused"
        );
    }

    #[test]
    fn refusals_say_how_to_get_a_token_or_a_role() {
        let e = classify(Status::unauthenticated(
            "authentication failed: unknown or revoked token",
        ))
        .err();
        assert!(
            matches!(&e, Some(ClientError::Unauthenticated(m)) if m.starts_with("unknown or revoked token; ") && m.contains("fenced auth new-token")),
            "{e:?}"
        );
        let e = classify(Status::permission_denied(
            "permission denied: identity \"a\" may not acquire",
        ))
        .err();
        assert!(
            matches!(&e, Some(ClientError::PermissionDenied(m)) if m.contains("may not acquire") && m.contains("auth_policy")),
            "{e:?}"
        );
    }

    #[tokio::test]
    async fn endpoints_are_host_port_or_http_urls() {
        assert_eq!(
            endpoint_error(&["127.0.0.1:7101", "http://localhost:7102"]),
            None
        );
        assert_eq!(endpoint_error(&["[::1]:7101"]), None);
        let https = endpoint_error(&["https://fenced.example:7101"]);
        assert!(
            https
                .as_deref()
                .is_some_and(|e| e.starts_with("https://fenced.example:7101: only http://")),
            "{https:?}"
        );
        let none = endpoint_error(&[" ", ""]);
        assert!(
            none.as_deref()
                .is_some_and(|e| e.contains("no endpoint given")),
            "{none:?}"
        );
    }
}
