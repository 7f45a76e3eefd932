//! Sessions against real nodes: a client's keeper keeps all its leases alive
//! with one KeepAlive (one command) per interval; a session that lapses ends
//! every lease in it at once and hands them to waiters; only the identity
//! that opened a session may use it; bounds and bad fields are refused by
//! name.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use fenced_client::LeaseOptions;
use fenced_core::{OwnerId, SessionId, Token};
use fenced_proto::v1::{self, acquire_response, session_response};
use fenced_tests::{acquire_all, lock_rpcs_ok, metric, write_auth_files, Cluster, Within};
use tonic::{metadata::MetadataValue, Code};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_keeps_2000_leases_in_its_session_with_one_command_per_interval() {
    const LEASES: usize = 2_000;
    const TTL: Duration = Duration::from_secs(6);
    let (cluster, metrics) = Cluster::start_with_metrics(3, |_| {}).await;
    let client = cluster.client();
    let every = LeaseOptions::default().renew_interval(TTL);

    let leases = acquire_all(&client, "sess/", LEASES, TTL).await;
    // Granted over several seconds: the session was kept alive meanwhile.
    let sample = |name: &'static str| {
        let addr = metrics[0].clone();
        async move { metric(&addr, name).await }
    };
    // The node sampled applies every grant before the count starts.
    for _ in 0..100 {
        if sample("fenced_live_leases").await == LEASES as u64 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(every).await;
    assert_eq!(sample("fenced_open_sessions").await, 1, "one session");
    let commands = sample("fenced_applied_commands_total").await;
    let keep_alives = sample("fenced_session_keep_alives_total").await;
    let calls = lock_rpcs_ok(&metrics, "KeepAlive").await;
    let renew_many = lock_rpcs_ok(&metrics, "RenewMany").await;
    let stats = client.keeper_stats();
    let span = 3 * every;
    tokio::time::sleep(span).await;

    let commands = sample("fenced_applied_commands_total").await - commands;
    let keep_alives = sample("fenced_session_keep_alives_total").await - keep_alives;
    let calls = lock_rpcs_ok(&metrics, "KeepAlive").await - calls;
    let keeper_calls = client.keeper_stats().calls - stats.calls;
    eprintln!(
        "over {span:?}: {commands} commands, {keep_alives} keep-alives, {calls} KeepAlive calls \
         ({keeper_calls} by the keeper), {LEASES} leases"
    );
    // About one keep-alive per interval for all 2,000 leases...
    assert!(
        (2..=4).contains(&keep_alives),
        "{keep_alives} keep-alives in three intervals"
    );
    // Each call is one keep-alive (the counters are read one after the
    // other, so one call may fall between two readings).
    assert!(calls.abs_diff(keep_alives) <= 1, "{calls} calls");
    assert!(
        keeper_calls.abs_diff(calls) <= 1,
        "{keeper_calls} by the keeper"
    );
    // ...and nothing else written: not one command per lease.
    assert!(
        commands <= keep_alives + 2,
        "{commands} commands applied for {keep_alives} keep-alives"
    );
    assert_eq!(lock_rpcs_ok(&metrics, "RenewMany").await, renew_many);
    assert_eq!(client.keeper_stats().lost, 0);
    for lease in &leases {
        assert!(lease.check().is_ok(), "{} lost", lease.resource());
    }
    // Past three TTLs since the first grant: kept by the session alone.
    let d = client.describe("sess/00000").await.unwrap();
    assert!(d.held && d.remaining_ms > 0, "{d:?}");
    assert_eq!(sample("fenced_live_leases").await, LEASES as u64);
    for lease in leases {
        lease.release().await.unwrap();
    }
    // The node sampled may apply the last releases a moment after the leader.
    let mut live = sample("fenced_live_leases").await;
    for _ in 0..50 {
        if live == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        live = sample("fenced_live_leases").await;
    }
    assert_eq!(live, 0, "leases left after every release");
}

fn open_req(session: SessionId, ttl_ms: u64) -> v1::OpenSessionRequest {
    v1::OpenSessionRequest {
        session_id: session.as_bytes().to_vec(),
        ttl_ms,
    }
}

fn in_session(resource: &str, owner: OwnerId, session: SessionId) -> v1::AcquireInSessionRequest {
    v1::AcquireInSessionRequest {
        label: String::new(),
        resource: resource.as_bytes().to_vec(),
        owner_id: owner.as_bytes().to_vec(),
        session_id: session.as_bytes().to_vec(),
    }
}

fn keep_req(session: SessionId) -> v1::KeepAliveRequest {
    v1::KeepAliveRequest {
        session_id: session.as_bytes().to_vec(),
    }
}

