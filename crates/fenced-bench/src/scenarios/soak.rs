//! The soak (docs/BENCHMARKS.md, "Soak"): a three-node cluster under a
//! steady load whose live state stays bounded (short leases on a fixed set
//! of resources, half released, half left to run out), with a fault every
//! fifteen seconds (a node paused past the election timeout, in turn), for
//! `--soak-s` seconds. Every five seconds each node's RSS, open files,
//! threads and data directory size are sampled beside its live leases; the
//! run fails on growth the live state does not explain
//! ([`fenced_bench::soak::leaks`]) and on any grant out of token order.

use std::{
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::Result;
use fenced_bench::soak::{self, Sample, Slack};
use fenced_client::{AcquireOutcome, OwnerId};

use super::Ctx;
use crate::{procs, sut::fenced_bin, systems, systems::Kind};

const SAMPLE_EVERY: Duration = Duration::from_secs(5);
const FAULT_EVERY: Duration = Duration::from_secs(15);
/// Above the election timeout: the pause moves the leadership.
const PAUSE: Duration = Duration::from_millis(1500);
const RESOURCES: u64 = 2_000;
const TTL: Duration = Duration::from_secs(2);

/// Bytes under `dir`, files of every depth.
fn dir_bytes(dir: &Path) -> u64 {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return 0;
    };
    entries
        .filter_map(|e| e.ok())
        .map(|e| match e.file_type() {
            Ok(t) if t.is_dir() => dir_bytes(&e.path()),
            Ok(_) => e.metadata().map_or(0, |m| m.len()),
            Err(_) => 0,
        })
        .sum()
}

fn open_files(pid: u32) -> u64 {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count() as u64)
}

pub async fn run(cx: &mut Ctx<'_>) -> Result<()> {
    if cx.kind != Kind::Fenced || !cx.args.fenced_endpoints.is_empty() {
        return Ok(());
    }
    if let Some(c) = cx.sut.cluster.as_mut() {
        c.kill_all();
    }
    let seconds = cx.args.soak_s;
    let sdir = cx.dir.join("soak");
    std::fs::create_dir_all(&sdir)?;
    let mut c = procs::fenced_cluster(&fenced_bin(cx.args)?, &sdir, false)?;
    c.start_all()?;
    c.wait_for_leader(Duration::from_secs(30)).await?;
    let eps = c.endpoints();
    let stop = Arc::new(AtomicBool::new(false));
    let grants = Arc::new(AtomicU64::new(0));
    let violations: Arc<std::sync::Mutex<Vec<String>>> = Arc::default();
    let mut load = Vec::new();
    for worker in 0..cx.args.soak_clients {
        let client = systems::fenced_client(&eps)?;
        let (stop, grants, ledger) = (
            Arc::clone(&stop),
            Arc::clone(&grants),
            Arc::clone(&cx.ledger),
        );
        let violations = Arc::clone(&violations);
        load.push(tokio::spawn(async move {
            let mut i = worker;
            while !stop.load(Ordering::Relaxed) {
                i = i
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                let resource = format!("soak:{}", i % RESOURCES);
                let owner = OwnerId::random();
                let asked = tokio::time::timeout(
                    Duration::from_secs(3),
                    client.acquire_once(&resource, owner, TTL, Duration::ZERO),
                )
                .await;
                if let Ok(Ok(AcquireOutcome::Granted { token, .. })) = asked {
                    if let Err(v) = ledger.record(&resource, token.get()) {
                        violations
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push(format!("soak: {v:?}"));
                    }
                    grants.fetch_add(1, Ordering::Relaxed);
                    if i % 2 == 0 {
                        let _ = client.release(&resource, owner, token).await;
                    }
                } else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }));
    }

    let started = Instant::now();
    let mut samples = Vec::new();
    let mut next_fault = FAULT_EVERY;
    let mut faults = 0u64;
    let status_client = systems::fenced_client(&eps)?;
    while started.elapsed() < Duration::from_secs(seconds) {
        tokio::time::sleep(SAMPLE_EVERY).await;
        let at_s = started.elapsed().as_secs_f64();
        let statuses = status_client.status_of_each().await;
        for node in c.nodes().to_vec() {
            let Some(pid) = c.pid(node.id) else { continue };
            let live_leases = statuses
                .iter()
                .find(|(ep, _)| *ep == node.client_addr())
                .and_then(|(_, s)| s.as_ref().ok())
                .map_or(0, |s| s.live_leases);
            samples.push(Sample {
                at_s,
                node: node.id,
                pid,
                rss_mb: procs::rss_bytes(pid).map_or(0.0, |b| b as f64 / 1e6),
                open_files: open_files(pid),
                threads: fenced_testkit::status_kib(pid, "Threads").unwrap_or(0),
                data_dir_mb: dir_bytes(&node.data_dir) as f64 / 1e6,
                live_leases,
            });
        }
        if started.elapsed() >= next_fault {
            let id = faults % 3 + 1;
            c.pause(id)?;
            tokio::time::sleep(PAUSE).await;
            c.resume(id)?;
            faults += 1;
            next_fault += FAULT_EVERY;
        }
    }
    stop.store(true, Ordering::Relaxed);
    for task in load {
        let _ = task.await;
    }
    let last: Vec<&Sample> = samples.iter().rev().take(3).collect();
    for s in last.iter().rev() {
        println!(
            "[soak] node {}: RSS {:.1} MB, {} open files, {} threads, data dir {:.1} MB, {} live leases",
            s.node, s.rss_mb, s.open_files, s.threads, s.data_dir_mb, s.live_leases
        );
    }
    let granted = grants.load(Ordering::Relaxed);
    println!(
        "[soak] {seconds} s: {granted} grants, {faults} pauses, {} samples",
        samples.len()
    );
    let max = |f: fn(&Sample) -> f64| samples.iter().map(f).fold(0.0, f64::max);
    let table = &mut *cx.table;
    table.put("soak: grants", Kind::Fenced, granted as f64, false);
    table.put(
        "soak: max node RSS (MB)",
        Kind::Fenced,
        max(|s| s.rss_mb),
        false,
    );
    table.put(
        "soak: max open files",
        Kind::Fenced,
        max(|s| s.open_files as f64),
        false,
    );
    table.put(
        "soak: max threads",
        Kind::Fenced,
        max(|s| s.threads as f64),
        false,
    );
    table.put(
        "soak: max data dir (MB)",
        Kind::Fenced,
        max(|s| s.data_dir_mb),
        false,
    );
    for leak in soak::leaks(&samples, &Slack::default()) {
        cx.out.failures.push(format!("soak: {leak}"));
    }
    cx.out.failures.extend(
        violations
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .drain(..),
    );
    if granted == 0 {
        cx.out.failures.push("soak: no grant during the run".into());
    }
    c.kill_all();
    Ok(())
}
