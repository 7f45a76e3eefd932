//! ValidateToken, History and Watch against real nodes: linearizable token
//! states, bounded history across restarts, watch streams that resume across
//! leader kills without gaps or repeats, slow watchers cut off, and every
//! refusal (bounds, permissions, watcher limits).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeSet,
    path::Path,
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use fenced_client::{AcquireOutcome, Client, ClientError, ReleaseOutcome};
use fenced_core::{OwnerId, Token};
use fenced_proto::v1::{self, watch_response::Body};
use fenced_tests::{bin, write_auth_files, Cluster, Within, ORDERS_AND_OPS_POLICY};
use tonic::{metadata::MetadataValue, Code};

const TTL: Duration = Duration::from_secs(30);

async fn grant(client: &Client, resource: &str, ttl: Duration) -> (OwnerId, Token) {
    let owner = OwnerId::random();
    match client
        .acquire_once(resource, owner, ttl, Duration::ZERO)
        .await
        .unwrap()
    {
        AcquireOutcome::Granted { token, .. } => (owner, token),
        other => panic!("expected a grant on {resource}, got {other:?}"),
    }
}

fn token(value: u64) -> Token {
    Token::new(value).unwrap()
}

fn state(v: &v1::ValidateTokenResponse) -> v1::TokenState {
    v1::TokenState::try_from(v.state).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_token_tells_current_superseded_expired_and_released() {
    let cluster = Cluster::start(3).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let client = cluster.client();
    // Asked of a follower: forwarded, answered by the leader's read.
    let via_follower = cluster.client_of(follower);

    let (a, ta) = grant(&client, "jobs/v", TTL).await;
    let v = via_follower.validate_token("jobs/v", ta).await.unwrap();
    assert_eq!(state(&v), v1::TokenState::Current);
    assert_eq!(v.current_token, ta.get());
    assert!(v.remaining_ms > 25_000 && v.remaining_ms <= 30_000, "{v:?}");
    assert!(v.cluster_time_ms > 0);

    assert_eq!(
        client.release("jobs/v", a, ta).await.unwrap(),
        ReleaseOutcome::Released
    );
    // Linearizable: the release acknowledged above is seen at once.
    let v = via_follower.validate_token("jobs/v", ta).await.unwrap();
    assert_eq!(state(&v), v1::TokenState::Released);
    assert_eq!(v.remaining_ms, 0);

    let (_, tb) = grant(&client, "jobs/v", Duration::from_secs(1)).await;
    let v = client.validate_token("jobs/v", ta).await.unwrap();
    assert_eq!(state(&v), v1::TokenState::Superseded);
    assert_eq!(v.current_token, tb.get());
    let v = client
        .validate_token("jobs/v", token(tb.get() + 1))
        .await
        .unwrap();
    assert_eq!(state(&v), v1::TokenState::Unknown);
    let v = client.validate_token("jobs/none", token(1)).await.unwrap();
    assert_eq!(state(&v), v1::TokenState::Unknown);
    assert_eq!(v.current_token, 0);

    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let v = client.validate_token("jobs/v", tb).await.unwrap();
    assert_eq!(state(&v), v1::TokenState::Expired);

    // The batch: one result per pair, in order, at one cluster time.
    let (_, tc) = grant(&client, "jobs/w", TTL).await;
    let r = via_follower
        .validate_tokens(&[("jobs/v", ta), ("jobs/w", tc), ("jobs/v", tb)])
        .await
        .unwrap();
    let states: Vec<_> = r.results.iter().map(state).collect();
    assert_eq!(
        states,
        [
            v1::TokenState::Superseded,
            v1::TokenState::Current,
            v1::TokenState::Expired
        ]
    );
    assert!(r
        .results
        .iter()
        .all(|x| x.cluster_time_ms == r.cluster_time_ms));

    // Bounds, each naming its field.
    let bad = |e: ClientError, field: &str| match e {
        ClientError::InvalidArgument(m) => assert!(m.starts_with(field), "{m}"),
        other => panic!("expected INVALID_ARGUMENT on {field}, got {other:?}"),
    };
    bad(
        client.validate_token("", token(1)).await.unwrap_err(),
        "resource",
    );
    bad(client.validate_tokens(&[]).await.unwrap_err(), "checks");
    let many: Vec<(&str, Token)> = (0..257).map(|_| ("jobs/v", token(1))).collect();
    let e = client.validate_tokens(&many).await.unwrap_err();
    assert!(e.to_string().contains("1 to 256"), "{e}");
    bad(e, "checks");
    // A token of 0 cannot be made as a `Token`: sent as the wire has it.
    let mut lock = cluster.lock_client(follower);
    let check = |token| v1::ValidateTokenRequest {
        resource: b"jobs/v".to_vec(),
        token,
        owner_id: Vec::new(),
    };
    let e = lock.validate_token(check(0)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().starts_with("token"), "{}", e.message());
    let e = lock
        .validate_tokens(v1::ValidateTokensRequest {
            checks: vec![check(1), check(0)],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("checks[1].token"), "{}", e.message());
}

/// With an owner id, ValidateToken answers CURRENT only for the owner the
/// lease was granted to: the current token under a made-up owner id (what
/// anyone with `read` could try) is OWNER_MISMATCH, and the answer says the
/// owner was compared. A bad owner id is refused by field.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn validate_token_compares_the_owner_id_when_given() {
    // Also on nodes that keep no grant history: the owner is read from the
    // live lease, not the history.
    for history in [None, Some(Within::new(0).unwrap())] {
        owner_checks(&Cluster::start_with(3, |s| s.history_per_resource = history).await).await;
    }
}

async fn owner_checks(cluster: &Cluster) {
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let (a, ta) = grant(&cluster.client(), "jobs/o", TTL).await;
    let check = |owner: &[u8], token: u64| v1::ValidateTokenRequest {
        resource: b"jobs/o".to_vec(),
        token,
        owner_id: owner.to_vec(),
    };
    let stranger = OwnerId::random();
    for id in [leader, follower] {
        let mut lock = cluster.lock_client(id);
        let own = lock
            .validate_token(check(a.as_bytes(), ta.get()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (state(&own), own.owner_checked),
            (v1::TokenState::Current, true)
        );
        let other = lock
            .validate_token(check(stranger.as_bytes(), ta.get()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (state(&other), other.owner_checked, other.remaining_ms),
            (v1::TokenState::OwnerMismatch, true, 0)
        );
        // Without an owner id: as before, and said to be unchecked.
        let plain = lock
            .validate_token(check(&[], ta.get()))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(
            (state(&plain), plain.owner_checked),
            (v1::TokenState::Current, false)
        );
        // The batch: per check, in order.
        let r = lock
            .validate_tokens(v1::ValidateTokensRequest {
                checks: vec![
                    check(stranger.as_bytes(), ta.get()),
                    check(a.as_bytes(), ta.get()),
                    check(stranger.as_bytes(), u64::MAX),
                ],
            })
            .await
            .unwrap()
            .into_inner();
        let states: Vec<_> = r.results.iter().map(state).collect();
        assert_eq!(
            states,
            [
                v1::TokenState::OwnerMismatch,
                v1::TokenState::Current,
                v1::TokenState::Unknown
            ]
        );
        let e = lock
            .validate_token(check(&[7; 3], ta.get()))
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
        assert!(e.message().starts_with("owner_id"), "{}", e.message());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_keeps_the_last_grants_through_a_restart_of_every_node() {
    let mut cluster = Cluster::start_with(3, |s| {
        s.history_per_resource = Some(Within::new(3).unwrap());
        s.snapshot_logs = Some(Within::new(10).unwrap());
    })
    .await;
    let client = cluster.client();
    let mut grants = Vec::new();
    for _ in 0..5 {
        let (owner, token) = grant(&client, "jobs/h", TTL).await;
        client.release("jobs/h", owner, token).await.unwrap();
        grants.push((owner, token));
    }
    let (live_owner, live_token) = grant(&client, "jobs/h", TTL).await;
    // Past the snapshot threshold, so the history also travels in one.
    for i in 0..12 {
        grant(&client, &format!("jobs/other-{i}"), TTL).await;
    }

    let check = |h: &v1::HistoryResponse| {
        assert_eq!(h.entries.len(), 3, "bounded at 3: {h:?}");
        assert_eq!(h.entries[0].token, live_token.get());
        assert_eq!(h.entries[0].owner_id, live_owner.as_bytes().to_vec());
        assert_eq!(h.entries[0].ended_at_ms, 0);
        assert_eq!(h.entries[0].ended, v1::EventKind::Unspecified as i32);
        for (entry, (owner, token)) in h.entries[1..].iter().zip(grants.iter().rev()) {
            assert_eq!(entry.token, token.get());
            assert_eq!(entry.owner_id, owner.as_bytes().to_vec());
            assert_eq!(entry.ended, v1::EventKind::Released as i32);
            assert!(entry.ended_at_ms >= entry.granted_at_ms && entry.granted_at_ms > 0);
        }
    };
    check(&client.history("jobs/h", 0).await.unwrap());
    assert_eq!(client.history("jobs/h", 1).await.unwrap().entries.len(), 1);
    match client.history("jobs/h", 65).await {
        Err(ClientError::InvalidArgument(m)) => {
            assert!(m.starts_with("limit") && m.contains("64"), "{m}")
        }
        other => panic!("expected INVALID_ARGUMENT on limit, got {other:?}"),
    }

    for id in 1..=3 {
        cluster.kill(id);
    }
    cluster.start_all().await;
    check(&cluster.client().history("jobs/h", 0).await.unwrap());

    let out = cluster.fencectl(&["--json", "history", "jobs/h"]);
    assert!(out.status.success(), "{out:?}");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["entries"][0]["token"], live_token.get());
    assert_eq!(v["entries"][0]["ended"], "live");
    assert_eq!(v["entries"][1]["ended"], "released");
}

/// What a watcher saw: every event with its revision, in arrival order.
type Seen = Arc<Mutex<Vec<v1::WatchEvent>>>;

/// Follows `prefix` from now and on every break resumes, on the next node,
/// from the last revision received, until `stop`.
async fn follow(endpoints: Vec<String>, prefix: &str, seen: Seen, stop: Arc<AtomicBool>) {
    let mut last = 0;
    let mut node = 0;
    let mut started = false;
    while !stop.load(Ordering::SeqCst) {
        let client = Client::new([&endpoints[node % endpoints.len()]])
            .unwrap()
            .with_call_timeout(Duration::from_secs(1));
        node += 1;
        let Ok(mut stream) = client.watch(prefix, last).await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        loop {
            let msg = tokio::select! {
                m = stream.message() => m,
                () = tokio::time::sleep(Duration::from_millis(200)) => {
                    if stop.load(Ordering::SeqCst) { return }
                    continue;
                }
            };
            match msg {
                Ok(Some(v1::WatchResponse {
                    body: Some(Body::Started(s)),
                })) => {
                    if !started {
                        last = s.revision;
                        started = true;
                    }
                    assert_eq!(
                        s.revision, last,
                        "a resumed stream starts where it was asked"
                    );
                }
                Ok(Some(v1::WatchResponse {
                    body: Some(Body::Event(e)),
                })) => {
                    last = e.revision;
                    seen.lock().unwrap().push(e);
                }
                Ok(Some(other)) => panic!("unexpected watch message {other:?}"),
                Ok(None) | Err(_) => break,
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watch_resumed_across_leader_kills_misses_nothing_and_repeats_nothing() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client();
    let seen: Seen = Arc::default();
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = tokio::spawn(follow(
        cluster.endpoints(),
        "jobs/",
        Arc::clone(&seen),
        Arc::clone(&stop),
    ));
    // Noise outside the prefix is never sent to this watcher.
    grant(&client, "other/x", TTL).await;

    // Writers: acquire and release, recording what was acknowledged.
    let acked: Arc<Mutex<Vec<(u64, v1::EventKind)>>> = Arc::default();
    let writing = Arc::new(AtomicBool::new(true));
    let mut writers = Vec::new();
    for w in 0..3 {
        let (client, acked, writing) = (cluster.client(), Arc::clone(&acked), Arc::clone(&writing));
        writers.push(tokio::spawn(async move {
            let resource = format!("jobs/{w}");
            while writing.load(Ordering::SeqCst) {
                let owner = OwnerId::random();
                let Ok(AcquireOutcome::Granted { token, .. }) = client
                    .acquire_once(&resource, owner, TTL, Duration::ZERO)
                    .await
                else {
                    continue;
                };
                acked
                    .lock()
                    .unwrap()
                    .push((token.get(), v1::EventKind::Granted));
                if let Ok(ReleaseOutcome::Released) = client.release(&resource, owner, token).await
                {
                    acked
                        .lock()
                        .unwrap()
                        .push((token.get(), v1::EventKind::Released));
                }
            }
        }));
    }
    // One lease left to run out: its expiry is an event too.
    let (_, expiring) = grant(&client, "jobs/expiring", Duration::from_secs(1)).await;

    for _ in 0..2 {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let leader = cluster.wait_for_leader(Duration::from_secs(20)).await;
        cluster.kill(leader);
        cluster.wait_for_leader(Duration::from_secs(20)).await;
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        cluster.spawn(leader);
    }
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    writing.store(false, Ordering::SeqCst);
    for w in writers {
        w.await.unwrap();
    }
    // A marker written last: once the watcher has it, it has everything.
    let (_, marker) = grant(&client, "jobs/marker", TTL).await;
    let deadline = Instant::now() + Duration::from_secs(30);
    while !seen.lock().unwrap().iter().any(|e| e.token == marker.get()) {
        assert!(Instant::now() < deadline, "the watcher never caught up");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stop.store(true, Ordering::SeqCst);
    watcher.await.unwrap();

    let seen = seen.lock().unwrap().clone();
    // No repeats, no reordering.
    for pair in seen.windows(2) {
        assert!(
            pair[1].revision > pair[0].revision,
            "revision {} after {}",
            pair[1].revision,
            pair[0].revision
        );
    }
    assert!(seen.iter().all(|e| e.resource.starts_with(b"jobs/")));
    let got: BTreeSet<(u64, i32)> = seen.iter().map(|e| (e.token, e.kind)).collect();
    assert_eq!(got.len(), seen.len(), "an event was delivered twice");
    // Nothing acknowledged is missing.
    let acked = acked.lock().unwrap().clone();
    assert!(acked.len() > 20, "too little written: {}", acked.len());
    for (token, kind) in &acked {
        assert!(
            got.contains(&(*token, *kind as i32)),
            "acknowledged {kind:?} of token {token} never seen"
        );
    }
    assert!(got.contains(&(expiring.get(), v1::EventKind::Expired as i32)));

    // Any node, asked from before the first event, tells the same story
    // with the same revisions.
    let first = seen[0].revision;
    for id in 1..=3 {
        let mut stream = cluster
            .client_of(id)
            .watch("jobs/", first - 1)
            .await
            .unwrap();
        let mut again = Vec::new();
        while again.len() < seen.len() {
            match tokio::time::timeout(Duration::from_secs(20), stream.message()).await {
                Ok(Ok(Some(v1::WatchResponse {
                    body: Some(Body::Event(e)),
                }))) => again.push(e),
                Ok(Ok(Some(_))) => {}
                other => panic!("node {id}: stream ended early: {other:?}"),
            }
        }
        assert_eq!(again, seen, "node {id} numbers the events differently");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_watcher_that_does_not_read_is_cut_off_with_fell_behind() {
    let cluster = Cluster::start_with(1, |s| s.watch_buffer = Some(Within::new(4).unwrap())).await;
    let client = cluster.client();
    // A small HTTP/2 window, so the node's buffer fills soon.
    let channel =
        tonic::transport::Endpoint::from_shared(format!("http://{}", cluster.endpoints()[0]))
            .unwrap()
            .initial_stream_window_size(Some(1024))
            .connect()
            .await
            .unwrap();
    let mut stream = v1::lock_client::LockClient::new(channel)
        .watch(v1::WatchRequest {
            prefix: b"slow/".to_vec(),
            from_revision: 0,
        })
        .await
        .unwrap()
        .into_inner();
    let total = 3_000u64;
    let mut tasks = Vec::new();
    for w in 0..30 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            for i in 0..total / 60 {
                let res = format!("slow/{w}-{i}");
                let (owner, token) = grant(&client, &res, TTL).await;
                client.release(&res, owner, token).await.unwrap();
            }
        }));
    }
    for t in tasks {
        t.await.unwrap();
    }
    // Past the stall bound (5 s) with the buffer full.
    tokio::time::sleep(Duration::from_secs(8)).await;
    let mut events = Vec::new();
    let mut fell_behind = None;
    while let Some(msg) = tokio::time::timeout(Duration::from_secs(10), stream.message())
        .await
        .expect("the stream ends")
        .unwrap()
    {
        match msg.body {
            Some(Body::Event(e)) => events.push(e.revision),
            Some(Body::FellBehind(f)) => fell_behind = Some(f.last_sent_revision),
            Some(Body::Started(_)) => {}
            other => panic!("unexpected {other:?}"),
        }
    }
    let last_sent = fell_behind.expect("the watcher was told it fell behind");
    assert!(
        (events.len() as u64) < total,
        "cut off before the end: {} events",
        events.len()
    );
    assert_eq!(events.last().copied().unwrap_or(last_sent), last_sent);
    for pair in events.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "a gap before the cut");
    }
    // Resuming from there delivers the rest, the first one next.
    let mut rest = client.watch("slow/", last_sent).await.unwrap();
    let mut next = Vec::new();
    while next.len() < 10 {
        if let Some(Body::Event(e)) = rest.message().await.unwrap().unwrap().body {
            next.push(e.revision);
        }
    }
    assert_eq!(next[0], last_sent + 1);
    // The refusal is counted.
    let log = cluster.logs();
    assert!(log.contains("watcher fell behind"), "no log line");
}

fn write_auth(dir: &Path) -> (String, String) {
    write_auth_files(
        dir,
        &[
            ("alice", "alice-token", "orders"),
            ("root", "root-token", "ops"),
        ],
        ORDERS_AND_OPS_POLICY,
    )
}

fn watch_req(prefix: &str, token: &str) -> tonic::Request<v1::WatchRequest> {
    let mut req = tonic::Request::new(v1::WatchRequest {
        prefix: prefix.as_bytes().to_vec(),
        from_revision: 0,
    });
    req.metadata_mut().insert(
        "authorization",
        MetadataValue::try_from(format!("Bearer {token}")).unwrap(),
    );
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_need_the_read_role_and_watchers_are_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, policy) = write_auth(dir.path());
    let cluster = Cluster::start_with(1, |s| {
        s.auth_tokens = Some(tokens.clone().into());
        s.auth_policy = Some(policy.clone().into());
        s.max_watchers = Some(Within::new(3).unwrap());
        s.max_watchers_per_identity = Some(Within::new(2).unwrap());
    })
    .await;
    let alice = cluster.client().with_token("alice-token").unwrap();
    let (_, token) = grant(&alice, "orders/1", TTL).await;
    assert!(alice.validate_token("orders/1", token).await.is_ok());
    assert!(alice.history("orders/1", 0).await.is_ok());
    let denied = |r: Result<(), ClientError>, what: &str| match r {
        Err(ClientError::PermissionDenied(m)) => assert!(m.contains("read"), "{what}: {m}"),
        other => panic!("{what}: expected PERMISSION_DENIED, got {other:?}"),
    };
    denied(
        alice
            .validate_token("billing/1", Token::new(1).unwrap())
            .await
            .map(|_| ()),
        "validate",
    );
    denied(
        alice
            .validate_tokens(&[("orders/1", token), ("billing/1", Token::new(1).unwrap())])
            .await
            .map(|_| ()),
        "validate a batch with one resource not granted",
    );
    denied(alice.history("billing/1", 0).await.map(|_| ()), "history");
    // Watch needs the grant on the whole prefix.
    denied(alice.watch("", 0).await.map(|_| ()), "watch everything");
    denied(
        alice.watch("billing/", 0).await.map(|_| ()),
        "watch billing/",
    );
    denied(
        alice.watch("order", 0).await.map(|_| ()),
        "watch a wider prefix",
    );
    let anonymous = cluster.client();
    assert!(matches!(
        anonymous.watch("orders/", 0).await,
        Err(ClientError::Unauthenticated(_))
    ));

    // Bounds: per identity, then in total.
    let mut lock = cluster.lock_client(1);
    let _a1 = lock
        .watch(watch_req("orders/", "alice-token"))
        .await
        .unwrap();
    let _a2 = lock
        .watch(watch_req("orders/a", "alice-token"))
        .await
        .unwrap();
    let e = lock
        .watch(watch_req("orders/", "alice-token"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(
        e.message().contains("max_watchers_per_identity (2)"),
        "{e:?}"
    );
    let _r1 = lock.watch(watch_req("", "root-token")).await.unwrap();
    let e = lock.watch(watch_req("", "root-token")).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(e.message().contains("max_watchers (3)"), "{e:?}");
    // A stream that ends frees its place.
    drop(_a1);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match lock.watch(watch_req("orders/", "alice-token")).await {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                assert_eq!(e.code(), Code::ResourceExhausted);
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(e) => panic!("the place was never freed: {e:?}"),
        }
    }
    // The prefix is bounded, by name.
    let long = "o".repeat(201);
    let e = lock
        .watch(watch_req(&long, "root-token"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("prefix: "), "{e:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencectl_watch_prints_one_line_per_event_and_resumes_from_a_revision() {
    let cluster = Cluster::start(3).await;
    let client = cluster.client();
    // Revision 1 is outside the prefix: `--from 0` would mean "from now".
    grant(&client, "noise/x", TTL).await;
    let (owner, token) = grant(&client, "cli/a", TTL).await;
    client.release("cli/a", owner, token).await.unwrap();
    grant(&client, "cli/b", TTL).await;

    // From the revision before the first event: all three, in order.
    let d = client.validate_token("cli/a", token).await.unwrap();
    assert_eq!(state(&d), v1::TokenState::Released);
    let mut all = client.watch("cli/", 0).await.unwrap();
    let Some(Body::Started(s)) = all.message().await.unwrap().unwrap().body else {
        panic!("a stream starts with its revision");
    };
    let first = s.revision - 2;
    let from = (first - 1).to_string();
    let out = cluster.fencectl(&[
        "--json",
        "watch",
        "cli/",
        "--from",
        &from,
        "--max-events",
        "3",
    ]);
    assert!(out.status.success(), "{out:?}");
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let kinds: Vec<&str> = lines.iter().map(|l| l["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds, ["granted", "released", "granted"]);
    assert_eq!(lines[0]["token"], token.get());
    assert_eq!(lines[0]["resource"], "cli/a");
    assert_eq!(lines[2]["resource"], "cli/b");
    assert_eq!(lines[0]["revision"], first);
    // Resuming after the second prints only the third.
    let from = (first + 1).to_string();
    let out = cluster.fencectl(&["watch", "cli/", "--from", &from, "--max-events", "1"]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(
        text.starts_with(&format!("{} granted cli/b token", first + 2)),
        "{text}"
    );

    let out = cluster.fencectl(&["validate", "cli/a", &token.to_string()]);
    assert_eq!(out.status.code(), Some(3), "{out:?}");
    assert!(String::from_utf8(out.stdout).unwrap().contains("released"));
}

/// A write through `fenced-resource` checking writes against the cluster
/// (its default; `--require-current` is still accepted).
async fn put_current(
    svc: &str,
    resource: &str,
    owner: OwnerId,
    token: u64,
    value: &str,
) -> Result<v1::PutResponse, tonic::Status> {
    // Lazy: a service not listening yet is an UNAVAILABLE answer.
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{svc}"))
        .unwrap()
        .connect_lazy();
    let mut req = tonic::Request::new(v1::PutRequest {
        key: b"ledger/k".to_vec(),
        resource: resource.as_bytes().to_vec(),
        token: Some(token),
        owner_id: owner.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        ..Default::default()
    });
    req.set_timeout(Duration::from_secs(20));
    v1::fenced_resource_client::FencedResourceClient::new(channel)
        .put(req)
        .await
        .map(tonic::Response::into_inner)
}

fn accepted(r: &v1::PutResponse) -> bool {
    matches!(r.outcome, Some(v1::put_response::Outcome::Accepted(_)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn require_current_refuses_a_released_token_and_fails_closed() {
    let mut cluster = Cluster::start(3).await;
    let client = cluster.client();
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", fenced_tests::free_port());
    let log = std::fs::File::create(dir.path().join("resource.log")).unwrap();
    let mut svc = std::process::Command::new(bin("fenced-resource"))
        .args(["serve", "--listen", &addr, "--data-dir"])
        .arg(dir.path().join("data"))
        .args([
            "--require-current",
            "--current-timeout-ms",
            "1000",
            "--cluster",
        ])
        .arg(cluster.endpoints().join(","))
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .unwrap();
    let (a, ta) = grant(&client, "ledger/1", TTL).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    let first = loop {
        match put_current(&addr, "ledger/1", a, ta.get(), "one").await {
            Ok(r) => break r,
            Err(e) if Instant::now() < deadline && e.code() == Code::Unavailable => {
                tokio::time::sleep(Duration::from_millis(100)).await
            }
            Err(e) => panic!("the current holder's write failed: {e:?}"),
        }
    };
    assert!(accepted(&first), "{first:?}");

    // Released: not older than the highest token, but no longer current.
    // A final refusal, typed like the store's own.
    client.release("ledger/1", a, ta).await.unwrap();
    let late = put_current(&addr, "ledger/1", a, ta.get(), "late")
        .await
        .unwrap();
    match late.outcome {
        Some(v1::put_response::Outcome::Rejected(r)) => {
            assert_eq!(r.reason, v1::RejectReason::NotCurrent as i32, "{r:?}");
            assert!(
                r.message
                    .contains("not current on the lock cluster (RELEASED"),
                "{r:?}"
            );
        }
        other => panic!("a released token's write was not refused: {other:?}"),
    }

    let (b, tb) = grant(&client, "ledger/1", TTL).await;
    assert!(accepted(
        &put_current(&addr, "ledger/1", b, tb.get(), "two")
            .await
            .unwrap()
    ));

    // No cluster: the write is refused in bounded time, not applied.
    for id in 1..=3 {
        cluster.kill(id);
    }
    let started = Instant::now();
    let e = put_current(&addr, "ledger/1", b, tb.get(), "three")
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.message().contains("not applied"), "{e:?}");
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let got = v1::fenced_resource_client::FencedResourceClient::new(channel)
        .get(v1::GetRequest {
            key: b"ledger/k".to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(got.value, b"two");
    assert_eq!(got.token, tb.get());
    svc.kill().unwrap();
    svc.wait().unwrap();
}
