//! The HTTP/JSON API on the client port: the same calls, answers,
//! permissions and bounds as gRPC, reached with plain HTTP/1.1 (as curl,
//! .NET's HttpClient or a browser would), over plaintext and TLS.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use bytes::Bytes;
use fenced_client::Client;
use fenced_tests::{
    free_port, http_get, tls_connect, tls_connect_offering, write_auth_files, Cluster,
};
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, AsyncWrite};

/// What an HTTP answer carried.
#[derive(Debug)]
struct Answer {
    status: u16,
    headers: http::HeaderMap,
    body: String,
}

impl Answer {
    fn json(&self) -> Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("{e}: {self:?}"))
    }
}

/// One HTTP/1.1 request on `io`; the whole answer.
async fn send_on<S>(io: S, method: &str, path: &str, headers: &[(&str, &str)], body: &str) -> Answer
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .unwrap();
    tokio::spawn(conn);
    let mut request = http::Request::builder()
        .method(method)
        .uri(path)
        .header("host", "fenced");
    for (name, value) in headers {
        request = request.header(*name, *value);
    }
    let request = request
        .body(Full::new(Bytes::from(body.to_string())))
        .unwrap();
    let response = tokio::time::timeout(Duration::from_secs(20), sender.send_request(request))
        .await
        .expect("an answer within 20 s")
        .unwrap();
    let (parts, body) = response.into_parts();
    let body = body.collect().await.unwrap().to_bytes();
    Answer {
        status: parts.status.as_u16(),
        headers: parts.headers,
        body: String::from_utf8_lossy(&body).into_owned(),
    }
}

async fn send(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &str,
) -> Answer {
    let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    send_on(tcp, method, path, headers, body).await
}

/// A POST of JSON, as `bearer` (if any).
async fn post(addr: &str, path: &str, bearer: Option<&str>, body: &Value) -> Answer {
    let auth = bearer.map(|t| format!("Bearer {t}"));
    let mut headers = vec![("content-type", "application/json")];
    if let Some(auth) = &auth {
        headers.push(("authorization", auth.as_str()));
    }
    send(addr, "POST", path, &headers, &body.to_string()).await
}

