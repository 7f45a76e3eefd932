//! The harness's TLS and authentication gates against a real `fenced` node
//! on loopback, started as the harness starts its nodes: they pass a node
//! serving TLS with the run's certificates and fail a plaintext one.
//! Needs `cargo build -p fenced-server --bin fenced` first.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    net::TcpListener,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use fenced_jepsen::{auth, cluster, tls};
use fenced_proto::v1::{lock_client::LockClient, DescribeRequest};

/// target/<profile>/deps/<test> -> target/<profile>/fenced
fn fenced_bin() -> PathBuf {
    let exe = std::env::current_exe().expect("test executable path");
    let bin = exe
        .parent()
        .and_then(Path::parent)
        .expect("target dir")
        .join("fenced");
    assert!(
        bin.exists(),
        "{} is missing: run `cargo build -p fenced-server --bin fenced` first",
        bin.display()
    );
    bin
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port()
}

fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("fenced-jepsen-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).expect("scratch dir");
    dir
}

struct Node {
    child: Child,
    addr: String,
}

impl Drop for Node {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One `fenced run` node on loopback with the auth files, and with `pki`'s
/// certificate for node 1 when given (plaintext otherwise).
fn start(dir: &Path, pki: Option<&tls::Pki>) -> Node {
    let (client, peer) = (free_port(), free_port());
    let addr = format!("127.0.0.1:{client}");
    let mut cmd = Command::new(fenced_bin());
    cmd.args(["run", "--id", "1", "--data-dir"])
        .arg(dir.join("data"))
        .args([
            "--listen",
            &addr,
            "--peer-listen",
            &format!("127.0.0.1:{peer}"),
            "--initial-cluster",
            &format!("1=127.0.0.1:{peer}/{addr}"),
        ])
        .env_remove("FENCED_INSECURE")
        .envs(auth::node_settings(dir).expect("auth files"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("node.log")).expect("log file"));
    if let Some(pki) = pki {
        cmd.envs(pki.node_env(1));
    }
    Node {
        child: cmd.spawn().expect("starting fenced"),
        addr,
    }
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

fn make_pki(dir: &Path) -> tls::Pki {
    let pki = tls::Pki::make(&fenced_bin(), &dir.join("pki"), &[(1, "127.0.0.1".into())])
        .expect("fenced certs");
    tls::install(pki.client().expect("client files"));
    pki
}

#[tokio::test]
async fn a_tls_node_with_the_runs_certificates_passes_both_gates_and_serves_the_harness() {
    let _serial = SERIAL.lock().await;
    let dir = scratch("tls-on");
    let pki = make_pki(&dir);
    let node = start(&dir, Some(&pki));
    eventually(|| tls::check_enforced(&node.addr))
        .await
        .expect("the TLS gate passes a node serving TLS only");
    tls::plaintext_refused(&node.addr)
        .await
        .expect("a plaintext call fails to connect");
    auth::check_enforced(&node.addr)
        .await
        .expect("the auth gate passes over TLS");
    // The harness's own calls: TLS with its certificate, and the token.
    eventually(|| describe_with_token(&node.addr))
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
    let node = start(&dir, None);
    // Up and answering in plaintext (loopback needs no --insecure).
    let addr = node.addr.clone();
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
    let err = tls::plaintext_refused(&node.addr)
        .await
        .expect_err("the plaintext check must fail a plaintext node");
    assert!(
        format!("{err:#}").contains("answered a plaintext call"),
        "{err:#}"
    );
    let err = tls::check_enforced(&node.addr)
        .await
        .expect_err("the TLS gate must fail a plaintext node");
    assert!(format!("{err:#}").contains("over TLS"), "{err:#}");
    drop(node);
    let _ = std::fs::remove_dir_all(&dir);
}
