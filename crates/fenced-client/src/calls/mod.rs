//! The RPC layer the rest of the crate calls through. [`Calls`] owns the
//! endpoints and their channels, the credentials sent with each call and
//! the retries that follow the leader; `rpc` holds one method per call of
//! the cluster's services with its typed answer, and `error` how a call
//! fails. The lease keeper, the sessions and the public `Client` sit on it
//! and it imports none of them: the keeper renews over a `Calls` without
//! needing a `Client`, and no import circle runs through the calls
//! (tests/module_graph.rs checks the direction).

mod error;
mod rpc;

use std::{
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use tonic::{
    metadata::{Ascii, MetadataValue},
    transport::Channel,
    Status,
};

use crate::{
    clock::Moment,
    leader::{Endpoint, Endpoints},
    tls::{self, TlsOptions},
    transport,
};

pub(crate) use error::unavailable_message;
use error::{classify, connection_refused, Attempt};
pub use error::{ClientError, NO_CLUSTER_HINT, PERMISSION_HINT, TOKEN_HINT};
pub(crate) use rpc::{acquire_outcome, answered_token, millis};
pub use rpc::{wall_time, AcquireOutcome, Dated, RenewItem};

/// The longest one attempt may take (beyond a blocking acquire's wait)
/// before the call is retried, on the next node: a node that lost touch with
/// the cluster must not hold a caller for the whole call budget.
pub(crate) const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(3);

/// The longest pause between two attempts. An election takes about the
/// leader lease plus a check (1-1.5 s with the default timeouts); a client
/// asleep in a longer pause when the new leader appears only adds to the
/// outage (a 500 ms cap made S6's grants resume 1.9 s after a kill, 0.9 s
/// after the election). Ten attempts a second per waiting client is little
/// next to what a cluster serves (etcd's client retries every 25 ms).
const RETRY_BACKOFF_MAX: Duration = Duration::from_millis(100);

/// The endpoints, credentials and retries of one client. Cheap to clone:
/// clones share the connections and where the next call goes.
#[derive(Clone)]
pub(crate) struct Calls {
    inner: Arc<Inner>,
}

struct Inner {
    /// Shared by clones made with the `with_*` builders too.
    endpoints: Arc<Endpoints>,
    /// Where the next call goes first: the leader, once an answer named it.
    next: AtomicUsize,
    settings: Settings,
}

/// What the `with_*` builders set.
#[derive(Clone)]
pub(crate) struct Settings {
    pub(crate) call_timeout: Duration,
    /// `Bearer <token>`, sent as `authorization` on every call.
    bearer: Option<MetadataValue<Ascii>>,
    /// Whether the endpoints are `https://`: a token goes to a plaintext
    /// one only on loopback.
    tls: bool,
    /// Give up at once when every endpoint refused the connection.
    pub(crate) fail_fast: bool,
    /// Sent with every acquire: what the job is, for people.
    pub(crate) job_label: String,
}

impl Calls {
    /// Connects (lazily) to `endpoints`, as [`crate::Client::with_tls`]
    /// documents.
    pub(crate) fn new<I, S>(endpoints: I, tls: Option<&TlsOptions>) -> Result<Self, ClientError>
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
                    bearer: None,
                    tls: tls.is_some(),
                    fail_fast: false,
                    job_label: String::new(),
                },
            }),
        })
    }

    /// Calls on the same connections with other settings; the first call
    /// goes to the first endpoint again.
    pub(crate) fn with_settings(&self, change: impl FnOnce(&mut Settings)) -> Self {
        let mut settings = self.inner.settings.clone();
        change(&mut settings);
        Self {
            inner: Arc::new(Inner {
                endpoints: Arc::clone(&self.inner.endpoints),
                next: AtomicUsize::new(0),
                settings,
            }),
        }
    }

    /// Calls that send `authorization: Bearer <token>`, as
    /// [`crate::Client::with_token`] documents.
    pub(crate) fn with_token(&self, token: &str) -> Result<Self, ClientError> {
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

    /// The job label sent with every acquire (empty: none).
    pub(crate) fn job_label(&self) -> &str {
        &self.inner.settings.job_label
    }

    /// How long one call may take in all, retries included.
    pub(crate) fn call_timeout(&self) -> Duration {
        self.inner.settings.call_timeout
    }

    /// The endpoints, as they were given.
    pub(crate) fn endpoints(&self) -> Vec<String> {
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
    /// `req` sent as [`Self::with_retries`] sends a call, within the
    /// client's call timeout and each attempt's own; the answer's body.
    pub(crate) async fn unary<Q, R, F, Fut>(&self, req: Q, send: F) -> Result<R, ClientError>
    where
        Q: Clone,
        F: Fn(Channel, tonic::Request<Q>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, Status>>,
    {
        let (answer, _) = self
            .with_retries(self.inner.settings.call_timeout, |ch, left| {
                send(ch, self.request(req.clone(), left.min(ATTEMPT_TIMEOUT)))
            })
            .await?;
        Ok(answer.into_inner())
    }

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
    use fenced_proto::v1::{
        self,
        cluster_server::{Cluster, ClusterServer},
    };
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

    fn next_of(calls: &Calls) -> usize {
        calls.inner.next.load(Ordering::Relaxed) % calls.inner.endpoints.len()
    }

    #[tokio::test]
    async fn the_client_moves_to_the_leader_an_answer_names(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let (leader, leader_calls) = fake_node(2, String::new()).await?;
        let (follower, follower_calls) = fake_node(1, format!("2,{leader}")).await?;
        let calls = Calls::new([follower.as_str(), leader.as_str()], None)?;
        calls.status().await?;
        assert_eq!(next_of(&calls), 1, "the hint named endpoint 1");
        for _ in 0..3 {
            calls.status().await?;
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
        let calls = Calls::new([a.as_str(), b.as_str()], None)?;
        for _ in 0..3 {
            calls.status().await?;
            assert_eq!(next_of(&calls), 0, "stays on the endpoint that answers");
        }
        assert_eq!(a_calls.load(Ordering::SeqCst), 3);
        Ok(())
    }

    #[tokio::test]
    async fn a_hint_to_a_node_that_does_not_answer_falls_back_to_the_list(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dead = dead_address().await?;
        let (a, a_calls) = fake_node(1, format!("2,{dead}")).await?;
        let calls = Calls::new([a.as_str(), dead.as_str()], None)?;
        calls.status().await?;
        assert_eq!(next_of(&calls), 1, "the hint is followed once");
        // The hinted node refuses: the call is answered by the list, and
        // the same hint is not followed back to the dead node.
        calls.status().await?;
        assert_eq!(a_calls.load(Ordering::SeqCst), 2);
        assert_eq!(next_of(&calls), 0, "the dead leader is held off");
        calls.status().await?;
        assert_eq!(a_calls.load(Ordering::SeqCst), 3);
        assert_eq!(next_of(&calls), 0);
        Ok(())
    }

    /// With fail-fast on, a cluster where nothing listens is reported at
    /// once, not after the call timeout.
    #[tokio::test]
    async fn fail_fast_gives_up_at_once_when_every_endpoint_refuses(
    ) -> Result<(), Box<dyn std::error::Error>> {
        let dead = [dead_address().await?, dead_address().await?];
        let calls = Calls::new(&dead, None)?.with_settings(|s| {
            s.call_timeout = Duration::from_secs(10);
            s.fail_fast = true;
        });
        let started = Instant::now();
        let err = calls.describe("x").await.err();
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
        let (live, live_calls) = fake_node(1, String::new()).await?;
        let calls =
            Calls::new([dead.as_str(), live.as_str()], None)?.with_settings(|s| s.fail_fast = true);
        calls.status().await?;
        assert_eq!(live_calls.load(Ordering::SeqCst), 1);

        let silent = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let silent_addr = silent.local_addr()?.to_string();
        let calls = Calls::new([dead.as_str(), silent_addr.as_str()], None)?.with_settings(|s| {
            s.call_timeout = Duration::from_millis(1500);
            s.fail_fast = true;
        });
        let started = Instant::now();
        let err = calls.status().await.err();
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
        match Calls::new(endpoints, None) {
            Err(ClientError::Endpoint { endpoint, reason }) => {
                Some(format!("{endpoint}: {reason}"))
            }
            Err(other) => Some(format!("unexpected error {other}")),
            Ok(_) => None,
        }
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