fn b64(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    // Standard base64, as the proto3 JSON mapping writes bytes.
    const ALPHABET: &[u8] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for chunk in bytes.chunks(3) {
        let n = chunk
            .iter()
            .enumerate()
            .fold(0u32, |acc, (i, b)| acc | (u32::from(*b) << (16 - 8 * i)));
        for i in 0..4 {
            if i <= chunk.len() {
                let _ = out.write_char(ALPHABET[((n >> (18 - 6 * i)) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}

fn owner() -> String {
    b64(fenced_core::OwnerId::random().as_bytes())
}

fn acquire_body(resource: &str, owner_id: &str) -> Value {
    json!({ "resource": b64(resource.as_bytes()), "ownerId": owner_id, "ttlMs": "30000" })
}

/// Tokens and a policy in `dir`: `reader-token` may read `billing/`,
/// `worker-token` may also lock it, `ops-token` is an admin.
fn billing_auth_files(dir: &std::path::Path) -> (String, String) {
    write_auth_files(
        dir,
        &[
            ("reader", "reader-token", "billing-reader"),
            ("worker", "worker-token", "billing-worker"),
            ("ops", "ops-token", "ops"),
        ],
        "[roles.billing-reader]\nread = [\"billing/\"]\n\
         [roles.billing-worker]\nlock = [\"billing/\"]\nread = [\"billing/\"]\n\
         [roles.ops]\nadmin = true\n",
    )
}

#[test]
fn base64_is_the_standard_alphabet_with_padding() {
    assert_eq!(b64(b"billing"), "YmlsbGluZw==");
    assert_eq!(b64(b"ab"), "YWI=");
    assert_eq!(b64(b"abc"), "YWJj");
}

/// A JSON acquire on a follower is forwarded and granted like a gRPC one;
/// the grant is the same lease the gRPC client then sees, and renew,
/// release, kv, history and status answer in the proto3 JSON mapping.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_calls_reach_the_same_leases_as_grpc() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let addr = cluster.nodes()[(follower - 1) as usize].client_addr();
    let owner_id = owner();

    let granted = post(
        &addr,
        "/v1/lock/acquire",
        None,
        &acquire_body("billing/march", &owner_id),
    )
    .await;
    assert_eq!(granted.status, 200, "{granted:?}");
    let granted = granted.json();
    let token = granted["granted"]["token"].as_str().unwrap().to_string();
    assert!(token.parse::<u64>().unwrap() >= 1, "{granted}");
    let unix_ms: u64 = granted["wallTimeUnixMs"].as_str().unwrap().parse().unwrap();
    // The same time as an RFC 3339 date, for people.
    let date = humantime::parse_rfc3339(granted["wallTime"].as_str().unwrap()).unwrap();
    let date_ms = date
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64;
    assert_eq!(date_ms, unix_ms, "{granted}");

    let grpc = Client::new(cluster.endpoints()).unwrap();
    let seen = grpc.describe("billing/march").await.unwrap();
    assert!(seen.held);
    assert_eq!(seen.last_token.to_string(), token);

    let renew = json!({ "resource": b64(b"billing/march"), "ownerId": owner_id,
                        "token": token, "ttlMs": "20000" });
    let renewed = post(&addr, "/v1/lock/renew", None, &renew).await;
    assert_eq!(renewed.status, 200, "{renewed:?}");
    assert!(renewed.json()["renewed"].is_object(), "{renewed:?}");

    let put = post(
        &addr,
        "/v1/kv/put",
        None,
        &json!({ "key": b64(b"march/total"), "value": b64(b"1200"),
                 "resource": b64(b"billing/march"), "ownerId": owner_id, "token": token }),
    )
    .await;
    assert_eq!(put.status, 200, "{put:?}");
    let got = post(
        &addr,
        "/v1/kv/get",
        None,
        &json!({ "key": b64(b"march/total") }),
    )
    .await;
    assert_eq!(got.status, 200, "{got:?}");
    assert!(got.body.contains(&b64(b"1200")), "{got:?}");

    let released = post(
        &addr,
        "/v1/lock/release",
        None,
        &json!({ "resource": b64(b"billing/march"), "ownerId": owner_id, "token": token }),
    )
    .await;
    assert_eq!(released.status, 200, "{released:?}");
    let history = post(
        &addr,
        "/v1/lock/history",
        None,
        &json!({ "resource": b64(b"billing/march") }),
    )
    .await;
    assert_eq!(history.status, 200, "{history:?}");
    let entries = history.json()["entries"].as_array().unwrap().clone();
    assert_eq!(entries.len(), 1, "{history:?}");
    assert_eq!(entries[0]["ended"], "EVENT_KIND_RELEASED", "{history:?}");
    assert!(entries[0]["endedAtUnixMs"].is_string(), "{history:?}");

    // A stale token is refused as gRPC refuses it, with the leader named.
    let stale = post(&addr, "/v1/lock/renew", None, &renew).await;
    assert_eq!(stale.status, 200, "{stale:?}");
    assert!(stale.json()["lost"].is_object(), "{stale:?}");
    assert!(stale.headers.contains_key("x-fenced-leader"), "{stale:?}");

    let status = post(&addr, "/v1/cluster/status", None, &json!({})).await;
    assert_eq!(status.status, 200, "{status:?}");
    assert_eq!(status.json()["leaderId"], leader.to_string(), "{status:?}");
}

/// Every served path answers a call with every field at its default: never
/// 404 (a call listed but not routed) nor a server error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_listed_call_is_routed() {
    let cluster = Cluster::start(1).await;
    let addr = cluster.nodes()[0].client_addr();
    let doc = send(&addr, "GET", "/v1/openapi.json", &[], "").await;
    assert_eq!(doc.status, 200, "{doc:?}");
    let doc = doc.json();
    let paths: Vec<String> = doc["paths"].as_object().unwrap().keys().cloned().collect();
    assert!(paths.len() > 20, "{paths:?}");
    for path in paths.iter().filter(|p| !p.ends_with("openapi.json")) {
        if path.ends_with("/watch") {
            continue; // a stream: watched below
        }
        let answer = send(&addr, "POST", path, &[], "").await;
        // A service may answer NOT_FOUND (no such member); the router's
        // own 404 says there is no call at the path.
        assert!(
            !answer.body.contains("no call at") && answer.status < 500,
            "{path}: {answer:?}"
        );
        assert!(answer.json().is_object(), "{path}: {answer:?}");
    }
    // A gRPC-only verb and a path that is no call.
    let get = send(&addr, "GET", "/v1/lock/acquire", &[], "").await;
    assert_eq!(get.status, 405, "{get:?}");
    assert_eq!(get.headers["allow"], "POST");
    let none = send(&addr, "POST", "/v1/lock/steal", &[], "").await;
    assert_eq!(none.status, 404, "{none:?}");
    assert!(none.body.contains("/v1/openapi.json"), "{none:?}");
}

/// The per-call metrics count a JSON call under the method it called, with
/// the code it answered: refusals were counted as `unknown` and OK, so an
/// operator whose workers speak JSON saw neither their calls nor the
/// PERMISSION_DENIED of someone probing with a read-only token.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_calls_are_counted_under_their_method_with_their_code() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, policy) = billing_auth_files(dir.path());
    let metrics = format!("127.0.0.1:{}", free_port());
    let cluster = Cluster::start_with(1, |s| {
        s.auth_tokens = Some(tokens.as_str().into());
        s.auth_policy = Some(policy.as_str().into());
        s.metrics_listen = Some(metrics.clone());
    })
    .await;
    let addr = cluster.nodes()[0].client_addr();
    // An acquire as `bearer`, each with an owner of its own.
    let acquire_as = |bearer: Option<&'static str>| {
        let (addr, body) = (addr.clone(), acquire_body("billing/metrics", &owner()));
        async move { post(&addr, "/v1/lock/acquire", bearer, &body).await }
    };

    let granted = acquire_as(Some("worker-token")).await;
    assert_eq!(granted.status, 200, "{granted:?}");
    for _ in 0..2 {
        let refused = acquire_as(Some("reader-token")).await;
        assert_eq!(refused.status, 403, "{refused:?}");
    }
    let anonymous = acquire_as(None).await;
    assert_eq!(anonymous.status, 401, "{anonymous:?}");
    let get = send(&addr, "GET", "/v1/lock/acquire", &[], "").await;
    assert_eq!(get.status, 405, "{get:?}");
    let none = send(&addr, "POST", "/v1/lock/steal", &[], "").await;
    assert_eq!(none.status, 404, "{none:?}");

    let (status, exposition) = http_get(&metrics, "/metrics").await;
    assert_eq!(status, 200, "{exposition}");
    fenced_server::observe::exposition::check(&exposition)
        .unwrap_or_else(|e| panic!("{e}\n{exposition}"));
    let acquire = "port=\"client\",method=\"fenced.v1.Lock/Acquire\"";
    for (code, n) in [
        ("OK", 1),
        ("PERMISSION_DENIED", 2),
        ("UNAUTHENTICATED", 1),
        ("UNIMPLEMENTED", 1),
    ] {
        let line = format!("fenced_rpc_requests_total{{{acquire},code=\"{code}\"}} {n}\n");
        assert!(exposition.contains(&line), "{line}{exposition}");
    }
    assert!(
        exposition.contains(&format!(
            "fenced_rpc_duration_seconds_count{{{acquire}}} 5\n"
        )),
        "{exposition}"
    );
    assert!(
        exposition.contains(
            "fenced_rpc_requests_total{port=\"client\",method=\"unknown\",code=\"NOT_FOUND\"} 1\n"
        ),
        "{exposition}"
    );
    assert!(
        !exposition.contains("method=\"unknown\",code=\"OK\""),
        "no JSON call is an unknown OK: {exposition}"
    );
}

/// Watch answers server-sent events: the start, then each event as JSON
/// with its wall time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn watch_streams_server_sent_events() {
    let cluster = Cluster::start(3).await;
    let addr = cluster.nodes()[0].client_addr();
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = http::Request::post("/v1/lock/watch")
        .header("host", "fenced")
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(
            json!({ "prefix": b64(b"reports/") }).to_string(),
        )))
        .unwrap();
    let response = sender.send_request(request).await.unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "text/event-stream");
    let mut body = response.into_body();
    let grpc = Client::new(cluster.endpoints()).unwrap();
    let fenced_client::Acquired::Granted(lease) = grpc
        .acquire("reports/daily", Duration::from_secs(30))
        .await
        .unwrap()
    else {
        panic!("reports/daily is held");
    };
    let mut text = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !text.contains("EVENT_KIND_GRANTED") {
        let frame = tokio::time::timeout_at(deadline, body.frame())
            .await
            .expect("the grant's event within 10 s")
            .unwrap()
            .unwrap();
        if let Some(data) = frame.data_ref() {
            text.push_str(&String::from_utf8_lossy(data));
        }
    }
    let events: Vec<Value> = text
        .lines()
        .filter_map(|l| l.strip_prefix("data: "))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(events[0]["started"].is_object(), "{text}");
    let granted = events
        .iter()
        .find(|e| e["event"]["kind"] == "EVENT_KIND_GRANTED")
        .unwrap();
    assert_eq!(
        granted["event"]["resource"],
        b64(b"reports/daily"),
        "{text}"
    );
    assert_eq!(
        granted["event"]["token"],
        lease.token().to_string(),
        "{text}"
    );
    assert!(granted["event"]["wallTimeUnixMs"].is_string(), "{text}");
}

