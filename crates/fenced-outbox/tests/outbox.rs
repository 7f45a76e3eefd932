//! The outbox against a real fenced cluster (fenced-testkit's launcher,
//! the `fenced` binary of this target directory), a real HTTP upstream and
//! real databases: SQLite always, PostgreSQL when FENCED_TEST_POSTGRES_URL
//! is set (`source .ci/postgres.sh`; skipped with a notice without it,
//! except under CI, where it fails).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod upstream;

use std::{
    path::{Path, PathBuf},
    sync::Arc,
    time::{Duration, Instant},
};

use fenced_client::{Client, OwnerId, Token};
use fenced_outbox::{
    decide::{Mark, RetryPolicy},
    metrics::{self, Counts},
    Dispatcher, DispatcherFence, Entry, HttpDelivery, MarkOutcome, Operation, OutboxError,
    Recorded, Settings, Store,
};
use fenced_sql::{Contract, Fence};
use fenced_testkit::{Cluster, ClusterSpec};
use rusqlite::TransactionBehavior;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use upstream::Upstream;

use fenced_testkit::{postgres_url, unique_name as unique};

/// One database the tests record into.
enum Db {
    Sqlite(PathBuf),
    Postgres(String),
}

impl Db {
    async fn sqlite(dir: &Path) -> Db {
        let db = Db::Sqlite(dir.join("app.db"));
        db.store().await.migrate().await.unwrap();
        db
    }

    async fn postgres(url: String) -> Db {
        let db = Db::Postgres(url);
        db.store().await.migrate().await.unwrap();
        db
    }

    async fn store(&self) -> Store {
        match self {
            Db::Sqlite(path) => Store::open(&format!("sqlite:{}", path.display()))
                .await
                .unwrap(),
            Db::Postgres(url) => Store::open(url).await.unwrap(),
        }
    }

    /// Records `op` in a transaction of its own, committed only when new.
    async fn record(&self, fence: &Fence<'_>, op: &Operation<'_>) -> Result<Recorded, OutboxError> {
        match self {
            Db::Sqlite(path) => {
                let mut conn = rusqlite::Connection::open(path).unwrap();
                conn.busy_timeout(Duration::from_secs(5)).unwrap();
                let tx = conn
                    .transaction_with_behavior(TransactionBehavior::Immediate)
                    .unwrap();
                let recorded = fenced_outbox::sqlite::record(&tx, fence, op)?;
                if matches!(recorded, Recorded::New { .. }) {
                    tx.commit().unwrap();
                }
                Ok(recorded)
            }
            Db::Postgres(url) => {
                let (mut client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(connection);
                let tx = client.transaction().await.unwrap();
                let recorded = fenced_outbox::postgres::record(&tx, fence, op).await?;
                if matches!(recorded, Recorded::New { .. }) {
                    tx.commit().await.unwrap();
                }
                Ok(recorded)
            }
        }
    }

    /// The fences row of `resource`: (highest token, owner id).
    async fn fences_row(&self, resource: &str) -> Option<(u64, String)> {
        match self {
            Db::Sqlite(path) => {
                let conn = rusqlite::Connection::open(path).unwrap();
                conn.query_row(
                    "SELECT last_accepted_token, owner_id FROM fenced_fences WHERE resource = ?1",
                    [resource],
                    |r| Ok((r.get::<_, i64>(0)? as u64, r.get(1)?)),
                )
                .ok()
            }
            Db::Postgres(url) => {
                let (client, connection) = tokio_postgres::connect(url, tokio_postgres::NoTls)
                    .await
                    .unwrap();
                tokio::spawn(connection);
                client
                    .query_opt(
                        "SELECT last_accepted_token, owner_id FROM fenced_fences WHERE resource = $1",
                        &[&resource],
                    )
                    .await
                    .unwrap()
                    .map(|r| (r.get::<_, i64>(0) as u64, r.get(1)))
            }
        }
    }
}

fn fence<'a>(resource: &'a str, token: u64, owner: &'a str) -> Fence<'a> {
    Fence {
        resource,
        token,
        owner_id: owner,
        operation_id: None,
        contract: Contract::AtLeast,
    }
}

/// A one-node cluster of real `fenced` processes.
async fn cluster(dir: &Path) -> Cluster {
    let bin = fenced_testkit::workspace_bin("fenced").unwrap();
    let mut cluster = Cluster::new(ClusterSpec::loopback(&bin, &dir.join("cluster"), 1).unwrap());
    cluster.start_all().unwrap();
    cluster
        .wait_for_leader(Duration::from_secs(20))
        .await
        .unwrap();
    cluster
}

/// What most tests start with: a directory, a cluster, an SQLite
/// database with the migration, an upstream.
async fn setup() -> (tempfile::TempDir, Cluster, Db, Upstream) {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    let db = Db::sqlite(dir.path()).await;
    (dir, cluster, db, Upstream::start().await)
}

const RETRY: RetryPolicy = RetryPolicy {
    base: Duration::from_millis(200),
    cap: Duration::from_secs(2),
    max_attempts: None,
};

fn dispatcher(cluster: &Cluster, store: Store, name: &str) -> Arc<Dispatcher<HttpDelivery>> {
    let client = Client::new(cluster.endpoints()).unwrap();
    let settings = Settings {
        name: name.to_string(),
        lease_ttl: Duration::from_secs(3),
        poll_interval: Duration::from_millis(50),
        batch: 8,
        retry: RETRY,
    };
    let delivery = HttpDelivery::new(None, Duration::from_secs(5)).unwrap();
    Arc::new(Dispatcher::new(client, store, delivery, settings).unwrap())
}

struct Running {
    dispatcher: Arc<Dispatcher<HttpDelivery>>,
    shutdown: CancellationToken,
    task: JoinHandle<()>,
}

impl Running {
    fn start(dispatcher: Arc<Dispatcher<HttpDelivery>>) -> Running {
        let shutdown = CancellationToken::new();
        let (d, s) = (Arc::clone(&dispatcher), shutdown.clone());
        let task = tokio::spawn(async move { d.run(s).await.unwrap() });
        Running {
            dispatcher,
            shutdown,
            task,
        }
    }

