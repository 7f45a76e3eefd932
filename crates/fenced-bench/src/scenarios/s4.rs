//! S4: S2 at 64 clients alone, then while many leases are kept alive.

use std::{
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering},
        Arc,
    },
    time::{Duration, Instant},
};

use anyhow::{Context, Result};
use fenced_bench::{check::TokenLedger, stats::Recorder};

use super::Ctx;
use crate::{
    load::{self, CycleLoad},
    report::{micros_ms, quantiles, Table},
    sut::Sut,
    systems::Kind,
    Args,
};

/// Connections S4's renewals are spread over. Each renews its share of the
/// leases one after another, so each must finish a renewal within
/// `TTL / 3 / (leases / workers)`: 10,000 leases, TTL 6 s over 256
/// connections leave 51 ms per renewal, far above any system's latency here.
const S4_RENEW_WORKERS: usize = 256;

/// S4: S2 at 64 clients (closed loop) alone, then while `--s4-leases`
/// leases are kept alive; reports both runs' throughput and p99, their
/// ratios, and the renewals' latency. fenced keeps the leases as
/// applications do, through `--s4-clients` clients' keepers (one session
/// each, kept alive once per interval);
/// the anchors renew lease by lease (etcd: one lease per key).
pub async fn run(cx: &mut Ctx<'_>) -> Result<()> {
    s4(cx.args, &cx.sut, cx.kind, cx.duration, &cx.ledger, cx.table).await
}

async fn s4(
    args: &Args,
    sut: &Sut,
    kind: Kind,
    duration: Duration,
    ledger: &Arc<TokenLedger>,
    table: &mut Table,
) -> Result<()> {
    let ttl = Duration::from_millis(args.s4_ttl_ms);
    let load = CycleLoad {
        clients: 64,
        duration,
        rate_per_second: None,
        resources_per_client: 8,
        ttl: Duration::from_secs(10),
    };
    let t = sut.target.clone();
    let l = Arc::clone(ledger);
    let base = sut
        .measure("S4 baseline: S2 64 clients alone", || async move {
            load::cycles(&t, load, l, "s4base", None).await
        })
        .await?;
    let setup = Instant::now();
    let renewer = if kind == Kind::Fenced {
        Renewer::Kept(
            load::keeper_load(
                &sut.target,
                args.s4_leases,
                args.s4_clients,
                ttl,
                Arc::clone(ledger),
            )
            .await?,
        )
    } else {
        let stop = Arc::new(AtomicBool::new(false));
        let renewed = Arc::new(AtomicU64::new(0));
        let task = load::renew_load(
            &sut.target,
            args.s4_leases,
            S4_RENEW_WORKERS,
            ttl,
            Arc::clone(ledger),
            Arc::clone(&stop),
            Arc::clone(&renewed),
        )
        .await?;
        Renewer::Each {
            stop,
            renewed,
            task,
        }
    };
    println!(
        "[{}] S4: {} leases acquired in {:.1} s over {} clients; renewing every {} ms",
        kind.name(),
        args.s4_leases,
        setup.elapsed().as_secs_f64(),
        if kind == Kind::Fenced {
            args.s4_clients
        } else {
            S4_RENEW_WORKERS
        },
        args.s4_ttl_ms / 3
    );
    // Let two renewal rounds pass before measuring: the leases granted over
    // the set-up settle into one call per client and interval.
    tokio::time::sleep(2 * ttl / 3).await;
    let (r0, c0) = renewer.renewed_and_calls();
    if let Renewer::Kept(kept) = &renewer {
        kept.take_latencies(&mut Recorder::new());
    }
    let t = sut.target.clone();
    let l = Arc::clone(ledger);
    let loaded = sut
        .measure("S4 S2 64 clients with the leases renewed", || async move {
            load::cycles(&t, load, l, "s4", None).await
        })
        .await?;
    let (r1, c1) = renewer.renewed_and_calls();
    let secs = loaded.elapsed.as_secs_f64().max(1e-9);
    let (rec, lost) = renewer.finish().await?;
    println!(
        "[{}] S4 renewals: {:.0} leases/s in {:.0} calls/s during the loaded run, errors {}, leases lost {lost}; {}",
        kind.name(),
        (r1 - r0) as f64 / secs,
        (c1 - c0) as f64 / secs,
        rec.errors,
        quantiles(&rec, "renew")
    );
    if let Some(e) = &rec.first_error {
        println!("    first renew error: {e}");
    }
    let (b_ops, l_ops) = (base.ops_per_second(), loaded.ops_per_second());
    let b99 = micros_ms(base.rec.quantile_micros("cycle", 0.99));
    let l99 = micros_ms(loaded.rec.quantile_micros("cycle", 0.99));
    println!(
        "[{}] S4: S2 64 clients {b_ops:.0} cycles/s, p99 {b99:.1} ms alone; {l_ops:.0} cycles/s, p99 {l99:.1} ms with {} leases renewed: throughput x{:.2}, p99 x{:.2}",
        kind.name(),
        args.s4_leases,
        l_ops / b_ops.max(1e-9),
        l99 / b99
    );
    table.put(
        "S4 renew p99 (ms)",
        kind,
        micros_ms(rec.quantile_micros("renew", 0.99)),
        false,
    );
    table.put("S4 S2 cycles/s alone", kind, b_ops, true);
    table.put("S4 S2 cycles/s with renewals", kind, l_ops, true);
    table.put(
        "S4 S2 throughput kept (loaded/alone)",
        kind,
        l_ops / b_ops.max(1e-9),
        true,
    );
    table.put("S4 S2 cycle p99 alone (ms)", kind, b99, false);
    table.put("S4 S2 cycle p99 with renewals (ms)", kind, l99, false);
    table.put("S4 S2 p99 slowdown (loaded/alone)", kind, l99 / b99, false);
    table.put("S4 renewal calls/s", kind, (c1 - c0) as f64 / secs, false);
    Ok(())
}

/// How S4's leases are kept alive.
enum Renewer {
    /// fenced: by the clients' keepers.
    Kept(load::KeptLeases),
    /// The anchors: a renewal per lease per interval.
    Each {
        stop: Arc<AtomicBool>,
        renewed: Arc<AtomicU64>,
        task: tokio::task::JoinHandle<Result<Recorder>>,
    },
}

impl Renewer {
    /// Leases renewed and calls made so far.
    fn renewed_and_calls(&self) -> (u64, u64) {
        match self {
            Renewer::Kept(k) => k.renewed_and_calls(),
            Renewer::Each { renewed, .. } => {
                let n = renewed.load(Ordering::Relaxed);
                (n, n)
            }
        }
    }

    /// Stops renewing; the renewals' latencies and the leases lost.
    async fn finish(self) -> Result<(Recorder, usize)> {
        match self {
            Renewer::Kept(kept) => {
                let mut rec = Recorder::new();
                kept.take_latencies(&mut rec);
                let lost = kept.lost();
                if lost > 0 {
                    rec.error(|| format!("{lost} of {} leases lost", kept.len()));
                }
                kept.release_all().await;
                Ok((rec, lost))
            }
            Renewer::Each { stop, task, .. } => {
                stop.store(true, Ordering::Relaxed);
                let rec = task.await.context("renew task")??;
                Ok((rec, 0))
            }
        }
    }
}
