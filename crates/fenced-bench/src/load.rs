//! The scenarios S1–S6: load generators that record latency per operation
//! type and check token order on every grant.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use fenced_bench::{check::TokenLedger, stats::Recorder};
use tokio::sync::Barrier;

use crate::systems::{Session, Target};

/// The outcome of one measured run.
#[derive(Debug, Clone)]
pub struct Run {
    /// Operations of the scenario's main kind (cycles, hand-offs, writes).
    pub ops: u64,
    pub elapsed: Duration,
    pub rec: Recorder,
    /// Named figures particular to the scenario.
    pub extra: BTreeMap<&'static str, f64>,
}

impl Run {
    pub fn ops_per_second(&self) -> f64 {
        self.ops as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Settings shared by the cycle runs.
#[derive(Debug, Clone, Copy)]
pub struct CycleLoad {
    pub clients: usize,
    pub duration: Duration,
    /// Cycles per second across all clients (open loop); `None`: closed loop.
    pub rate_per_second: Option<f64>,
    /// Resources each client cycles over; 0: a fresh resource every cycle.
    pub resources_per_client: usize,
    pub ttl: Duration,
}

/// A unique prefix for resource names of one run.
pub fn nonce() -> String {
    let id = uuid::Uuid::new_v4().simple().to_string();
    id[..8].to_string()
}

/// Connects `n` sessions concurrently.
async fn sessions(target: &Target, n: usize, lease_per_lock: bool) -> Result<Vec<Session>> {
    let mut tasks = Vec::new();
    for _ in 0..n {
        let t = target.clone();
        tasks.push(tokio::spawn(async move { t.session(lease_per_lock).await }));
    }
    let mut out = Vec::new();
    for t in tasks {
        out.push(t.await.context("session task")??);
    }
    Ok(out)
}

/// When each granted acquire was sent and when its grant arrived (S6).
pub type GrantTimes = Arc<std::sync::Mutex<Vec<(Instant, Instant)>>>;

/// Acquire+release cycles (S1, S2, S4's foreground, S6): each client on its
/// own resources, so every acquire must be granted.
pub async fn cycles(
    target: &Target,
    load: CycleLoad,
    ledger: Arc<TokenLedger>,
    label: &str,
    grant_times: Option<GrantTimes>,
) -> Result<Run> {
    let prefix = format!("{label}-{}", nonce());
    let sessions = sessions(target, load.clients, false).await?;
    let barrier = Arc::new(Barrier::new(load.clients + 1));
    let mut tasks = Vec::new();
    let interval = load
        .rate_per_second
        .map(|r| Duration::from_secs_f64(load.clients as f64 / r.max(1e-3)));
    for (client, mut session) in sessions.into_iter().enumerate() {
        let barrier = Arc::clone(&barrier);
        let ledger = Arc::clone(&ledger);
        let prefix = prefix.clone();
        let grant_times = grant_times.clone();
        tasks.push(tokio::spawn(async move {
            let mut rec = Recorder::new();
            let name = |i: u64| {
                if load.resources_per_client == 0 {
                    format!("{prefix}:{client}:{i}")
                } else {
                    format!("{prefix}:{client}:{}", i % load.resources_per_client as u64)
                }
            };
            // One warm-up cycle opens the connection before the clock starts.
            let warm = format!("{prefix}:{client}:warm");
            if let Ok(Some(g)) = session.acquire(&warm, load.ttl, Duration::ZERO).await {
                let _ = session.release(&warm, &g).await;
            }
            barrier.wait().await;
            let start = Instant::now();
            let end = start + load.duration;
            let mut i: u64 = 0;
            let mut done: u64 = 0;
            loop {
                // Open loop: each cycle has an intended start; latency counts
                // from it, so a stall is charged to every cycle it delayed
                // (no coordinated omission).
                let intended = match interval {
                    Some(iv) => {
                        // Spread clients over the interval.
                        let offset = iv.mul_f64(client as f64 / load.clients as f64);
                        let t = start + offset + iv.mul_f64(i as f64);
                        if t >= end {
                            break;
                        }
                        tokio::time::sleep_until(t.into()).await;
                        t
                    }
                    None => {
                        let now = Instant::now();
                        if now >= end {
                            break;
                        }
                        now
                    }
                };
                let resource = name(i);
                i += 1;
                let sent = Instant::now();
                let grant = match session.acquire(&resource, load.ttl, Duration::ZERO).await {
                    Ok(Some(g)) => g,
                    Ok(None) => {
                        rec.error(|| format!("{resource}: held, but only this client uses it"));
                        continue;
                    }
                    Err(e) => {
                        rec.error(|| format!("{e:#}"));
                        continue;
                    }
                };
                let granted = Instant::now();
                rec.record("acquire", granted - intended);
                ledger.record(&resource, grant.token)?;
                if let Some(times) = &grant_times {
                    times
                        .lock()
                        .unwrap_or_else(std::sync::PoisonError::into_inner)
                        .push((sent, granted));
                }
                match session.release(&resource, &grant).await {
                    Ok(true) => {}
                    Ok(false) => rec.error(|| format!("{resource}: release found no holder")),
                    Err(e) => rec.error(|| format!("{e:#}")),
                }
                let released = Instant::now();
                rec.record("release", released - granted);
                rec.record("cycle", released - intended);
                done += 1;
            }
            Ok::<_, anyhow::Error>((rec, done, Instant::now() - start))
        }));
    }
    barrier.wait().await;
    let mut rec = Recorder::new();
    let mut ops = 0;
    let mut elapsed = Duration::ZERO;
    for t in tasks {
        let (r, n, el) = t.await.context("client task")??;
        rec.merge(&r);
        ops += n;
        elapsed = elapsed.max(el);
    }
    Ok(Run {
        ops,
        elapsed,
        rec,
        extra: BTreeMap::new(),
    })
}

/// S3: `clients` fight for one resource with a blocking acquire.
pub async fn contended(
    target: &Target,
    clients: usize,
    duration: Duration,
    ledger: Arc<TokenLedger>,
) -> Result<Run> {
    let resource = format!("s3-{}-{clients}", nonce());
    let sessions = sessions(target, clients, false).await?;
    let barrier = Arc::new(Barrier::new(clients + 1));
    let ttl = Duration::from_secs(30);
    let wait = Duration::from_secs(10);
    let mut tasks = Vec::new();
    for mut session in sessions {
        let barrier = Arc::clone(&barrier);
        let ledger = Arc::clone(&ledger);
        let resource = resource.clone();
        tasks.push(tokio::spawn(async move {
            let mut rec = Recorder::new();
            let mut grants: u64 = 0;
            barrier.wait().await;
            let end = Instant::now() + duration;
            while Instant::now() < end {
                let sent = Instant::now();
                let grant = match session.acquire(&resource, ttl, wait).await {
                    Ok(Some(g)) => g,
                    Ok(None) => {
                        rec.record("wait", sent.elapsed());
                        continue;
                    }
                    Err(e) => {
                        rec.error(|| format!("{e:#}"));
                        continue;
                    }
                };
                let granted = Instant::now();
                rec.record("wait", granted - sent);
                ledger.record(&resource, grant.token)?;
                grants += 1;
                match session.release(&resource, &grant).await {
                    Ok(true) => {}
                    Ok(false) => rec.error(|| format!("{resource}: release found no holder")),
                    Err(e) => rec.error(|| format!("{e:#}")),
                }
                rec.record("release", granted.elapsed());
            }
            Ok::<_, anyhow::Error>((rec, grants))
        }));
    }
    barrier.wait().await;
    let started = Instant::now();
    let mut rec = Recorder::new();
    let mut per_client = Vec::new();
    for t in tasks {
        let (r, n) = t.await.context("client task")??;
        rec.merge(&r);
        per_client.push(n);
    }
    let elapsed = started.elapsed();
    let ops: u64 = per_client.iter().sum();
    let max = per_client.iter().copied().max().unwrap_or(0);
    let min = per_client.iter().copied().min().unwrap_or(0);
    let mut extra = BTreeMap::new();
    extra.insert("grants_max_per_client", max as f64);
    extra.insert("grants_min_per_client", min as f64);
    extra.insert(
        "fairness_max_over_min",
        if min == 0 {
            f64::INFINITY
        } else {
            max as f64 / min as f64
        },
    );
    Ok(Run {
        ops,
        elapsed,
        rec,
        extra,
    })
}

/// The TTL S4's leases are acquired with, before renewals take over.
const S4_SETUP_TTL: Duration = Duration::from_secs(60);

/// S4's background: `leases` live leases, each renewed every `ttl / 3`
/// from `workers` connections, until `stop` is set. Latency counts from
/// the moment each renewal was due.
pub async fn renew_load(
    target: &Target,
    leases: usize,
    workers: usize,
    ttl: Duration,
    ledger: Arc<TokenLedger>,
    stop: Arc<AtomicBool>,
    renewed: Arc<AtomicU64>,
) -> Result<tokio::task::JoinHandle<Result<Recorder>>> {
    let prefix = format!("s4-{}", nonce());
    let sessions = sessions(target, workers, true).await?;
    // Acquire everything first.
    let per_worker = leases.div_ceil(workers.max(1));
    // Leases are acquired for long enough to outlast the set-up (10,000
    // etcd leases take longer than a 6 s TTL to grant here, and an etcd
    // lease keeps the TTL it was granted with); the first renewal brings
    // fenced's and PostgreSQL's down to `ttl`. The renewal load is the same.
    let setup_ttl = ttl.max(S4_SETUP_TTL);
    let mut setups = Vec::new();
    for (w, mut session) in sessions.into_iter().enumerate() {
        let ledger = Arc::clone(&ledger);
        let prefix = prefix.clone();
        setups.push(tokio::spawn(async move {
            let mut held = Vec::new();
            for i in 0..per_worker {
                let resource = format!("{prefix}:{w}:{i}");
                match session
                    .acquire(&resource, setup_ttl, Duration::ZERO)
                    .await?
                {
                    Some(g) => {
                        ledger.record(&resource, g.token)?;
                        held.push((resource, g));
                    }
                    None => bail!("{resource}: held at set-up"),
                }
            }
            Ok::<_, anyhow::Error>((session, held))
        }));
    }
    let mut ready = Vec::new();
    for s in setups {
        ready.push(s.await.context("set-up task")??);
    }
    let period = ttl / 3;
    Ok(tokio::spawn(async move {
        let mut tasks = Vec::new();
        for (mut session, held) in ready {
            let stop = Arc::clone(&stop);
            let renewed = Arc::clone(&renewed);
            tasks.push(tokio::spawn(async move {
                let mut rec = Recorder::new();
                let n = held.len().max(1);
                let start = Instant::now();
                let mut round: u64 = 0;
                'outer: loop {
                    for (i, (resource, grant)) in held.iter().enumerate() {
                        let due = start
                            + period.mul_f64(round as f64)
                            + period.mul_f64(i as f64 / n as f64);
                        tokio::time::sleep_until(due.into()).await;
                        if stop.load(Ordering::Relaxed) {
                            break 'outer;
                        }
                        match session.renew(resource, grant, ttl).await {
                            Ok(true) => {
                                rec.record("renew", due.elapsed());
                                renewed.fetch_add(1, Ordering::Relaxed);
                            }
                            Ok(false) => {
                                rec.error(|| format!("{resource}: renew found the lease lost"))
                            }
                            Err(e) => rec.error(|| format!("{e:#}")),
                        }
                    }
                    round += 1;
                }
                // The leases are left to expire (TTL): releasing 10,000
                // one by one would only lengthen the run.
                drop(session);
                rec
            }));
        }
        let mut rec = Recorder::new();
        for t in tasks {
            rec.merge(&t.await.context("renew task")?);
        }
        Ok(rec)
    }))
}

/// ValidateToken under load (fenced only): `clients` callers, each holding
/// one lease, ask in a closed loop whether its token is still current
/// (a linearizable read, no log entry). `batch` above 1 sends
/// ValidateTokens of that many pairs per call; ops count pairs.
pub async fn validate(
    endpoints: &[String],
    clients: usize,
    batch: usize,
    duration: Duration,
) -> Result<Run> {
    let prefix = format!("validate-{}", nonce());
    let barrier = Arc::new(Barrier::new(clients + 1));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client =
            crate::systems::fenced_client(endpoints)?.with_call_timeout(Duration::from_secs(15));
        let barrier = Arc::clone(&barrier);
        let resource = format!("{prefix}:{c}");
        tasks.push(tokio::spawn(async move {
            let mut rec = Recorder::new();
            let owner = fenced_core::OwnerId::random();
            let token = match client
                .acquire_once(&resource, owner, Duration::from_secs(600), Duration::ZERO)
                .await
            {
                Ok(fenced_client::AcquireOutcome::Granted { token, .. }) => token,
                other => bail!("validate: {resource} not granted: {other:?}"),
            };
            let pairs: Vec<_> = (0..batch).map(|_| (resource.as_str(), token)).collect();
            barrier.wait().await;
            let end = Instant::now() + duration;
            let mut ops = 0u64;
            while Instant::now() < end {
                let sent = Instant::now();
                let current = if batch <= 1 {
                    client
                        .validate_token(&resource, token)
                        .await
                        .map(|v| vec![v.state])
                } else {
                    client
                        .validate_tokens(&pairs)
                        .await
                        .map(|r| r.results.iter().map(|v| v.state).collect())
                };
                match current {
                    Ok(states)
                        if states
                            .iter()
                            .all(|s| *s == fenced_proto::v1::TokenState::Current as i32) =>
                    {
                        rec.record("validate", sent.elapsed());
                        ops += states.len() as u64;
                    }
                    Ok(states) => {
                        rec.error(|| format!("{resource}: token {token} not current: {states:?}"))
                    }
                    Err(e) => rec.error(|| format!("{resource}: {e}")),
                }
            }
            let _ = client.release(&resource, owner, token).await;
            Ok((ops, rec))
        }));
    }
    barrier.wait().await;
    let start = Instant::now();
    let mut run = Run {
        ops: 0,
        elapsed: Duration::ZERO,
        rec: Recorder::new(),
        extra: BTreeMap::new(),
    };
    for t in tasks {
        let (ops, rec) = t.await.context("validate task")??;
        run.ops += ops;
        run.rec.merge(&rec);
    }
    run.elapsed = start.elapsed();
    Ok(run)
}

