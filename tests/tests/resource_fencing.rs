//! The protected resource end to end with real processes: the article's
//! stale-owner sequence against the library, the `fenced-resource` service
//! and PostgreSQL, plus contracts, bad input and a crash of the service.
//!
//! Workers are separate processes: this test binary started again with
//! `FENCED_WORKER_TARGET` set runs only `worker_process_entry_point`.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    collections::BTreeMap,
    ffi::OsString,
    io::{BufRead, BufReader, Write as _},
    path::{Path, PathBuf},
    process::{Child, ChildStdin, ChildStdout, Command, Stdio},
    sync::Arc,
    time::{Duration, Instant},
};

use fenced_core::{OwnerId, ResourceName, Token};
use fenced_proto::v1::{
    acquire_response, fenced_resource_client::FencedResourceClient, lock_client::LockClient,
    put_response, renew_response, AcquireRequest, DescribeRequest, FenceMode, GetRequest,
    PutRequest, RejectReason, RenewRequest,
};
use fenced_resource::{postgres::PgFenceStore, FenceStore, Mode, Write, WriteOutcome};
use fenced_tests::{bin, free_port, lock_rpcs_ok, postgres_url, write_auth_files, Cluster, Pki};
use nix::{
    sys::signal::{kill, Signal},
    unistd::Pid,
};
use tonic::{transport::Channel, Code};

const LEASE_TTL: Duration = Duration::from_secs(2);

// ---------------------------------------------------------------- helpers

/// A `fenced-resource serve` process.
struct ServiceProc {
    port: u16,
    data_dir: PathBuf,
    log: PathBuf,
    /// Its arguments after `--listen` and `--data-dir`.
    args: Vec<OsString>,
    /// Set: it serves TLS from these certificates.
    pki: Option<Pki>,
    child: Option<Child>,
}

impl ServiceProc {
    /// A service checking no write against a cluster: the store's own
    /// contract, on its own.
    async fn start(dir: &Path) -> ServiceProc {
        Self::start_with(dir, &["--standalone-no-cluster-check".into()], None).await
    }

    async fn start_with(dir: &Path, args: &[OsString], pki: Option<Pki>) -> ServiceProc {
        let mut svc = ServiceProc {
            port: free_port(),
            data_dir: dir.join("resource-data"),
            log: dir.join("resource.log"),
            args: args.to_vec(),
            pki,
            child: None,
        };
        svc.spawn().await;
        svc
    }

    fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    async fn spawn(&mut self) {
        let log = std::fs::File::options()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let child = Command::new(bin("fenced-resource"))
            .args(["serve", "--listen", &self.addr(), "--data-dir"])
            .arg(&self.data_dir)
            .args(&self.args)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(20);
        loop {
            let mut c = self.client();
            let answer = c
                .get(GetRequest {
                    key: b"ping".to_vec(),
                })
                .await;
            // Any answer of the service itself (a refusal included) means it
            // is serving.
            if answer.is_ok()
                || answer.is_err_and(|s| {
                    matches!(s.code(), Code::Unauthenticated | Code::PermissionDenied)
                })
            {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "fenced-resource did not start: {}",
                std::fs::read_to_string(&self.log).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            c.kill().unwrap();
            c.wait().unwrap();
        }
    }

    /// A channel showing client `name`'s certificate (TLS only).
    fn channel(&self, name: Option<&str>) -> Channel {
        match &self.pki {
            Some(pki) => pki.channel(&self.addr(), name),
            None => Channel::from_shared(format!("http://{}", self.addr()))
                .unwrap()
                .timeout(Duration::from_secs(10))
                .connect_lazy(),
        }
    }

    fn client(&self) -> FencedResourceClient<Channel> {
        FencedResourceClient::new(self.channel(None))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for ServiceProc {
    fn drop(&mut self) {
        self.kill9();
    }
}

/// A key's highest token and bound resource; `None` if never written.
async fn get_token(c: &mut FencedResourceClient<Channel>, key: &str) -> Option<(u64, String)> {
    let g = c
        .get(GetRequest {
            key: key.as_bytes().to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    g.found.then_some((g.token, g.resource))
}

fn put(key: &str, token: u64, owner: OwnerId, value: &str) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec(),
        resource: key.as_bytes().to_vec(),
        token: Some(token),
        owner_id: owner.as_bytes().to_vec(),
        value: value.as_bytes().to_vec(),
        ..Default::default()
    }
}

async fn put_status(c: &mut FencedResourceClient<Channel>, req: PutRequest) -> (String, u64) {
    match c.put(req).await.unwrap().into_inner().outcome.unwrap() {
        put_response::Outcome::Accepted(a) => ("accepted".into(), a.token),
        put_response::Outcome::AlreadyApplied(a) => ("already_applied".into(), a.token),
        put_response::Outcome::Rejected(r) => ("rejected".into(), r.highest_token),
    }
}

/// Where workers write: the library on a directory, the service, or
/// PostgreSQL.
#[derive(Clone)]
enum Target {
    Library(PathBuf),
    Service(String),
    Postgres(String),
}

impl Target {
    fn encode(&self) -> String {
        match self {
            Target::Library(dir) => format!("library={}", dir.display()),
            Target::Service(addr) => format!("service={addr}"),
            Target::Postgres(url) => format!("postgres={url}"),
        }
    }

    fn decode(text: &str) -> Target {
        let (kind, rest) = text.split_once('=').unwrap();
        match kind {
            "library" => Target::Library(PathBuf::from(rest)),
            "service" => Target::Service(rest.to_string()),
            "postgres" => Target::Postgres(rest.to_string()),
            other => panic!("unknown target {other}"),
        }
    }

    /// One fenced write; returns (status, highest token). The library
    /// target opens the store only for the write, so two worker processes
    /// can take turns on the same directory.
    async fn write(
        &self,
        resource: &str,
        token: u64,
        owner: OwnerId,
        value: &str,
    ) -> (String, u64) {
        let w = Write::for_resource(
            ResourceName::new(resource).unwrap(),
            Token::new(token).unwrap(),
            owner,
            value,
        );
        let outcome = match self {
            Target::Library(dir) => {
                let store = open_when_free(dir);
                store.write(&w).unwrap()
            }
            Target::Service(addr) => {
                let channel = Channel::from_shared(format!("http://{addr}"))
                    .unwrap()
                    .connect_lazy();
                return put_status(
                    &mut FencedResourceClient::new(channel),
                    put(resource, token, owner, value),
                )
                .await;
            }
            Target::Postgres(url) => {
                let mut store = PgFenceStore::connect(url).await.unwrap();
                store.write(&w).await.unwrap()
            }
        };
        (outcome.status().to_string(), outcome.highest_token())
    }

    /// The key's (token, value).
    async fn read(&self, key: &str) -> Option<(u64, String)> {
        let current = match self {
            Target::Library(dir) => open_when_free(dir).get(key).unwrap(),
            Target::Service(addr) => {
                let channel = Channel::from_shared(format!("http://{addr}"))
                    .unwrap()
                    .connect_lazy();
                let r = FencedResourceClient::new(channel)
                    .get(GetRequest {
                        key: key.as_bytes().to_vec(),
                    })
                    .await
                    .unwrap()
                    .into_inner();
                return r
                    .found
                    .then(|| (r.token, String::from_utf8(r.value).unwrap()));
            }
            Target::Postgres(url) => PgFenceStore::connect(url)
                .await
                .unwrap()
                .get(key)
                .await
                .unwrap(),
        };
        current.map(|c| (c.token, String::from_utf8(c.value).unwrap()))
    }
}

/// sled allows one process per directory: wait while the other worker has
/// it open.
fn open_when_free(dir: &Path) -> FenceStore {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        match FenceStore::open(dir) {
            Ok(s) => return s,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => panic!("cannot open {}: {e}", dir.display()),
        }
    }
}

// ---------------------------------------------------------------- worker

/// The worker process: acquire, keep renewing, write part 1, "compute"
/// (wait for a line on stdin), write the final result with the same token.
/// The parent freezes it with SIGSTOP during the computation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn worker_process_entry_point() {
    let Ok(target) = std::env::var("FENCED_WORKER_TARGET") else {
        return; // not started as a worker: nothing to do
    };
    let target = Target::decode(&target);
    let name = std::env::var("FENCED_WORKER_NAME").unwrap();
    let resource = std::env::var("FENCED_WORKER_RESOURCE").unwrap();
    let endpoints: Vec<String> = std::env::var("FENCED_WORKER_ENDPOINTS")
        .unwrap()
        .split(',')
        .map(str::to_string)
        .collect();
    // Any node will do: followers forward to the leader.
    let lock = LockClient::new(
        Channel::from_shared(format!("http://{}", endpoints[0]))
            .unwrap()
            .timeout(Duration::from_secs(10))
            .connect_lazy(),
    );
    let owner = OwnerId::random();
    let granted = lock
        .clone()
        .acquire(AcquireRequest {
            label: String::new(),
            resource: resource.as_bytes().to_vec(),
            owner_id: owner.as_bytes().to_vec(),
            ttl_ms: LEASE_TTL.as_millis() as u64,
            wait_ms: 20_000,
        })
        .await
        .unwrap()
        .into_inner();
    let token = match granted.outcome {
        Some(acquire_response::Outcome::Granted(g)) => g.token,
        other => panic!("{name}: not granted: {other:?}"),
    };
    println!("@worker granted {token}");
    // Keep the lease alive while working, as a real worker does: only a
    // pause can make it lapse.
    let keeper = {
        let (mut lock, resource) = (lock.clone(), resource.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LEASE_TTL / 5).await;
                let renewed = lock
                    .renew(RenewRequest {
                        resource: resource.as_bytes().to_vec(),
                        owner_id: owner.as_bytes().to_vec(),
                        token,
                        ttl_ms: LEASE_TTL.as_millis() as u64,
                    })
                    .await
                    .map(|r| r.into_inner().outcome);
                if !matches!(renewed, Ok(Some(renew_response::Outcome::Renewed(_)))) {
                    eprintln!("lease lost: {renewed:?}");
                    return;
                }
            }
        })
    };
    let (status, _) = target
        .write(&resource, token, owner, &format!("{name} part 1"))
        .await;
    println!("@worker wrote part1 {status}");
    // The long computation; the parent says when it is over.
    let mut line = String::new();
    tokio::task::spawn_blocking(move || std::io::stdin().read_line(&mut line).map(|_| line))
        .await
        .unwrap()
        .unwrap();
    let (status, highest) = target
        .write(&resource, token, owner, &format!("{name} final"))
        .await;
    println!("@worker final {status} {highest}");
    keeper.abort();
}

