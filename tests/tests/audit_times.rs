//! Audit times: every grant, end, history entry and watch event carries the
//! leader's wall clock at its cluster time, the same on every node, and
//! fencectl shows it as an RFC 3339 date beside the cluster time.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use fenced_client::{AcquireOutcome, ReleaseOutcome};
use fenced_core::OwnerId;
use fenced_proto::v1::{self, watch_response::Body};
use fenced_tests::Cluster;

fn unix_ms_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_millis() as u64
}

/// Waits until the cluster has a wall-clock anchor: a new leader records
/// one at once.
async fn anchored(cluster: &Cluster) {
    let client = cluster.client();
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let d = client.describe("audit/anchor").await.unwrap();
        if d.wall_time_unix_ms != 0 {
            return;
        }
        assert!(Instant::now() < deadline, "no wall-clock anchor after 10 s");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The first `n` events of a watch opened through `lock` (one node).
async fn events_on(
    mut lock: v1::lock_client::LockClient<tonic::transport::Channel>,
    n: usize,
) -> Vec<v1::WatchEvent> {
    let mut stream = lock
        .watch(v1::WatchRequest {
            prefix: b"audit/".to_vec(),
            from_revision: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let mut events = Vec::new();
    while events.len() < n {
        let msg = tokio::time::timeout(Duration::from_secs(10), stream.message())
            .await
            .expect("an event within 10 s")
            .unwrap()
            .unwrap();
        if let Some(Body::Event(e)) = msg.body {
            events.push(e);
        }
    }
    events
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grants_and_ends_carry_the_leaders_wall_clock_the_same_on_every_node() {
    let cluster = Cluster::start(3).await;
    anchored(&cluster).await;
    let client = cluster.client();
    let streams: Vec<_> = (1..=3)
        .map(|id| tokio::spawn(events_on(cluster.lock_client(id), 2)))
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;

    let before = unix_ms_now();
    let owner = OwnerId::random();
    let AcquireOutcome::Granted {
        token,
        wall_time_unix_ms: granted_wall,
        ..
    } = client
        .acquire_once("audit/run", owner, Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap()
    else {
        panic!("not granted");
    };
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert_eq!(
        client.release("audit/run", owner, token).await.unwrap(),
        ReleaseOutcome::Released
    );
    let after = unix_ms_now();
    // Within the anchor's drift bound of this machine's clock (the nodes
    // run on it too).
    let near = |ms: u64| ms + 1_000 >= before && ms <= after + 1_000;
    assert!(
        near(granted_wall),
        "{granted_wall} not in {before}..{after}"
    );

    let history = client.history("audit/run", 0).await.unwrap();
    let entry = &history.entries[0];
    assert_eq!(entry.granted_at_unix_ms, granted_wall);
    assert!(near(entry.ended_at_unix_ms), "{entry:?}");
    // The times people read follow the cluster time between them.
    assert_eq!(
        entry.ended_at_unix_ms - entry.granted_at_unix_ms,
        entry.ended_at_ms - entry.granted_at_ms
    );

    let mut seen = Vec::new();
    for s in streams {
        let events = s.await.unwrap();
        let walls: Vec<u64> = events.iter().map(|e| e.wall_time_unix_ms).collect();
        assert_eq!(
            walls,
            vec![entry.granted_at_unix_ms, entry.ended_at_unix_ms],
            "{events:?}"
        );
        seen.push(walls);
    }
    assert_eq!(seen.len(), 3, "every node's watch says the same");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencectl_shows_dates_beside_cluster_times() {
    let cluster = Cluster::start(3).await;
    anchored(&cluster).await;
    let out = cluster.fencectl(&["--json", "acquire", "audit/cli", "--ttl", "30s"]);
    assert!(out.status.success(), "{:?}", out);
    let granted: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let at = granted["granted_at"].as_str().unwrap();
    let parsed = humantime::parse_rfc3339(at).unwrap();
    let ms = parsed.duration_since(UNIX_EPOCH).unwrap().as_millis() as u64;
    assert_eq!(ms, granted["wall_time_unix_ms"].as_u64().unwrap());
    assert!(ms.abs_diff(unix_ms_now()) < 5_000, "{at}");

    let out = cluster.fencectl(&["--json", "history", "audit/cli"]);
    let history: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(history["entries"][0]["granted_at"], at, "{history}");
    assert!(history["entries"][0]["ended_at"].is_null(), "{history}");

    let out = cluster.fencectl(&["history", "audit/cli"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(&format!("granted {at}, live (held")),
        "{text}"
    );

    // A renewal and a release are dated too, in JSON and in text.
    let (owner, token) = (
        granted["owner_id"].as_str().unwrap(),
        granted["token"].to_string(),
    );
    let dated = |json: &serde_json::Value, field: &str| {
        let at = json[field]
            .as_str()
            .unwrap_or_else(|| panic!("{field}: {json}"));
        let ms = humantime::parse_rfc3339(at)
            .unwrap()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        assert_eq!(ms, json["wall_time_unix_ms"].as_u64().unwrap(), "{json}");
        assert!(ms.abs_diff(unix_ms_now()) < 5_000, "{json}");
    };
    let renew = [
        "renew",
        "audit/cli",
        "--owner-id",
        owner,
        "--token",
        &token,
        "--ttl",
        "30s",
    ];
    let out = cluster.fencectl(&[&["--json"][..], &renew].concat());
    assert!(out.status.success(), "{out:?}");
    dated(&serde_json::from_slice(&out.stdout).unwrap(), "renewed_at");
    let out = cluster.fencectl(&renew);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains(", at 20"), "{text}");
    let out = cluster.fencectl(&[
        "--json",
        "release",
        "audit/cli",
        "--owner-id",
        owner,
        "--token",
        &token,
    ]);
    assert!(out.status.success(), "{out:?}");
    dated(&serde_json::from_slice(&out.stdout).unwrap(), "released_at");
}
