//! Floods, bounded in count and time: a node refuses what is beyond its
//! limits, keeps serving the clients it already serves, and stays inside a
//! memory budget.
//!
//! Memory budget: a debug-build node stays under [`RSS_BUDGET_KIB`] of
//! resident memory (VmRSS) through every flood here.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use fenced_core::OwnerId;
use fenced_proto::v1::{self, acquire_response, lock_client::LockClient, renew_response};
use fenced_tests::{http_get, Cluster, RunSettings, Within};
use tokio::{net::TcpStream, task::JoinSet};
use tonic::{transport::Channel, Code};

/// Floods run one at a time: two at once on a small machine would measure
/// each other.
static ONE_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// The most resident memory a node may use during a flood, KiB.
const RSS_BUDGET_KIB: u64 = 256 * 1024;

/// The value of one sample in node `addr`'s `/metrics`.
async fn metric(addr: &str, sample: &str) -> u64 {
    let (status, body) = http_get(addr, "/metrics").await;
    assert_eq!(status, 200);
    body.lines()
        .find_map(|l| l.strip_prefix(sample)?.strip_prefix(' ')?.parse().ok())
        .unwrap_or_else(|| panic!("{sample} not in /metrics:\n{body}"))
}

/// A status after which a client tries again: no answer yet, not a refusal.
fn is_retryable(s: &tonic::Status) -> bool {
    matches!(
        s.code(),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled
    )
}

fn acquire(resource: &str, owner: &OwnerId, wait_ms: u64) -> v1::AcquireRequest {
    v1::AcquireRequest {
        label: String::new(),
        resource: resource.as_bytes().to_vec(),
        owner_id: owner.as_bytes().to_vec(),
        ttl_ms: 60_000,
        wait_ms,
    }
}

/// A lease held by a client of its own, renewed on demand: the client
/// that must keep being served while another floods the node.
struct Bystander {
    lock: LockClient<Channel>,
    owner: OwnerId,
    token: u64,
}

impl Bystander {
    async fn start(cluster: &Cluster, leader: u64, resource: &str) -> Bystander {
        Self::take(cluster.lock_client(leader), resource).await
    }

    /// Takes a lease on `resource` over `lock`.
    async fn take(mut lock: LockClient<Channel>, resource: &str) -> Bystander {
        let owner = OwnerId::random();
        let reply = lock
            .acquire(acquire(resource, &owner, 0))
            .await
            .expect("the bystander's acquire")
            .into_inner();
        let Some(acquire_response::Outcome::Granted(g)) = reply.outcome else {
            panic!("the bystander is granted: {reply:?}");
        };
        Bystander {
            lock,
            owner,
            token: g.token,
        }
    }

    /// Renews on the bystander's own connection, trying again on
    /// UNAVAILABLE like any client (a leader change on a loaded machine);
    /// returns how long it took.
    async fn renew(&mut self, resource: &str) -> Duration {
        let started = Instant::now();
        let reply = loop {
            let mut req = tonic::Request::new(v1::RenewRequest {
                resource: resource.as_bytes().to_vec(),
                owner_id: self.owner.as_bytes().to_vec(),
                token: self.token,
                ttl_ms: 60_000,
            });
            req.set_timeout(Duration::from_secs(30));
            match self.lock.renew(req).await {
                Ok(reply) => break reply.into_inner(),
                Err(s) if is_retryable(&s) && started.elapsed() < Duration::from_secs(30) => {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
                Err(s) => panic!("the bystander's renew is not served: {s:?}"),
            }
        };
        assert!(
            matches!(reply.outcome, Some(renew_response::Outcome::Renewed(_))),
            "the bystander keeps its lease: {reply:?}"
        );
        started.elapsed()
    }
}

/// A three-node cluster with `env`, each node serving `/metrics`; its
/// metrics addresses and its leader.
async fn flood_cluster(settings: impl FnOnce(&mut RunSettings)) -> (Cluster, Vec<String>, u64) {
    let (cluster, metrics) = Cluster::start_with_metrics(3, settings).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    (cluster, metrics, leader)
}

/// A bystander on a thread and runtime of its own (a client process
/// apart from the flooding one): takes a lease on `resource` at `addr`,
/// then renews it every 200 ms until `stop`; returns the slowest renew.
fn bystander_apart(
    addr: String,
    resource: &'static str,
    stop: Arc<std::sync::atomic::AtomicBool>,
) -> std::thread::JoinHandle<Duration> {
    let (ready_tx, ready_rx) = std::sync::mpsc::channel();
    let handle = std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("the bystander's runtime");
        rt.block_on(async move {
            let channel = Channel::from_shared(format!("http://{addr}"))
                .unwrap()
                .connect_lazy();
            let mut bystander = Bystander::take(LockClient::new(channel), resource).await;
            ready_tx.send(()).expect("the test waits for the bystander");
            let mut slowest = Duration::ZERO;
            while !stop.load(Ordering::Relaxed) {
                slowest = slowest.max(bystander.renew(resource).await);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            slowest
        })
    });
    ready_rx
        .recv_timeout(Duration::from_secs(10))
        .expect("the bystander holds its lease");
    handle
}