struct Worker {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
}

impl Worker {
    fn start(cluster: &Cluster, name: &str, resource: &str, target: &Target) -> Worker {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args([
                "worker_process_entry_point",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env("FENCED_WORKER_TARGET", target.encode())
            .env("FENCED_WORKER_NAME", name)
            .env("FENCED_WORKER_RESOURCE", resource)
            .env("FENCED_WORKER_ENDPOINTS", cluster.endpoints().join(","))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        Worker {
            stdin: child.stdin.take().unwrap(),
            stdout: BufReader::new(child.stdout.take().unwrap()),
            child,
        }
    }

    /// The next line the worker printed that starts with `prefix`.
    fn expect(&mut self, prefix: &str) -> String {
        loop {
            let mut line = String::new();
            assert!(
                self.stdout.read_line(&mut line).unwrap() > 0,
                "worker exited before printing {prefix:?}"
            );
            // libtest may print "test ... " in front on the same line.
            let said = line
                .split_once("@worker ")
                .map_or("", |(_, said)| said.trim());
            if let Some(rest) = said.strip_prefix(prefix) {
                return rest.trim().to_string();
            }
        }
    }

    fn pid(&self) -> Pid {
        Pid::from_raw(self.child.id() as i32)
    }

    fn finish_computation(&mut self) {
        writeln!(self.stdin, "continue").unwrap();
        self.stdin.flush().unwrap();
    }

    fn wait(mut self) {
        let status = self.child.wait().unwrap();
        assert!(status.success(), "worker failed: {status}");
    }
}

/// The article's sequence: A acquires and starts writing, is frozen past its
/// lease, B acquires a higher token and writes, A resumes and writes with
/// its old token: refused, and B's data stays.
async fn stale_owner_sequence(target: Target) {
    let cluster = Cluster::start(3).await;
    let mut lock = cluster.lock_client(1);
    let resource = format!("statement:account-{}:2026-07", OwnerId::random());

    let mut a = Worker::start(&cluster, "A", &resource, &target);
    let token_a: u64 = a.expect("granted").parse().unwrap();
    assert_eq!(a.expect("wrote part1"), "accepted", "A's useful work began");
    // A is renewing: its lease outlives its TTL while it runs.
    tokio::time::sleep(LEASE_TTL + Duration::from_millis(500)).await;
    let d = lock
        .describe(DescribeRequest {
            resource: resource.as_bytes().to_vec(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(d.held && d.last_token == token_a, "A still holds: {d:?}");

    kill(a.pid(), Signal::SIGSTOP).unwrap();
    // Frozen, A renews nothing; the cluster ends its lease and B gets it.
    let mut b = Worker::start(&cluster, "B", &resource, &target);
    let token_b: u64 = b.expect("granted").parse().unwrap();
    assert!(token_b > token_a, "B's token {token_b} > A's {token_a}");
    assert_eq!(b.expect("wrote part1"), "accepted");
    b.finish_computation();
    assert_eq!(b.expect("final"), format!("accepted {token_b}"));
    b.wait();

    kill(a.pid(), Signal::SIGCONT).unwrap();
    a.finish_computation();
    assert_eq!(
        a.expect("final"),
        format!("rejected {token_b}"),
        "A's late write is refused"
    );
    a.wait();

    assert_eq!(
        target.read(&resource).await,
        Some((token_b, "B final".to_string())),
        "B's data is intact"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_owner_is_refused_by_the_library() {
    let dir = tempfile::tempdir().unwrap();
    stale_owner_sequence(Target::Library(dir.path().join("store"))).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_owner_is_refused_by_the_service() {
    let dir = tempfile::tempdir().unwrap();
    let svc = ServiceProc::start(dir.path()).await;
    stale_owner_sequence(Target::Service(svc.addr())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stale_owner_is_refused_by_postgres() {
    let Some(url) = postgres_url() else { return };
    stale_owner_sequence(Target::Postgres(url)).await;
}

// ---------------------------------------------------------------- service

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_equal_tokens_follow_the_key_contract() {
    let dir = tempfile::tempdir().unwrap();
    let svc = ServiceProc::start(dir.path()).await;
    let mut c = svc.client();
    let owner = OwnerId::random();
    // allow-equal: the same owner writes again under one token
    assert_eq!(
        put_status(&mut c, put("loose", 4, owner, "1")).await.0,
        "accepted"
    );
    assert_eq!(
        put_status(&mut c, put("loose", 4, owner, "2")).await.0,
        "accepted"
    );
    // strict: one write per token, then already applied
    let mut strict = put("once", 4, owner, "final");
    strict.mode = FenceMode::Strict as i32;
    assert_eq!(put_status(&mut c, strict.clone()).await.0, "accepted");
    strict.value = b"again".to_vec();
    assert_eq!(
        put_status(&mut c, strict).await,
        ("already_applied".into(), 4)
    );
    let got = c
        .get(GetRequest {
            key: b"once".to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (got.token, got.value, got.mode),
        (4, b"final".to_vec(), FenceMode::Strict as i32)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_takes_token_resource_and_owner_from_metadata() {
    let dir = tempfile::tempdir().unwrap();
    let svc = ServiceProc::start(dir.path()).await;
    let mut c = svc.client();
    let owner = OwnerId::random();
    let mut req = tonic::Request::new(PutRequest {
        key: b"gateway".to_vec(),
        value: b"via metadata".to_vec(),
        ..Default::default()
    });
    let md = req.metadata_mut();
    md.insert("x-fencing-token", "12".parse().unwrap());
    md.insert("x-fencing-resource", "gateway".parse().unwrap());
    md.insert("x-fencing-owner", owner.to_string().parse().unwrap());
    let reply = c.put(req).await.unwrap().into_inner();
    assert!(matches!(
        reply.outcome,
        Some(put_response::Outcome::Accepted(ref a)) if a.token == 12
    ));
    // A stale token in metadata is refused like one in the body.
    let mut stale = tonic::Request::new(put("gateway", 12, owner, "x"));
    stale.get_mut().token = None;
    stale
        .metadata_mut()
        .insert("x-fencing-token", "11".parse().unwrap());
    match c.put(stale).await.unwrap().into_inner().outcome.unwrap() {
        put_response::Outcome::Rejected(r) => {
            assert_eq!(r.reason, RejectReason::StaleToken as i32);
            assert_eq!((r.token, r.highest_token), (11, 12));
            assert_eq!(r.key, "gateway");
            assert_eq!(r.owner_id, owner.as_bytes().to_vec());
        }
        other => panic!("{other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_refuses_bad_input_by_field_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let svc = ServiceProc::start(dir.path()).await;
    let mut c = svc.client();
    let owner = OwnerId::random();
    let key = "bad-input";
    let cases: Vec<(PutRequest, &str, &str)> = vec![
        (
            PutRequest {
                token: None,
                ..put(key, 1, owner, "v")
            },
            "token",
            "required",
        ),
        (put(key, 0, owner, "v"), "token", "at least 1"),
        (
            put(key, 1, owner, &"x".repeat(1024 * 1024 + 1)),
            "value",
            "1048576",
        ),
        (
            PutRequest {
                key: vec![b'k'; 257],
                ..put(key, 1, owner, "v")
            },
            "key",
            "256",
        ),
        (
            PutRequest {
                mode: 7,
                ..put(key, 1, owner, "v")
            },
            "mode",
            "unknown value 7",
        ),
        (
            PutRequest {
                resource: vec![],
                ..put(key, 1, owner, "v")
            },
            "resource",
            "required",
        ),
        (
            PutRequest {
                owner_id: vec![],
                ..put(key, 1, owner, "v")
            },
            "owner_id",
            "required",
        ),
        (
            PutRequest {
                idempotency_key: "i".repeat(129),
                ..put(key, 1, owner, "v")
            },
            "idempotency_key",
            "128",
        ),
    ];
    for (req, field, bound) in cases {
        let err = c.put(req).await.unwrap_err();
        assert_eq!(err.code(), Code::InvalidArgument, "{field}: {err:?}");
        assert!(
            err.message().starts_with(field) && err.message().contains(bound),
            "{field}/{bound}: {}",
            err.message()
        );
    }
    assert_eq!(get_token(&mut c, key).await, None, "nothing was written");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_concurrent_writers_with_mixed_tokens() {
    let dir = tempfile::tempdir().unwrap();
    let svc = ServiceProc::start(dir.path()).await;
    let owners: Arc<Vec<OwnerId>> = Arc::new((0..=30).map(|_| OwnerId::random()).collect());
    let mut tasks = Vec::new();
    for w in 0..4u64 {
        let (mut c, owners) = (svc.client(), owners.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..30u64 {
                let token = (i * 7 + w * 11) % 30 + 1;
                put_status(
                    &mut c,
                    put(
                        "contended",
                        token,
                        owners[token as usize],
                        &format!("by {token}"),
                    ),
                )
                .await;
            }
        }));
    }
    let mut reader = svc.client();
    let watcher = tokio::spawn(async move {
        let mut last = 0;
        for _ in 0..100 {
            let g = reader
                .get(GetRequest {
                    key: b"contended".to_vec(),
                })
                .await
                .unwrap()
                .into_inner();
            if g.found {
                assert!(
                    g.token >= last,
                    "fence went back from {last} to {}",
                    g.token
                );
                assert_eq!(g.value, format!("by {}", g.token).into_bytes());
                last = g.token;
            }
        }
    });
    for t in tasks {
        t.await.unwrap();
    }
    watcher.await.unwrap();
    let g = svc
        .client()
        .get(GetRequest {
            key: b"contended".to_vec(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((g.token, g.value), (30, b"by 30".to_vec()));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn service_killed_mid_stream_keeps_every_acknowledged_write() {
    let dir = tempfile::tempdir().unwrap();
    let mut svc = ServiceProc::start(dir.path()).await;
    let owners: Vec<OwnerId> = (0..400).map(|_| OwnerId::random()).collect();
    // Four writers, each on its own key with rising tokens; the service is
    // killed while they write.
    let mut tasks = Vec::new();
    for k in 0..4 {
        let (mut c, owners) = (svc.client(), owners.clone());
        tasks.push(tokio::spawn(async move {
            let key = format!("crash-{k}");
            let mut acked: Option<(u64, String)> = None;
            for token in 1..400u64 {
                let value = format!("{key} token {token}");
                match c
                    .put(put(&key, token, owners[token as usize], &value))
                    .await
                {
                    Ok(r) => match r.into_inner().outcome.unwrap() {
                        put_response::Outcome::Accepted(_) => acked = Some((token, value)),
                        other => panic!("{other:?}"),
                    },
                    Err(_) => break, // the service died
                }
            }
            (key, acked)
        }));
    }
    tokio::time::sleep(Duration::from_millis(1500)).await;
    svc.kill9();
    let mut acked = BTreeMap::new();
    for t in tasks {
        let (key, last) = t.await.unwrap();
        acked.insert(
            key,
            last.expect("some writes were acknowledged before the kill"),
        );
    }
    svc.spawn().await;
    let mut c = svc.client();
    for (key, (token, value)) in &acked {
        let g = c
            .get(GetRequest {
                key: key.as_bytes().to_vec(),
            })
            .await
            .unwrap()
            .into_inner();
        assert!(g.found, "{key} lost");
        assert!(
            g.token >= *token,
            "{key}: fence went back from {token} to {}",
            g.token
        );
        if g.token == *token {
            assert_eq!(g.value, value.as_bytes(), "{key}: acknowledged value lost");
        } else {
            // a write that was applied but whose answer was lost to the kill
            assert_eq!(g.value, format!("{key} token {}", g.token).into_bytes());
        }
        // and the fence holds after the restart
        let (status, highest) = put_status(&mut c, put(key, *token - 1, owners[0], "late")).await;
        assert_eq!((status.as_str(), highest), ("rejected", g.token));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencectl_resource_put_and_get_report_in_json() {
    let cluster_dir = tempfile::tempdir().unwrap();
    let svc = ServiceProc::start(cluster_dir.path()).await;
    let owner = OwnerId::random().to_string();
    let run = |args: &[&str]| {
        let out = Command::new(bin("fencectl"))
            .arg("--json")
            .args(args)
            .args(["--endpoint", &svc.addr()])
            .output()
            .unwrap();
        let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        (
            out.status.code(),
            json,
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    };
    let put_args = |token: &str, value: &str| {
        vec![
            "resource",
            "put",
            "report",
            "--token",
            token,
            "--owner-id",
            &owner,
            "--value",
            value,
        ]
        .into_iter()
        .map(str::to_string)
        .collect::<Vec<_>>()
    };
    fn args(v: &[String]) -> Vec<&str> {
        v.iter().map(String::as_str).collect()
    }
    let mut first = put_args("7", "v1");
    first.extend(["--idempotency-key", "op-1"].map(str::to_string));
    let (code, json, _) = run(&args(&first));
    assert_eq!(code, Some(0));
    assert_eq!(
        (json["status"].as_str(), json["version"].as_u64()),
        (Some("accepted"), Some(1))
    );
    // the same idempotency key again: applied once, same answer
    let (code, json, _) = run(&args(&first));
    assert_eq!((code, json["version"].as_u64()), (Some(0), Some(1)));
    let (code, json, _) = run(&args(&put_args("6", "stale")));
    assert_eq!(code, Some(3));
    assert_eq!(json["status"], "rejected");
    assert_eq!(
        (json["token"].as_u64(), json["highest_token"].as_u64()),
        (Some(6), Some(7))
    );
    assert_eq!(json["reason"], "stale_token");
    let (code, _, stderr) = run(&args(&put_args("0", "zero")));
    assert_eq!(code, Some(2), "token 0 is bad input: {stderr}");
    assert!(stderr.contains("token"), "{stderr}");
    let (code, json, _) = run(&["resource", "get", "report"]);
    assert_eq!(code, Some(0));
    assert_eq!(
        (json["token"].as_u64(), json["value"].as_str()),
        (Some(7), Some("v1"))
    );
}

// ---------------------------------------------------------------- PostgreSQL

fn pg_write(key: &str, token: u64, owner: OwnerId, value: &str) -> Write {
    Write::for_resource(
        ResourceName::new(key).unwrap(),
        Token::new(token).unwrap(),
        owner,
        value,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_equal_tokens_idempotency_and_bad_input() {
    let Some(url) = postgres_url() else { return };
    let mut store = PgFenceStore::connect(&url).await.unwrap();
    let run = OwnerId::random();
    let owner = OwnerId::random();

    // allow-equal
    let loose = format!("loose-{run}");
    for v in 1..=2 {
        assert_eq!(
            store.write(&pg_write(&loose, 4, owner, "x")).await.unwrap(),
            WriteOutcome::Accepted {
                token: 4,
                version: v
            }
        );
    }
    // an equal token from another owner id
    assert!(matches!(
        store.write(&pg_write(&loose, 4, OwnerId::random(), "y")).await.unwrap(),
        WriteOutcome::Rejected(r) if r.reason == fenced_resource::RejectReason::OwnerMismatch
    ));
    // strict
    let once = format!("once-{run}");
    let mut w = pg_write(&once, 4, owner, "final");
    w.mode = Some(Mode::Strict);
    assert!(matches!(
        store.write(&w).await.unwrap(),
        WriteOutcome::Accepted { .. }
    ));
    w.value = b"again".to_vec();
    assert_eq!(
        store.write(&w).await.unwrap(),
        WriteOutcome::AlreadyApplied {
            token: 4,
            version: 1
        }
    );
    assert_eq!(store.get(&once).await.unwrap().unwrap().value, b"final");

    // idempotency key: applied once, same answer
    let idem = format!("idem-{run}");
    let mut w = pg_write(&idem, 2, owner, "charge");
    w.idempotency_key = Some("charge-1".into());
    let first = store.write(&w).await.unwrap();
    assert_eq!(
        first,
        WriteOutcome::Accepted {
            token: 2,
            version: 1
        }
    );
    assert_eq!(store.write(&w).await.unwrap(), first);
    assert_eq!(store.get(&idem).await.unwrap().unwrap().version, 1);
    let mut reused = pg_write(&idem, 2, owner, "other");
    reused.idempotency_key = Some("charge-1".into());
    assert!(matches!(
        store.write(&reused).await,
        Err(fenced_resource::StoreError::InvalidArgument(e)) if e.field() == "idempotency_key"
    ));

    // another lock resource's token
    let bound = format!("bound-{run}");
    store
        .write(&pg_write(&bound, 3, owner, "kept"))
        .await
        .unwrap();
    let other = Write::new(
        bound.clone(),
        ResourceName::new("other-lock").unwrap(),
        Token::new(99).unwrap(),
        owner,
        "x",
    );
    assert!(matches!(
        store.write(&other).await.unwrap(),
        WriteOutcome::Rejected(r) if matches!(r.reason, fenced_resource::RejectReason::WrongResource { .. })
    ));

    // expected version
    let mut v = pg_write(&bound, 3, owner, "v2");
    v.expected_version = Some(5);
    assert!(matches!(
        store.write(&v).await.unwrap(),
        WriteOutcome::Rejected(r) if r.reason == fenced_resource::RejectReason::VersionMismatch { expected: 5, actual: 1 }
    ));
    assert_eq!(store.get(&bound).await.unwrap().unwrap().value, b"kept");

    // bad input: nothing written
    let bad = format!("bad-{run}");
    let big = pg_write(&bad, 1, owner, &"x".repeat(1024 * 1024 + 1));
    assert!(matches!(
        store.write(&big).await,
        Err(fenced_resource::StoreError::InvalidArgument(e)) if e.field() == "value"
    ));
    let huge_token = pg_write(&bad, u64::MAX, owner, "x");
    assert!(matches!(
        store.write(&huge_token).await,
        Err(fenced_resource::StoreError::InvalidArgument(e)) if e.field() == "token"
    ));
    assert_eq!(store.get(&bad).await.unwrap(), None);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn postgres_concurrent_writers_with_mixed_tokens() {
    let Some(url) = postgres_url() else { return };
    let key = format!("contended-{}", OwnerId::random());
    let owners: Arc<Vec<OwnerId>> = Arc::new((0..=30).map(|_| OwnerId::random()).collect());
    let mut tasks = Vec::new();
    for w in 0..4u64 {
        let (url, key, owners) = (url.clone(), key.clone(), owners.clone());
        tasks.push(tokio::spawn(async move {
            let mut store = PgFenceStore::connect(&url).await.unwrap();
            for i in 0..30u64 {
                let token = (i * 7 + w * 11) % 30 + 1;
                let mut write =
                    pg_write(&key, token, owners[token as usize], &format!("by {token}"));
                write.idempotency_key = Some(format!("w{w}-i{i}"));
                store.write(&write).await.unwrap();
            }
        }));
    }
    let reader = {
        let (url, key) = (url.clone(), key.clone());
        tokio::spawn(async move {
            let store = PgFenceStore::connect(&url).await.unwrap();
            let mut last = 0;
            for _ in 0..100 {
                if let Some(c) = store.get(&key).await.unwrap() {
                    assert!(
                        c.token >= last,
                        "fence went back from {last} to {}",
                        c.token
                    );
                    assert_eq!(c.value, format!("by {}", c.token).into_bytes());
                    last = c.token;
                }
            }
        })
    };
    for t in tasks {
        t.await.unwrap();
    }
    reader.await.unwrap();
    let store = PgFenceStore::connect(&url).await.unwrap();
    let c = store.get(&key).await.unwrap().unwrap();
    assert_eq!((c.token, c.value), (30, b"by 30".to_vec()));
}

// ---------------------------------------------------------------- exposed service

/// `--cluster` and the endpoints of `cluster`.
fn cluster_args(cluster: &Cluster) -> Vec<OsString> {
    vec!["--cluster".into(), cluster.endpoints().join(",").into()]
}

/// A lease on `resource` from the cluster: (token, owner id), kept while
/// the returned lease lives.
async fn lease(cluster: &Cluster, resource: &str) -> fenced_client::Lease {
    match cluster
        .client()
        .acquire(resource, Duration::from_secs(30))
        .await
        .unwrap()
    {
        fenced_client::Acquired::Granted(lease) => lease,
        fenced_client::Acquired::Held { current_token, .. } => {
            panic!("{resource}: held by {current_token}")
        }
    }
}

fn rejection(outcome: put_response::Outcome) -> fenced_proto::v1::PutRejected {
    match outcome {
        put_response::Outcome::Rejected(r) => r,
        other => panic!("not rejected: {other:?}"),
    }
}

/// The attacks of a caller that reaches the port: tokens the cluster never
/// issued (u64::MAX, one above its newest), the current token with a made-up
/// owner id (read from describe by anyone with `read`), and a squatter's
/// first write binding a key to another resource. Each is refused, nothing
/// is raised, and the real holder's writes land after them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_and_owners_the_cluster_did_not_issue_cannot_poison_a_key() {
    let cluster = Cluster::start(3).await;
    let svc = ServiceProc::start_with(cluster.dir.path(), &cluster_args(&cluster), None).await;
    let mut c = svc.client();
    let holder = lease(&cluster, "jobs/a").await;
    let (token, owner) = (holder.token().get(), holder.owner_id());
    let squatter = OwnerId::random();

    for (what, req) in [
        ("u64::MAX", put("jobs/a", u64::MAX, squatter, "poison")),
        (
            "above the newest",
            put("jobs/a", token + 1, squatter, "poison"),
        ),
        (
            "the current token, another owner",
            put("jobs/a", token, squatter, "poison"),
        ),
    ] {
        let r = rejection(c.put(req).await.unwrap().into_inner().outcome.unwrap());
        assert_eq!(r.reason, RejectReason::NotCurrent as i32, "{what}: {r:?}");
        assert!(r.message.contains("not applied"), "{what}: {}", r.message);
    }
    assert_eq!(
        get_token(&mut c, "jobs/a").await,
        None,
        "a refused write bound the key"
    );

    // A squatter's first write binds a key to its own resource: refused, so
    // the real holder's first write binds it.
    let mut squat = put("jobs/b", u64::MAX, squatter, "squat");
    squat.resource = b"jobs/elsewhere".to_vec();
    let r = rejection(c.put(squat).await.unwrap().into_inner().outcome.unwrap());
    assert_eq!(r.reason, RejectReason::NotCurrent as i32, "{r:?}");
    let b = lease(&cluster, "jobs/b").await;
    let (status, _) =
        put_status(&mut c, put("jobs/b", b.token().get(), b.owner_id(), "real")).await;
    assert_eq!(status, "accepted");
    assert_eq!(
        get_token(&mut c, "jobs/b").await,
        Some((b.token().get(), "jobs/b".into()))
    );

    // The real holder writes after all of them.
    assert_eq!(
        put_status(&mut c, put("jobs/a", token, owner, "real")).await,
        ("accepted".into(), token)
    );
    // Once released, its token is not current any more.
    holder.release().await.unwrap();
    let r = rejection(
        c.put(put("jobs/a", token, owner, "late"))
            .await
            .unwrap()
            .into_inner()
            .outcome
            .unwrap(),
    );
    assert_eq!(r.reason, RejectReason::NotCurrent as i32, "{r:?}");
    assert!(r.message.contains("RELEASED"), "{}", r.message);

    // fencectl: a refusal by the cluster check exits 3 with the reason.
    let out = Command::new(bin("fencectl"))
        .arg("--json")
        .args([
            "resource",
            "put",
            "jobs/a",
            "--token",
            &u64::MAX.to_string(),
        ])
        .args(["--owner-id", &squatter.to_string(), "--value", "x"])
        .args(["--endpoint", &svc.addr()])
        .output()
        .unwrap();
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{json} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(json["reason"], "not_current", "{json}");
    assert_eq!(get_token(&mut c, "jobs/a").await.unwrap().0, token);
    // Owner ids are never logged above debug.
    assert!(!svc.log().contains(&squatter.to_string()), "{}", svc.log());
}

/// Writes that arrive together are checked in shared ValidateTokens calls:
/// 64 concurrent writers make fewer calls than writes, and every write lands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writes_share_cluster_checks() {
    let (cluster, metrics) = Cluster::start_with_metrics(3, |_| {}).await;
    let mut args = cluster_args(&cluster);
    args.extend(["--current-calls-in-flight".into(), "1".into()]);
    let svc = ServiceProc::start_with(cluster.dir.path(), &args, None).await;
    let leases =
        fenced_tests::acquire_all(&cluster.client(), "batch/", 64, Duration::from_secs(60)).await;
    let before = lock_rpcs_ok(&metrics, "ValidateTokens").await;
    let mut tasks = Vec::new();
    for l in &leases {
        let mut c = svc.client();
        let req = put(l.resource(), l.token().get(), l.owner_id(), "v");
        tasks.push(tokio::spawn(async move { put_status(&mut c, req).await.0 }));
    }
    for t in tasks {
        assert_eq!(t.await.unwrap(), "accepted");
    }
    let calls = lock_rpcs_ok(&metrics, "ValidateTokens").await - before;
    assert!(
        (1..64).contains(&calls),
        "64 writes made {calls} ValidateTokens calls"
    );
}

/// TLS with client certificates and bearer tokens from the nodes' auth file
/// format: a put needs `lock` on the resource's prefix, a get `read`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn puts_need_lock_and_gets_read_on_the_resource_prefix() {
    let cluster = Cluster::start(3).await;
    let dir = cluster.dir.path().join("svc");
    std::fs::create_dir_all(&dir).unwrap();
    let pki = Pki::new(&dir.join("pki"));
    let (cert, key) = pki.server("resource");
    let (tokens, policy) = write_auth_files(
        &dir,
        &[
            ("reader-bot", "reader-secret", "reader"),
            ("writer-bot", "writer-secret", "writer"),
        ],
        "[roles.reader]\nread = [\"jobs/\"]\n\
         [roles.writer]\nlock = [\"jobs/\"]\nread = [\"jobs/\"]\n\
         [identities]\nreader = [\"reader\"]\nwriter = [\"writer\"]\n",
    );
    let mut args = cluster_args(&cluster);
    args.extend(
        [
            "--tls-cert".into(),
            cert.into_os_string(),
            "--tls-key".into(),
            key.into_os_string(),
            "--tls-ca".into(),
            pki.ca().into_os_string(),
            "--auth-tokens".into(),
            tokens.into(),
            "--auth-policy".into(),
            policy.into(),
        ]
        .into_iter(),
    );
    let svc = ServiceProc::start_with(&dir, &args, Some(pki.clone())).await;
    let holder = lease(&cluster, "jobs/paid").await;
    let write = put("jobs/paid", holder.token().get(), holder.owner_id(), "paid");
    let as_bearer = |token: &str, req: PutRequest| {
        let mut r = tonic::Request::new(req);
        r.metadata_mut()
            .insert("authorization", format!("Bearer {token}").parse().unwrap());
        r
    };

    // No credentials: refused, nothing written.
    let e = svc.client().put(write.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    let e = svc
        .client()
        .put(as_bearer("guessed", write.clone()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    // A read-only identity, by certificate or token: refused, naming the grant.
    let mut reader = FencedResourceClient::new(svc.channel(Some("reader")));
    let e = reader.put(write.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert!(e.message().contains("lock"), "{}", e.message());
    let e = svc
        .client()
        .put(as_bearer("reader-secret", write.clone()))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    assert_eq!(get_token(&mut reader, "jobs/paid").await, None);
    // A writer outside its prefix: refused.
    let e = FencedResourceClient::new(svc.channel(Some("writer")))
        .put(put("other/x", 1, OwnerId::random(), "x"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied, "{e:?}");
    // The writer, by certificate: lands; the reader reads it.
    let mut writer = FencedResourceClient::new(svc.channel(Some("writer")));
    assert_eq!(put_status(&mut writer, write.clone()).await.0, "accepted");
    assert_eq!(
        get_token(&mut reader, "jobs/paid").await,
        Some((holder.token().get(), "jobs/paid".into()))
    );
    // Unauthenticated gets are refused too.
    let e = svc
        .client()
        .get(GetRequest {
            key: b"jobs/paid".to_vec(),
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::Unauthenticated, "{e:?}");
    // fencectl with a bearer token: the writer's lands, the reader's exits 5.
    let fencectl = |token: &str| {
        Command::new(bin("fencectl"))
            .arg("--cacert")
            .arg(pki.ca())
            .args(["--auth-token", token, "resource", "put", "jobs/paid"])
            .args(["--token", &holder.token().get().to_string()])
            .args([
                "--owner-id",
                &holder.owner_id().to_string(),
                "--value",
                "again",
            ])
            .args(["--endpoint", &svc.addr()])
            .output()
            .unwrap()
    };
    let out = fencectl("reader-secret");
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = fencectl("writer-secret");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Plaintext off loopback is refused at start, naming the address and the
/// flags to add; without a cluster the service starts only when the
/// standalone mode is named, and then warns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_off_loopback_and_no_cluster_refuse_to_start_unless_named() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        Command::new(bin("fenced-resource"))
            .args(["serve", "--data-dir"])
            .arg(dir.path().join("data"))
            .args(args)
            .output()
            .unwrap()
    };
    let public = format!("0.0.0.0:{}", free_port());
    let out = run(&["--listen", &public, "--standalone-no-cluster-check"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains(&public) && stderr.contains("--tls-cert"),
        "{stderr}"
    );

    let local = format!("127.0.0.1:{}", free_port());
    let out = run(&["--listen", &local]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(
        stderr.contains("--cluster") && stderr.contains("--standalone-no-cluster-check"),
        "{stderr}"
    );

    // Named: it serves any token, and says so at start.
    let svc = ServiceProc::start(dir.path()).await;
    let mut c = svc.client();
    assert_eq!(
        put_status(&mut c, put("free", 9, OwnerId::random(), "v"))
            .await
            .0,
        "accepted"
    );
    assert!(
        svc.log().contains("--standalone-no-cluster-check"),
        "{}",
        svc.log()
    );
    assert!(svc.log().contains("WARN"), "{}", svc.log());
}
