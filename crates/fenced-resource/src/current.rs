//! The cluster check: before a write is applied, the lock cluster is asked
//! (ValidateTokens, a linearizable read) whether the write's token is the
//! current lease of its resource and was granted to the write's owner id.
//! Anything else refuses the write: a token the cluster never issued (above
//! its newest), an ended or superseded lease, another owner's lease, and a
//! cluster that cannot answer in time (fail closed).
//!
//! Writes that arrive together share one call: a batcher takes every check
//! queued (at most `batch_max`, waiting at most `batch_wait` for more) while
//! at most `calls_in_flight` calls run, so a busy writer pays a fraction of
//! a round trip per write.
//!
//! The answer holds at a point after the write arrived and before it is
//! applied; a lease superseded between the two is still fenced by the
//! store's own compare as soon as the newer owner writes (docs/DECISIONS.md,
//! "fenced-resource: the cluster check").

use std::{sync::Arc, time::Duration};

use fenced_core::{OwnerId, ResourceName, Token};
use fenced_proto::v1::{self, lock_client::LockClient};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tonic::{
    metadata::{Ascii, MetadataValue},
    transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity},
    Code, Status,
};

/// How the service reaches the lock cluster.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// `host:port` (or `http(s)://host:port`) of the cluster's nodes.
    pub endpoints: Vec<String>,
    /// PEM of the CA that signed the nodes' certificates: TLS on.
    pub ca_pem: Option<Vec<u8>>,
    /// PEM certificate and key of this service, for a cluster that
    /// requires client certificates.
    pub identity_pem: Option<(Vec<u8>, Vec<u8>)>,
    /// Bearer token with the `read` role on the resources.
    pub bearer: Option<String>,
    /// The time one check may take in all, queueing and retries included.
    pub timeout: Duration,
    /// The most checks in flight; beyond, writes are refused at once.
    pub max_in_flight: usize,
    /// The most checks in one ValidateTokens call (1 to
    /// [`fenced_core::MAX_VALIDATE_BATCH`]).
    pub batch_max: usize,
    /// How long a batch waits for more checks once it has one.
    pub batch_wait: Duration,
    /// The most ValidateTokens calls in flight at once.
    pub calls_in_flight: usize,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            endpoints: Vec::new(),
            ca_pem: None,
            identity_pem: None,
            bearer: None,
            timeout: Duration::from_secs(2),
            max_in_flight: 1_024,
            batch_max: fenced_core::MAX_VALIDATE_BATCH,
            batch_wait: Duration::ZERO,
            calls_in_flight: 4,
        }
    }
}

impl ClusterOptions {
    /// Options for `endpoints` with the files of a command line read: the
    /// cluster's CA, this service's certificate and key, a file whose first
    /// line is a bearer token. Each error names the flag's field and path.
    pub fn from_files(
        endpoints: Vec<String>,
        ca: Option<&std::path::Path>,
        identity: Option<(&std::path::Path, &std::path::Path)>,
        token_file: Option<&std::path::Path>,
    ) -> Result<Self, String> {
        let read = |field: &str, p: &std::path::Path| {
            std::fs::read(p).map_err(|e| format!("{field}: {}: {e}", p.display()))
        };
        let bearer = token_file
            .map(|p| first_line_of("cluster_token_file", p))
            .transpose()?;
        let identity_pem = match identity {
            Some((c, k)) => Some((read("cluster_cert", c)?, read("cluster_key", k)?)),
            None => None,
        };
        Ok(ClusterOptions {
            endpoints,
            ca_pem: ca.map(|p| read("cluster_ca", p)).transpose()?,
            identity_pem,
            bearer,
            ..ClusterOptions::default()
        })
    }
}

/// The first line of the file at `path`, trimmed: a secret (a bearer
/// token, an Authorization value) kept out of flags. Each error names
/// `field` and the path.
pub fn first_line_of(field: &str, path: &std::path::Path) -> Result<String, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{field}: {}: {e}", path.display()))?;
    let text =
        String::from_utf8(bytes).map_err(|_| format!("{field}: {}: not UTF-8", path.display()))?;
    text.lines()
        .next()
        .map(str::trim)
        .filter(|t| !t.is_empty())
        .map(str::to_string)
        .ok_or_else(|| format!("{field}: {}: empty", path.display()))
}

