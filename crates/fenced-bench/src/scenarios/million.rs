//! The capacity of one group: a three-node cluster filled with many live
//! leases (docs/SCALING.md), its memory, and a restart of the whole
//! cluster with them.

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use fenced_client::{AcquireOutcome, Client, ClientError, OwnerId, Token};
use fenced_proto::v1::{StatusResponse, TokenState};
use fenced_testkit::Within;

use super::Ctx;
use crate::{
    load as scenarios, procs,
    sut::fenced_bin,
    systems::{self, Kind},
};

/// Every this many leases filled, one is kept as a sample to check after
/// the restart (at least one, at most about 2,000).
fn sample_every(n: usize) -> u64 {
    (n as u64 / 2_000).max(1)
}

/// How long the leases are taken for: the longest TTL a node allows by
/// default, longer than any run.
const TTL: Duration = Duration::from_secs(3600);

/// What the run measured.
pub struct Figures {
    pub leases: usize,
    pub fill_s: f64,
    /// Elections while the leases were taken, the nodes snapshotting the
    /// table as it grew, and until they settled: none should happen.
    pub fill_elections: u64,
    pub rss_mb: Vec<f64>,
    pub peak_rss_mb: Vec<f64>,
    pub shutdown_s: f64,
    pub serving_s: f64,
    pub all_loaded_s: f64,
    pub rss_after_restart_mb: Vec<f64>,
    /// RSS ten seconds later: what the load's freed memory leaves once the
    /// allocator has had time to return it.
    pub rss_settled_mb: Vec<f64>,
}

/// How long after the restart's first RSS sample the second is taken.
const SETTLE: Duration = Duration::from_secs(10);

fn mb(bytes: Option<u64>) -> f64 {
    bytes.map_or(f64::NAN, |b| b as f64 / 1e6)
}

/// Each process's resident memory, in MB.
fn resident_mb(pids: &[u32]) -> Vec<f64> {
    pids.iter().map(|p| mb(procs::rss_bytes(*p))).collect()
}

fn list(v: &[f64]) -> String {
    v.iter()
        .map(|x| format!("{x:.1}"))
        .collect::<Vec<_>>()
        .join("/")
}

pub async fn run(cx: &mut Ctx<'_>) -> Result<()> {
    if cx.kind != Kind::Fenced || !cx.args.fenced_endpoints.is_empty() {
        return Ok(());
    }
    if let Some(c) = cx.sut.cluster.as_mut() {
        c.kill_all();
    }
    let (args, table) = (cx.args, &mut *cx.table);
    let out = &mut *cx.out;
    let n = usize::try_from(args.million_leases)?;
    let clients = usize::try_from(args.million_clients)?;
    let f = measure(args, cx.dir, n, clients).await?;
    let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
    table.put(
        &format!("million: fill {n} leases (s)"),
        Kind::Fenced,
        f.fill_s,
        false,
    );
    table.put(
        &format!("million: max node RSS with {n} leases (MB)"),
        Kind::Fenced,
        max(&f.rss_mb),
        false,
    );
    table.put(
        "million: max node peak RSS (MB)",
        Kind::Fenced,
        max(&f.peak_rss_mb),
        false,
    );
    table.put(
        "million: SIGTERM of the three nodes (s)",
        Kind::Fenced,
        f.shutdown_s,
        false,
    );
    table.put(
        "million: restart to serving (s)",
        Kind::Fenced,
        f.serving_s,
        false,
    );
    table.put(
        "million: restart to every node loaded (s)",
        Kind::Fenced,
        f.all_loaded_s,
        false,
    );
    table.put(
        "million: max node RSS after restart (MB)",
        Kind::Fenced,
        max(&f.rss_after_restart_mb),
        false,
    );
    table.put(
        "million: max node RSS 10 s after restart (MB)",
        Kind::Fenced,
        max(&f.rss_settled_mb),
        false,
    );
    if max(&f.rss_mb) > 400.0 {
        out.failures.push(format!(
            "million: a node used {:.1} MB with {} leases (target 400 MB)",
            max(&f.rss_mb),
            f.leases
        ));
    }
    table.put(
        "million: elections while filling",
        Kind::Fenced,
        f.fill_elections as f64,
        false,
    );
    if f.fill_elections > 0 {
        out.failures.push(format!(
            "million: {} election(s) while {} leases were taken and snapshotted (target: none)",
            f.fill_elections, f.leases
        ));
    }
    if f.serving_s > 5.0 {
        out.failures.push(format!(
            "million: the restarted cluster served after {:.3} s (target 5 s)",
            f.serving_s
        ));
    }
    Ok(())
}

