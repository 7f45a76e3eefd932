//! S1: one client, a fresh resource every cycle: the latency of one
//! acquire and release.

use std::{sync::Arc, time::Duration};

use anyhow::Result;

use super::Ctx;
use crate::{
    load::{self, CycleLoad},
    report::micros_ms,
};

pub async fn run(cx: &mut Ctx<'_>) -> Result<()> {
    let (args, kind, duration) = (cx.args, cx.kind, cx.duration);
    let ledger = Arc::clone(&cx.ledger);
    let (sut, table) = (&mut cx.sut, &mut *cx.table);
    let ttl = Duration::from_secs(10);
    let load = CycleLoad {
        clients: 1,
        duration,
        rate_per_second: args.rate.map(|r| r.min(1000.0)),
        resources_per_client: 0,
        ttl,
    };
    let t = sut.target.clone();
    let l = Arc::clone(&ledger);
    let run = sut
        .measure("S1 one client, fresh resources", || async move {
            load::cycles(&t, load, l, "s1", None).await
        })
        .await?;
    table.put(
        "S1 cycle p50 (ms)",
        kind,
        micros_ms(run.rec.quantile_micros("cycle", 0.5)),
        false,
    );
    table.put(
        "S1 cycle p99 (ms)",
        kind,
        micros_ms(run.rec.quantile_micros("cycle", 0.99)),
        false,
    );
    table.put("S1 cycles/s", kind, run.ops_per_second(), true);
    table.put_percentiles("S1 1 client, cycle", kind, &run, "cycle");
    Ok(())
}