/// S4 on fenced as an application holds leases: `leases` leases spread over
/// `clients` [`fenced_client::Client`]s (each given every endpoint), each
/// client's leases in its session, which its keeper keeps alive in one
/// KeepAlive call per interval.
pub struct KeptLeases {
    clients: Vec<fenced_client::Client>,
    leases: Vec<fenced_client::Lease>,
}

/// Grants the leases (16 acquires in flight per client) and hands them to
/// their clients' keepers.
pub async fn keeper_load(
    target: &Target,
    leases: usize,
    clients: usize,
    ttl: Duration,
    ledger: Arc<TokenLedger>,
) -> Result<KeptLeases> {
    let Target::Fenced { endpoints } = target else {
        bail!("keeper_load: fenced only");
    };
    let prefix = format!("s4-{}", nonce());
    let clients = clients.max(1);
    let per_client = leases.div_ceil(clients);
    let mut setups = Vec::new();
    let mut all_clients = Vec::new();
    for c in 0..clients {
        let client = crate::systems::fenced_client(endpoints)?;
        all_clients.push(client.clone());
        let ledger = Arc::clone(&ledger);
        let prefix = prefix.clone();
        let n = per_client.min(leases.saturating_sub(c * per_client));
        setups.push(tokio::spawn(async move {
            let mut held = Vec::with_capacity(n);
            let mut taking = tokio::task::JoinSet::new();
            for i in 0..n {
                let client = client.clone();
                let resource = format!("{prefix}:{c}:{i}");
                taking.spawn(async move {
                    let got = client.acquire(&resource, ttl).await;
                    (resource, got)
                });
                while taking.len() >= 16 || (i + 1 == n && !taking.is_empty()) {
                    let Some(done) = taking.join_next().await else {
                        break;
                    };
                    let (resource, got) = done.context("acquire task")?;
                    match got.map_err(|e| anyhow::anyhow!("{resource}: {e}"))? {
                        fenced_client::Acquired::Granted(lease) => {
                            ledger.record(&resource, lease.token().get())?;
                            held.push(lease);
                        }
                        fenced_client::Acquired::Held { .. } => {
                            bail!("{resource}: held at set-up")
                        }
                    }
                }
            }
            Ok::<_, anyhow::Error>(held)
        }));
    }
    let mut all = Vec::with_capacity(leases);
    for s in setups {
        all.extend(s.await.context("set-up task")??);
    }
    Ok(KeptLeases {
        clients: all_clients,
        leases: all,
    })
}

impl KeptLeases {
    /// Leases renewed and renewal calls made so far, over every client.
    pub fn renewed_and_calls(&self) -> (u64, u64) {
        self.clients
            .iter()
            .map(|c| c.keeper_stats())
            .fold((0, 0), |(r, n), s| (r + s.renewed, n + s.calls))
    }

    /// Leases no longer held (lost, or past their local deadline).
    pub fn lost(&self) -> usize {
        self.leases.iter().filter(|l| l.check().is_err()).count()
    }

    /// Moves each renewal call's latency since the last take into `rec`
    /// as `renew`.
    pub fn take_latencies(&self, rec: &mut Recorder) {
        for c in &self.clients {
            for d in c.take_renewal_latencies() {
                rec.record("renew", d);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.leases.len()
    }

    /// Releases every lease (256 calls in flight), so the next scenario
    /// starts on a cluster without them.
    pub async fn release_all(self) {
        let mut releasing = tokio::task::JoinSet::new();
        for lease in self.leases {
            releasing.spawn(async move {
                let _ = lease.release().await;
            });
            while releasing.len() >= 256 {
                let _ = releasing.join_next().await;
            }
        }
        while releasing.join_next().await.is_some() {}
    }
}