/// Opens `n` connections to `addr`, `wave` at a time, and keeps them all.
async fn open_connections(addr: &str, n: usize, wave: usize) -> Vec<TcpStream> {
    let mut all = Vec::with_capacity(n);
    while all.len() < n {
        let mut set = JoinSet::new();
        for _ in 0..wave.min(n - all.len()) {
            let addr = addr.to_string();
            set.spawn(async move { TcpStream::connect(addr).await });
        }
        while let Some(r) = set.join_next().await {
            all.push(r.unwrap().expect("loopback connect"));
        }
    }
    all
}

/// How many of `conns` the node closed, once that number stopped moving
/// and reached `at_least` (the node accepts a backlog at its own pace), or
/// after 20 s.
async fn settle(conns: &[TcpStream], at_least: usize) -> usize {
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut closed = closed_by_peer(conns);
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let now = closed_by_peer(conns);
        if (now == closed && now >= at_least) || Instant::now() > deadline {
            return now;
        }
        closed = now;
    }
}

/// Sends the first byte of the HTTP/2 preface on each of `conns`: a
/// handshake the kernel left unfinished when the node's accept queue
/// overflowed completes with it, so the node sees every connection.
fn nudge(conns: &[TcpStream]) {
    for c in conns {
        let _ = c.try_write(b"P");
    }
}

