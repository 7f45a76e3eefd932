//! The article's monthly-statement worker, several instances at once, against
//! a real cluster and a real protected resource.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use fenced_proto::v1::{fenced_resource_client::FencedResourceClient, GetRequest};
use fenced_tests::{bin, free_port, Cluster};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};

struct Resource {
    child: Child,
    addr: String,
}

impl Drop for Resource {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Without the cluster check: these tests show the store's own fence
/// refusing the frozen worker (the check would refuse it earlier).
async fn start_resource(dir: &std::path::Path) -> Resource {
    let addr = format!("127.0.0.1:{}", free_port());
    let child = Command::new(bin("fenced-resource"))
        .args([
            "serve",
            "--listen",
            &addr,
            "--data-dir",
            dir.to_str().unwrap(),
            "--standalone-no-cluster-check",
        ])
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(Instant::now() < deadline, "fenced-resource did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Resource { child, addr }
}

fn worker(cluster: &Cluster, resource: &Resource, instance: &str, extra: &[&str]) -> Command {
    let mut cmd = Command::new(bin("statement-worker"));
    cmd.args([
        "--instance",
        instance,
        "--account",
        "1842",
        "--month",
        "2026-07",
    ])
    .args(["--endpoints", &cluster.endpoints().join(",")])
    .args(["--resource-endpoint", &resource.addr])
    .args(extra)
    .stdout(Stdio::piped());
    cmd
}

async fn stored_statement(resource: &Resource) -> (u64, String) {
    let mut client = FencedResourceClient::connect(format!("http://{}", resource.addr))
        .await
        .unwrap();
    let got = client
        .get(GetRequest {
            key: b"statement/account-1842/2026-07".to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(got.found);
    (got.token, String::from_utf8(got.value).unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_instances_produce_one_statement() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let resource = start_resource(dir.path()).await;
    let children: Vec<_> = ["a", "b", "c"]
        .iter()
        .map(|i| {
            worker(&cluster, &resource, i, &["--work", "2s"])
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<String> = children
        .into_iter()
        .map(|c| {
            let out = c.wait_with_output().unwrap();
            assert!(out.status.success(), "{out:?}");
            String::from_utf8(out.stdout).unwrap()
        })
        .collect();
    let writers: Vec<&String> = outputs
        .iter()
        .filter(|o| o.contains("wrote statement/"))
        .collect();
    assert_eq!(writers.len(), 1, "{outputs:?}");
    assert_eq!(
        outputs
            .iter()
            .filter(|o| o.contains("nothing to do"))
            .count(),
        2,
        "{outputs:?}"
    );
    let (token, value) = stored_statement(&resource).await;
    assert!(
        writers[0].contains(&format!("with token {token}")),
        "{outputs:?}"
    );
    assert!(value.contains(&format!("(token {token})")));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_worker_frozen_past_its_lease_cannot_overwrite_its_successor() {
    let cluster = Cluster::start(3).await;
    let dir = tempfile::tempdir().unwrap();
    let resource = start_resource(dir.path()).await;

    // A wins, starts the work, and is frozen in the middle of it.
    let mut a = worker(
        &cluster,
        &resource,
        "a",
        &["--work", "2s", "--ttl", "1s", "--skip-lease-check"],
    )
    .spawn()
    .unwrap();
    let a_pid = Pid::from_raw(a.id() as i32);
    let mut a_out = std::io::BufRead::lines(std::io::BufReader::new(a.stdout.take().unwrap()));
    let won = a_out.next().unwrap().unwrap();
    assert!(won.contains("won"), "{won}");
    kill(a_pid, Signal::SIGSTOP).unwrap();
    tokio::time::sleep(Duration::from_millis(2_500)).await;

    // B takes over after A's lease ran out and writes its statement.
    let b = worker(&cluster, &resource, "b", &["--work", "100ms"])
        .output()
        .unwrap();
    let b_out = String::from_utf8(b.stdout).unwrap();
    assert!(b.status.success() && b_out.contains("wrote"), "{b_out}");
    let (b_token, b_value) = stored_statement(&resource).await;

    // A resumes, finishes its work and writes with its old token: refused.
    kill(a_pid, Signal::SIGCONT).unwrap();
    let status = a.wait().unwrap();
    let rest: Vec<String> = a_out.map(|l| l.unwrap()).collect();
    assert_eq!(
        status.code(),
        Some(3),
        "A's write must be refused: {rest:?}"
    );
    assert!(
        rest.iter()
            .any(|l| l.contains("REJECTED") && l.contains(&format!("highest_token={b_token}"))),
        "{rest:?}"
    );
    assert_eq!(
        stored_statement(&resource).await,
        (b_token, b_value),
        "B's statement is intact"
    );
}
