//! S2: clients each cycling over resources of their own (uncontended), by
//! client count.

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
    for &n in &args.s2_clients {
        let load = CycleLoad {
            clients: n,
            duration,
            rate_per_second: args.rate,
            resources_per_client: 8,
            ttl,
        };
        let t = sut.target.clone();
        let l = Arc::clone(&ledger);
        let run = sut
            .measure(&format!("S2 {n} clients, uncontended"), || async move {
                load::cycles(&t, load, l, "s2", None).await
            })
            .await?;
        table.put(
            &format!("S2 {n} clients: cycles/s"),
            kind,
            run.ops_per_second(),
            true,
        );
        table.put(
            &format!("S2 {n} clients: cycle p99 (ms)"),
            kind,
            micros_ms(run.rec.quantile_micros("cycle", 0.99)),
            false,
        );
        table.put_percentiles(&format!("S2 {n} clients, cycle"), kind, &run, "cycle");
    }
    Ok(())
}
