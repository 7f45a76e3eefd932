//! The write boundary outside fenced's own stores: the HTTP layer on a
//! service of one's own (`fenced-http`) and the gateway in front of an
//! upstream that cannot check a token (`fenced-gateway`), each against a
//! real cluster and a real HTTP server, with a worker that pauses past its
//! lease.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    net::SocketAddr,
    path::Path,
    process::{Child, Command, Stdio},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use axum::{extract::State, routing::post, Extension, Router};
use bytes::Bytes;
use fenced_client::{AcquireOutcome, Client, OwnerId, Token};
use fenced_http::{FenceLayer, Fenced, SqliteLedger};
use fenced_resource::current::{ClusterOptions, CurrentCheck};
use fenced_tests::{bin, free_port, write_auth_files, Cluster, Pki};
use http_body_util::{BodyExt, Full};
use hyper::{HeaderMap, Request};
use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// A lease taken with no keeper: it ends at its TTL, as a paused worker's.
struct Grant {
    resource: String,
    token: Token,
    owner: OwnerId,
}

impl Grant {
    /// A grant made up by the test, for a boundary run without the cluster
    /// check: any owner id, the token given.
    fn unleased(resource: &str, token: u64) -> Grant {
        Grant {
            resource: resource.to_string(),
            token: Token::new(token).expect("token"),
            owner: OwnerId::random(),
        }
    }

    async fn take(client: &Client, resource: &str, ttl: Duration) -> Grant {
        let owner = OwnerId::random();
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            match client
                .acquire_once(resource, owner, ttl, Duration::from_secs(5))
                .await
            {
                Ok(AcquireOutcome::Granted { token, .. }) => {
                    return Grant {
                        resource: resource.to_string(),
                        token,
                        owner,
                    }
                }
                other => assert!(
                    Instant::now() < deadline,
                    "no grant of {resource}: {other:?}"
                ),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn headers(&self, op: Option<&str>) -> Vec<(&'static str, String)> {
        let mut h = vec![
            ("x-fencing-resource", self.resource.clone()),
            ("x-fencing-token", self.token.get().to_string()),
            ("x-fencing-owner", self.owner.as_uuid().to_string()),
        ];
        if let Some(op) = op {
            h.push(("x-fencing-operation-id", op.to_string()));
        }
        h
    }
}

/// An answer: status, headers, body.
type Answer = (u16, HeaderMap, String);

/// One HTTP/1.1 request over `stream`.
async fn send_on<S>(stream: S, path: &str, headers: &[(&str, String)], body: &str) -> Answer
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let mut req = Request::post(path).header("host", "gateway");
    for (k, v) in headers {
        req = req.header(*k, v.as_str());
    }
    let req = req
        .body(Full::new(Bytes::from(body.to_string())))
        .expect("request");
    let answer = tx.send_request(req).await.expect("answer");
    let (head, body) = answer.into_parts();
    let body = body.collect().await.expect("body").to_bytes();
    (
        head.status.as_u16(),
        head.headers,
        String::from_utf8_lossy(&body).into_owned(),
    )
}

async fn send(addr: SocketAddr, path: &str, headers: &[(&str, String)], body: &str) -> Answer {
    send_on(
        TcpStream::connect(addr).await.expect("connect"),
        path,
        headers,
        body,
    )
    .await
}

fn json(body: &str) -> serde_json::Value {
    serde_json::from_str(body).unwrap_or_else(|e| panic!("not JSON ({e}): {body}"))
}

/// What an upstream (or a handler) received.
#[derive(Debug, Clone)]
struct Seen {
    token: u64,
    body: String,
    idempotency_key: Option<String>,
    authorization: Option<String>,
    owner_header: bool,
}

/// A real HTTP server that applies whatever it is sent, after `delay`.
#[derive(Clone)]
struct Upstream {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    delay: Arc<Mutex<Duration>>,
    /// Requests received, applied or not yet.
    arrivals: Arc<std::sync::atomic::AtomicUsize>,
}

impl Upstream {
    async fn start() -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind");
        let up = Upstream {
            addr: listener.local_addr().expect("addr"),
            seen: Arc::default(),
            delay: Arc::default(),
            arrivals: Arc::default(),
        };
        let app = Router::new()
            .fallback(upstream_apply)
            .with_state(up.clone());
        tokio::spawn(async move { axum::serve(listener, app).await });
        up
    }

    fn seen(&self) -> Vec<Seen> {
        self.seen.lock().expect("seen").clone()
    }

    fn set_delay(&self, d: Duration) {
        *self.delay.lock().expect("delay") = d;
    }
}

async fn upstream_apply(
    State(up): State<Upstream>,
    headers: HeaderMap,
    body: String,
) -> &'static str {
    up.arrivals
        .fetch_add(1, std::sync::atomic::Ordering::SeqCst);
    // As most servers do, a request received is applied even if its
    // client hangs up: the work runs in a task of its own. A body starting
    // with "slow" takes the upstream's delay; others are applied at once.
    let delay = if body.starts_with("slow") {
        *up.delay.lock().expect("delay")
    } else {
        Duration::ZERO
    };
    let work = tokio::spawn(async move {
        tokio::time::sleep(delay).await;
        let text = |name: &str| {
            headers
                .get(name)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string)
        };
        up.seen.lock().expect("seen").push(Seen {
            token: text("x-fencing-token")
                .and_then(|t| t.parse().ok())
                .unwrap_or(0),
            body,
            idempotency_key: text("idempotency-key"),
            authorization: text("authorization"),
            owner_header: headers.contains_key("x-fencing-owner"),
        });
    });
    let _ = work.await;
    "applied"
}

// ---------------------------------------------------------------- the layer

