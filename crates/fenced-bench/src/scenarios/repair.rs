//! A damaged node, measured (docs/BENCHMARKS.md, "A damaged node"): a
//! three-node cluster with many live leases; a follower is stopped, one bit
//! of its snapshot flipped, and it is started again. Timed: how long it
//! takes to refuse (detect), `fenced repair`, and the start until it votes
//! again, caught up. Checked: it refused by its checksum, every replica
//! then holds the same table, and with the leader stopped the repaired
//! node and the third elect a leader that still has every sampled lease
//! under its token.

use std::{
    process::Command,
    sync::{atomic::AtomicU64, Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};

use super::{million, Ctx};
use crate::{
    load as scenarios,
    sut::{fenced_bin, wait_until},
    systems,
    systems::Kind,
};

/// Clients filling the cluster.
const CLIENTS: usize = 64;

/// What the run measured.
struct Figures {
    leases: usize,
    detect_s: f64,
    prepare_s: f64,
    repair_s: f64,
    snapshot_mb: f64,
}

pub async fn run(cx: &mut Ctx<'_>) -> Result<()> {
    if cx.kind != Kind::Fenced || !cx.args.fenced_endpoints.is_empty() {
        return Ok(());
    }
    if let Some(c) = cx.sut.cluster.as_mut() {
        c.kill_all();
    }
    let n = usize::try_from(cx.args.repair_leases)?;
    let f = measure(&fenced_bin(cx.args)?, cx.dir, n).await?;
    let table = &mut *cx.table;
    table.put(
        &format!(
            "repair: damaged snapshot refused at start, {} leases (s)",
            f.leases
        ),
        Kind::Fenced,
        f.detect_s,
        false,
    );
    table.put(
        "repair: fenced repair (s)",
        Kind::Fenced,
        f.prepare_s,
        false,
    );
    table.put(
        &format!(
            "repair: start to voting again, caught up, {} leases (s)",
            f.leases
        ),
        Kind::Fenced,
        f.repair_s,
        false,
    );
    table.put(
        "repair: snapshot size (MB)",
        Kind::Fenced,
        f.snapshot_mb,
        false,
    );
    Ok(())
}

async fn measure(bin: &std::path::Path, dir: &std::path::Path, n: usize) -> Result<Figures> {
    let mut c = million::cluster_for(bin, dir, "repair", n)?;
    c.spec_mut()
        .set_env("FENCED_LOG", "warn,fenced_server::repair=info");
    // A snapshot soon after the fill (the fill's entries carry many grants
    // each): the damage is to a snapshot that holds every lease.
    c.spec_mut().set_env("FENCED_SNAPSHOT_LOGS", "200");
    c.start_all()?;
    let eps = c.endpoints();
    let client = systems::fenced_client(&eps)?;
    million::wait_for_grant(&client, Duration::from_secs(30)).await?;
    let samples: Arc<Mutex<Vec<(String, u64)>>> = Arc::default();
    let max_token = Arc::new(AtomicU64::new(0));
    let prefix = format!("repair-{}", scenarios::nonce());
    million::fill(&eps, &prefix, n, CLIENTS, &samples, &max_token).await?;
    let leader = c.wait_for_leader(Duration::from_secs(10)).await?;
    let damaged = (1..=3).find(|id| *id != leader).context("no follower")?;
    // Until the follower's snapshot holds every lease: grants push the log
    // on to the next snapshot.
    let waited = Instant::now();
    loop {
        let s = c.status(damaged, false).await;
        if s.as_ref()
            .is_some_and(|s| s.snapshot_index > 0 && s.live_leases >= n as u64)
        {
            let applied = s.map_or(0, |s| s.last_applied);
            let snapshot = c
                .status(damaged, false)
                .await
                .map_or(0, |s| s.snapshot_index);
            if snapshot + 200 >= applied {
                break;
            }
        }
        if waited.elapsed() > Duration::from_secs(120) {
            bail!("node {damaged} took no snapshot of the {n} leases within 120 s");
        }
        let _ = client
            .acquire_once(
                &format!("{prefix}-push-{}", scenarios::nonce()),
                fenced_client::OwnerId::random(),
                Duration::from_secs(3600),
                Duration::ZERO,
            )
            .await;
    }
    let data_dir = c.node(damaged)?.data_dir.clone();
    c.terminate(damaged, Duration::from_secs(30))?;
    let snapshot = data_dir.join("state/snapshot.bin");
    let mut bytes = std::fs::read(&snapshot).with_context(|| format!("{}", snapshot.display()))?;
    let snapshot_mb = bytes.len() as f64 / 1e6;
    let at = bytes.len() / 2;
    if let Some(b) = bytes.get_mut(at) {
        *b ^= 0x04;
    }
    std::fs::write(&snapshot, &bytes)?;
    drop(bytes);

    let started = Instant::now();
    c.start(damaged)?;
    let refused = loop {
        if let Some(status) = c.exited(damaged)? {
            break status;
        }
        if started.elapsed() > Duration::from_secs(120) {
            bail!("node {damaged} started on a damaged snapshot and did not refuse within 120 s");
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let detect_s = started.elapsed().as_secs_f64();
    let log = c.log_of(damaged);
    if refused.success() || !log.contains("damaged at offset") {
        bail!("node {damaged} did not refuse its damaged snapshot by its checksum ({refused}):\n{log}");
    }
    println!(
        "[repair] node {damaged} refused its damaged snapshot ({:.1} MB) after {detect_s:.3} s",
        snapshot_mb
    );

    let prepared = Instant::now();
    let out = Command::new(bin)
        .args(["repair", "--node-id", &damaged.to_string(), "--data-dir"])
        .arg(&data_dir)
        .output()?;
    if !out.status.success() {
        bail!("fenced repair: {}", String::from_utf8_lossy(&out.stderr));
    }
    let prepare_s = prepared.elapsed().as_secs_f64();

    let applied_then = client
        .status_of_each()
        .await
        .into_iter()
        .filter_map(|(_, s)| s.ok())
        .map(|s| s.last_applied)
        .max()
        .unwrap_or(0);
    c.start(damaged)?;
    let damaged_ep = c.node(damaged)?.client_addr();
    let only_damaged = systems::fenced_client([damaged_ep.as_str()])?;
    let repair_s = wait_until(
        Duration::from_secs(300),
        &format!("node {damaged} repaired"),
        || async {
            only_damaged.status().await.is_ok_and(|s| {
                !s.repairing && s.last_applied >= applied_then && s.live_leases >= n as u64
            })
        },
    )
    .await?
    .as_secs_f64();
    println!("[repair] node {damaged} voting again, caught up with {n} leases, {repair_s:.3} s after its start");

    // Every replica holds the same table, then the repaired node votes.
    let converged = c.wait_for_convergence(Duration::from_secs(60)).await?;
    if converged
        .windows(2)
        .any(|w| w[0].state_digest != w[1].state_digest)
    {
        bail!("replicas differ after the repair: {converged:?}");
    }
    c.terminate(leader, Duration::from_secs(30))?;
    let next = c.wait_for_leader(Duration::from_secs(30)).await?;
    let client = systems::fenced_client(&eps)?;
    let samples = samples
        .lock()
        .map_err(|_| anyhow::anyhow!("samples"))?
        .clone();
    for (name, token) in &samples {
        let d = client.describe(name).await?;
        if !d.held || d.last_token != *token {
            bail!(
                "{name}: held {} token {} after the repair, expected token {token}",
                d.held,
                d.last_token
            );
        }
    }
    println!(
        "[repair] with the leader (node {leader}) stopped, node {next} leads; {} sampled leases held under their tokens",
        samples.len()
    );
    c.kill_all();
    Ok(Figures {
        leases: n,
        detect_s,
        prepare_s,
        repair_s,
        snapshot_mb,
    })
}