/// Why a write was refused by the cluster check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// The cluster answered: the token is not the current lease of this
    /// owner (final: the write must not be retried with this token).
    NotCurrent {
        /// The state's name (`SUPERSEDED`, `UNKNOWN`, `OWNER_MISMATCH`...).
        state: &'static str,
        /// The newest token the cluster issued for the resource (0: none).
        current_token: u64,
        /// The whole reason, for the writer.
        message: String,
    },
    /// The check could not be made (retry later); nothing was written.
    Unavailable(String),
    /// Too many checks in flight (retry later); nothing was written.
    Exhausted(String),
}

/// What an answer of the cluster means for the write (a pure decision).
///
/// ```
/// use fenced_proto::v1::{TokenState, ValidateTokenResponse};
/// use fenced_resource::current::{verdict, Refusal};
/// let ok = ValidateTokenResponse { state: TokenState::Current as i32, current_token: 4, owner_checked: true, ..Default::default() };
/// assert_eq!(verdict(&ok, 4), Ok(()));
/// // A server that did not compare the owner id is not trusted with it.
/// let old = ValidateTokenResponse { owner_checked: false, ..ok.clone() };
/// assert!(matches!(verdict(&old, 4), Err(Refusal::Unavailable(_))));
/// let never = ValidateTokenResponse { state: TokenState::Unknown as i32, current_token: 4, owner_checked: true, ..Default::default() };
/// assert!(matches!(verdict(&never, u64::MAX), Err(Refusal::NotCurrent { state: "UNKNOWN", .. })));
/// ```
pub fn verdict(answer: &v1::ValidateTokenResponse, token: u64) -> Result<(), Refusal> {
    let state = v1::TokenState::try_from(answer.state).unwrap_or(v1::TokenState::Unspecified);
    if state == v1::TokenState::Current && !answer.owner_checked {
        return Err(Refusal::Unavailable(
            "the lock cluster did not compare the owner id (a node older than \
             ValidateTokenRequest.owner_id); the write was not applied"
                .into(),
        ));
    }
    if state == v1::TokenState::Current {
        return Ok(());
    }
    let name = state.as_str_name().trim_start_matches("TOKEN_STATE_");
    let why = match state {
        v1::TokenState::Unknown if token > answer.current_token => {
            "the cluster never issued it (above its newest token)"
        }
        v1::TokenState::Superseded => "a newer lease was granted",
        v1::TokenState::Expired => "its lease ran out",
        v1::TokenState::Released => "its lease was released",
        v1::TokenState::OwnerMismatch => "its lease was granted to another owner id",
        _ => "the cluster does not know it",
    };
    Err(Refusal::NotCurrent {
        state: name,
        current_token: answer.current_token,
        message: format!(
            "token {token} is not current on the lock cluster ({name}: {why}; the cluster's \
             newest token is {}); the write was not applied",
            answer.current_token
        ),
    })
}

/// Takes up to `max` more items from `queue` without waiting.
fn fill<T>(batch: &mut Vec<T>, queue: &mut mpsc::Receiver<T>, max: usize) {
    while batch.len() < max {
        match queue.try_recv() {
            Ok(item) => batch.push(item),
            Err(_) => break,
        }
    }
}

struct Pending {
    check: v1::ValidateTokenRequest,
    reply: oneshot::Sender<Result<v1::ValidateTokenResponse, Refusal>>,
}

/// The nodes and how to call them.
struct Cluster {
    channels: Vec<(String, Channel)>,
    bearer: Option<MetadataValue<Ascii>>,
    timeout: Duration,
}

/// Asks the cluster whether a write's token is current for its owner.
#[derive(Clone)]
pub struct CurrentCheck {
    queue: mpsc::Sender<Pending>,
    timeout: Duration,
    in_flight: Arc<Semaphore>,
    max_in_flight: usize,
}