fn close_req(session: SessionId) -> v1::CloseSessionRequest {
    v1::CloseSessionRequest {
        session_id: session.as_bytes().to_vec(),
    }
}

fn token_of(resp: v1::AcquireResponse) -> u64 {
    match resp.outcome {
        Some(acquire_response::Outcome::Granted(g)) => g.token,
        other => panic!("not granted: {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_session_ends_every_lease_at_once_and_a_waiter_gets_one() {
    let cluster = Cluster::start(3).await;
    let mut lock = cluster.lock_client(1);
    let session = SessionId::random();
    let opened = lock.open_session(open_req(session, 2_000)).await.unwrap();
    assert!(matches!(
        opened.into_inner().outcome,
        Some(session_response::Outcome::Alive(v1::SessionAlive {
            ttl_ms: 2_000,
            ..
        }))
    ));
    let mut tokens = Vec::new();
    for i in 0..3 {
        let resp = lock
            .acquire_in_session(in_session(
                &format!("lapse/{i}"),
                OwnerId::random(),
                session,
            ))
            .await
            .unwrap();
        tokens.push(token_of(resp.into_inner()));
    }
    // A waiter on one of them, through another client.
    let waiter = cluster.client();
    let waiting = tokio::spawn(async move {
        waiter
            .lock("lapse/1", Duration::from_secs(30), Duration::from_secs(20))
            .await
    });
    // No keep-alive: the session lapses about 2 s after its open.
    let lease = waiting.await.unwrap().unwrap();
    assert!(
        lease.token().get() > tokens[2],
        "a higher token after the lapse"
    );
    let client = cluster.client();
    let mut ends = Vec::new();
    for (i, token) in tokens.iter().enumerate() {
        let v = client
            .validate_token(&format!("lapse/{i}"), Token::new(*token).unwrap())
            .await
            .unwrap();
        assert_ne!(v.state, v1::TokenState::Current as i32, "lapse/{i}");
        let history = client.history(&format!("lapse/{i}"), 4).await.unwrap();
        let first = history.entries.iter().find(|e| e.token == *token).unwrap();
        assert_eq!(first.ended, v1::EventKind::Expired as i32);
        ends.push(first.ended_at_ms);
    }
    assert!(
        ends.iter().all(|t| *t == ends[0]),
        "every lease of the session ended at the same cluster time: {ends:?}"
    );
    // The session is gone: a keep-alive says so, and revives nothing.
    let resp = lock
        .keep_alive(keep_req(session))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        resp.outcome,
        Some(session_response::Outcome::Gone(_))
    ));
    let resp = lock
        .acquire_in_session(in_session("lapse/9", OwnerId::random(), session))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        resp.outcome,
        Some(acquire_response::Outcome::SessionGone(_))
    ));
    let d = client.describe("lapse/0").await.unwrap();
    assert!(!d.held);
    lease.release().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn closing_a_session_releases_its_leases_and_renewing_one_is_refused() {
    let cluster = Cluster::start(3).await;
    let mut lock = cluster.lock_client(2);
    let session = SessionId::random();
    lock.open_session(open_req(session, 30_000)).await.unwrap();
    let owner = OwnerId::random();
    let token = token_of(
        lock.acquire_in_session(in_session("close/a", owner, session))
            .await
            .unwrap()
            .into_inner(),
    );
    lock.acquire_in_session(in_session("close/b", OwnerId::random(), session))
        .await
        .unwrap();
    let err = lock
        .renew(v1::RenewRequest {
            resource: b"close/a".to_vec(),
            owner_id: owner.as_bytes().to_vec(),
            token,
            ttl_ms: 5_000,
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), Code::FailedPrecondition);
    assert!(err.message().contains("KeepAlive"), "{}", err.message());
    let closed = lock.close_session(close_req(session)).await.unwrap();
    assert_eq!(closed.into_inner().leases_ended, 2);
    let client = cluster.client();
    assert!(!client.describe("close/a").await.unwrap().held);
    let v = client
        .validate_token("close/a", Token::new(token).unwrap())
        .await
        .unwrap();
    assert_eq!(v.state, v1::TokenState::Released as i32);
    // A retried close is answered the same way, with nothing left to end.
    let again = lock.close_session(close_req(session)).await.unwrap();
    assert_eq!(again.into_inner().leases_ended, 0);
}

const POLICY: &str = r#"
[roles.orders]
lock = ["orders/"]
read = ["orders/"]