/// Fills a fresh cluster of `bin` with `n` live leases from `clients`
/// clients, measures each node's memory, restarts every node (SIGTERM,
/// then start) and times until the cluster serves again: a new grant
/// succeeds and a sampled lease is described as held with its token. Then
/// checks every sampled lease and that the next token is above all.
async fn measure(
    args: &crate::Args,
    dir: &std::path::Path,
    n: usize,
    clients: usize,
) -> Result<Figures> {
    let mut c = cluster_for(&fenced_bin(args)?, dir, "million", n)?;
    crate::sut::use_fenced_settings(args, &mut c);
    // The start-up's own timings (snapshot loaded, log replayed) are info.
    c.spec_mut().set_env(
        "FENCED_LOG",
        "warn,fenced_server::state_machine=info,fenced_server::node=info,fenced_server::replication::election=info",
    );
    c.start_all()?;
    let eps = c.endpoints();
    let client = systems::fenced_client(&eps)?;
    wait_for_grant(&client, Duration::from_secs(30)).await?;
    let term_before = highest_term(&client.status_of_each().await);

    let prefix = format!("million-{}", scenarios::nonce());
    let samples: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let max_token = Arc::new(AtomicU64::new(0));
    let fill_started = Instant::now();
    fill(&eps, &prefix, n, clients, &samples, &max_token).await?;
    let fill_s = fill_started.elapsed().as_secs_f64();
    println!(
        "[million] {n} live leases acquired in {fill_s:.1} s from {clients} clients ({:.0} grants/s)",
        n as f64 / fill_s
    );
    // Let snapshots being built finish and the followers catch up.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let statuses = client.status_of_each().await;
    let fill_elections = highest_term(&statuses).saturating_sub(term_before);
    println!(
        "[million] elections while filling and snapshotting: {fill_elections} (term {term_before} before)"
    );
    for (ep, s) in &statuses {
        let s = s
            .as_ref()
            .map_err(|e| anyhow::anyhow!("status of {ep}: {e}"))?;
        println!(
            "[million] node {ep}: live leases {}, last log index {}, applied {}",
            s.live_leases, s.last_log_index, s.last_applied
        );
    }
    let pids = c.pids();
    let rss_mb = resident_mb(&pids);
    let peak_rss_mb: Vec<f64> = pids.iter().map(|p| mb(procs::peak_rss_bytes(*p))).collect();
    println!(
        "[million] RSS per node {} MB with {n} leases (peak {} MB; target 400 MB)",
        list(&rss_mb),
        list(&peak_rss_mb)
    );

    // Restart the whole cluster: SIGTERM to every node, then start them.
    let stopping = Instant::now();
    for id in 1..=3 {
        let (status, took) = c.terminate(id, Duration::from_secs(60))?;
        println!(
            "[million] node {id} stopped by SIGTERM in {:.3} s ({status})",
            took.as_secs_f64()
        );
    }
    let shutdown_s = stopping.elapsed().as_secs_f64();
    let restarted = Instant::now();
    c.start_all()?;
    let samples = samples
        .lock()
        .map_err(|_| anyhow::anyhow!("samples"))?
        .clone();
    let (probe_name, probe_token) = loop {
        if restarted.elapsed() > Duration::from_secs(120) {
            bail!("the restarted cluster did not serve within 120 s");
        }
        if let Some(served) = serves(&eps, &samples).await {
            break served;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let serving_s = restarted.elapsed().as_secs_f64();
    println!(
        "[million] whole cluster restarted: serving (a grant, a held lease described with its token) after {serving_s:.3} s (target 5 s)"
    );
    // Every node has the leases back (followers load their snapshot too).
    let client = systems::fenced_client(&eps)?;
    loop {
        let st = client.status_of_each().await;
        if st.iter().all(|(_, s)| {
            s.as_ref()
                .is_ok_and(|s| s.live_leases >= n as u64 && s.leader_id != 0)
        }) {
            break;
        }
        if restarted.elapsed() > Duration::from_secs(120) {
            bail!("not every node had its {n} leases back within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let all_loaded_s = restarted.elapsed().as_secs_f64();
    println!("[million] every node reports {n} live leases and a leader after {all_loaded_s:.3} s");

    verify(&client, &samples, &max_token, &probe_name, probe_token).await?;
    let rss_after_restart_mb = resident_mb(&c.pids());
    println!(
        "[million] RSS per node after the restart {} MB",
        list(&rss_after_restart_mb)
    );
    tokio::time::sleep(SETTLE).await;
    let rss_settled_mb = resident_mb(&c.pids());
    println!(
        "[million] RSS per node {} s after that {} MB",
        SETTLE.as_secs(),
        list(&rss_settled_mb)
    );
    for id in 1..=3 {
        c.terminate(id, Duration::from_secs(60))?;
    }
    Ok(Figures {
        leases: n,
        fill_s,
        fill_elections,
        rss_mb,
        peak_rss_mb,
        shutdown_s,
        serving_s,
        all_loaded_s,
        rss_after_restart_mb,
        rss_settled_mb,
    })
}

/// A three-node cluster of `bin` in `dir/name`, not started, whose table
/// takes `n` live leases and room to spare.
pub(super) fn cluster_for(
    bin: &std::path::Path,
    dir: &std::path::Path,
    name: &str,
    n: usize,
) -> Result<fenced_testkit::Cluster> {
    let sub = dir.join(name);
    std::fs::create_dir_all(&sub)?;
    let mut c = procs::fenced_cluster(bin, &sub, false)?;
    let leases = u64::try_from(n)?.saturating_add(10_000);
    c.spec_mut().settings.max_live_leases =
        Some(Within::new(leases).context("the scenario's lease count")?);
    Ok(c)
}

/// The highest Raft term among the nodes' statuses (each election raises it).
fn highest_term(statuses: &[(String, Result<StatusResponse, ClientError>)]) -> u64 {
    statuses
        .iter()
        .filter_map(|(_, s)| s.as_ref().ok().map(|s| s.term))
        .max()
        .unwrap_or(0)
}

pub(super) async fn wait_for_grant(client: &Client, within: Duration) -> Result<()> {
    let started = Instant::now();
    loop {
        let name = format!("million-start-{}", scenarios::nonce());
        let attempt = tokio::time::timeout(
            Duration::from_secs(2),
            client.acquire_once(&name, OwnerId::random(), TTL, Duration::ZERO),
        )
        .await;
        let last = match attempt {
            Ok(Ok(AcquireOutcome::Granted { .. })) => return Ok(()),
            Ok(Ok(other)) => format!("{other:?}"),
            Ok(Err(e)) => e.to_string(),
            Err(_) => "timed out".to_string(),
        };
        if started.elapsed() > within {
            bail!("no grant within {within:?} of the start (last: {last})");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub(super) async fn fill(
    eps: &[String],
    prefix: &str,
    n: usize,
    clients: usize,
    samples: &Arc<Mutex<Vec<(String, u64)>>>,
    max_token: &Arc<AtomicU64>,
) -> Result<()> {
    let next = Arc::new(AtomicU64::new(0));
    let every = sample_every(n);
    let progress_started = Instant::now();
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let client = systems::fenced_client(eps)?;
        let next = Arc::clone(&next);
        let samples = Arc::clone(samples);
        let max_token = Arc::clone(max_token);
        let prefix = prefix.to_string();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n as u64 {
                    return Ok::<_, anyhow::Error>(());
                }
                if i > 0 && i.is_multiple_of(100_000) {
                    println!(
                        "[million] {i} leases after {:.1} s",
                        progress_started.elapsed().as_secs_f64()
                    );
                }
                let r = format!("{prefix}:{i:08}");
                let token = match client
                    .acquire_once(&r, OwnerId::random(), TTL, Duration::ZERO)
                    .await
                    .map_err(|e| anyhow::anyhow!("acquire {r}: {e}"))?
                {
                    AcquireOutcome::Granted { token, .. } => token,
                    other => bail!("{r}: not granted: {other:?}"),
                };
                max_token.fetch_max(token.get(), Ordering::Relaxed);
                if i.is_multiple_of(every) {
                    samples
                        .lock()
                        .map_err(|_| anyhow::anyhow!("samples"))?
                        .push((r, token.get()));
                }
            }
        }));
    }
    for t in tasks {
        t.await.context("fill task")??;
    }
    Ok(())
}

/// Whether the cluster serves: a new resource is granted and the first
/// sample is described as held with its token. The probe's name and token.
async fn serves(eps: &[String], samples: &[(String, u64)]) -> Option<(String, u64)> {
    let client = systems::fenced_client(eps).ok()?;
    let (name, token) = samples.first()?;
    let d = tokio::time::timeout(Duration::from_millis(500), client.describe(name))
        .await
        .ok()?
        .ok()?;
    if !(d.held && d.last_token == *token) {
        return None;
    }
    let probe = format!("million-probe-{}", scenarios::nonce());
    let granted = tokio::time::timeout(
        Duration::from_millis(500),
        client.acquire_once(&probe, OwnerId::random(), TTL, Duration::ZERO),
    )
    .await
    .ok()?
    .ok()?;
    match granted {
        AcquireOutcome::Granted { token, .. } => Some((probe, token.get())),
        _ => None,
    }
}

/// Every sampled lease is still held with its token, and the token granted
/// after the restart is above every token granted before it.
async fn verify(
    client: &Client,
    samples: &[(String, u64)],
    max_token: &AtomicU64,
    probe: &str,
    probe_token: u64,
) -> Result<()> {
    let max = max_token.load(Ordering::Relaxed);
    if probe_token <= max {
        bail!("{probe} was granted token {probe_token} after the restart, not above {max}");
    }
    for chunk in samples.chunks(200) {
        let checks = chunk
            .iter()
            .map(|(r, t)| Ok((r.as_str(), Token::new(*t)?)))
            .collect::<Result<Vec<_>, fenced_core::InvalidArgument>>()
            .map_err(|e| anyhow::anyhow!("sampled token: {e}"))?;
        let answer = client
            .validate_tokens(&checks)
            .await
            .map_err(|e| anyhow::anyhow!("validate: {e}"))?;
        for ((r, t), v) in chunk.iter().zip(&answer.results) {
            if v.state != TokenState::Current as i32 || v.current_token != *t {
                bail!(
                    "{r}: token {t} after the restart is {:?} with current token {}",
                    TokenState::try_from(v.state),
                    v.current_token
                );
            }
        }
        if answer.results.len() != chunk.len() {
            bail!(
                "validate answered {} of {} pairs",
                answer.results.len(),
                chunk.len()
            );
        }
    }
    for (r, t) in samples.iter().step_by(50) {
        let d = client
            .describe(r)
            .await
            .map_err(|e| anyhow::anyhow!("describe {r}: {e}"))?;
        if !d.held || d.last_token != *t {
            bail!(
                "{r}: described as held={} last_token={} after the restart, not held with {t}",
                d.held,
                d.last_token
            );
        }
    }
    println!(
        "[million] after the restart: {} sampled leases held with their tokens; the next token {probe_token} is above every earlier one ({max})",
        samples.len()
    );
    Ok(())
}