impl CurrentCheck {
    /// Connects lazily to the cluster and starts the batcher (call it inside
    /// a tokio runtime). Errors name the option at fault.
    pub fn new(o: ClusterOptions) -> Result<Self, String> {
        if o.endpoints.is_empty() {
            return Err("cluster: the cluster check needs --cluster endpoints (or \
                        --standalone-no-cluster-check to run without one)"
                .into());
        }
        if o.max_in_flight == 0 {
            return Err("current_checks_in_flight: must be at least 1".into());
        }
        let batch_bound = fenced_core::MAX_VALIDATE_BATCH;
        if o.batch_max == 0 || o.batch_max > batch_bound {
            return Err(format!(
                "current_batch_max: must be 1 to {batch_bound}, got {}",
                o.batch_max
            ));
        }
        if o.calls_in_flight == 0 {
            return Err("current_calls_in_flight: must be at least 1".into());
        }
        let scheme = if o.ca_pem.is_some() { "https" } else { "http" };
        let mut channels = Vec::new();
        for e in &o.endpoints {
            let url = if e.contains("://") {
                e.clone()
            } else {
                format!("{scheme}://{e}")
            };
            let mut endpoint = Endpoint::from_shared(url.clone())
                .map_err(|err| format!("cluster: endpoint {e}: {err}"))?
                .connect_timeout(o.timeout)
                .tcp_nodelay(true);
            if let Some(ca) = &o.ca_pem {
                let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
                if let Some((cert, key)) = &o.identity_pem {
                    tls = tls.identity(Identity::from_pem(cert, key));
                }
                endpoint = endpoint
                    .tls_config(tls)
                    .map_err(|err| format!("cluster: TLS for {e}: {err}"))?;
            }
            channels.push((e.clone(), endpoint.connect_lazy()));
        }
        let bearer = o
            .bearer
            .map(|t| {
                MetadataValue::try_from(format!("Bearer {}", t.trim()))
                    .map_err(|_| "cluster_token: must be printable ASCII".to_string())
            })
            .transpose()?;
        let cluster = Arc::new(Cluster {
            channels,
            bearer,
            timeout: o.timeout,
        });
        let (queue, rx) = mpsc::channel(o.max_in_flight);
        tokio::spawn(batcher(
            cluster,
            rx,
            o.batch_max,
            o.batch_wait,
            o.calls_in_flight,
        ));
        Ok(Self {
            queue,
            timeout: o.timeout,
            in_flight: Arc::new(Semaphore::new(o.max_in_flight)),
            max_in_flight: o.max_in_flight,
        })
    }

    /// `Ok` when `token` is the current lease of `resource`, granted to
    /// `owner`; else why the write is refused (nothing was written).
    pub async fn require(
        &self,
        resource: &ResourceName,
        token: Token,
        owner: OwnerId,
    ) -> Result<(), Refusal> {
        let _slot = self.in_flight.try_acquire().map_err(|_| {
            Refusal::Exhausted(format!(
                "current_checks_in_flight ({}) reached: the write was not applied; retry",
                self.max_in_flight
            ))
        })?;
        let (reply, answer) = oneshot::channel();
        let check = v1::ValidateTokenRequest {
            resource: resource.as_str().as_bytes().to_vec(),
            token: token.get(),
            owner_id: owner.as_bytes().to_vec(),
        };
        let unavailable = |why: &str| {
            Refusal::Unavailable(format!(
                "the lock cluster did not confirm token {token} on {resource} ({why}); the \
                 write was not applied"
            ))
        };
        self.queue
            .try_send(Pending { check, reply })
            .map_err(|_| unavailable("the check queue is full or stopped"))?;
        let answer = tokio::time::timeout(self.timeout, answer)
            .await
            .map_err(|_| unavailable(&format!("no answer within {} ms", self.timeout.as_millis())))?
            .map_err(|_| unavailable("the check was dropped"))??;
        verdict(&answer, token.get()).inspect_err(|r| {
            if let Refusal::NotCurrent { state, current_token, .. } = r {
                tracing::info!(%resource, token = token.get(), current_token, state,
                    "write refused: the token is not current on the lock cluster");
                tracing::debug!(%resource, token = token.get(), owner = %owner, "refused write's owner");
            }
        })
    }
}