/// A service of one's own: POST /statement stores the body, behind the
/// layer; its effects are what the handler ran.
async fn own_service(
    layer: FenceLayer,
    handler_delay: Duration,
) -> (SocketAddr, Arc<Mutex<Vec<Seen>>>) {
    let effects: Arc<Mutex<Vec<Seen>>> = Arc::default();
    let app = Router::new()
        .route(
            "/statement",
            post(
                move |State(effects): State<Arc<Mutex<Vec<Seen>>>>,
                      Extension(fenced): Extension<Fenced>,
                      body: String| async move {
                    tokio::time::sleep(handler_delay).await;
                    let fail = body == "fail";
                    effects.lock().expect("effects").push(Seen {
                        token: fenced.token.get(),
                        body,
                        idempotency_key: fenced.operation_id.clone(),
                        authorization: None,
                        owner_header: true,
                    });
                    if fail {
                        (axum::http::StatusCode::INTERNAL_SERVER_ERROR, "failed")
                    } else {
                        (axum::http::StatusCode::OK, "stored")
                    }
                },
            ),
        )
        .layer(layer)
        .with_state(Arc::clone(&effects));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (addr, effects)
}

fn standalone(ledger: impl fenced_http::Ledger) -> FenceLayer {
    FenceLayer::builder(ledger)
        .standalone_no_cluster_check()
        .build()
        .expect("layer")
}

