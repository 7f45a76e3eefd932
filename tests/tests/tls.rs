//! TLS on both ports: a TLS cluster works, and every refusal holds: a
//! client without a certificate when one is required, a client trusting
//! another CA, a non-member node's certificate and a client's certificate
//! on the peer port (with a forged AppendEntries behind it), plaintext to a
//! TLS port, and plaintext on a public address without `--insecure`. A node
//! whose membership lags admits a newer member its members vouch for.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use fenced_client::{Acquired, Client, ClientError, Lease, Token};
use fenced_tests::{bin, free_port, tls_connect, Cluster, Pki};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    net::TcpStream,
};

/// What a Raft connection starts with (crates/fenced-server/src/peer/network.rs).
const PREFACE: &[u8; 8] = b"fncdrft2";

async fn granted(client: &Client, resource: &str) -> Token {
    held(client, resource).await.token()
}

/// A lease on `resource`, kept while it lives.
async fn held(client: &Client, resource: &str) -> Lease {
    match client
        .acquire(resource, Duration::from_secs(30))
        .await
        .unwrap()
    {
        Acquired::Granted(lease) => lease,
        Acquired::Held { current_token, .. } => panic!("{resource}: held by {current_token}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tls_cluster_elects_grants_and_survives_a_leader_kill() {
    let mut cluster = Cluster::start_tls(3, |_| {}).await;
    let client = cluster.client();
    let first = granted(&client, "tls-a").await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    cluster.kill(leader);
    let next = cluster.wait_for_leader(Duration::from_secs(20)).await;
    assert_ne!(next, leader);
    let second = granted(&client, "tls-b").await;
    assert!(second > first, "tokens go up across the failover");
    // A follower forwards to the leader over mutual TLS on the peer port.
    let follower = (1..=3).find(|id| *id != leader && *id != next).unwrap();
    let third = granted(&cluster.client_of(follower), "tls-c").await;
    assert!(third > second);
    // `fenced healthcheck` with the node's own TLS settings, on both ports;
    // without them a TLS port does not answer it.
    let (cert, key) = cluster.pki.as_ref().unwrap().node(follower);
    let ca = cluster.pki.as_ref().unwrap().ca();
    let node = &cluster.nodes()[(follower - 1) as usize];
    for port in [node.client_port, node.peer_port] {
        let check = |tls: bool| {
            let mut cmd = Command::new(bin("fenced"));
            cmd.args(["healthcheck", "--endpoint", &format!("127.0.0.1:{port}")]);
            if tls {
                cmd.env("FENCED_TLS_CERT", &cert)
                    .env("FENCED_TLS_KEY", &key)
                    .env("FENCED_TLS_CA", &ca);
            }
            cmd.output().unwrap()
        };
        let ok = check(true);
        assert!(
            ok.status.success() && String::from_utf8_lossy(&ok.stdout).contains("SERVING"),
            "port {port}: {}",
            String::from_utf8_lossy(&ok.stderr)
        );
        assert!(
            !check(false).status.success(),
            "port {port} answered plaintext"
        );
    }
    // Without --client-cert-auth a client certificate is optional.
    let pki = cluster.pki.clone().unwrap();
    let anonymous = Client::with_tls(cluster.endpoints(), Some(&pki.client_options(None))).unwrap();
    granted(&anonymous, "tls-d").await;
    // fencectl speaks TLS with --cacert, --cert and --key.
    let out = cluster.fencectl(&["describe", "tls-c"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_are_checked_when_required_and_the_ca_always() {
    let cluster = Cluster::start_tls(3, |s| s.client_cert_auth = true).await;
    let pki = cluster.pki.clone().unwrap();
    let endpoints = cluster.endpoints();

    // With a certificate the CA signed: served.
    let alice = Client::with_tls(&endpoints, Some(&pki.client_options(Some("alice")))).unwrap();
    granted(&alice, "cert-a").await;

    // No certificate: refused, and the error says TLS and what to check.
    let anonymous = Client::with_tls(&endpoints, Some(&pki.client_options(None)))
        .unwrap()
        .with_call_timeout(Duration::from_secs(3));
    match anonymous.acquire("cert-b", Duration::from_secs(30)).await {
        Err(ClientError::Tls(msg)) => assert!(
            msg.starts_with("TLS ") && msg.contains("check --cert and --key"),
            "{msg}"
        ),
        other => panic!(
            "a client without a certificate was not refused by TLS: {:?}",
            other.err()
        ),
    }

    // Trusting another CA (its certificate signed by that one too): refused.
    let other = Pki::new(&cluster.dir.path().join("other-pki"));
    let stranger = Client::with_tls(&endpoints, Some(&other.client_options(Some("alice"))))
        .unwrap()
        .with_call_timeout(Duration::from_secs(3));
    match stranger.acquire("cert-c", Duration::from_secs(30)).await {
        Err(ClientError::Tls(msg)) => assert!(
            msg.starts_with("TLS handshake with 127.0.0.1:")
                && msg.contains("unknown authority; check --cacert"),
            "{msg}"
        ),
        other => panic!(
            "a client trusting another CA was not refused by TLS: {:?}",
            other.err()
        ),
    }
    let (cert, key) = other.client("alice");
    let out = Command::new(bin("fencectl"))
        .args(["--endpoints", &endpoints.join(","), "--timeout", "3s"])
        .arg("--cacert")
        .arg(other.ca())
        .arg("--cert")
        .arg(cert)
        .arg("--key")
        .arg(key)
        .args(["describe", "cert-a"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("TLS handshake with 127.0.0.1:") && stderr.contains("check --cacert"),
        "{stderr}"
    );
    // Nothing of theirs reached the table.
    let d = alice.describe("cert-b").await.unwrap();
    assert!(!d.held, "{d:?}");
}

/// An AppendEntries frame as a leader would send it: length, call byte 1,
/// a cluster time and flags, then a body (which a refused connection never
/// gets to decode).
fn forged_append_entries() -> Vec<u8> {
    let mut frame = Vec::new();
    let body = [0u8; 64];
    let len = (1 + 9 + body.len()) as u32;
    frame.extend_from_slice(&len.to_be_bytes());
    frame.push(1);
    frame.extend_from_slice(&u64::MAX.to_be_bytes());
    frame.push(0);
    frame.extend_from_slice(&body);
    frame
}

/// Sends the preface and a forged AppendEntries on `conn`; returns how the
/// node answered: `None` when it kept the connection open without a word
/// for `wait`, else what the read gave.
async fn send_forged(
    conn: &mut tokio_rustls::client::TlsStream<TcpStream>,
    wait: Duration,
    with_frame: bool,
) -> Option<std::io::Result<usize>> {
    let mut bytes = PREFACE.to_vec();
    if with_frame {
        bytes.extend(forged_append_entries());
    }
    // A refused handshake may already fail the write.
    if let Err(e) = conn.write_all(&bytes).await.and(conn.flush().await) {
        return Some(Err(e));
    }
    let mut buf = [0u8; 64];
    tokio::time::timeout(wait, conn.read(&mut buf)).await.ok()
}

/// The state that a forged message would change, on every node.
async fn state(cluster: &Cluster) -> Vec<(u64, u64, u64, u64, Vec<u64>)> {
    let mut all = Vec::new();
    for id in 1..=3 {
        let s = cluster.status(id).await.expect("status");
        let members = s.members.iter().map(|m| m.id).collect();
        all.push((s.term, s.leader_id, s.last_token, s.live_leases, members));
    }
    all
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_peer_port_admits_member_nodes_only() {
    let cluster = Cluster::start_tls(3, |_| {}).await;
    let pki = cluster.pki.clone().unwrap();
    let _lease = held(&cluster.client(), "peer-a").await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    cluster.wait_for_convergence(Duration::from_secs(10)).await;
    let before = state(&cluster).await;
    let peer_addr = format!("127.0.0.1:{}", cluster.nodes()[0].peer_port);

    // Control: a member's certificate is let in and the connection waits
    // for frames.
    let (cert, key) = pki.node(2);
    let mut member = tls_connect(&peer_addr, &pki.ca(), &cert, &key)
        .await
        .expect("a member's handshake");
    assert!(
        send_forged(&mut member, Duration::from_millis(700), false)
            .await
            .is_none(),
        "a member's Raft connection was closed at once"
    );

    // A valid certificate of node 9, which is not a member; and a client's
    // certificate. Both carry a forged AppendEntries from a future time.
    let (cert9, key9) = pki.node(9);
    let (certc, keyc) = pki.client("mallory");
    for (who, cert, key) in [("node 9", &cert9, &key9), ("a client", &certc, &keyc)] {
        match tls_connect(&peer_addr, &pki.ca(), cert, key).await {
            // TLS 1.3: the client finishes its side first; the node's
            // refusal arrives on the first read.
            Ok(mut conn) => match send_forged(&mut conn, Duration::from_secs(5), true).await {
                // A refusal is an alert; a connection let in and closed
                // after the frame would read as a clean end instead.
                Some(Err(e)) => assert!(e.to_string().contains("alert"), "{who}: {e}"),
                other => panic!("{who}: the peer port let the connection in: {other:?}"),
            },
            Err(e) => assert!(e.to_string().contains("alert"), "{who}: {e}"),
        }
    }
    let log = cluster.log_of(1);
    assert!(
        log.contains("peer certificate refused: node 9 is not a member"),
        "{log}"
    );
    assert!(log.contains("it names no node"), "{log}");
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(
        state(&cluster).await,
        before,
        "a refused peer changed the cluster"
    );
    assert_eq!(
        cluster.wait_for_leader(Duration::from_secs(5)).await,
        leader
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_to_a_tls_port_is_refused() {
    let cluster = Cluster::start_tls(3, |_| {}).await;
    // gRPC without TLS on the client port.
    let plain = Client::new(cluster.endpoints())
        .unwrap()
        .with_call_timeout(Duration::from_secs(2));
    assert!(
        plain.status().await.is_err(),
        "a plaintext client was served"
    );
    // A Raft preface and frame in clear on the peer port: the node answers
    // with a TLS alert at most, never a Raft reply, and closes.
    let mut tcp = TcpStream::connect(("127.0.0.1", cluster.nodes()[0].peer_port))
        .await
        .unwrap();
    let mut bytes = PREFACE.to_vec();
    bytes.extend(forged_append_entries());
    tcp.write_all(&bytes).await.unwrap();
    let mut reply = Vec::new();
    let read = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut reply)).await;
    assert!(read.is_ok(), "the peer port kept a plaintext connection");
    assert!(
        reply.is_empty() || reply[0] == 0x15,
        "not a TLS alert: {reply:?}"
    );
    assert!(cluster.status(1).await.is_some());
}

fn run_node(args: &[&str], dir: &Path) -> std::process::Child {
    let (client, peer) = (free_port(), free_port());
    Command::new(bin("fenced"))
        .args([
            "run",
            "--id",
            "1",
            "--listen",
            &format!("0.0.0.0:{client}"),
            "--peer-listen",
            &format!("0.0.0.0:{peer}"),
            "--initial-cluster",
            &format!("1=127.0.0.1:{peer}"),
        ])
        .arg("--data-dir")
        .arg(dir)
        .args(args)
        .env("FENCED_LOG", "info,openraft=warn")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_on_a_public_address_needs_insecure_and_warns() {
    let dir = tempfile::tempdir().unwrap();
    let refused = run_node(&[], &dir.path().join("a"))
        .wait_with_output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("is not a loopback address and TLS is off")
            && stderr.contains("--tls-cert")
            && stderr.contains("--insecure"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("a").exists(),
        "it refused before touching the disk"
    );

    let started = start_log(run_node(&["--insecure"], &dir.path().join("b"))).await;
    assert!(started.contains("node started"), "{started}");
    assert!(
        started.contains("WARN") && started.contains("--insecure: serving plaintext"),
        "{started}"
    );
}

/// What a node started as `child` logs until "node started" (at most 15
/// s); the node is then stopped.
async fn start_log(mut child: std::process::Child) -> String {
    let mut stderr = child.stderr.take().unwrap();
    let mut text = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(15);
    let started = tokio::task::spawn_blocking(move || {
        use std::io::Read;
        let mut buf = [0u8; 4096];
        while Instant::now() < deadline {
            match stderr.read(&mut buf) {
                Ok(0) | Err(_) => break,
                Ok(n) => text.extend_from_slice(&buf[..n]),
            }
            if String::from_utf8_lossy(&text).contains("node started") {
                break;
            }
        }
        String::from_utf8_lossy(&text).to_string()
    })
    .await
    .unwrap();
    let _ = child.kill();
    let _ = child.wait();
    started
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_on_a_public_address_needs_authentication_and_warns_without() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let (cert, key) = pki.node(1);
    let ca = pki.ca();
    let tls: Vec<String> = [
        ("--tls-cert", &cert),
        ("--tls-key", &key),
        ("--tls-ca", &ca),
    ]
    .iter()
    .map(|(flag, path)| format!("{flag}={}", path.display()))
    .collect();
    let tls: Vec<&str> = tls.iter().map(String::as_str).collect();
    let refused = run_node(&tls, &dir.path().join("a"))
        .wait_with_output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert_eq!(refused.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("authentication is off")
            && stderr.contains("--auth-policy")
            && stderr.contains("--insecure-no-auth"),
        "{stderr}"
    );
    assert!(
        !dir.path().join("a").exists(),
        "it refused before touching the disk"
    );

    let mut loud = tls.clone();
    loud.push("--insecure-no-auth");
    let started = start_log(run_node(&loud, &dir.path().join("b"))).await;
    assert!(started.contains("node started"), "{started}");
    assert!(
        started.contains("WARN") && started.contains("--insecure-no-auth: authentication is off"),
        "{started}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fenced_resource_serves_tls_and_requires_client_certificates() {
    use fenced_proto::v1::{fenced_resource_client::FencedResourceClient, GetRequest};
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::new(&dir.path().join("pki"));
    let (cert, key) = pki.server("resource");
    let addr = format!("127.0.0.1:{}", free_port());
    let log = std::fs::File::create(dir.path().join("resource.log")).unwrap();
    let mut child = Command::new(bin("fenced-resource"))
        .args([
            "serve",
            "--listen",
            &addr,
            "--client-cert-auth",
            "--standalone-no-cluster-check",
        ])
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .arg("--tls-cert")
        .arg(cert)
        .arg("--tls-key")
        .arg(key)
        .arg("--tls-ca")
        .arg(pki.ca())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let get = |channel| async move {
        let ping = GetRequest {
            key: b"ping".to_vec(),
        };
        FencedResourceClient::new(channel).get(ping).await
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while get(pki.channel(&addr, Some("writer"))).await.is_err() {
        assert!(
            Instant::now() < deadline,
            "fenced-resource did not serve TLS: {}",
            std::fs::read_to_string(dir.path().join("resource.log")).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        get(pki.channel(&addr, None)).await.is_err(),
        "served a client without a certificate"
    );
    let plain = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .unwrap()
        .timeout(Duration::from_secs(5))
        .connect_lazy();
    assert!(get(plain).await.is_err(), "served plaintext");
    // fencectl resource with the global TLS flags.
    let (cert, key) = pki.client("writer");
    let out = Command::new(bin("fencectl"))
        .arg("--cacert")
        .arg(pki.ca())
        .arg("--cert")
        .arg(cert)
        .arg("--key")
        .arg(key)
        .args(["resource", "get", "ping", "--endpoint", &addr])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let anonymous = Command::new(bin("fencectl"))
        .arg("--cacert")
        .arg(pki.ca())
        .args(["resource", "get", "ping", "--endpoint", &addr])
        .output()
        .unwrap();
    assert!(
        !anonymous.status.success(),
        "served fencectl without a certificate"
    );
    let _ = child.kill();
    let _ = child.wait();
}

/// Waits up to 2 s for node `id`'s log to hold `needle`.
async fn wait_for_log(cluster: &Cluster, id: u64, needle: &str) {
    let deadline = Instant::now() + Duration::from_secs(2);
    while !cluster.log_of(id).contains(needle) {
        assert!(
            Instant::now() < deadline,
            "node {id} never logged {needle:?}:\n{}",
            cluster.log_of(id)
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_removed_from_the_membership_is_refused_on_the_peer_port() {
    use fenced_proto::v1::{cluster_client::ClusterClient, RemoveNodeRequest};
    let mut cluster = Cluster::start_tls(3, |_| {}).await;
    let pki = cluster.pki.clone().unwrap();
    // A Raft connection node 3 holds open while it is removed.
    let (cert, key) = pki.node(3);
    let peer_addr = format!("127.0.0.1:{}", cluster.nodes()[0].peer_port);
    let mut held = tls_connect(&peer_addr, &pki.ca(), &cert, &key)
        .await
        .expect("a member's handshake");
    assert!(send_forged(&mut held, Duration::from_millis(300), false)
        .await
        .is_none());
    // Node 3 leaves; with it stopped, the leader is 1 or 2.
    cluster.kill(3);
    let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
    // RemoveNode takes it out of the voters, then out of the membership.
    let mut admin = ClusterClient::new(cluster.channel(leader));
    admin
        .remove_node(RemoveNodeRequest { node_id: 3 })
        .await
        .expect("node 3 removed");
    // Every node's snapshot follows the committed membership.
    let deadline = Instant::now() + Duration::from_secs(10);
    for id in [1u64, 2] {
        while cluster
            .status(id)
            .await
            .is_none_or(|s| s.members.iter().any(|m| m.id == 3))
        {
            assert!(Instant::now() < deadline, "node {id} still lists node 3");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    // The open connection's next frame is not served: it is closed first.
    held.write_all(&forged_append_entries()).await.unwrap();
    held.flush().await.unwrap();
    let mut buf = [0u8; 64];
    let read = tokio::time::timeout(Duration::from_secs(5), held.read(&mut buf)).await;
    assert!(
        matches!(read, Ok(Ok(0)) | Ok(Err(_))),
        "the removed node's connection answered: {read:?}"
    );
    // The node logs the refusal after it closed the connection.
    wait_for_log(&cluster, 1, "node 3 is no longer a member").await;
    match tls_connect(&peer_addr, &pki.ca(), &cert, &key).await {
        Ok(mut conn) => match send_forged(&mut conn, Duration::from_secs(5), true).await {
            Some(Err(e)) => assert!(e.to_string().contains("alert"), "{e}"),
            other => panic!("the removed node was let in: {other:?}"),
        },
        Err(e) => assert!(e.to_string().contains("alert"), "{e}"),
    }
    // Refused as retired: a removed id never returns.
    wait_for_log(&cluster, 1, "node 3 is retired").await;
    // The two that are left still serve.
    granted(&cluster.client_of(1), "after-removal").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_tls_serves_https_only() {
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let cluster = Cluster::start_tls(1, |s| {
        s.metrics_listen = Some(listen.to_string());
        s.metrics_tls = true;
    })
    .await;
    let pki = cluster.pki.clone().unwrap();
    let (cert, key) = pki.client("scraper");
    let mut conn = tls_connect(&listen, &pki.ca(), &cert, &key)
        .await
        .expect("a TLS handshake on the metrics port");
    conn.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    let mut body = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), conn.read_to_end(&mut body)).await;
    let text = String::from_utf8_lossy(&body);
    assert!(
        text.starts_with("HTTP/1.1 200") && text.contains("fenced_current_term"),
        "{text}"
    );
    // Plain HTTP gets no metrics.
    let mut tcp = TcpStream::connect(&listen).await.unwrap();
    tcp.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut reply = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(5), tcp.read_to_end(&mut reply)).await;
    assert!(
        !String::from_utf8_lossy(&reply).contains("fenced_current_term"),
        "metrics served in plaintext"
    );
}

/// With TLS and a policy, a client certificate's name is its identity: on
/// every node, through a follower too (the follower forwards the name over
/// the peer port's mutual TLS, where the leader believes it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_certificate_is_an_identity_the_policy_grants_by_prefix() {
    let files = tempfile::tempdir().unwrap();
    let policy = fenced_tests::alice_orders_policy(files.path());
    let cluster = Cluster::start_tls(3, |s| s.auth_policy = Some(policy.as_str().into())).await;
    let pki = cluster.pki.clone().unwrap();
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    for node in [leader, follower] {
        let addr = cluster.nodes()[(node - 1) as usize].client_addr();
        let alice =
            Client::with_tls([addr.clone()], Some(&pki.client_options(Some("alice")))).unwrap();
        granted(&alice, &format!("orders/{node}")).await;
        match alice
            .acquire(&format!("billing/{node}"), Duration::from_secs(30))
            .await
        {
            Err(ClientError::PermissionDenied(msg)) => {
                assert!(
                    msg.contains("orders/"),
                    "the prefixes granted are named: {msg}"
                )
            }
            other => panic!(
                "alice was not refused billing/ on node {node}: {:?}",
                other.err()
            ),
        }
        // A certificate the CA signed, for a name the policy does not know.
        let mallory = Client::with_tls([addr], Some(&pki.client_options(Some("mallory"))))
            .unwrap()
            .with_call_timeout(Duration::from_secs(3));
        match mallory
            .acquire(&format!("orders/m{node}"), Duration::from_secs(30))
            .await
        {
            Err(ClientError::PermissionDenied(_)) => {}
            other => panic!("mallory was not refused on node {node}: {:?}", other.err()),
        }
    }
}

/// On the HTTPS metrics port, a client certificate's name is an identity
/// for the status page: granted admin it sees the view, otherwise 403.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_status_page_takes_a_client_certificate_as_its_identity() {
    let files = tempfile::tempdir().unwrap();
    let policy = files.path().join("policy.toml");
    std::fs::write(
        &policy,
        format!(
            "[roles.ops]\nadmin = true\n[roles.orders]\nread = [\"orders/\"]\n\
             [roles.harness]\nlock = [\"\"]\nread = [\"\"]\n\
             [identities]\nops-laptop = [\"ops\"]\nalice = [\"orders\"]\n{harness} = [\"harness\"]\n",
            harness = fenced_tests::HARNESS_CLIENT
        ),
    )
    .unwrap();
    let deny = files.path().join("deny.toml");
    std::fs::write(&deny, "").unwrap();
    let listen = format!("127.0.0.1:{}", free_port());
    let cluster = Cluster::start_tls(1, |s| {
        s.metrics_listen = Some(listen.to_string());
        s.metrics_tls = true;
        s.auth_policy = Some(policy.clone());
        s.tls_deny = Some(deny.clone());
    })
    .await;
    let pki = cluster.pki.clone().unwrap();
    let get_status = |name: &'static str| {
        let (pki, listen) = (pki.clone(), listen.clone());
        async move {
            let (cert, key) = pki.client(name);
            let mut conn = tls_connect(&listen, &pki.ca(), &cert, &key).await.unwrap();
            conn.write_all(b"GET /status HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
                .await
                .unwrap();
            let mut body = Vec::new();
            let _ =
                tokio::time::timeout(Duration::from_secs(10), conn.read_to_end(&mut body)).await;
            String::from_utf8_lossy(&body).into_owned()
        }
    };
    let ops = get_status("ops-laptop").await;
    assert!(
        ops.starts_with("HTTP/1.1 200") && ops.contains("id=\"leases\""),
        "{ops}"
    );
    let alice = get_status("alice").await;
    assert!(alice.starts_with("HTTP/1.1 403"), "{alice}");
    assert!(!alice.contains("id=\"leases\""), "{alice}");

    // A keep-alive connection opened before ops-laptop's certificate was
    // revoked serves it nothing after the reload.
    let (cert, key) = pki.client("ops-laptop");
    let mut open = tls_connect(&listen, &pki.ca(), &cert, &key).await.unwrap();
    let before = keep_alive_get(&mut open, "/status").await;
    assert!(before.starts_with("HTTP/1.1 200"), "{before}");
    std::fs::write(&deny, "clients = [\"ops-laptop\"]\n").unwrap();
    cluster.signal(1, nix::sys::signal::Signal::SIGHUP);
    wait_for_log(&cluster, 1, "deny list reloaded").await;
    let after = keep_alive_get(&mut open, "/status").await;
    assert!(after.starts_with("HTTP/1.1 401"), "{after}");
    assert!(
        after.contains("revoked") && !after.contains("id=\"leases\""),
        "{after}"
    );
}

/// One GET on an open HTTP/1.1 connection, which stays open: the answer's
/// head and body (by its Content-Length).
async fn keep_alive_get<S: AsyncRead + AsyncWrite + Unpin>(conn: &mut S, path: &str) -> String {
    conn.write_all(format!("GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").as_bytes())
        .await
        .unwrap();
    let mut got = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let text = String::from_utf8_lossy(&got).into_owned();
        if let Some(head_end) = text.find("\r\n\r\n") {
            let length = text[..head_end]
                .lines()
                .find_map(|l| {
                    let (k, v) = l.split_once(':')?;
                    k.eq_ignore_ascii_case("content-length")
                        .then(|| v.trim().parse::<usize>().ok())?
                })
                .unwrap_or(0);
            if got.len() >= head_end + 4 + length {
                return text;
            }
        }
        let n = tokio::time::timeout(Duration::from_secs(10), conn.read(&mut buf))
            .await
            .expect("an answer within 10 s")
            .unwrap();
        assert!(n > 0, "connection closed after {text}");
        got.extend_from_slice(&buf[..n]);
    }
}

/// The leader the running nodes `ids` agree on, waiting up to `within`.
async fn leader_among(cluster: &Cluster, ids: &[u64], within: Duration) -> u64 {
    let deadline = Instant::now() + within;
    loop {
        let mut seen = Vec::new();
        for id in ids {
            seen.push(cluster.status(*id).await.map_or(0, |s| s.leader_id));
        }
        if seen[0] != 0 && ids.contains(&seen[0]) && seen.iter().all(|l| *l == seen[0]) {
            return seen[0];
        }
        assert!(
            Instant::now() < deadline,
            "nodes {ids:?} agree on no leader within {within:?}: {seen:?}\n{}",
            cluster.logs()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_whose_membership_lags_admits_a_leader_that_joined_after_it() {
    use fenced_proto::v1::{cluster_client::ClusterClient, PromoteLearnerRequest};
    let mut cluster = Cluster::start_tls(3, |_| {}).await;
    cluster.wait_for_leader(Duration::from_secs(20)).await;
    // Node 3 is down while nodes 4 and 5 join and become voters: its
    // membership names nodes 1, 2 and 3 only.
    cluster.kill(3);
    for id in [4u64, 5] {
        cluster.join_node(id, None);
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let leader = leader_among(&cluster, &[1, 2], Duration::from_secs(20)).await;
            let promoted = ClusterClient::new(cluster.channel(leader))
                .promote_learner(PromoteLearnerRequest { node_id: id })
                .await;
            if promoted.is_ok() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "node {id} not promoted: {promoted:?}\n{}",
                cluster.logs()
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    // Stop leaders until node 4 or 5 leads (four of five voters run; a
    // stopped one leaves the three a majority needs). Killed and started
    // again rather than paused: a paused leader, resumed, may still deliver
    // appends of its old term to node 3 when it starts, and node 3 would
    // learn the new membership from them instead of from the new leader.
    let up = [1u64, 2, 4, 5];
    let mut leader = leader_among(&cluster, &up, Duration::from_secs(20)).await;
    for _ in 0..10 {
        if leader >= 4 {
            break;
        }
        cluster.kill(leader);
        let others: Vec<u64> = up.iter().copied().filter(|i| *i != leader).collect();
        leader_among(&cluster, &others, Duration::from_secs(20)).await;
        cluster.spawn(leader);
        // The restarted node follows the new leader before the next round.
        leader = leader_among(&cluster, &up, Duration::from_secs(20)).await;
    }
    assert!(leader >= 4, "node 4 or 5 never led");
    let token = granted(&cluster.client_of(leader), "written-while-3-was-down").await;
    assert!(token.get() > 0);
    let applied = cluster
        .status(leader)
        .await
        .expect("leader status")
        .last_applied;

    // Node 3 restarts with its old membership: the leader's certificate
    // names a node it does not know. Nodes 1 and 2, whose membership is
    // newer, vouch for it, and node 3 catches up.
    cluster.spawn(3);
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let s = cluster.status(3).await;
        let caught_up = s.as_ref().is_some_and(|s| {
            s.leader_id == leader
                && s.last_applied >= applied
                && [4, 5]
                    .iter()
                    .all(|id| s.members.iter().any(|m| m.id == *id))
        });
        if caught_up {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 3 never caught up with leader {leader}: {s:?}\n{}",
            cluster.log_of(3)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let log = cluster.log_of(3);
    assert!(
        log.contains(&format!(
            "peer certificate refused: node {leader} is not a member"
        )),
        "node 3 knew the leader from the start:\n{log}"
    );
    assert!(
        log.contains(&format!(
            "peer certificate admitted: a majority of the voters name node {leader}"
        )),
        "{log}"
    );
}