/// Attacks on the JSON door of a cluster with auth on: no or a wrong
/// token, a read-only identity writing, a forged forwarded identity, a
/// browser form (CSRF with the operator's credentials), an oversized
/// body. Each is refused with its HTTP status and nothing is written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_auth_on_json_callers_get_exactly_their_permissions() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, policy) = billing_auth_files(dir.path());
    let cluster = Cluster::start_with(3, |s| {
        s.auth_tokens = Some(tokens.as_str().into());
        s.auth_policy = Some(policy.as_str().into());
    })
    .await;
    let addr = cluster.nodes()[1].client_addr();
    let acquire = |owner_id: &str| acquire_body("billing/run", owner_id);

    for bearer in [None, Some("wrong-token")] {
        let refused = post(&addr, "/v1/lock/acquire", bearer, &acquire(&owner())).await;
        assert_eq!(refused.status, 401, "{bearer:?}: {refused:?}");
        assert_eq!(refused.json()["status"], "UNAUTHENTICATED", "{refused:?}");
        let doc = send(&addr, "GET", "/v1/openapi.json", &[], "").await;
        assert_eq!(doc.status, 401, "{doc:?}");
    }
    let read_only = post(
        &addr,
        "/v1/lock/acquire",
        Some("reader-token"),
        &acquire(&owner()),
    )
    .await;
    assert_eq!(read_only.status, 403, "{read_only:?}");
    assert!(
        read_only.json()["message"]
            .as_str()
            .unwrap()
            .contains("lock"),
        "{read_only:?}"
    );
    // Posing as a forwarding node with another identity changes nothing.
    let auth = "Bearer reader-token";
    let forged = send(
        &addr,
        "POST",
        "/v1/lock/acquire",
        &[
            ("content-type", "application/json"),
            ("authorization", auth),
            ("x-fenced-identity", "ops"),
            ("x-fenced-forwarded", "1"),
        ],
        &acquire(&owner()).to_string(),
    )
    .await;
    assert!(forged.status == 403 || forged.status == 401, "{forged:?}");
    let membership = post(
        &addr,
        "/v1/cluster/remove_node",
        Some("worker-token"),
        &json!({ "nodeId": "3" }),
    )
    .await;
    assert_eq!(membership.status, 403, "{membership:?}");
    // A cross-site form post carrying the worker's credentials.
    let form = send(
        &addr,
        "POST",
        "/v1/lock/acquire",
        &[
            ("content-type", "text/plain"),
            ("authorization", "Bearer worker-token"),
        ],
        &acquire(&owner()).to_string(),
    )
    .await;
    assert_eq!(form.status, 415, "{form:?}");
    // Larger than four times the gRPC bound: refused before decoding.
    let huge = format!("{{\"resource\":\"{}\"}}", "A".repeat(2 * 1024 * 1024));
    let oversized = send(
        &addr,
        "POST",
        "/v1/lock/acquire",
        &[
            ("content-type", "application/json"),
            ("authorization", "Bearer worker-token"),
        ],
        &huge,
    )
    .await;
    assert_eq!(oversized.status, 413, "{oversized:?}");
    assert!(oversized.body.contains("at most"), "{oversized:?}");

    // Nothing above was granted: the worker's grant is token 1.
    let worker = post(
        &addr,
        "/v1/lock/acquire",
        Some("worker-token"),
        &acquire(&owner()),
    )
    .await;
    assert_eq!(worker.status, 200, "{worker:?}");
    assert_eq!(worker.json()["granted"]["token"], "1", "{worker:?}");
    let described = post(
        &addr,
        "/v1/lock/describe",
        Some("reader-token"),
        &json!({ "resource": b64(b"billing/run") }),
    )
    .await;
    assert_eq!(described.status, 200, "{described:?}");
    let doc = send(
        &addr,
        "GET",
        "/v1/openapi.json",
        &[("authorization", "Bearer reader-token")],
        "",
    )
    .await;
    assert_eq!(doc.status, 200, "{doc:?}");
}