[roles.reader]
read = [""]
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_the_identity_that_opened_a_session_may_use_it() {
    let dir = tempfile::tempdir().unwrap();
    let (tokens, policy) = write_auth_files(
        dir.path(),
        &[
            ("alice", "alice-token", "orders"),
            ("bob", "bob-token", "orders"),
            ("rita", "rita-token", "reader"),
        ],
        POLICY,
    );
    let cluster = Cluster::start_with(3, |s| {
        s.auth_tokens = Some(tokens.clone().into());
        s.auth_policy = Some(policy.clone().into());
    })
    .await;
    let mut lock = cluster.lock_client(1);
    let session = SessionId::random();
    lock.open_session(bearer(open_req(session, 30_000), "alice-token"))
        .await
        .unwrap();
    let token = token_of(
        lock.acquire_in_session(bearer(
            in_session("orders/1", OwnerId::random(), session),
            "alice-token",
        ))
        .await
        .unwrap()
        .into_inner(),
    );
    // Bob, who may lock the same prefix, can neither keep, close, open nor
    // acquire in Alice's session.
    let refused = |e: tonic::Status| {
        assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
        assert!(e.message().contains("another identity"), "{}", e.message());
    };
    refused(
        lock.keep_alive(bearer(keep_req(session), "bob-token"))
            .await
            .unwrap_err(),
    );
    refused(
        lock.close_session(bearer(close_req(session), "bob-token"))
            .await
            .unwrap_err(),
    );
    refused(
        lock.acquire_in_session(bearer(
            in_session("orders/2", OwnerId::random(), session),
            "bob-token",
        ))
        .await
        .unwrap_err(),
    );
    refused(
        lock.open_session(bearer(open_req(session, 30_000), "bob-token"))
            .await
            .unwrap_err(),
    );
    // Nor a resource outside Alice's prefixes in her own session.
    let e = lock
        .acquire_in_session(bearer(
            in_session("billing/1", OwnerId::random(), session),
            "alice-token",
        ))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    assert!(e.message().contains("billing/1"), "{}", e.message());
    // No lock role at all: no session; no token: not even asked.
    let e = lock
        .open_session(bearer(open_req(SessionId::random(), 30_000), "rita-token"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{}", e.message());
    assert!(e.message().contains("open_session"), "{}", e.message());
    let e = lock
        .open_session(open_req(SessionId::random(), 30_000))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{}", e.message());
    // Alice's session and lease are untouched; she closes it.
    let alive = lock
        .keep_alive(bearer(keep_req(session), "alice-token"))
        .await
        .unwrap()
        .into_inner();
    assert!(matches!(
        alive.outcome,
        Some(session_response::Outcome::Alive(_))
    ));
    let alice = cluster.client().with_token("alice-token").unwrap();
    let d = alice.describe("orders/1").await.unwrap();
    assert!(d.held && d.last_token == token, "{d:?}");
    let closed = lock
        .close_session(bearer(close_req(session), "alice-token"))
        .await
        .unwrap();
    assert_eq!(closed.into_inner().leases_ended, 1);
}

/// `msg` with `token` as bearer.
fn bearer<T>(msg: T, token: &str) -> tonic::Request<T> {
    let mut req = tonic::Request::new(msg);
    req.metadata_mut().insert(
        "authorization",
        MetadataValue::try_from(format!("Bearer {token}")).unwrap(),
    );
    req
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_bounds_and_fields_are_refused_by_name() {
    let cluster = Cluster::start_with(3, |s| {
        s.max_sessions = Some(Within::new(2).unwrap());
        s.max_sessions_per_identity = Some(Within::new(5).unwrap());
    })
    .await;
    let mut lock = cluster.lock_client(1);
    let e = lock
        .open_session(v1::OpenSessionRequest {
            session_id: vec![1; 3],
            ttl_ms: 10_000,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(
        e.message(),
        "session_id: must be exactly 16 bytes (a UUID), got 3"
    );
    let e = lock
        .open_session(open_req(SessionId::random(), 10))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(
        e.message(),
        "ttl_ms: must be between 1000 and 3600000 ms, got 10"
    );
    let e = lock
        .keep_alive(v1::KeepAliveRequest { session_id: vec![] })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().starts_with("session_id: "), "{}", e.message());
    let e = lock
        .acquire_in_session(v1::AcquireInSessionRequest {
            label: String::new(),
            resource: b"r".to_vec(),
            owner_id: OwnerId::random().as_bytes().to_vec(),
            session_id: vec![0; 16],
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("non-nil"), "{}", e.message());
    for _ in 0..2 {
        lock.open_session(open_req(SessionId::random(), 10_000))
            .await
            .unwrap();
    }
    let e = lock
        .open_session(open_req(SessionId::random(), 10_000))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted);
    assert!(
        e.message().starts_with("max_sessions=2: "),
        "{}",
        e.message()
    );
}
