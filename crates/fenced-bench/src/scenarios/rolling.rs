//! A rolling restart under load, as an upgrade does it: each node in turn
//! gets SIGTERM (a leader hands over first), is started again on its data,
//! and catches up before the next goes. Clients list every endpoint, as
//! users configure them, and take and release leases throughout.
//!
//! Measured: the longest gap between two grants anywhere in the cluster
//! (target: under 1 s), and the calls that failed after the client's own
//! retries (target: none). Every grant also goes through the token ledger.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use fenced_bench::check::TokenLedger;
use fenced_client::{AcquireOutcome, Client};
use fenced_core::OwnerId;

use super::Ctx;
use crate::{
    load::nonce,
    procs::Started,
    systems::{fenced_client, Kind},
};
use fenced_testkit::Cluster;

/// What one rolling restart showed.
pub struct RollingReport {
    pub longest_gap: Duration,
    pub errors: u64,
    pub first_errors: Vec<String>,
    pub grants: u64,
    /// Per node: how long SIGTERM took to end it, and how long from its
    /// start until it had caught up with the leader.
    pub restarts: Vec<(u64, Duration, Duration)>,
}

/// The grants seen so far and the longest pause between two of them.
struct GrantClock {
    last: Mutex<Instant>,
    longest_us: AtomicU64,
    grants: AtomicU64,
}

impl GrantClock {
    fn grant(&self) {
        let now = Instant::now();
        let mut last = self.last.lock().unwrap_or_else(PoisonError::into_inner);
        let gap = now.saturating_duration_since(*last);
        *last = now;
        self.longest_us
            .fetch_max(u64::try_from(gap.as_micros()).unwrap_or(u64::MAX), Relaxed);
        self.grants.fetch_add(1, Relaxed);
    }
}

pub async fn run(cx: &mut Ctx<'_>) -> Result<()> {
    if cx.kind != Kind::Fenced {
        return Ok(());
    }
    let Some(Started::Fenced(cluster)) = cx.sut.cluster.as_mut() else {
        return Ok(());
    };
    let (args, table, out) = (cx.args, &mut *cx.table, &mut *cx.out);
    let ledger = &cx.ledger;
    let r = rolling_restart(
        cluster,
        args.rolling_clients,
        Duration::from_secs(1),
        ledger,
    )
    .await?;
    for (id, stopped, back) in &r.restarts {
        println!(
        "[fenced] rolling restart: node {id} exited {:.0} ms after SIGTERM, caught up {:.0} ms after its start",
        stopped.as_secs_f64() * 1e3,
        back.as_secs_f64() * 1e3
    );
    }
    let gap_ms = r.longest_gap.as_secs_f64() * 1e3;
    println!(
    "[fenced] rolling restart of {} nodes, {} clients listing every endpoint: {} grants, longest gap between grants {gap_ms:.0} ms (target under 1000 ms), {} calls failed after the client's retries (target 0)",
    r.restarts.len(),
    args.rolling_clients,
    r.grants,
    r.errors
);
    table.put(
        "Rolling restart: longest gap between grants (ms)",
        Kind::Fenced,
        gap_ms,
        false,
    );
    table.put(
        "Rolling restart: calls failed after retries",
        Kind::Fenced,
        r.errors as f64,
        false,
    );
    if r.errors > 0 {
        out.failures.push(format!(
            "rolling restart: {} calls failed after the client's retries; first: {:?}",
            r.errors, r.first_errors
        ));
    }
    Ok(())
}