/// Gathers queued checks into ValidateTokens calls until every
/// [`CurrentCheck`] is dropped.
async fn batcher(
    cluster: Arc<Cluster>,
    mut queue: mpsc::Receiver<Pending>,
    batch_max: usize,
    batch_wait: Duration,
    calls_in_flight: usize,
) {
    let calls = Arc::new(Semaphore::new(calls_in_flight));
    loop {
        // A call place first: while every place is taken, checks queue up
        // and the next call carries them all.
        let Ok(place) = calls.clone().acquire_owned().await else {
            return;
        };
        let Some(first) = queue.recv().await else {
            return;
        };
        let mut batch = vec![first];
        fill(&mut batch, &mut queue, batch_max);
        if batch.len() < batch_max && !batch_wait.is_zero() {
            let until = tokio::time::Instant::now() + batch_wait;
            while batch.len() < batch_max {
                match tokio::time::timeout_at(until, queue.recv()).await {
                    Ok(Some(p)) => {
                        batch.push(p);
                        fill(&mut batch, &mut queue, batch_max);
                    }
                    _ => break,
                }
            }
        }
        let cluster = cluster.clone();
        tokio::spawn(async move {
            let _place = place;
            let (checks, replies): (Vec<_>, Vec<_>) =
                batch.into_iter().map(|p| (p.check, p.reply)).unzip();
            let answers = cluster.answer(checks).await;
            for (reply, answer) in replies.into_iter().zip(answers) {
                // The writer may have given up (its time ran out).
                let _ = reply.send(answer);
            }
        });
    }
}

impl Cluster {
    /// One answer per check, in order.
    async fn answer(
        &self,
        checks: Vec<v1::ValidateTokenRequest>,
    ) -> Vec<Result<v1::ValidateTokenResponse, Refusal>> {
        let n = checks.len();
        match self.call(checks.clone()).await {
            Ok(answers) => answers.into_iter().map(Ok).collect(),
            // A refusal of one resource (not readable by this service's
            // identity) must not refuse the others it was batched with.
            Err(Asked::Final(_)) if n > 1 => {
                let mut out = Vec::with_capacity(n);
                for check in checks {
                    out.push(match self.call(vec![check]).await {
                        Ok(mut one) => one
                            .pop()
                            .ok_or_else(|| Refusal::Unavailable("no answer to the check".into())),
                        Err(e) => Err(e.refusal()),
                    });
                }
                out
            }
            Err(e) => vec![Err(e.refusal()); n],
        }
    }

    /// One ValidateTokens call, bounded in time, with one answer per check.
    async fn call(
        &self,
        checks: Vec<v1::ValidateTokenRequest>,
    ) -> Result<Vec<v1::ValidateTokenResponse>, Asked> {
        let n = checks.len();
        let request = v1::ValidateTokensRequest { checks };
        match tokio::time::timeout(self.timeout, self.ask(request)).await {
            Ok(Ok(r)) if r.results.len() == n => Ok(r.results),
            Ok(Ok(r)) => Err(Asked::Transient(format!(
                "{} answers to {n} checks",
                r.results.len()
            ))),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(Asked::Transient(format!(
                "no answer within {} ms",
                self.timeout.as_millis()
            ))),
        }
    }