/// Over TLS, HTTP/1.1 is negotiated for a JSON caller (ALPN), and the
/// client certificate's name is the identity, as for gRPC.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn over_tls_a_client_certificate_is_the_json_callers_identity() {
    let files = tempfile::tempdir().unwrap();
    let policy = fenced_tests::alice_orders_policy(files.path());
    let cluster = Cluster::start_tls(3, |s| s.auth_policy = Some(policy.as_str().into())).await;
    let pki = cluster.pki.clone().unwrap();
    let addr = cluster.nodes()[0].client_addr();
    let (cert, key) = pki.client("alice");
    for (resource, status) in [("orders/7", 200), ("billing/7", 403)] {
        let tls = tls_connect(&addr, &pki.ca(), &cert, &key).await.unwrap();
        let answer = send_on(
            tls,
            "POST",
            "/v1/lock/acquire",
            &[("content-type", "application/json")],
            &acquire_body(resource, &owner()).to_string(),
        )
        .await;
        assert_eq!(answer.status, status, "{resource}: {answer:?}");
    }
    // A caller that offers only HTTP/1.1 by ALPN is answered over it.
    let tls = tls_connect_offering(&addr, &pki.ca(), &cert, &key, &[b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"http/1.1"[..]));
    let answer = send_on(tls, "POST", "/v1/cluster/status", &[], "").await;
    assert_eq!(answer.status, 200, "{answer:?}");
    // gRPC clients still get HTTP/2.
    let tls = tls_connect_offering(&addr, &pki.ca(), &cert, &key, &[b"h2", b"http/1.1"])
        .await
        .unwrap();
    assert_eq!(tls.get_ref().1.alpn_protocol(), Some(&b"h2"[..]));
    // Plaintext HTTP to the TLS port gets no answer.
    let tcp = tokio::net::TcpStream::connect(&addr).await.unwrap();
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(tcp))
        .await
        .unwrap();
    tokio::spawn(conn);
    let request = http::Request::post("/v1/cluster/status")
        .header("host", "fenced")
        .body(Full::new(Bytes::new()))
        .unwrap();
    let plain = tokio::time::timeout(Duration::from_secs(10), sender.send_request(request)).await;
    assert!(
        !matches!(plain, Ok(Ok(ref r)) if r.status() == 200),
        "{plain:?}"
    );
}