    fn counts(&self) -> Counts {
        self.dispatcher.metrics().counts()
    }

    async fn stop(self) {
        self.shutdown.cancel();
        tokio::time::timeout(Duration::from_secs(10), self.task)
            .await
            .expect("the dispatcher stops on shutdown")
            .unwrap();
    }
}

/// Polls `entries` of `resource` until `done` holds (panics after 20 s).
async fn wait_for(
    store: &Store,
    resource: &str,
    what: &str,
    done: impl Fn(&[Entry]) -> bool,
) -> Vec<Entry> {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let entries = store.entries(resource).await.unwrap();
        if done(&entries) {
            return entries;
        }
        assert!(
            Instant::now() < deadline,
            "waited 20 s for {what}: {entries:?}"
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

async fn eventually(what: &str, mut done: impl FnMut() -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while !done() {
        assert!(Instant::now() < deadline, "waited 20 s for {what}");
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

fn states(entries: &[Entry]) -> Vec<(&str, &str)> {
    entries
        .iter()
        .map(|e| (e.idempotency_key.as_str(), e.state.as_str()))
        .collect()
}

/// Owner A (token t) is superseded by B (t' > t), which records; A records
/// after: refused, nothing recorded; only B's operation is delivered.
async fn stale_worker(db: &Db, cluster: &Cluster) {
    let up = Upstream::start().await;
    let resource = unique("invoice");
    let client = Client::new(cluster.endpoints()).unwrap();
    let a = client
        .lock(&resource, Duration::from_secs(5), Duration::ZERO)
        .await
        .unwrap();
    let (a_token, a_owner) = (a.token().get(), a.owner_id().to_string());
    // A pauses; its lease ends; B is granted a newer token.
    a.release().await.unwrap();
    let b = client
        .lock(&resource, Duration::from_secs(5), Duration::ZERO)
        .await
        .unwrap();
    let (b_token, b_owner) = (b.token().get(), b.owner_id().to_string());
    assert!(b_token > a_token);
    let url = up.url("/charges");
    let recorded = db
        .record(
            &fence(&resource, b_token, &b_owner),
            &Operation::post(&url, b"{\"by\":\"b\"}", "charge-b"),
        )
        .await
        .unwrap();
    assert!(matches!(recorded, Recorded::New { .. }), "{recorded:?}");
    // A wakes up and records: refused, with B's token named.
    let late = db
        .record(
            &fence(&resource, a_token, &a_owner),
            &Operation::post(&url, b"{\"by\":\"a\"}", "charge-a"),
        )
        .await
        .unwrap();
    assert_eq!(late, Recorded::Stale { highest: b_token });
    // B retries its record (same key): recorded once.
    let again = db
        .record(
            &fence(&resource, b_token, &b_owner),
            &Operation::post(&url, b"{\"by\":\"b\"}", "charge-b"),
        )
        .await
        .unwrap();
    assert_eq!(again, Recorded::Duplicate);

    let store = db.store().await;
    let entries = store.entries(&resource).await.unwrap();
    assert_eq!(
        states(&entries),
        vec![("charge-b", "pending")],
        "A's operation is not recorded"
    );
    assert_eq!(entries[0].token, b_token);

    let d = Running::start(dispatcher(cluster, store.clone(), &unique("stale")));
    wait_for(&store, &resource, "B's delivery", |e| {
        states(e) == [("charge-b", "delivered")]
    })
    .await;
    assert_eq!(up.applied_keys(), vec!["charge-b".to_string()]);
    assert_eq!(
        up.received_count("charge-a"),
        0,
        "A's operation never leaves"
    );
    assert_eq!(
        up.applied_body("charge-b").as_deref(),
        Some(&b"{\"by\":\"b\"}"[..])
    );
    eventually("the delivered counter", || d.counts().delivered == 1).await;
    d.stop().await;
    drop(b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_worker_is_refused_and_only_the_newer_owners_operation_is_delivered() {
    let dir = tempfile::tempdir().unwrap();
    let cluster = cluster(dir.path()).await;
    stale_worker(&Db::sqlite(dir.path()).await, &cluster).await;
    if let Some(url) = postgres_url() {
        stale_worker(&Db::postgres(url).await, &cluster).await;
    }
}

/// The delivery-time defence: an operation written without the guard
/// (by hand, or a bug) behind a newer owner's is skipped and marked
/// superseded, never sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operation_behind_a_newer_token_is_superseded_at_delivery() {
    let (_dir, cluster, db, up) = setup().await;
    let url = up.url("/x");
    db.record(
        &fence("doc-7", 6, "owner-b"),
        &Operation::post(&url, b"b", "b-1"),
    )
    .await
    .unwrap();
    let Db::Sqlite(path) = &db else {
        unreachable!()
    };
    rusqlite::Connection::open(path)
        .unwrap()
        .execute(
            "INSERT INTO fenced_outbox (resource, token, owner_id, idempotency_key, destination, method, content_type, payload)
             VALUES ('doc-7', 5, 'owner-a', 'a-1', ?1, 'POST', 'application/json', x'61')",
            [&url],
        )
        .unwrap();
    let store = db.store().await;
    let d = Running::start(dispatcher(&cluster, store.clone(), "superseded"));
    let entries = wait_for(&store, "doc-7", "both marked", |e| {
        e.iter().all(|e| e.state != "pending")
    })
    .await;
    assert_eq!(
        states(&entries),
        vec![("b-1", "delivered"), ("a-1", "superseded")]
    );
    assert!(entries[1]
        .last_error
        .as_deref()
        .unwrap()
        .contains("newer token 6"));
    assert_eq!(entries[1].attempts, 0);
    assert_eq!(up.received_count("a-1"), 0);
    eventually("the superseded counter", || d.counts().superseded == 1).await;
    d.stop().await;
}

/// A dispatcher aborted while the upstream holds its request: after the
/// takeover the operation goes again with the same key, is applied once
/// upstream and marked delivered once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_killed_mid_delivery_is_taken_over_and_the_key_applied_once() {
    let (_dir, cluster, db, up) = setup().await;
    up.hold("k-1");
    db.record(
        &fence("order-1", 1, "w"),
        &Operation::post(&up.url("/orders"), b"1", "k-1"),
    )
    .await
    .unwrap();
    let store = db.store().await;
    let first = Running::start(dispatcher(&cluster, store.clone(), "killed"));
    eventually("the first delivery to arrive", || {
        up.received_count("k-1") == 1
    })
    .await;
    first.task.abort();
    let _ = first.task.await;

    let second = Running::start(dispatcher(&cluster, store.clone(), "killed"));
    let entries = wait_for(&store, "order-1", "the redelivery", |e| {
        states(e) == [("k-1", "delivered")]
    })
    .await;
    assert_eq!(up.received_count("k-1"), 2, "sent again after the takeover");
    assert_eq!(up.applied_keys(), vec!["k-1".to_string()], "applied once");
    assert_eq!(
        entries[0].attempts, 1,
        "one marked attempt: the aborted one never marked"
    );
    eventually("the delivered counter", || second.counts().delivered == 1).await;
    up.release();
    second.stop().await;
}

/// A standby stopped while it waits for the lease leaves nothing behind:
/// its request, already on the server, is granted when the holder lets go,
/// and the standby gives that grant back before it returns, so the next
/// owner is not kept waiting for a TTL nobody renews.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_stopped_while_waiting_leaves_no_lease_behind() {
    let (_dir, cluster, db, _up) = setup().await;
    let store = db.store().await;
    let name = "stopped-standby";
    let resource = format!("outbox-dispatcher:{name}");
    let client = Client::new(cluster.endpoints()).unwrap();
    let holder = client
        .lock(&resource, Duration::from_secs(30), Duration::ZERO)
        .await
        .unwrap();
    let standby = Running::start(dispatcher(&cluster, store, name));
    // Its wait is on the server now.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!standby.counts().active);
    standby.shutdown.cancel();
    tokio::time::sleep(Duration::from_millis(100)).await;
    holder.release().await.unwrap();
    tokio::time::timeout(Duration::from_secs(15), standby.task)
        .await
        .expect("the standby stops within its bounded wait")
        .unwrap();
    let next = client
        .lock(&resource, Duration::from_secs(3), Duration::ZERO)
        .await
        .expect("granted at once: the stopped standby holds nothing");
    next.release().await.unwrap();
}

/// Dispatcher 1 holds the lease and loses it (released under it);
/// dispatcher 2, waiting, becomes active and delivers everything; a mark
/// with dispatcher 1's token is refused afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn takeover_delivers_the_rest_and_the_old_dispatchers_mark_is_refused() {
    let (_dir, cluster, db, up) = setup().await;
    up.hold("t-1");
    let url = up.url("/t");
    for key in ["t-1", "t-2", "t-3"] {
        db.record(
            &fence("ledger", 3, "w"),
            &Operation::post(&url, key.as_bytes(), key),
        )
        .await
        .unwrap();
    }
    let store = db.store().await;
    let name = "takeover";
    let resource = format!("outbox-dispatcher:{name}");
    let d1 = Running::start(dispatcher(&cluster, store.clone(), name));
    eventually("dispatcher 1 delivering t-1", || {
        up.received_count("t-1") == 1
    })
    .await;
    assert!(d1.counts().active);
    let (t1, owner1) = db
        .fences_row(&resource)
        .await
        .expect("dispatcher 1 claimed");

    let d2 = Running::start(dispatcher(&cluster, store.clone(), name));
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        !d2.counts().active,
        "a standby while dispatcher 1 holds the lease"
    );
    // Dispatcher 1's lease ends under it (as if its renewals stopped).
    let client = Client::new(cluster.endpoints()).unwrap();
    client
        .release(
            &resource,
            OwnerId::parse(&owner1).unwrap(),
            Token::new(t1).unwrap(),
        )
        .await
        .unwrap();

    let entries = wait_for(&store, "ledger", "dispatcher 2's deliveries", |e| {
        e.iter().all(|e| e.state == "delivered")
    })
    .await;
    assert_eq!(entries.len(), 3);
    eventually("dispatcher 1 to stand by", || !d1.counts().active).await;
    eventually("dispatcher 2's counter", || d2.counts().delivered == 3).await;
    assert!(d2.counts().active);
    assert_eq!(d1.counts().delivered, 0, "dispatcher 1 marked nothing");
    assert_eq!(up.applied_keys(), vec!["t-1", "t-2", "t-3"]);
    assert_eq!(up.received_count("t-1"), 2, "t-1 again, with the same key");
    let (t2, _) = db.fences_row(&resource).await.unwrap();
    assert!(t2 > t1);

    // Both stop; a new operation stays pending.
    d1.stop().await;
    d2.stop().await;
    let Recorded::New { sequence } = db
        .record(
            &fence("ledger", 3, "w"),
            &Operation::post(&url, b"4", "t-4"),
        )
        .await
        .unwrap()
    else {
        panic!("t-4 not recorded")
    };
    // Dispatcher 1 wakes up late and marks with its token: refused.
    let stale = DispatcherFence {
        resource: resource.clone(),
        token: t1,
        owner_id: owner1,
    };
    for (seq, mark) in [
        (sequence, Mark::Delivered),
        (
            entries[0].sequence,
            Mark::Failed {
                reason: "late".into(),
            },
        ),
    ] {
        assert_eq!(
            store.mark(&stale, seq, &mark).await.unwrap(),
            MarkOutcome::Stale { highest: t2 }
        );
    }
    let after = store.entries("ledger").await.unwrap();
    assert_eq!(
        states(&after),
        vec![
            ("t-1", "delivered"),
            ("t-2", "delivered"),
            ("t-3", "delivered"),
            ("t-4", "pending")
        ]
    );
    up.release();
}

/// 503 three times, then 201: delivered on the fourth attempt, each wait
/// at least the backoff's floor.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upstream_that_fails_then_recovers_is_retried_with_backoff() {
    let (_dir, cluster, db, up) = setup().await;
    up.fail_next(3, 503);
    db.record(
        &fence("mail", 1, "w"),
        &Operation::post(&up.url("/send"), b"hi", "m-1"),
    )
    .await
    .unwrap();
    let store = db.store().await;
    let d = Running::start(dispatcher(&cluster, store.clone(), "retry"));
    let entries = wait_for(&store, "mail", "the delivery", |e| {
        states(e) == [("m-1", "delivered")]
    })
    .await;
    assert_eq!(entries[0].attempts, 4);
    assert_eq!(entries[0].last_error.as_deref(), Some("HTTP status 503"));
    let times = up.received_times("m-1");
    assert_eq!(times.len(), 4, "three refusals and the delivery, no more");
    for (i, pair) in times.windows(2).enumerate() {
        // After attempt n the wait is at least base * 2^(n-1) / 2.
        let floor = RETRY.base * 2u32.pow(u32::try_from(i).unwrap()) / 2;
        let gap = pair[1] - pair[0];
        assert!(
            gap >= floor,
            "attempt {} came {gap:?} after the previous one, before {floor:?}",
            i + 2
        );
    }
    assert_eq!(up.applied_keys(), vec!["m-1".to_string()]);
    eventually("the delivered counter", || d.counts().delivered == 1).await;
    let counts = d.counts();
    assert_eq!((counts.retried, counts.delivered, counts.failed), (3, 1, 0));
    d.stop().await;
}

/// 400: failed with the reason, never sent again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permanent_failure_is_failed_with_its_reason_and_not_retried() {
    let (_dir, cluster, db, up) = setup().await;
    up.answer("bad-1", 400);
    let url = up.url("/p");
    db.record(&fence("p", 1, "w"), &Operation::post(&url, b"x", "bad-1"))
        .await
        .unwrap();
    db.record(&fence("p", 1, "w"), &Operation::post(&url, b"y", "good-1"))
        .await
        .unwrap();
    let store = db.store().await;
    let d = Running::start(dispatcher(&cluster, store.clone(), "permanent"));
    let entries = wait_for(&store, "p", "both settled", |e| {
        states(e) == [("bad-1", "failed"), ("good-1", "delivered")]
    })
    .await;
    assert_eq!(entries[0].attempts, 1);
    assert_eq!(
        entries[0].last_error.as_deref(),
        Some("permanent failure: HTTP status 400")
    );
    tokio::time::sleep(Duration::from_millis(600)).await;
    assert_eq!(up.received_count("bad-1"), 1, "not retried");
    eventually("the counters", || {
        d.counts().delivered == 1 && d.counts().failed == 1
    })
    .await;
    let counts = d.counts();
    assert_eq!((counts.failed, counts.retried, counts.delivered), (1, 0, 1));
    d.stop().await;
}