    /// Tries the nodes in turn until one answers; errors that another node
    /// cannot fix (permission, bad request) end the call at once.
    async fn ask(
        &self,
        request: v1::ValidateTokensRequest,
    ) -> Result<v1::ValidateTokensResponse, Asked> {
        let mut last = String::new();
        let mut pause = Duration::from_millis(20);
        loop {
            for (name, ch) in &self.channels {
                let mut req = tonic::Request::new(request.clone());
                req.set_timeout(self.timeout);
                if let Some(b) = &self.bearer {
                    req.metadata_mut().insert("authorization", b.clone());
                }
                match LockClient::new(ch.clone()).validate_tokens(req).await {
                    Ok(r) => return Ok(r.into_inner()),
                    Err(s)
                        if matches!(
                            s.code(),
                            Code::PermissionDenied | Code::Unauthenticated | Code::InvalidArgument
                        ) =>
                    {
                        return Err(Asked::Final(format!("{name}: {}", s.message())))
                    }
                    Err(s) => last = format!("{name}: {}", s.message()),
                }
            }
            tracing::debug!(error = %last, "no node answered the check yet");
            tokio::time::sleep(pause).await;
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    }
}

/// Why a call gave no answers.
enum Asked {
    /// Refused in a way another node would not change.
    Final(String),
    /// No answer in time.
    Transient(String),
}

impl Asked {
    fn refusal(self) -> Refusal {
        Refusal::Unavailable(match self {
            Asked::Final(m) => {
                format!("the lock cluster refused the check ({m}); the write was not applied")
            }
            Asked::Transient(m) => {
                format!("the lock cluster did not answer ({m}); the write was not applied")
            }
        })
    }
}

/// The status a transient refusal is answered with.
pub fn refusal_status(r: &Refusal) -> Status {
    match r {
        Refusal::NotCurrent { message, .. } => Status::failed_precondition(message.clone()),
        Refusal::Unavailable(m) => Status::unavailable(m.clone()),
        Refusal::Exhausted(m) => Status::resource_exhausted(m.clone()),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;

    fn options(endpoints: &[&str]) -> ClusterOptions {
        ClusterOptions {
            endpoints: endpoints.iter().map(|s| s.to_string()).collect(),
            timeout: Duration::from_millis(300),
            max_in_flight: 1,
            ..ClusterOptions::default()
        }
    }

    fn answer(state: v1::TokenState, current_token: u64) -> v1::ValidateTokenResponse {
        v1::ValidateTokenResponse {
            state: state as i32,
            current_token,
            owner_checked: true,
            ..Default::default()
        }
    }

    #[test]
    fn only_a_current_lease_of_the_owner_passes() {
        use v1::TokenState as S;
        assert_eq!(verdict(&answer(S::Current, 5), 5), Ok(()));
        for (state, name) in [
            (S::Superseded, "SUPERSEDED"),
            (S::Expired, "EXPIRED"),
            (S::Released, "RELEASED"),
            (S::Unknown, "UNKNOWN"),
            (S::OwnerMismatch, "OWNER_MISMATCH"),
            (S::Unspecified, "UNSPECIFIED"),
        ] {
            let Err(Refusal::NotCurrent {
                state: got,
                message,
                ..
            }) = verdict(&answer(state, 5), 5)
            else {
                panic!("{name} passed");
            };
            assert_eq!(got, name);
            assert!(message.contains("not applied"), "{message}");
        }
        let never = verdict(&answer(S::Unknown, 5), u64::MAX).unwrap_err();
        let Refusal::NotCurrent { message, .. } = never else {
            panic!()
        };
        assert!(message.contains("never issued"), "{message}");
        // An unknown state number from a newer server refuses too.
        let mut future = answer(S::Current, 5);
        future.state = 99;
        assert!(matches!(
            verdict(&future, 5),
            Err(Refusal::NotCurrent { .. })
        ));
    }

    #[tokio::test]
    async fn options_out_of_bounds_name_the_option() {
        assert!(CurrentCheck::new(options(&[]))
            .err()
            .unwrap()
            .contains("--standalone-no-cluster-check"));
        let mut o = options(&["127.0.0.1:1"]);
        o.batch_max = fenced_core::MAX_VALIDATE_BATCH + 1;
        assert!(CurrentCheck::new(o)
            .err()
            .unwrap()
            .contains("current_batch_max"));
    }

    #[tokio::test]
    async fn a_cluster_that_cannot_answer_refuses_the_write_in_bounded_time() {
        // Nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let check = CurrentCheck::new(options(&[&format!("127.0.0.1:{port}")])).unwrap();
        let resource = ResourceName::new("r").unwrap();
        let owner = OwnerId::random();
        let started = std::time::Instant::now();
        let e = check
            .require(&resource, Token::new(1).unwrap(), owner)
            .await
            .unwrap_err();
        let Refusal::Unavailable(m) = e else {
            panic!("{e:?}")
        };
        assert!(m.contains("not applied"), "{m}");
        assert!(started.elapsed() < Duration::from_secs(3));
        // The bound on checks in flight: the one place taken, the next is
        // refused at once.
        let held = check.in_flight.clone().try_acquire_owned().unwrap();
        let e = check
            .require(&resource, Token::new(1).unwrap(), owner)
            .await
            .unwrap_err();
        let Refusal::Exhausted(m) = e else {
            panic!("{e:?}")
        };
        assert!(m.contains("current_checks_in_flight (1)"), "{m}");
        drop(held);
    }
}