/// Restarts every node of `cluster` in turn (ids in order, whichever
/// leads) while `clients` clients cycle acquire and release; `settle` is
/// the pause after a node caught up before the next is stopped.
async fn rolling_restart(
    cluster: &mut Cluster,
    clients: usize,
    settle: Duration,
    ledger: &Arc<TokenLedger>,
) -> Result<RollingReport> {
    let endpoints = cluster.endpoints();
    let client = fenced_client(&endpoints)?;
    let stop = Arc::new(AtomicBool::new(false));
    let clock = Arc::new(GrantClock {
        last: Mutex::new(Instant::now()),
        longest_us: AtomicU64::new(0),
        grants: AtomicU64::new(0),
    });
    let errors = Arc::new(Mutex::new(Vec::new()));
    let prefix = format!("rolling-{}", nonce());
    let mut load = Vec::new();
    for i in 0..clients {
        let (client, stop, clock) = (client.clone(), Arc::clone(&stop), Arc::clone(&clock));
        let (errors, ledger) = (Arc::clone(&errors), Arc::clone(ledger));
        let prefix = prefix.clone();
        load.push(tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Relaxed) {
                // A fresh resource per cycle: a release lost to an error
                // leaves nothing held in the next cycle's way.
                let resource = format!("{prefix}-{i}-{n}");
                n += 1;
                if let Err(e) = cycle(&client, &resource, &clock, &ledger).await {
                    errors
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push(format!("{resource}: {e}"));
                }
            }
        }));
    }
    // Steady load first, so the gap measured is the restarts'.
    tokio::time::sleep(settle).await;
    *clock.last.lock().unwrap_or_else(PoisonError::into_inner) = Instant::now();
    clock.longest_us.store(0, Relaxed);
    let mut restarts = Vec::new();
    let ids = cluster.ids();
    for id in ids {
        let (status, stopped_in) =
            tokio::task::block_in_place(|| cluster.terminate(id, Duration::from_secs(10)))
                .with_context(|| format!("SIGTERM to node {id}"))?;
        if !status.success() {
            bail!("node {id} exited with {status} after SIGTERM");
        }
        let started = Instant::now();
        cluster.start(id)?;
        caught_up(&endpoints, id, Duration::from_secs(30)).await?;
        restarts.push((id, stopped_in, started.elapsed()));
        tokio::time::sleep(settle).await;
    }
    stop.store(true, Relaxed);
    for task in load {
        task.await?;
    }
    let errors = std::mem::take(&mut *errors.lock().unwrap_or_else(PoisonError::into_inner));
    Ok(RollingReport {
        longest_gap: Duration::from_micros(clock.longest_us.load(Relaxed)),
        errors: errors.len() as u64,
        first_errors: errors.into_iter().take(5).collect(),
        grants: clock.grants.load(Relaxed),
        restarts,
    })
}

/// One acquire and release, each with the client's own retries.
async fn cycle(
    client: &Client,
    resource: &str,
    clock: &GrantClock,
    ledger: &TokenLedger,
) -> Result<()> {
    let owner = OwnerId::random();
    let outcome = client
        .acquire_once(resource, owner, Duration::from_secs(10), Duration::ZERO)
        .await?;
    let AcquireOutcome::Granted { token, .. } = outcome else {
        bail!("not granted: {outcome:?}");
    };
    clock.grant();
    ledger
        .record(resource, token.get())
        .map_err(|v| anyhow::anyhow!("token order violated: {v}"))?;
    client.release(resource, owner, token).await?;
    Ok(())
}

/// Waits until node `id` knows the leader and has applied everything the
/// leader had committed when the wait began.
async fn caught_up(endpoints: &[String], id: u64, within: Duration) -> Result<()> {
    let deadline = Instant::now() + within;
    let mut target: Option<u64> = None;
    loop {
        let client = fenced_client(endpoints)?;
        let statuses = client.status_of_each().await;
        let node = statuses
            .iter()
            .filter_map(|(_, s)| s.as_ref().ok())
            .find(|s| s.node_id == id);
        let leader = statuses
            .iter()
            .filter_map(|(_, s)| s.as_ref().ok())
            .find(|s| s.leader_id == s.node_id && s.node_id != id);
        if target.is_none() {
            target = leader.map(|l| l.last_applied);
        }
        if let Some(node) = node {
            // Back as leader already: it has everything committed.
            if node.leader_id == id {
                return Ok(());
            }
            if target.is_some_and(|t| node.leader_id != 0 && node.last_applied >= t) {
                return Ok(());
            }
        }
        if Instant::now() > deadline {
            bail!("node {id} did not catch up within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