async fn bad_input(db: &Db) {
    let resource = unique("bad");
    let big = vec![b'x'; fenced_outbox::PAYLOAD_MAX_BYTES + 1];
    let cases: [(Operation<'_>, &str, &str); 4] = [
        (
            Operation::post("https://api.example.com/", &big, "k"),
            "payload",
            "payload: must be at most 1048576 bytes, got 1048577",
        ),
        (
            Operation::post("https://api.example.com/", b"{}", ""),
            "idempotency_key",
            "idempotency_key: must be 1 to 128 bytes, got 0",
        ),
        (
            Operation::post("api.example.com/charges", b"{}", "k"),
            "destination",
            "destination: must be an http:// or https:// URL with a host",
        ),
        (
            Operation::post("http://", b"{}", "k"),
            "destination",
            "destination: must be an http:// or https:// URL with a host",
        ),
    ];
    for (op, field, message) in cases {
        match db.record(&fence(&resource, 1, "w"), &op).await {
            Err(e @ OutboxError::Invalid { field: f, .. }) => {
                assert_eq!(f, field);
                assert!(e.to_string().starts_with(message), "{e}");
            }
            other => panic!("{field}: {other:?}"),
        }
    }
    // A fence out of its bound is refused by the guard's own check.
    let e = db
        .record(
            &fence(&resource, 0, "w"),
            &Operation::post("https://a.example/", b"", "k"),
        )
        .await
        .unwrap_err();
    assert!(
        e.to_string().starts_with("token: must be at least 1"),
        "{e}"
    );
    assert_eq!(db.store().await.entries(&resource).await.unwrap(), vec![]);
    assert_eq!(db.fences_row(&resource).await, None, "the guard never ran");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_input_is_refused_naming_the_field_and_nothing_is_recorded() {
    let dir = tempfile::tempdir().unwrap();
    bad_input(&Db::sqlite(dir.path()).await).await;
    if let Some(url) = postgres_url() {
        bad_input(&Db::postgres(url).await).await;
    }
}

/// `/metrics` over TLS refuses plaintext and a client without a
/// certificate, serves one with a certificate from the CA, and its backlog
/// gauge counts the pending operations. The binary refuses an off-loopback
/// listener without TLS, naming the flag.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_refuse_clients_without_a_certificate_and_show_the_backlog() {
    let dir = tempfile::tempdir().unwrap();
    let exe = env!("CARGO_BIN_EXE_fenced-outbox");
    // `dispatch` with `flag value`: refused before anything is opened.
    let refused = |flag: &str, value: &str| {
        let out = std::process::Command::new(exe)
            .args(["dispatch", "--database", "sqlite::memory:"])
            .args(["--cluster", "127.0.0.1:1", "--name", "m", flag, value])
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let (code, stderr) = refused("--metrics-listen", "0.0.0.0:0");
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("--metrics-tls-cert is required"),
        "{stderr}"
    );
    for (flag, value) in [
        ("--lease-ttl", "0s"),
        ("--batch", "0"),
        ("--batch", "257"),
        ("--max-attempts", "0"),
    ] {
        let (code, stderr) = refused(flag, value);
        assert_eq!(code, Some(2), "{stderr}");
        assert!(stderr.contains(flag), "{flag} {value}: {stderr}");
    }

    // The binary's migrate, then two pending operations.
    let db_path = dir.path().join("app.db");
    let out = std::process::Command::new(exe)
        .args([
            "migrate",
            "--database",
            &format!("sqlite:{}", db_path.display()),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let db = Db::Sqlite(db_path);
    for key in ["a", "b"] {
        db.record(
            &fence("backlog", 1, "w"),
            &Operation::post("http://127.0.0.1:9/", b"", key),
        )
        .await
        .unwrap();
    }

    let pki = fenced_testkit::Pki::new(
        &fenced_testkit::workspace_bin("fenced").unwrap(),
        &dir.path().join("pki"),
    )
    .unwrap();
    let (cert, key) = pki.server("metrics", "127.0.0.1").unwrap();
    let (client_cert, client_key) = pki.client("scraper").unwrap();
    let acceptor = metrics::tls_acceptor(&cert, &key, &pki.ca()).unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let shutdown = CancellationToken::new();
    let metrics = Arc::new(metrics::Metrics::default());
    tokio::spawn(metrics::serve(
        listener,
        Some(acceptor),
        db.store().await,
        metrics,
        shutdown.clone(),
    ));

    assert!(
        upstream::plain_get(addr, "/metrics").await.is_err(),
        "plaintext is refused"
    );
    let e = upstream::tls_get(addr, &pki.ca(), None, "/metrics")
        .await
        .unwrap_err();
    assert!(!e.is_empty());
    let (status, body) = upstream::tls_get(
        addr,
        &pki.ca(),
        Some((&client_cert, &client_key)),
        "/metrics",
    )
    .await
    .unwrap();
    assert_eq!(status, 200);
    fenced_server::observe::exposition::check(&body).unwrap();
    assert!(body.contains("\nfenced_outbox_pending 2\n"), "{body}");
    assert!(
        body.contains("\nfenced_outbox_backlog_up 1\n")
            || body.starts_with("# HELP fenced_outbox_backlog_up"),
        "{body}"
    );
    assert!(
        body.contains("\nfenced_outbox_dispatcher_active 0\n"),
        "{body}"
    );
    shutdown.cancel();
}

/// The binary end to end: `fenced-outbox dispatch` delivers, shows itself
/// active on `/metrics` (plaintext on loopback), and on SIGTERM stops with
/// 0 and releases its lease at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_delivers_reports_and_releases_on_sigterm() {
    let (dir, cluster, db, up) = setup().await;
    db.record(
        &fence("bin", 1, "w"),
        &Operation::post(&up.url("/b"), b"b", "bin-1"),
    )
    .await
    .unwrap();
    let Db::Sqlite(path) = &db else {
        unreachable!()
    };
    let metrics_addr = format!("127.0.0.1:{}", fenced_testkit::free_port().unwrap());
    let log = std::fs::File::create(dir.path().join("dispatch.log")).unwrap();
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_fenced-outbox"))
        .arg("dispatch")
        .env(
            "FENCED_OUTBOX_DATABASE",
            format!("sqlite:{}", path.display()),
        )
        .env("FENCED_OUTBOX_CLUSTER", cluster.endpoints().join(","))
        .args([
            "--name",
            "binary",
            "--lease-ttl",
            "3s",
            "--poll-interval",
            "50ms",
        ])
        .args(["--metrics-listen", &metrics_addr])
        .stderr(log)
        .spawn()
        .unwrap();
    let store = db.store().await;
    wait_for(&store, "bin", "the binary's delivery", |e| {
        states(e) == [("bin-1", "delivered")]
    })
    .await;
    let addr = metrics_addr.parse().unwrap();
    let (status, body) = upstream::plain_get(addr, "/metrics").await.unwrap();
    assert_eq!(status, 200);
    fenced_server::observe::exposition::check(&body).unwrap();
    assert!(
        body.contains("\nfenced_outbox_dispatcher_active 1\n"),
        "{body}"
    );
    assert!(
        body.contains("\nfenced_outbox_delivered_total 1\n"),
        "{body}"
    );
    assert!(body.contains("\nfenced_outbox_pending 0\n"), "{body}");

    let kill = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .unwrap();
    assert!(kill.success());
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        assert!(Instant::now() < deadline, "no exit 10 s after SIGTERM");
        tokio::time::sleep(Duration::from_millis(25)).await;
    };
    let log = std::fs::read_to_string(dir.path().join("dispatch.log")).unwrap();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(log.contains("token="), "the log names the token: {log}");
    // Released: the lease is granted at once, well before its TTL.
    let client = Client::new(cluster.endpoints()).unwrap();
    let lease = client
        .lock(
            "outbox-dispatcher:binary",
            Duration::from_secs(3),
            Duration::ZERO,
        )
        .await
        .unwrap();
    lease.release().await.unwrap();
}

/// A dispatcher process, its metrics address and its log file.
fn dispatcher_process(
    dir: &std::path::Path,
    cluster: &Cluster,
    db_path: &std::path::Path,
    tag: &str,
) -> (std::process::Child, std::net::SocketAddr) {
    let metrics_addr: std::net::SocketAddr =
        format!("127.0.0.1:{}", fenced_testkit::free_port().unwrap())
            .parse()
            .unwrap();
    let log = std::fs::File::create(dir.join(format!("{tag}.log"))).unwrap();
    let child = std::process::Command::new(env!("CARGO_BIN_EXE_fenced-outbox"))
        .arg("dispatch")
        .env(
            "FENCED_OUTBOX_DATABASE",
            format!("sqlite:{}", db_path.display()),
        )
        .env("FENCED_OUTBOX_CLUSTER", cluster.endpoints().join(","))
        .args([
            "--name",
            "paused",
            "--lease-ttl",
            "2s",
            "--poll-interval",
            "50ms",
        ])
        .args(["--metrics-listen", &metrics_addr.to_string()])
        .stderr(log)
        .spawn()
        .unwrap();
    (child, metrics_addr)
}

fn signal(child: &std::process::Child, sig: &str) {
    let ok = std::process::Command::new("kill")
        .args([sig, &child.id().to_string()])
        .status()
        .unwrap();
    assert!(ok.success());
}

/// A dispatcher process stopped (SIGSTOP) mid-delivery, past its lease: the
/// other process takes over and delivers; when the first wakes up it marks
/// nothing, and each key is applied once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dispatcher_process_paused_past_its_lease_is_taken_over_and_marks_nothing() {
    let (dir, cluster, db, up) = setup().await;
    let Db::Sqlite(path) = &db else {
        unreachable!()
    };
    up.hold("z-1");
    db.record(
        &fence("zz", 1, "w"),
        &Operation::post(&up.url("/z"), b"z1", "z-1"),
    )
    .await
    .unwrap();
    let (mut first, first_metrics) = dispatcher_process(dir.path(), &cluster, path, "first");
    eventually("the first delivery to arrive", || {
        up.received_count("z-1") == 1
    })
    .await;
    signal(&first, "-STOP");
    let (mut second, _) = dispatcher_process(dir.path(), &cluster, path, "second");
    // The second takes over once the first's lease has run out, and sends
    // the operation again with the same key.
    eventually("the second delivery to arrive", || {
        up.received_count("z-1") == 2
    })
    .await;
    up.release();
    let store = db.store().await;
    wait_for(&store, "zz", "the second's delivery", |e| {
        states(e) == [("z-1", "delivered")]
    })
    .await;
    db.record(
        &fence("zz", 1, "w"),
        &Operation::post(&up.url("/z"), b"z2", "z-2"),
    )
    .await
    .unwrap();
    wait_for(&store, "zz", "the next delivery", |e| {
        states(e) == [("z-1", "delivered"), ("z-2", "delivered")]
    })
    .await;
    // The first wakes up with its answer in hand and a lost lease.
    signal(&first, "-CONT");
    let mut body = String::new();
    for _ in 0..100 {
        if let Ok((200, text)) = upstream::plain_get(first_metrics, "/metrics").await {
            if text.contains("\nfenced_outbox_dispatcher_active 0\n") {
                body = text;
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        body.contains("\nfenced_outbox_delivered_total 0\n"),
        "the paused dispatcher marked a delivery: {body}"
    );
    assert_eq!(
        up.applied_keys(),
        vec!["z-1".to_string(), "z-2".to_string()]
    );
    assert_eq!(up.received_count("z-2"), 1, "z-2 sent by the second only");
    for child in [&mut first, &mut second] {
        let _ = child.kill();
        let _ = child.wait();
    }
}