fn cluster_check(cluster: &Cluster) -> CurrentCheck {
    CurrentCheck::new(ClusterOptions {
        endpoints: cluster.endpoints(),
        ..ClusterOptions::default()
    })
    .expect("cluster check")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_refuses_a_paused_owner_once_the_newer_owner_wrote() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let dir = tempfile::tempdir().expect("dir");
    let ledger = SqliteLedger::open(&dir.path().join("fences.db")).expect("ledger");
    let layer = FenceLayer::builder(ledger)
        .standalone_no_cluster_check()
        .build()
        .expect("layer");
    let (addr, effects) = own_service(layer, Duration::ZERO).await;
    let r = "statement:account-1842:2026-07";

    let a = Grant::take(&client, r, Duration::from_millis(1_000)).await;
    let (status, _, body) = send(addr, "/statement", &a.headers(Some("a-1")), "A draft").await;
    assert_eq!((status, body.as_str()), (200, "stored"));
    // A pauses past its lease; B takes over and writes.
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let b = Grant::take(&client, r, Duration::from_secs(30)).await;
    assert!(b.token > a.token);
    let (status, _, _) = send(addr, "/statement", &b.headers(Some("b-1")), "B final").await;
    assert_eq!(status, 200);
    // A wakes up and writes: refused, by name.
    let (status, headers, body) = send(addr, "/statement", &a.headers(Some("a-2")), "A late").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(
        headers.get("content-type").map(|v| v.as_bytes()),
        Some(&b"application/json"[..])
    );
    let refusal = json(&body);
    assert_eq!(refusal["resource"], r);
    assert_eq!(refusal["presented_token"], a.token.get());
    assert_eq!(refusal["highest_accepted"], b.token.get());
    assert_eq!(refusal["stage"], "ledger");
    assert_eq!(refusal["error"], "stale_token");
    // A retry of B's applied operation does not run the handler again.
    let (status, headers, body) =
        send(addr, "/statement", &b.headers(Some("b-1")), "B final").await;
    assert_eq!(status, 200);
    assert_eq!(
        headers.get("x-fencing-outcome").map(|v| v.as_bytes()),
        Some(&b"already-applied"[..])
    );
    assert_eq!(json(&body)["outcome"], "already_applied");
    let bodies: Vec<_> = effects
        .lock()
        .expect("effects")
        .iter()
        .map(|s| s.body.clone())
        .collect();
    assert_eq!(bodies, ["A draft", "B final"]);
    // Bad headers: 400 naming the header, nothing run.
    let mut bad = b.headers(None);
    bad[1].1 = "0".into();
    let (status, _, body) = send(addr, "/statement", &bad, "x").await;
    assert_eq!(status, 400);
    assert!(json(&body)["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("x-fencing-token: ")));
    let (status, _, body) = send(addr, "/statement", &[], "x").await;
    assert_eq!(status, 400);
    assert_eq!(json(&body)["stage"], "headers");
    assert_eq!(effects.lock().expect("effects").len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_with_the_cluster_check_refuses_a_paused_owner_before_the_newer_one_writes() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let dir = tempfile::tempdir().expect("dir");
    let ledger = SqliteLedger::open(&dir.path().join("fences.db")).expect("ledger");
    let layer = FenceLayer::builder(ledger)
        .cluster_check(cluster_check(&cluster))
        .build()
        .expect("layer");
    let (addr, effects) = own_service(layer, Duration::ZERO).await;
    let r = "statement:account-7:2026-07";
    let a = Grant::take(&client, r, Duration::from_millis(1_000)).await;
    let (status, _, _) = send(addr, "/statement", &a.headers(Some("a-1")), "A first").await;
    assert_eq!(status, 200);
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let b = Grant::take(&client, r, Duration::from_secs(30)).await;
    // A lost the answer to its first write and retries it after B's grant:
    // it learns the write happened, not that it was refused.
    let (status, headers, _) = send(addr, "/statement", &a.headers(Some("a-1")), "A first").await;
    assert_eq!(status, 200);
    assert!(headers.contains_key("x-fencing-outcome"));
    // B has not written: without the check, A's new write would still pass.
    let (status, _, body) = send(addr, "/statement", &a.headers(None), "A late").await;
    assert_eq!(status, 409, "{body}");
    let refusal = json(&body);
    assert_eq!(refusal["stage"], "cluster");
    assert_eq!(refusal["current_token"], b.token.get());
    // A token the cluster never issued cannot raise the ledger's highest.
    let forged = Grant {
        resource: r.into(),
        token: Token::new(9_000_000).expect("token"),
        owner: b.owner,
    };
    let (status, _, body) = send(addr, "/statement", &forged.headers(None), "forged").await;
    assert_eq!(
        (status, json(&body)["stage"].clone()),
        (409, "cluster".into())
    );
    let (status, _, _) = send(addr, "/statement", &b.headers(None), "B").await;
    assert_eq!(status, 200);
    let tokens: Vec<_> = effects
        .lock()
        .expect("effects")
        .iter()
        .map(|s| s.token)
        .collect();
    assert_eq!(tokens, [a.token.get(), b.token.get()]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_runs_one_handler_per_resource_and_a_failed_one_can_be_retried() {
    let dir = tempfile::tempdir().expect("dir");
    let ledger = SqliteLedger::open(&dir.path().join("fences.db")).expect("ledger");
    // A layer must say whether tokens are checked with the cluster.
    let unset =
        FenceLayer::builder(SqliteLedger::open(&dir.path().join("other.db")).expect("ledger"))
            .build();
    assert!(unset.is_err_and(|e| e.starts_with("cluster_check: ")));
    let (addr, effects) = own_service(standalone(ledger), Duration::from_millis(400)).await;
    let grant = |token: u64| Grant::unleased("import:batch-9", token);
    let (old, new) = (grant(5), grant(6));
    // The older token's handler is running when the newer arrives: the
    // newer waits for it, so the effects land in token order.
    let first =
        tokio::spawn(async move { send(addr, "/statement", &old.headers(None), "old").await });
    tokio::time::sleep(Duration::from_millis(100)).await;
    let started = Instant::now();
    let (status, _, _) = send(addr, "/statement", &new.headers(None), "new").await;
    assert_eq!(status, 200);
    assert!(
        started.elapsed() >= Duration::from_millis(600),
        "{:?}",
        started.elapsed()
    );
    assert_eq!(first.await.expect("first").0, 200);
    // A handler that fails records no operation: the retry runs.
    let (status, _, _) = send(addr, "/statement", &new.headers(Some("n-1")), "fail").await;
    assert_eq!(status, 500);
    let (status, headers, _) = send(addr, "/statement", &new.headers(Some("n-1")), "retried").await;
    assert_eq!(status, 200);
    assert!(!headers.contains_key("x-fencing-outcome"));
    let bodies: Vec<_> = effects
        .lock()
        .expect("effects")
        .iter()
        .map(|s| s.body.clone())
        .collect();
    assert_eq!(bodies, ["old", "new", "fail", "retried"]);
    // The older token stays refused.
    let (status, _, body) = send(addr, "/statement", &grant(5).headers(None), "late").await;
    assert_eq!(status, 409);
    assert_eq!(json(&body)["highest_accepted"], 6);
}

// -------------------------------------------------------------- the gateway

/// A `fenced-gateway` process.
struct Gateway {
    child: Child,
    addr: SocketAddr,
    metrics: SocketAddr,
}

impl Gateway {
    fn start(data: &Path, upstream: &Upstream, extra: &[String]) -> Gateway {
        let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let metrics: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
        let mut args = vec![
            "--listen".to_string(),
            addr.to_string(),
            "--upstream".into(),
            format!("http://{}/api", upstream.addr),
            "--data-dir".into(),
            data.display().to_string(),
            "--metrics-listen".into(),
            metrics.to_string(),
        ];
        args.extend(extra.iter().cloned());
        let child = Command::new(bin("fenced-gateway"))
            .args(&args)
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn fenced-gateway");
        let g = Gateway {
            child,
            addr,
            metrics,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "fenced-gateway did not listen on {addr}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        g
    }

    fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    async fn metric(&self, sample: &str) -> u64 {
        let (_, _, text) = {
            let stream = TcpStream::connect(self.metrics).await.expect("metrics");
            let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
                .await
                .expect("handshake");
            tokio::spawn(conn);
            let req = Request::get("/metrics")
                .header("host", "m")
                .body(Full::new(Bytes::new()))
                .expect("req");
            let a = tx.send_request(req).await.expect("answer");
            let body = a.into_body().collect().await.expect("body").to_bytes();
            (0, (), String::from_utf8_lossy(&body).into_owned())
        };
        text.lines()
            .find_map(|l| l.strip_prefix(sample)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("{sample} not in {text}"))
    }
}

impl Drop for Gateway {
    fn drop(&mut self) {
        self.kill();
    }
}

fn cluster_args(cluster: &Cluster) -> Vec<String> {
    vec!["--cluster".into(), cluster.endpoints().join(",")]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_stale_owner_sequence_survives_a_restart() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let upstream = Upstream::start().await;
    let data = tempfile::tempdir().expect("dir");
    let mut gw = Gateway::start(data.path(), &upstream, &cluster_args(&cluster));
    let r = "payout:merchant-12:2026-07";

    let a = Grant::take(&client, r, Duration::from_millis(1_000)).await;
    let (status, _, body) = send(gw.addr, "/payouts", &a.headers(Some("payout-1")), "A").await;
    assert_eq!((status, body.as_str()), (200, "applied"));
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let b = Grant::take(&client, r, Duration::from_secs(30)).await;
    // An operation id names one operation on the resource whoever sends
    // it: the one A completed is not sent again for B.
    let (status, headers, _) = send(gw.addr, "/payouts", &b.headers(Some("payout-1")), "B").await;
    assert_eq!(status, 200);
    assert!(headers.contains_key("x-fencing-outcome"));
    let (status, headers, _) = send(gw.addr, "/payouts", &b.headers(Some("payout-2")), "B").await;
    assert_eq!(status, 200);
    assert!(!headers.contains_key("x-fencing-outcome"));
    let (status, _, body) = send(gw.addr, "/payouts", &a.headers(Some("payout-3")), "A late").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(json(&body)["stage"], "cluster");
    // Missing operation id: 400 naming it.
    let (status, _, body) = send(gw.addr, "/payouts", &b.headers(None), "B").await;
    assert_eq!(status, 400);
    assert!(json(&body)["message"]
        .as_str()
        .is_some_and(|m| m.starts_with("x-fencing-operation-id: required")));
    // A retry of B's operation is answered, not sent again.
    let (status, headers, _) = send(gw.addr, "/payouts", &b.headers(Some("payout-2")), "B").await;
    assert_eq!(status, 200);
    assert!(headers.contains_key("x-fencing-outcome"));

    let seen = upstream.seen();
    assert_eq!(
        seen.iter().map(|s| s.body.as_str()).collect::<Vec<_>>(),
        ["A", "B"]
    );
    // Each operation reaches the upstream with its own derived key and
    // without the owner id or the caller's credentials.
    assert_eq!(
        seen[1].idempotency_key.as_deref(),
        Some(fenced_gateway_key(r, "payout-2").as_str())
    );
    assert_ne!(seen[0].idempotency_key, seen[1].idempotency_key);
    assert!(seen
        .iter()
        .all(|s| !s.owner_header && s.authorization.is_none()));
    assert_eq!(
        gw.metric("fenced_gateway_requests_total{outcome=\"forwarded\"}")
            .await,
        2
    );
    assert_eq!(
        gw.metric("fenced_gateway_requests_total{outcome=\"duplicate\"}")
            .await,
        2
    );
    assert_eq!(
        gw.metric("fenced_gateway_requests_total{outcome=\"stale\"}")
            .await,
        1
    );

    // The gateway is killed; restarted without the cluster check, its
    // ledger alone still refuses A: the highest token survived.
    gw.kill();
    let gw = Gateway::start(
        data.path(),
        &upstream,
        &["--standalone-no-cluster-check".to_string()],
    );
    let (status, _, body) =
        send(gw.addr, "/payouts", &a.headers(Some("payout-4")), "A again").await;
    assert_eq!(status, 409, "{body}");
    let refusal = json(&body);
    assert_eq!(refusal["stage"], "ledger");
    assert_eq!(refusal["highest_accepted"], b.token.get());
    assert_eq!(upstream.seen().len(), 2);
}

/// The key the gateway derives, computed here independently of it.
fn fenced_gateway_key(resource: &str, op: &str) -> String {
    use std::fmt::Write;
    let mut input = Vec::new();
    for f in [resource.as_bytes(), op.as_bytes()] {
        input.extend_from_slice(&(f.len() as u64).to_be_bytes());
        input.extend_from_slice(f);
    }
    let digest = ring_sha256(&input);
    let mut out = "fenced-".to_string();
    for b in digest {
        let _ = write!(out, "{b:02x}");
    }
    out
}

fn ring_sha256(input: &[u8]) -> Vec<u8> {
    use sha2::Digest;
    sha2::Sha256::digest(input).to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_judges_a_worker_paused_mid_request_when_its_body_arrives() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    let upstream = Upstream::start().await;
    let data = tempfile::tempdir().expect("dir");
    let gw = Gateway::start(data.path(), &upstream, &cluster_args(&cluster));
    let r = "statement:account-99:2026-07";
    let a = Grant::take(&client, r, Duration::from_millis(1_000)).await;

    // A sends its head and half its body, then pauses past its lease.
    let body = "A's statement, all of it";
    let mut raw = TcpStream::connect(gw.addr).await.expect("connect");
    let mut head = format!(
        "POST /statements HTTP/1.1\r\nhost: gw\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in a.headers(Some("stmt-1")) {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    raw.write_all(head.as_bytes()).await.expect("head");
    raw.write_all(&body.as_bytes()[..10]).await.expect("half");
    tokio::time::sleep(Duration::from_millis(1_300)).await;
    let b = Grant::take(&client, r, Duration::from_secs(30)).await;
    let (status, _, _) = send(gw.addr, "/statements", &b.headers(Some("stmt-2")), "B's").await;
    assert_eq!(status, 200);
    // A wakes up and finishes its upload.
    raw.write_all(&body.as_bytes()[10..]).await.expect("rest");
    let mut answer = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(10), raw.read(&mut answer))
        .await
        .expect("answer in time")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 409"), "{answer}");
    assert!(answer.contains("\"stage\":\"cluster\""), "{answer}");
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(seen[0].token, b.token.get());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_holds_a_stale_request_behind_a_slow_newer_one_then_refuses_it() {
    let upstream = Upstream::start().await;
    let data = tempfile::tempdir().expect("dir");
    // The ledger alone: the cluster check would refuse the stale request
    // anyway; this shows the turn and the record-before-forward.
    let gw = Gateway::start(
        data.path(),
        &upstream,
        &[
            "--standalone-no-cluster-check".to_string(),
            "--max-body-bytes".into(),
            "64".into(),
        ],
    );
    let grant = |token: u64| Grant::unleased("invoice:77", token);
    let (stale, newer) = (grant(3), grant(4));
    upstream.set_delay(Duration::from_millis(800));
    let addr = gw.addr;
    let newer_call = tokio::spawn(async move {
        send(
            addr,
            "/invoices",
            &newer.headers(Some("inv-1")),
            "slow newer",
        )
        .await
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The newer request is in flight at the upstream; the stale one waits
    // for its turn and is refused after it.
    let started = Instant::now();
    let (status, _, body) =
        send(gw.addr, "/invoices", &stale.headers(Some("inv-0")), "stale").await;
    let waited = started.elapsed();
    assert_eq!(status, 409, "{body}");
    assert_eq!(json(&body)["highest_accepted"], 4);
    assert!(
        waited >= Duration::from_millis(400),
        "refused after {waited:?}, before the newer finished"
    );
    assert_eq!(newer_call.await.expect("newer").0, 200);
    let seen = upstream.seen();
    assert_eq!(seen.iter().map(|s| s.token).collect::<Vec<_>>(), [4]);
    // Bounds: an oversized body is a 413 naming the bound, not forwarded.
    upstream.set_delay(Duration::ZERO);
    let (status, _, body) = send(
        gw.addr,
        "/invoices",
        &grant(5).headers(Some("inv-2")),
        &"x".repeat(65),
    )
    .await;
    assert_eq!(status, 413, "{body}");
    assert!(body.contains("max_body_bytes"), "{body}");
    assert_eq!(upstream.seen().len(), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_bounds_a_stalled_body_and_a_silent_upstream_in_time() {
    let upstream = Upstream::start().await;
    let data = tempfile::tempdir().expect("dir");
    let gw = Gateway::start(
        data.path(),
        &upstream,
        &[
            "--standalone-no-cluster-check".to_string(),
            "--body-timeout-ms".into(),
            "300".into(),
            "--upstream-timeout-ms".into(),
            "300".into(),
        ],
    );
    let grant = |token: u64| Grant::unleased("export:9", token);
    // A body that stops half way: 408 once the body time is up.
    let mut raw = TcpStream::connect(gw.addr).await.expect("connect");
    let mut head = "POST /exports HTTP/1.1\r\nhost: gw\r\ncontent-length: 100\r\n".to_string();
    for (k, v) in grant(1).headers(Some("e-1")) {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n0123456789");
    raw.write_all(head.as_bytes()).await.expect("head");
    let mut answer = vec![0; 4096];
    let n = tokio::time::timeout(Duration::from_secs(5), raw.read(&mut answer))
        .await
        .expect("answered in time")
        .expect("read");
    let answer = String::from_utf8_lossy(&answer[..n]).into_owned();
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("body_timeout_ms"), "{answer}");
    // An upstream slower than the bound: 504, and the token stays
    // recorded (an older one is refused afterwards).
    upstream.set_delay(Duration::from_millis(1_000));
    let (status, _, body) = send(
        gw.addr,
        "/exports",
        &grant(5).headers(Some("e-5")),
        "slow export",
    )
    .await;
    assert_eq!(status, 504, "{body}");
    assert_eq!(json(&body)["stage"], "upstream");
    let (status, _, body) = send(gw.addr, "/exports", &grant(4).headers(Some("e-4")), "x").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(json(&body)["highest_accepted"], 5);
}

/// A TLS connection to `addr` trusting `pki`'s CA, as client `name`.
async fn tls_to(
    addr: SocketAddr,
    pki: &Pki,
    name: Option<&str>,
) -> Result<tokio_rustls::client::TlsStream<TcpStream>, String> {
    use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(pki.ca()).expect("ca") {
        roots.add(c.expect("ca cert")).expect("root");
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_root_certificates(roots);
    let config = match name {
        None => builder.with_no_client_auth(),
        Some(n) => {
            let (cert, key) = pki.client(n);
            let chain = CertificateDer::pem_file_iter(&cert)
                .expect("cert")
                .collect::<Result<Vec<_>, _>>()
                .expect("chain");
            builder
                .with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(&key).expect("key"))
                .expect("client auth")
        }
    };
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let server = ServerName::try_from("127.0.0.1").expect("name");
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(server, tcp)
        .await
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_authenticates_callers_and_needs_lock_on_the_resource() {
    let upstream = Upstream::start().await;
    let dir = tempfile::tempdir().expect("dir");
    let pki = Pki::new(&dir.path().join("pki"));
    let (cert, key) = pki.server("gateway");
    let (tokens, policy) = write_auth_files(
        dir.path(),
        &[("billing-bot", "bot-secret", "payouts")],
        "[roles.payouts]\nlock = [\"payout:\"]\n[roles.reader]\nread = [\"payout:\"]\n\
         [identities]\nbilling = [\"payouts\"]\nauditor = [\"reader\"]\nother = [\"payouts-elsewhere\"]\n\
         [roles.payouts-elsewhere]\nlock = [\"invoice:\"]\n",
    );
    let data = dir.path().join("data");
    let deny = dir.path().join("deny.toml");
    std::fs::write(&deny, "").expect("deny list");
    let gw = Gateway::start(
        &data,
        &upstream,
        &[
            "--standalone-no-cluster-check".to_string(),
            "--tls-cert".into(),
            cert.display().to_string(),
            "--tls-key".into(),
            key.display().to_string(),
            "--client-ca".into(),
            pki.ca().display().to_string(),
            "--auth-policy".into(),
            policy,
            "--auth-tokens".into(),
            tokens,
            "--tls-deny".into(),
            deny.display().to_string(),
        ],
    );
    let grant = Grant::unleased("payout:merchant-1", 8);
    let headers = grant.headers(Some("p-1"));
    // Plaintext to a TLS port gets no HTTP answer at all.
    let plain = tokio::time::timeout(Duration::from_secs(5), async {
        let mut s = TcpStream::connect(gw.addr).await.expect("connect");
        let _ = s
            .write_all(b"POST / HTTP/1.1\r\nhost: g\r\ncontent-length: 0\r\n\r\n")
            .await;
        let mut buf = [0u8; 64];
        s.read(&mut buf)
            .await
            .map(|n| String::from_utf8_lossy(&buf[..n]).into_owned())
    })
    .await
    .expect("closed in time");
    assert!(
        !plain.as_deref().unwrap_or_default().contains("HTTP/"),
        "{plain:?}"
    );
    // No certificate: unauthenticated. A read-only identity and one whose
    // lock grant is for another prefix: forbidden.
    for (name, want) in [(None, 401), (Some("auditor"), 403), (Some("other"), 403)] {
        let s = tls_to(gw.addr, &pki, name).await.expect("tls");
        let (status, _, body) = send_on(s, "/payouts", &headers, "x").await;
        assert_eq!(status, want, "{name:?}: {body}");
        assert_eq!(json(&body)["stage"], "permission");
    }
    assert!(upstream.seen().is_empty());
    // A bearer token names an identity too; a wrong one is refused.
    let mut with_token = headers.clone();
    with_token.push(("authorization", "Bearer wrong".into()));
    let s = tls_to(gw.addr, &pki, None).await.expect("tls");
    assert_eq!(send_on(s, "/payouts", &with_token, "x").await.0, 401);
    with_token.pop();
    with_token.push(("authorization", "Bearer bot-secret".into()));
    with_token[3].1 = "p-0".into();
    let s = tls_to(gw.addr, &pki, None).await.expect("tls");
    assert_eq!(send_on(s, "/payouts", &with_token, "by token").await.0, 200);
    // The caller's credential never reaches the upstream.
    assert!(upstream.seen().iter().all(|s| s.authorization.is_none()));
    // A keep-alive connection whose certificate is revoked afterwards is
    // refused at its next request.
    let s = tls_to(gw.addr, &pki, Some("billing")).await.expect("tls");
    let (mut tx, conn) = hyper::client::conn::http1::handshake(TokioIo::new(s))
        .await
        .expect("handshake");
    tokio::spawn(conn);
    let post = |headers: &[(&'static str, String)], body: &'static str| {
        let mut req = Request::post("/payouts").header("host", "gateway");
        for (k, v) in headers {
            req = req.header(*k, v.as_str());
        }
        req.body(Full::new(Bytes::from(body))).expect("request")
    };
    tx.ready().await.expect("ready");
    let answer = tx
        .send_request(post(&headers, "paid"))
        .await
        .expect("answer");
    assert_eq!(answer.status(), 200);
    let _ = answer.into_body().collect().await;
    assert_eq!(upstream.seen().len(), 2);
    std::fs::write(&deny, "clients = [\"billing\"]\n").expect("deny");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(gw.child.id()).expect("pid")),
        nix::sys::signal::Signal::SIGHUP,
    )
    .expect("SIGHUP");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut retry = headers.clone();
    for attempt in 0.. {
        retry[3].1 = format!("revoked-{attempt}");
        tx.ready().await.expect("ready");
        let answer = tx
            .send_request(post(&retry, "after revocation"))
            .await
            .expect("answer");
        let status = answer.status();
        let _ = answer.into_body().collect().await;
        if status == 401 {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still served after the revocation: {status}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The metrics port under TLS wants a client certificate too.
    let refused = match tls_to(gw.metrics, &pki, None).await {
        Err(_) => true,
        Ok(mut s) => {
            let _ = s
                .write_all(b"GET /metrics HTTP/1.1\r\nhost: m\r\n\r\n")
                .await;
            let mut buf = [0u8; 64];
            !matches!(s.read(&mut buf).await, Ok(n) if n > 0)
        }
    };
    assert!(refused, "metrics served without a client certificate");
    // A revoked certificate is refused there too; another is served.
    let s = tls_to(gw.metrics, &pki, Some("billing"))
        .await
        .expect("tls");
    assert_eq!(send_on(s, "/metrics", &[], "").await.0, 401);
    let s = tls_to(gw.metrics, &pki, Some("auditor"))
        .await
        .expect("tls");
    let (_, _, text) = send_on(s, "/metrics", &[], "").await;
    let forwarded = format!(
        "fenced_gateway_requests_total{{outcome=\"forwarded\"}} {}",
        upstream.seen().len()
    );
    assert!(text.contains(&forwarded), "{forwarded} not in {text}");

    // Off loopback without TLS, without auth, or without the cluster
    // check, it refuses to start, naming what is missing.
    let tls_args = vec![
        "--tls-cert".to_string(),
        cert.display().to_string(),
        "--tls-key".into(),
        key.display().to_string(),
    ];
    let mut with_auth = tls_args.clone();
    with_auth.extend([
        "--auth-tokens".to_string(),
        dir.path().join("tokens.toml").display().to_string(),
    ]);
    for (extra, want) in [
        (vec![], "listen: refusing plaintext"),
        (tls_args, "listen: "),
        (
            with_auth,
            "standalone_no_cluster_check: refused off loopback",
        ),
    ] {
        let mut args = vec![
            "--listen".to_string(),
            "0.0.0.0:0".into(),
            "--upstream".into(),
            "http://127.0.0.1:1".into(),
            "--data-dir".into(),
            dir.path().join("x").display().to_string(),
            "--standalone-no-cluster-check".into(),
        ];
        args.extend(extra);
        let out = Command::new(bin("fenced-gateway"))
            .args(&args)
            .output()
            .expect("run");
        assert_eq!(out.status.code(), Some(2));
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(want), "{err}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_guards_a_tonic_service_with_grpc_statuses() {
    use fenced_proto::v1::{fenced_resource_client::FencedResourceClient, PutRequest};
    use fenced_resource::{service::ResourceService, FenceStore};
    let dir = tempfile::tempdir().expect("dir");
    let store = Arc::new(FenceStore::open(dir.path().join("store")).expect("store"));
    let ledger = SqliteLedger::open(&dir.path().join("fences.db")).expect("ledger");
    let addr: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().expect("addr");
    tokio::spawn(
        tonic::transport::Server::builder()
            .layer(
                FenceLayer::builder(ledger)
                    .standalone_no_cluster_check()
                    .build()
                    .expect("layer"),
            )
            .add_service(ResourceService::new(store).into_server())
            .serve(addr),
    );
    let mut client = loop {
        if let Ok(c) = FencedResourceClient::connect(format!("http://{addr}")).await {
            break c;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let grant = |token: u64, owner: OwnerId| Grant {
        resource: "report:q3".into(),
        token: Token::new(token).expect("token"),
        owner,
    };
    let put_op = |g: &Grant, value: &str, op: Option<&str>| {
        let mut req = tonic::Request::new(PutRequest {
            key: if value.is_empty() {
                Vec::new()
            } else {
                g.resource.as_bytes().to_vec()
            },
            resource: g.resource.as_bytes().to_vec(),
            token: Some(g.token.get()),
            owner_id: g.owner.as_bytes().to_vec(),
            value: value.as_bytes().to_vec(),
            ..Default::default()
        });
        for (k, v) in g.headers(op) {
            req.metadata_mut().insert(k, v.parse().expect("metadata"));
        }
        req
    };
    let put = |g: &Grant, value: &str| put_op(g, value, None);
    let newer = grant(7, OwnerId::random());
    assert!(client.put(put(&newer, "v7")).await.is_ok());
    // Through tonic, the refusal is a gRPC status carrying the same JSON.
    let stale = grant(6, OwnerId::random());
    let status = client.put(put(&stale, "v6")).await.expect_err("stale");
    assert_eq!(status.code(), tonic::Code::FailedPrecondition);
    let refusal = json(status.message());
    assert_eq!(refusal["stage"], "ledger");
    assert_eq!(refusal["highest_accepted"], 7);
    let mut bare = put(&newer, "v");
    bare.metadata_mut().remove("x-fencing-token");
    let status = client.put(bare).await.expect_err("no token header");
    assert_eq!(status.code(), tonic::Code::InvalidArgument);
    assert!(
        status.message().contains("x-fencing-token: required"),
        "{}",
        status.message()
    );
    // A call the service refuses (an empty key) answers HTTP 200 with an
    // error status: its operation id is not recorded, and the retry runs.
    let status = client
        .put(put_op(&newer, "", Some("g-1")))
        .await
        .expect_err("empty key");
    assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
    assert!(client.put(put_op(&newer, "v7b", Some("g-1"))).await.is_ok());
    // Once it succeeded, a retry is answered ALREADY_EXISTS, not run.
    let status = client
        .put(put_op(&newer, "v7c", Some("g-1")))
        .await
        .expect_err("duplicate");
    assert_eq!(status.code(), tonic::Code::AlreadyExists, "{status:?}");
    assert_eq!(json(status.message())["outcome"], "already_applied");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn layer_instances_sharing_a_postgres_ledger_refuse_a_stale_owner_between_them() {
    let Some(url) = fenced_tests::postgres_url() else {
        eprintln!("skipped: no PostgreSQL (FENCED_TEST_POSTGRES_URL)");
        return;
    };
    // Two instances of one service behind a load balancer, one ledger.
    let one = fenced_http::PostgresLedger::connect(&url, 2)
        .await
        .expect("ledger 1");
    let two = fenced_http::PostgresLedger::connect(&url, 3)
        .await
        .expect("ledger 2");
    let (addr_one, effects_one) = own_service(standalone(one), Duration::ZERO).await;
    let (addr_two, effects_two) = own_service(standalone(two), Duration::ZERO).await;
    let resource = format!("statement:pg-{}", OwnerId::random().as_uuid());
    let grant = |token: u64| Grant::unleased(&resource, token);
    let (a, b) = (grant(11), grant(12));
    let (status, _, _) = send(addr_one, "/statement", &a.headers(Some("s-a")), "A").await;
    assert_eq!(status, 200);
    let (status, _, _) = send(addr_two, "/statement", &b.headers(Some("s-b")), "B").await;
    assert_eq!(status, 200);
    // A writes again through the first instance: the shared ledger refuses.
    let (status, _, body) = send(addr_one, "/statement", &a.headers(Some("s-a2")), "A late").await;
    assert_eq!(status, 409, "{body}");
    assert_eq!(json(&body)["highest_accepted"], 12);
    // B's operation retried through the other instance is a duplicate.
    let (status, headers, _) = send(addr_one, "/statement", &b.headers(Some("s-b")), "B").await;
    assert_eq!(status, 200);
    assert!(headers.contains_key("x-fencing-outcome"));
    assert_eq!(effects_one.lock().expect("one").len(), 1);
    assert_eq!(effects_two.lock().expect("two").len(), 1);
}

/// An HTTPS upstream that requires a client certificate from `pki`'s CA
/// and records what it applies, as `Upstream` does.
async fn tls_upstream(pki: &Pki) -> Upstream {
    use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let (cert, key) = pki.server("upstream");
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(pki.ca()).expect("ca") {
        roots.add(c.expect("ca cert")).expect("root");
    }
    let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
        Arc::new(roots),
        Arc::clone(&provider),
    )
    .build()
    .expect("verifier");
    let config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("versions")
        .with_client_cert_verifier(verifier)
        .with_single_cert(
            CertificateDer::pem_file_iter(&cert)
                .expect("cert")
                .collect::<Result<Vec<_>, _>>()
                .expect("chain"),
            PrivateKeyDer::from_pem_file(&key).expect("key"),
        )
        .expect("config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let up = Upstream {
        addr: listener.local_addr().expect("addr"),
        seen: Arc::default(),
        delay: Arc::default(),
        arrivals: Arc::default(),
    };
    let app = Router::new()
        .fallback(upstream_apply)
        .with_state(up.clone());
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let (acceptor, app) = (acceptor.clone(), app.clone());
            tokio::spawn(async move {
                let Ok(tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let service =
                    hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
                        let app = app.clone();
                        async move {
                            use tower::ServiceExt;
                            app.oneshot(req.map(axum::body::Body::new)).await
                        }
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(tls), service)
                    .await;
            });
        }
    });
    up
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_speaks_tls_to_its_upstream_with_its_own_certificate() {
    let dir = tempfile::tempdir().expect("dir");
    let pki = Pki::new(&dir.path().join("pki"));
    let upstream = tls_upstream(&pki).await;
    let (gw_cert, gw_key) = pki.client("gateway");
    let secret = dir.path().join("api-key");
    std::fs::write(&secret, "Bearer gateway-secret\n").expect("secret");
    let data = dir.path().join("data");
    let mut args = vec![
        "--listen".to_string(),
        format!("127.0.0.1:{}", free_port()),
        "--upstream".into(),
        format!("https://127.0.0.1:{}/api", upstream.addr.port()),
        "--data-dir".into(),
        data.display().to_string(),
        "--standalone-no-cluster-check".into(),
        "--upstream-ca".into(),
        pki.ca().display().to_string(),
        "--upstream-authorization-file".into(),
        secret.display().to_string(),
    ];
    let addr: SocketAddr = args[1].parse().expect("addr");
    let spawn = |args: &[String]| {
        let child = Command::new(bin("fenced-gateway"))
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(Instant::now() < deadline, "no gateway on {addr}");
            std::thread::sleep(Duration::from_millis(50));
        }
        child
    };
    let grant = |token: u64| Grant::unleased("charge:3", token);
    // Without its client certificate the upstream refuses the gateway: a
    // 502, nothing applied.
    let mut child = spawn(&args);
    let (status, _, body) = send(addr, "/charges", &grant(1).headers(Some("c-1")), "x").await;
    assert_eq!(status, 502, "{body}");
    assert!(upstream.seen().is_empty());
    let _ = child.kill();
    let _ = child.wait();
    args.extend([
        "--upstream-cert".to_string(),
        gw_cert.display().to_string(),
        "--upstream-key".into(),
        gw_key.display().to_string(),
    ]);
    let mut child = spawn(&args);
    let (status, _, body) = send(addr, "/charges", &grant(2).headers(Some("c-2")), "charge").await;
    assert_eq!((status, body.as_str()), (200, "applied"));
    let seen = upstream.seen();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].authorization.as_deref(),
        Some("Bearer gateway-secret")
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Sends a whole request over a raw connection and hangs up once the
/// upstream has it, before the answer.
async fn send_and_hang_up(
    addr: SocketAddr,
    upstream: &Upstream,
    headers: &[(&str, String)],
    body: &str,
) {
    let before = upstream.arrivals.load(std::sync::atomic::Ordering::SeqCst);
    let mut raw = TcpStream::connect(addr).await.expect("connect");
    let mut head = format!(
        "POST /jobs HTTP/1.1\r\nhost: gw\r\ncontent-length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    head.push_str(body);
    raw.write_all(head.as_bytes()).await.expect("request");
    let deadline = Instant::now() + Duration::from_secs(10);
    while upstream.arrivals.load(std::sync::atomic::Ordering::SeqCst) == before {
        assert!(
            Instant::now() < deadline,
            "the request never reached the upstream"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(raw);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_keeps_the_turn_while_a_hung_up_callers_request_is_upstream() {
    let upstream = Upstream::start().await;
    let data = tempfile::tempdir().expect("dir");
    let gw = Gateway::start(
        data.path(),
        &upstream,
        &["--standalone-no-cluster-check".to_string()],
    );
    let grant = |token: u64| Grant::unleased("job:nightly", token);
    upstream.set_delay(Duration::from_millis(800));
    // The older owner's request is forwarded, then its caller hangs up
    // while the upstream is still applying it.
    send_and_hang_up(
        gw.addr,
        &upstream,
        &grant(3).headers(Some("j-3")),
        "slow old",
    )
    .await;
    let started = Instant::now();
    let (status, _, body) = send(gw.addr, "/jobs", &grant(4).headers(Some("j-4")), "new").await;
    assert_eq!(status, 200, "{body}");
    // The newer request waited for the older one's upstream answer, so it
    // was applied after it.
    assert!(
        started.elapsed() >= Duration::from_millis(400),
        "{:?}",
        started.elapsed()
    );
    let bodies: Vec<_> = upstream.seen().iter().map(|s| s.body.clone()).collect();
    assert_eq!(bodies, ["slow old", "new"]);
    assert_eq!(gw.metric("fenced_gateway_in_flight").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_sends_one_key_for_one_operation_whoever_retries_it() {
    let upstream = Upstream::start().await;
    let data = tempfile::tempdir().expect("dir");
    let gw = Gateway::start(
        data.path(),
        &upstream,
        &[
            "--standalone-no-cluster-check".to_string(),
            "--upstream-timeout-ms".into(),
            "300".into(),
        ],
    );
    let grant = |token: u64| Grant::unleased("payout:merchant-40", token);
    upstream.set_delay(Duration::from_millis(800));
    // The first attempt times out at the gateway but lands upstream later.
    let (status, _, _) = send(
        gw.addr,
        "/payouts",
        &grant(5).headers(Some("pay-1")),
        "slow first",
    )
    .await;
    assert_eq!(status, 504);
    tokio::time::sleep(Duration::from_millis(900)).await;
    // The owner that took over repeats the operation: the same key, so the
    // upstream can tell it is the same payout.
    let (status, _, _) = send(
        gw.addr,
        "/payouts",
        &grant(6).headers(Some("pay-1")),
        "retry",
    )
    .await;
    assert_eq!(status, 200);
    let seen = upstream.seen();
    assert_eq!(seen.len(), 2);
    let key = fenced_gateway_key("payout:merchant-40", "pay-1");
    assert!(
        seen.iter()
            .all(|s| s.idempotency_key.as_deref() == Some(key.as_str())),
        "{seen:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gateway_bounds_forwards_that_outlive_their_callers() {
    let upstream = Upstream::start().await;
    let data = tempfile::tempdir().expect("dir");
    let gw = Gateway::start(
        data.path(),
        &upstream,
        &[
            "--standalone-no-cluster-check".to_string(),
            "--max-connections".into(),
            "1".into(),
        ],
    );
    let grant = |resource: &str| Grant::unleased(resource, 1);
    upstream.set_delay(Duration::from_millis(1_500));
    // A caller hangs up while its request is upstream: its connection is
    // free again, its forward is not.
    send_and_hang_up(
        gw.addr,
        &upstream,
        &grant("job:a").headers(Some("a")),
        "slow a",
    )
    .await;
    let (status, _, body) = send(gw.addr, "/jobs", &grant("job:b").headers(Some("b")), "b").await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(json(&body)["error"], "busy");
    // Once the upstream answered, the next one goes through.
    tokio::time::sleep(Duration::from_millis(1_600)).await;
    let (status, _, body) = send(gw.addr, "/jobs", &grant("job:b").headers(Some("b")), "b").await;
    assert_eq!(status, 200, "{body}");
}
