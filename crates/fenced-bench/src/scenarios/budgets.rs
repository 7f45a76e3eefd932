//! budgets (fenced only, on a cluster of its own): memory with many live
//! leases, start-up, restart (docs/DESIGN.md §8).

use std::{
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};

use super::Ctx;
use crate::{
    load, procs,
    report::{Outcome, Table},
    sut::{fenced_bin, fenced_leader_first, target_for, wait_until},
    systems::{self, Kind, Target},
    Args,
};

pub async fn run(cx: &mut Ctx<'_>) -> Result<()> {
    if cx.kind != Kind::Fenced || !cx.args.fenced_endpoints.is_empty() {
        return Ok(());
    }
    // A fresh cluster of its own: stop this one first.
    if let Some(c) = cx.sut.cluster.as_mut() {
        c.kill_all();
    }
    budgets(cx.args, cx.dir, cx.table, cx.out).await
}

/// docs/DESIGN.md §8: memory with many live leases, start-up, restart.
async fn budgets(
    args: &Args,
    dir: &std::path::Path,
    table: &mut Table,
    out: &mut Outcome,
) -> Result<()> {
    let bdir = dir.join("budgets");
    std::fs::create_dir_all(&bdir)?;
    let mut c = procs::fenced_cluster(&fenced_bin(args)?, &bdir, false)?;
    let started = Instant::now();
    c.start_all()?;
    let eps = c.endpoints();
    // Each node serves (answers Status) once it is up.
    let mut serve_s: f64 = 0.0;
    for e in &eps {
        let client = systems::fenced_client([e.as_str()])?;
        wait_until(Duration::from_secs(10), "empty node serving", || {
            let client = client.clone();
            async move {
                !client
                    .status_of_each()
                    .await
                    .iter()
                    .any(|(_, s)| s.is_err())
            }
        })
        .await?;
        serve_s = serve_s.max(started.elapsed().as_secs_f64());
    }
    c.wait_for_leader(Duration::from_secs(20)).await?;
    let first_grant = started.elapsed().as_secs_f64();
    println!(
        "[fenced] budgets: empty nodes serve after {serve_s:.3} s (bound 1 s); leader elected after {first_grant:.3} s"
    );
    table.put(
        "budget: empty node serves after (s)",
        Kind::Fenced,
        serve_s,
        false,
    );
    if serve_s > 1.0 {
        out.failures.push(format!(
            "start-up: an empty node served after {serve_s:.3} s (bound 1 s)"
        ));
    }
    let (leader_first, _) = fenced_leader_first(&eps).await?;
    let target = Target::Fenced {
        endpoints: leader_first,
    };
    let rss_before: Vec<u64> = c
        .pids()
        .iter()
        .filter_map(|p| procs::rss_bytes(*p))
        .collect();
    let n = args.budget_leases;
    let load_start = Instant::now();
    fill(&target, n).await?;
    println!(
        "[fenced] budgets: {n} live leases acquired in {:.1} s",
        load_start.elapsed().as_secs_f64()
    );
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_after: Vec<u64> = c
        .pids()
        .iter()
        .filter_map(|p| procs::rss_bytes(*p))
        .collect();
    let max_after = rss_after.iter().copied().max().unwrap_or(0);
    let per_lease = rss_after
        .iter()
        .zip(&rss_before)
        .map(|(a, b)| a.saturating_sub(*b))
        .max()
        .unwrap_or(0) as f64
        / n.max(1) as f64;
    let client = systems::fenced_client(&eps)?;
    let statuses = client.status_of_each().await;
    let log_len = statuses
        .iter()
        .filter_map(|(_, s)| s.as_ref().ok())
        .map(|s| s.last_log_index)
        .max()
        .unwrap_or(0);
    println!(
        "[fenced] budgets: RSS per node {} MB with {n} leases (bound 150 MB); {per_lease:.0} bytes per lease; log index {log_len}",
        rss_after.iter().map(|r| format!("{:.1}", *r as f64 / 1e6)).collect::<Vec<_>>().join("/"),
    );
    table.put(
        &format!("budget: max node RSS with {n} leases (MB)"),
        Kind::Fenced,
        max_after as f64 / 1e6,
        false,
    );
    table.put(
        "budget: memory per lease (bytes)",
        Kind::Fenced,
        per_lease,
        false,
    );
    if max_after > 150_000_000 {
        out.failures.push(format!(
            "memory: a node used {:.1} MB with {n} leases (bound 150 MB)",
            max_after as f64 / 1e6
        ));
    }
    // Restart the whole cluster (kill -9) and time until every node has
    // the leases back and a new grant succeeds.
    c.kill_all();
    let restarted = Instant::now();
    c.start_all()?;
    let eps2 = eps.clone();
    wait_until(Duration::from_secs(30), "restart", || {
        let eps = eps2.clone();
        async move {
            let Ok(client) = systems::fenced_client(&eps) else {
                return false;
            };
            let st = client.status_of_each().await;
            st.iter().all(|(_, s)| {
                s.as_ref()
                    .map(|s| s.live_leases >= n as u64 && s.leader_id != 0)
                    .unwrap_or(false)
            })
        }
    })
    .await?;
    let mut session = target_for(&eps).await?.session(false).await?;
    let probe = format!("budget-probe-{}", load::nonce());
    session
        .acquire(&probe, Duration::from_secs(10), Duration::ZERO)
        .await?
        .context("probe held after restart")?;
    let restart_s = restarted.elapsed().as_secs_f64();
    println!("[fenced] budgets: restart with {n} leases and log index {log_len}: serving (all leases back, a grant) after {restart_s:.3} s (bound 5 s)");
    table.put(
        &format!("budget: restart with {n} leases, serving after (s)"),
        Kind::Fenced,
        restart_s,
        false,
    );
    if restart_s > 5.0 {
        out.failures.push(format!(
            "restart: serving after {restart_s:.3} s (bound 5 s)"
        ));
    }
    c.kill_all();
    Ok(())
}

/// Acquires `n` fresh leases for an hour from 64 clients.
async fn fill(target: &Target, n: usize) -> Result<()> {
    let clients = 64;
    let prefix = format!("budget-{}", load::nonce());
    let next = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..clients {
        let mut s = target.session(false).await?;
        let next = Arc::clone(&next);
        let prefix = prefix.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n as u64 {
                    return Ok::<_, anyhow::Error>(());
                }
                let r = format!("{prefix}:{i}");
                s.acquire(&r, Duration::from_secs(3600), Duration::ZERO)
                    .await?
                    .with_context(|| format!("{r} held"))?;
            }
        }));
    }
    for t in tasks {
        t.await.context("fill task")??;
    }
    Ok(())
}
