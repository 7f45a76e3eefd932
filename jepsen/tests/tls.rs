//! The harness's TLS and authentication gates against a real `fenced` node
//! on loopback, started as the harness starts its nodes: they pass a node
//! serving TLS with the run's certificates and fail a plaintext one.
//! Needs `cargo build -p fenced-server --bin fenced` first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use fenced_jepsen::{auth, cluster, tls};
use fenced_proto::v1::{lock_client::LockClient, DescribeRequest};
use fenced_testkit::{Cluster, ClusterSpec, Pki, Tls};

fn fenced_bin() -> PathBuf {
    fenced_testkit::workspace_bin("fenced").unwrap_or_else(|e| panic!("{e:#}"))
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fenced-jepsen-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

/// One `fenced run` node on loopback with the auth files, serving TLS with
/// `pki`'s certificate for node 1 when given (plaintext otherwise), as the
/// harness starts its nodes (through fenced-testkit).
fn start(dir: &Path, pki: Option<&Pki>) -> (Cluster, String) {
    let mut spec = ClusterSpec::loopback(&fenced_bin(), dir, 1).expect("ports");
    let (tokens, policy) = auth::write_files(dir).expect("auth files");
    spec.settings.auth_tokens = Some(tokens);
    spec.settings.auth_policy = Some(policy);
    spec.tls = pki.map(|pki| Tls {
        pki: pki.clone(),
        client: tls::CLIENT_NAME.into(),
    });
    let mut node = Cluster::new(spec);
    node.start(1).expect("starting fenced");
    let addr = node.endpoints()[0].clone();
    (node, addr)
}

async fn describe_with_token(addr: &str) -> Result<(), tonic::Status> {
    let mut req = tonic::Request::new(DescribeRequest {
        resource: b"r".to_vec(),
        allow_stale: true,
    });
    auth::authorize(&mut req);
    req.set_timeout(Duration::from_secs(2));
    LockClient::new(cluster::channel(addr).expect("channel"))
        .describe(req)
        .await
        .map(|_| ())
}

/// Retries `f` until it succeeds or 20 s pass; returns the last result.
async fn eventually<F, Fut, T, E>(mut f: F) -> Result<T, E>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, E>>,
{
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let r = f().await;
        if r.is_ok() || Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The tests share the process-wide TLS configuration: one at a time.
static SERIAL: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

fn make_pki(dir: &Path) -> Pki {
    let pki = tls::make_pki(&fenced_bin(), &dir.join("pki"), &[(1, "127.0.0.1".into())])
        .expect("fenced certs");
    tls::install(tls::client_tls(&pki).expect("client files"));
    pki
}

#[tokio::test]
async fn a_tls_node_with_the_runs_certificates_passes_both_gates_and_serves_the_harness() {
    let _serial = SERIAL.lock().await;
    let dir = scratch("tls-on");
    let pki = make_pki(&dir);
    let (node, addr) = start(&dir, Some(&pki));
    eventually(|| tls::check_enforced(&addr))
        .await
        .expect("the TLS gate passes a node serving TLS only");
    tls::plaintext_refused(&addr)
        .await
        .expect("a plaintext call fails to connect");
    auth::check_enforced(&addr)
        .await
        .expect("the auth gate passes over TLS");
    // The harness's own calls: TLS with its certificate, and the token.
    eventually(|| describe_with_token(&addr))
        .await
        .expect("a describe over the harness's channel is served");
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test]
async fn the_tls_gate_fails_a_plaintext_node() {
    let _serial = SERIAL.lock().await;
    let dir = scratch("tls-off");
    make_pki(&dir);
    let (node, addr) = start(&dir, None);
    // Up and answering in plaintext (loopback needs no --insecure).
    eventually(|| async {
        let ch = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
            .expect("endpoint")
            .connect_lazy();
        let mut req = tonic::Request::new(DescribeRequest {
            resource: b"r".to_vec(),
            allow_stale: true,
        });
        auth::authorize(&mut req);
        LockClient::new(ch).describe(req).await
    })
    .await
    .expect("the plaintext node serves");
    let err = tls::plaintext_refused(&addr)
        .await
        .expect_err("the plaintext check must fail a plaintext node");
    assert!(
        format!("{err:#}").contains("answered a plaintext call"),
        "{err:#}"
    );
    let err = tls::check_enforced(&addr)
        .await
        .expect_err("the TLS gate must fail a plaintext node");
    assert!(format!("{err:#}").contains("over TLS"), "{err:#}");
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}
