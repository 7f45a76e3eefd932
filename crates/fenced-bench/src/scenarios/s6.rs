//! S6 (fenced and etcd): S2 with 16 clients; the leader is killed a third
//! of the way in.

use std::{
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use fenced_bench::check::TokenLedger;

use super::Ctx;
use crate::{
    load::{self, CycleLoad, Run},
    procs::Started,
    report::{micros_ms, quantiles},
    sut::fenced_leader_first,
    systems::{self, Kind, Target},
};

pub async fn run(cx: &mut Ctx<'_>) -> Result<()> {
    let (kind, duration) = (cx.kind, cx.duration);
    let ledger = Arc::clone(&cx.ledger);
    let (sut, table) = (&mut cx.sut, &mut *cx.table);
    if matches!(kind, Kind::Postgres | Kind::PostgresSync) {
        return Ok(());
    }
    if let Some(cluster) = sut.cluster.as_mut() {
        let (recovery_s, run) = measure(&sut.target, cluster, duration, &ledger, kind).await?;
        table.put(
            "S6 seconds until a grant after leader kill",
            kind,
            recovery_s,
            false,
        );
        table.put(
            "S6 cycle p999 across the kill (ms)",
            kind,
            micros_ms(run.rec.quantile_micros("cycle", 0.999)),
            false,
        );
        if kind == Kind::Fenced && recovery_s > 3.0 {
            cx.out.failures.push(format!(
                    "S6: a grant took {recovery_s:.2} s after the leader died (budget: 3 x 1 s election timeout)"
                ));
        }
    }
    Ok(())
}

/// S6: S2 with 16 clients; the leader is killed a third of the way in.
async fn measure(
    target: &Target,
    cluster: &mut Started,
    duration: Duration,
    ledger: &Arc<TokenLedger>,
    kind: Kind,
) -> Result<(f64, Run)> {
    // A third before the kill, two thirds (at least 12 s) after it: long
    // enough to see a client wait out a request lost in the election.
    let total = duration.max(Duration::from_secs(18));
    if matches!(target, Target::Postgres { .. }) {
        bail!("S6 needs a cluster");
    }
    let times = Arc::new(Mutex::new(Vec::new()));
    let load = CycleLoad {
        clients: 16,
        duration: total,
        rate_per_second: None,
        resources_per_client: 8,
        ttl: Duration::from_secs(10),
    };
    let t = target.clone();
    let l = Arc::clone(ledger);
    let tm = Arc::clone(&times);
    let task = tokio::spawn(async move { load::cycles(&t, load, l, "s6", Some(tm)).await });
    tokio::time::sleep(total / 3).await;
    // The leader now, not the one found at start: earlier scenarios may
    // have moved it, and killing a follower would measure no outage.
    let leader_addr = match target {
        Target::Fenced { endpoints } => fenced_leader_first(endpoints).await?.0,
        Target::Etcd { endpoints } => systems::etcd_leader_first(endpoints).await?,
        Target::Postgres { .. } => bail!("S6 needs a cluster"),
    }
    .into_iter()
    .next()
    .context("no endpoint")?;
    let leader_id = cluster
        .id_at(&leader_addr)
        .context("leader is not a member this benchmark started")?;
    let killed_at = Instant::now();
    cluster.kill(leader_id)?;
    let run = task.await.context("S6 load")??;
    // Recovery: the first grant of an acquire sent after the kill. Replies
    // that were already on their way when the leader died do not count.
    let times = times
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let recovery_s = times
        .iter()
        .filter(|(sent, _)| *sent > killed_at)
        .map(|(_, granted)| (*granted - killed_at).as_secs_f64())
        .fold(f64::INFINITY, f64::min);
    let window_s = (total - total / 3).as_secs_f64();
    let resumed = if recovery_s.is_finite() {
        format!("grants resumed {recovery_s:.3} s after the kill")
    } else {
        format!("no acquire sent after the kill was granted within the {window_s:.0} s left")
    };
    println!(
        "[{}] S6 leader {leader_id} killed: {resumed}; {} cycles/s across; errors {}; {}",
        kind.name(),
        run.ops_per_second() as u64,
        run.rec.errors,
        quantiles(&run.rec, "cycle")
    );
    if let Some(e) = &run.rec.first_error {
        println!("    first error: {e}");
    }
    cluster.spawn(leader_id)?;
    Ok((recovery_s, run))
}