/// How many of `conns` the far end has closed (end of stream or reset),
/// reading past what it sent first (its HTTP/2 settings).
fn closed_by_peer(conns: &[TcpStream]) -> usize {
    let mut buf = [0u8; 256];
    conns
        .iter()
        .filter(|c| loop {
            match c.try_read(&mut buf) {
                Ok(0) => break true,
                Ok(_) => continue,
                Err(e) => break e.kind() != std::io::ErrorKind::WouldBlock,
            }
        })
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_thousand_connections_are_refused_beyond_max_connections() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (cluster, metrics, leader) =
        flood_cluster(|s| s.max_connections = Some(Within::new(1000).unwrap())).await;
    let mut bystander = Bystander::start(&cluster, leader, "bystander").await;
    let started = Instant::now();

    let flood = open_connections(
        &cluster.nodes()[leader as usize - 1].client_addr(),
        10_000,
        500,
    )
    .await;
    let peer_flood = open_connections(&cluster.peer_addr(leader), 2_000, 500).await;
    // The leader keeps serving the client it serves, and keeps committing
    // (its connections to the followers hold their slots).
    let renew_took = bystander.renew("bystander").await;
    assert!(
        renew_took < Duration::from_secs(5),
        "renew took {renew_took:?}"
    );

    // Beyond 1000 open connections (the bystander's among them), every
    // new one is closed at once: wait for the node to have accepted the
    // whole backlog.
    nudge(&flood);
    nudge(&peer_flood);
    let closed = settle(&flood, 9_000).await;
    assert!(
        (9_001..=9_100).contains(&closed),
        "{closed} of 10000 flood connections closed with 1000 allowed"
    );
    let refused = metric(
        &metrics[leader as usize - 1],
        "fenced_limit_refusals_total{limit=\"max_connections\",port=\"client\"}",
    )
    .await;
    assert_eq!(refused, closed as u64, "each refusal is counted once");
    // On the peer port a connection takes no slot before its first bytes
    // route it: 2000 silent ones from one address keep at most their
    // source's share (64) pending, each newer one closing that source's
    // oldest, and the rest close at the routing timeout (3 s); none is
    // refused for max_connections, whose slots the followers keep.
    let peer_closed = settle(&peer_flood, 2_000).await;
    assert_eq!(peer_closed, 2_000, "silent peer connections still open");
    let leader_metrics = &metrics[leader as usize - 1];
    let evicted = metric(
        leader_metrics,
        "fenced_limit_refusals_total{limit=\"max_pending_handshakes_per_source\",port=\"peer\"}",
    )
    .await;
    assert!(
        (1..=2_000).contains(&evicted),
        "{evicted} of 2000 silent peer connections closed for their source's share"
    );
    let peer_refused = metric(
        leader_metrics,
        "fenced_limit_refusals_total{limit=\"max_connections\",port=\"peer\"}",
    )
    .await;
    assert_eq!(peer_refused, 0, "a silent peer connection took a slot");
    let rss = cluster.rss_kib(leader);
    eprintln!("leader RSS with 1000 connections held: {rss} KiB");
    assert!(rss < RSS_BUDGET_KIB, "leader RSS {rss} KiB over budget");

    // Closed connections give their slots back: a new client is served.
    drop(flood);
    drop(peer_flood);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let mut fresh = cluster.lock_client(leader);
        let reply = fresh
            .acquire(acquire("after-flood", &OwnerId::random(), 0))
            .await;
        if reply.is_ok() {
            break;
        }
        assert!(Instant::now() < deadline, "no slot freed: {reply:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bystander.renew("bystander").await;
    assert!(started.elapsed() < Duration::from_secs(60));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hundred_thousand_streams_are_served_without_starving_another_client() {
    let _serial = ONE_AT_A_TIME.lock().await;
    const CONNECTIONS: usize = 100;
    const STREAMS: usize = 1_000;
    // A debug build saturating both cores of a small machine, client and
    // three nodes together, delays heartbeats by more than the default
    // election timeout: a longer one keeps this test about streams.
    let (cluster, _, leader) = flood_cluster(|s| {
        s.max_concurrent_streams = Some(Within::new(100).unwrap());
        s.election_timeout_ms = Some(Within::new(3000).unwrap());
    })
    .await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let bystander = bystander_apart(
        cluster.nodes()[leader as usize - 1].client_addr(),
        "bystander",
        Arc::clone(&stop),
    );
    let held = OwnerId::random();
    cluster
        .lock_client(leader)
        .acquire(acquire("contended", &held, 0))
        .await
        .unwrap();

    let started = Instant::now();
    let ok = Arc::new(AtomicU64::new(0));
    let shed = Arc::new(AtomicU64::new(0));
    let mut flood = JoinSet::new();
    for _ in 0..CONNECTIONS {
        // One connection each, 1000 calls on it at once: a describe (a
        // local read) or an acquire of a held resource (a log entry).
        let channel = cluster.channel(leader);
        for i in 0..STREAMS {
            let mut lock = LockClient::new(channel.clone());
            let (ok, shed) = (Arc::clone(&ok), Arc::clone(&shed));
            flood.spawn(async move {
                let code = if i % 10 == 0 {
                    lock.acquire(acquire("contended", &OwnerId::random(), 0))
                        .await
                        .map(|_| ())
                } else {
                    lock.describe(v1::DescribeRequest {
                        resource: b"contended".to_vec(),
                        allow_stale: true,
                    })
                    .await
                    .map(|_| ())
                };
                match code {
                    Ok(()) => {
                        ok.fetch_add(1, Ordering::Relaxed);
                    }
                    // A clean "not now" (a leader change, a deadline) is an
                    // answer too; anything else is a failure.
                    Err(s) if is_retryable(&s) => {
                        shed.fetch_add(1, Ordering::Relaxed);
                    }
                    Err(s) => panic!("a flood call failed: {s:?}"),
                }
            });
        }
    }
    // The bystander is served while the flood runs.
    let mut peak_rss = 0;
    while !flood.is_empty() {
        peak_rss = peak_rss.max(cluster.rss_kib(leader));
        while let Some(done) = flood.try_join_next() {
            done.unwrap();
        }
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "{} of 100000 calls done in 60 s",
            ok.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let slowest = bystander
        .join()
        .expect("the bystander was served throughout");
    let (ok, shed) = (ok.load(Ordering::Relaxed), shed.load(Ordering::Relaxed));
    eprintln!(
        "100000 calls in {:?}: {ok} served, {shed} told to retry; slowest bystander renew {slowest:?}; peak leader RSS {peak_rss} KiB",
        started.elapsed()
    );
    // Every call was answered, and most of them served.
    assert_eq!(ok + shed, (CONNECTIONS * STREAMS) as u64);
    assert!(ok >= (CONNECTIONS * STREAMS) as u64 / 2, "only {ok} served");
    // Every call of the flood queues beside it: the renew waits its turn,
    // it is not starved. Starved, the renew sent as the flood began would be
    // served only after it: as long as the flood itself. Its turn comes
    // well before (13-15 s of a 25-32 s flood on 2 quiet cores in a debug
    // build, 24 s of 31 s with a build running beside it), so the bound is
    // relative to the flood, not a number of seconds this machine's load
    // moves.
    let flood_took = started.elapsed();
    assert!(
        slowest < flood_took.mul_f64(0.9),
        "a renew took {slowest:?} of the flood's {flood_took:?}: starved behind it"
    );
    assert!(
        peak_rss < RSS_BUDGET_KIB,
        "leader RSS {peak_rss} KiB over budget"
    );
}

/// What a flood of acquires got back.
#[derive(Debug, Default)]
struct Tally {
    granted: u64,
    refused: u64,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_client_asking_for_a_million_leases_gets_max_live_leases_and_no_more() {
    let _serial = ONE_AT_A_TIME.lock().await;
    const LIMIT: u64 = 10_000;
    const ASKED: u64 = 1_000_000;
    const IN_FLIGHT: u64 = 512;
    let (cluster, metrics, leader) = flood_cluster(|s| {
        s.max_live_leases = Some(Within::new(10_000).unwrap());
        s.max_waiters = Some(Within::new(1000).unwrap());
    })
    .await;
    let mut bystander = Bystander::start(&cluster, leader, "bystander").await;

    // One client, one owner id, one connection: distinct resources, 512
    // acquires in flight, until a million were asked or 30 s passed.
    let started = Instant::now();
    let flood_owner = OwnerId::random();
    let channel = cluster.channel(leader);
    let next = Arc::new(AtomicU64::new(0));
    let tally = Arc::new(std::sync::Mutex::new(Tally::default()));
    let mut flood = JoinSet::new();
    for _ in 0..IN_FLIGHT {
        let (next, tally, owner) = (Arc::clone(&next), Arc::clone(&tally), flood_owner);
        let mut lock = LockClient::new(channel.clone());
        flood.spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= ASKED || started.elapsed() > Duration::from_secs(30) {
                    return;
                }
                // Retried with the same owner id when no answer came: an
                // acquire is idempotent per owner, so each resource is
                // counted once, by its final answer.
                let answer = loop {
                    match lock
                        .acquire(acquire(&format!("flood-{i}"), &owner, 0))
                        .await
                    {
                        Err(s) if is_retryable(&s) => {
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                        answer => break answer,
                    }
                };
                match answer {
                    Ok(reply) => {
                        assert!(
                            matches!(
                                reply.get_ref().outcome,
                                Some(acquire_response::Outcome::Granted(_))
                            ),
                            "{reply:?}"
                        );
                        tally.lock().unwrap().granted += 1;
                    }
                    Err(s) => {
                        assert_eq!(s.code(), Code::ResourceExhausted, "{s:?}");
                        assert!(
                            s.message().starts_with("max_live_leases=10000"),
                            "{}",
                            s.message()
                        );
                        tally.lock().unwrap().refused += 1;
                    }
                }
            }
        });
    }
    let mut peak_rss = 0;
    while !flood.is_empty() {
        bystander.renew("bystander").await;
        for id in 1..=3 {
            peak_rss = peak_rss.max(cluster.rss_kib(id));
        }
        while let Some(done) = flood.try_join_next() {
            done.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let tally = std::mem::take(&mut *tally.lock().unwrap());
    // The bystander's lease counts: the flood got the rest.
    assert_eq!(tally.granted, LIMIT - 1, "{tally:?}");
    assert!(
        tally.refused >= 10_000,
        "too few refusals to matter: {tally:?}"
    );
    assert!(
        peak_rss < RSS_BUDGET_KIB,
        "a node's RSS {peak_rss} KiB over budget"
    );
    let counted = metric(
        &metrics[leader as usize - 1],
        "fenced_limit_refusals_total{limit=\"max_live_leases\",port=\"client\"}",
    )
    .await;
    assert_eq!(counted, tally.refused);
    eprintln!(
        "{} acquires asked in {:?}: {tally:?}; peak RSS {peak_rss} KiB",
        tally.granted + tally.refused,
        started.elapsed()
    );

    // Waiters in total are bounded the same way: 1500 waits on held
    // resources, 1000 are queued and 500 refused naming max_waiters.
    // A few connections carry them all (HTTP/2 streams): 1,500 connects at
    // once would overflow the listener's backlog and test the kernel instead.
    let channels: Vec<_> = (0..4).map(|_| cluster.lock_client(leader)).collect();
    let mut waits = JoinSet::new();
    for i in 0..1_500 {
        let mut lock = channels[i % channels.len()].clone();
        waits.spawn(async move {
            let res = format!("flood-{}", i % 10);
            match lock
                .acquire(acquire(&res, &OwnerId::random(), 60_000))
                .await
            {
                Err(s) if s.code() == Code::ResourceExhausted => {
                    assert!(
                        s.message().starts_with("max_waiters=1000"),
                        "{}",
                        s.message()
                    );
                }
                other => panic!("a queued waiter answered before its wait: {other:?}"),
            }
        });
    }
    let mut refused_waits = 0;
    let deadline = Instant::now() + Duration::from_secs(15);
    while refused_waits < 500 && Instant::now() < deadline {
        if let Ok(Some(done)) =
            tokio::time::timeout(Duration::from_millis(500), waits.join_next()).await
        {
            done.unwrap();
            refused_waits += 1;
        }
    }
    assert_eq!(refused_waits, 500);
    let mut queued = 0;
    for i in 0..10 {
        let d = cluster
            .lock_client(leader)
            .describe(v1::DescribeRequest {
                resource: format!("flood-{i}").into_bytes(),
                allow_stale: false,
            })
            .await
            .unwrap()
            .into_inner();
        queued += d.waiters;
    }
    assert_eq!(queued, 1_000);
    // The holder's renew still works with both bounds reached.
    bystander.renew("bystander").await;
    waits.abort_all();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_connection_is_closed_after_idle_timeout_and_an_idle_client_is_not() {
    let _serial = ONE_AT_A_TIME.lock().await;
    let (cluster, metrics, leader) = flood_cluster(|s| {
        s.http2_keepalive_interval_ms = Some(Within::new(1000).unwrap());
        s.http2_keepalive_timeout_ms = Some(Within::new(1000).unwrap());
        s.idle_timeout_ms = Some(Within::new(2000).unwrap());
    })
    .await;
    let addr = cluster.nodes()[leader as usize - 1].client_addr();
    let mut bystander = Bystander::start(&cluster, leader, "idle").await;
    // A connection that never sends a byte, and one that sent half a preface.
    let silent = TcpStream::connect(&addr).await.unwrap();
    let half = TcpStream::connect(&addr).await.unwrap();
    half.try_write(b"PRI * HTTP").unwrap();
    tokio::time::sleep(Duration::from_secs(4)).await;
    assert_eq!(
        closed_by_peer(&[silent, half]),
        2,
        "silent connections stay open"
    );
    let idle_closed = metric(
        &metrics[leader as usize - 1],
        "fenced_limit_refusals_total{limit=\"idle_timeout_ms\",port=\"client\"}",
    )
    .await;
    // Those two, and not the bystander's connection, idle as long.
    assert_eq!(idle_closed, 2, "{idle_closed} idle connections counted");
    // The client that sent nothing but keep-alive answers for 4 s is still
    // connected: its renew goes out on the same connection.
    let before = idle_closed;
    bystander.renew("idle").await;
    let after = metric(
        &metrics[leader as usize - 1],
        "fenced_limit_refusals_total{limit=\"idle_timeout_ms\",port=\"client\"}",
    )
    .await;
    assert_eq!(after, before, "a live client was cut off as idle");
}

/// Opens silent connections (no byte, not even a ClientHello) to `addr`
/// from the loopback addresses 127.0.0.2 to 127.0.0.201, `per_second` a
/// second, until `stop`, keeping the newest 5,000 open (more than a
/// port's whole connection budget); returns how many it opened. Each
/// source stays under its share: the port's whole pending budget is what
/// this floods.
async fn silent_flood(addr: String, per_second: u64, stop: Arc<AtomicBool>) -> u64 {
    let mut held = std::collections::VecDeque::new();
    let mut tick = tokio::time::interval(Duration::from_millis(10));
    let mut opened = 0u64;
    while !stop.load(Ordering::Relaxed) {
        tick.tick().await;
        for _ in 0..per_second / 100 {
            let source = std::net::Ipv4Addr::new(127, 0, 0, 2 + (opened % 200) as u8);
            let socket = tokio::net::TcpSocket::new_v4().unwrap();
            socket.bind((source, 0).into()).unwrap();
            if let Ok(c) = socket.connect(addr.parse().unwrap()).await {
                held.push_back(c);
                opened += 1;
                if held.len() > 5_000 {
                    held.pop_front();
                }
            }
        }
    }
    opened
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_cannot_shut_nodes_or_clients_out() {
    let _serial = ONE_AT_A_TIME.lock().await;
    // The attack: thousands of TCP connections to the leader's peer and
    // client ports that never send a ClientHello, from many addresses,
    // more than the whole connection budget (4096 per port), and more
    // arriving all the time. Without a pending budget of their own they
    // held every slot and a follower's new connection to the leader failed.
    let cluster = Cluster::start_tls(3, |_| {}).await;
    let leader = cluster.wait_for_leader(Duration::from_secs(10)).await;
    cluster.wait_for_convergence(Duration::from_secs(10)).await;
    let follower = (1..=3).find(|id| *id != leader).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let peer_flood = tokio::spawn(silent_flood(cluster.peer_addr(leader), 1_500, stop.clone()));
    let client_addr = cluster.nodes()[leader as usize - 1].client_addr();
    let client_flood = tokio::spawn(silent_flood(client_addr, 1_500, stop.clone()));
    // Let the floods pass the connection budget.
    tokio::time::sleep(Duration::from_secs(4)).await;

    // The follower has not talked to the leader over gRPC yet: its first
    // forwarded describe opens a new peer connection during the flood.
    // A new TLS client of the leader's client port: a new connection each.
    let mut failures = Vec::new();
    for i in 0..8 {
        let resource = format!("flooded-{i}").into_bytes();
        let via_follower = cluster
            .lock_client(follower)
            .describe(v1::DescribeRequest {
                resource: resource.clone(),
                allow_stale: false,
            })
            .await;
        if let Err(e) = via_follower {
            failures.push(format!("forwarded describe {i}: {e}"));
        }
        let direct = cluster
            .lock_client(leader)
            .describe(v1::DescribeRequest {
                resource,
                allow_stale: false,
            })
            .await;
        if let Err(e) = direct {
            failures.push(format!("new client's describe {i}: {e}"));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let opened = (peer_flood.await.unwrap(), client_flood.await.unwrap());
    eprintln!("silent connections opened (peer, client): {opened:?}");
    assert!(
        opened.0 > 4_096 && opened.1 > 4_096,
        "the flood never passed the connection budget: {opened:?}"
    );
    assert!(
        failures.is_empty(),
        "calls failed under the flood: {failures:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_sockets_cannot_keep_scrapes_out_of_metrics() {
    let _serial = ONE_AT_A_TIME.lock().await;
    // The metrics port served 16 connections and closed every other one:
    // 16 silent sockets kept every scrape and the status page out.
    let (cluster, metrics, leader) = flood_cluster(|_| {}).await;
    let addr = metrics[leader as usize - 1].clone();
    let stop = Arc::new(AtomicBool::new(false));
    let flood = tokio::spawn(silent_flood(addr.clone(), 500, Arc::clone(&stop)));
    tokio::time::sleep(Duration::from_secs(1)).await;
    for _ in 0..5 {
        let (status, body) = http_get(&addr, "/metrics").await;
        assert_eq!(status, 200, "a scrape under the flood: {body}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let opened = flood.await.unwrap();
    assert!(opened > 200, "the flood opened only {opened} connections");
    let evicted = metric(
        &addr,
        "fenced_limit_refusals_total{limit=\"max_pending_handshakes\",port=\"metrics\"}",
    )
    .await;
    assert!(
        evicted > 0,
        "no silent connection was closed for a newer one"
    );
    drop(cluster);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn handshaken_silent_connections_take_no_connection_slot() {
    let _serial = ONE_AT_A_TIME.lock().await;
    // The attack: TLS handshakes finished (a client certificate is optional
    // on the client port, so anyone can), then nothing sent. Until they
    // speak HTTP/2 they hold only pending slots: with 16 connections
    // allowed, 40 of them leave room for new clients.
    let cluster =
        Cluster::start_tls(1, |s| s.max_connections = Some(Within::new(16).unwrap())).await;
    let pki = cluster.pki.clone().unwrap();
    let addr = cluster.nodes()[0].client_addr();
    let (cert, key) = pki.client("silent");
    let mut silent = Vec::new();
    for _ in 0..40 {
        silent.push(
            fenced_tests::tls_connect(&addr, &pki.ca(), &cert, &key)
                .await
                .expect("a handshake"),
        );
    }
    for i in 0..3 {
        let reply = cluster
            .lock_client(1)
            .describe(v1::DescribeRequest {
                resource: format!("silent-{i}").into_bytes(),
                allow_stale: true,
            })
            .await;
        assert!(
            reply.is_ok(),
            "a new client beside 40 silent ones: {reply:?}"
        );
    }
    // They are closed once their time to speak has passed.
    tokio::time::sleep(Duration::from_secs(4)).await;
    let mut buf = [0u8; 16];
    for conn in &mut silent {
        let read = tokio::time::timeout(
            Duration::from_secs(2),
            tokio::io::AsyncReadExt::read(conn, &mut buf),
        )
        .await
        .expect("a silent connection still open after its time to speak");
        assert!(matches!(read, Ok(0) | Err(_)), "{read:?}");
    }
}
