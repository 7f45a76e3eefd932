//! S3: clients contending for one resource: hand-offs per second, the wait
//! for a grant, and fairness.

use std::sync::Arc;

use anyhow::Result;

use super::Ctx;
use crate::{load, report::micros_ms};

pub async fn run(cx: &mut Ctx<'_>) -> Result<()> {
    let (args, kind, duration) = (cx.args, cx.kind, cx.duration);
    let ledger = Arc::clone(&cx.ledger);
    let (sut, table) = (&mut cx.sut, &mut *cx.table);
    for &n in &args.s3_clients {
        let t = sut.target.clone();
        let l = Arc::clone(&ledger);
        let run = sut
            .measure(&format!("S3 {n} clients, one resource"), || async move {
                load::contended(&t, n, duration, l).await
            })
            .await?;
        table.put(
            &format!("S3 {n} clients: hand-offs/s"),
            kind,
            run.ops_per_second(),
            true,
        );
        table.put(
            &format!("S3 {n} clients: wait p99 (ms)"),
            kind,
            micros_ms(run.rec.quantile_micros("wait", 0.99)),
            false,
        );
        table.put_percentiles(&format!("S3 {n} clients, wait"), kind, &run, "wait");
        if let Some(f) = run.extra.get("fairness_max_over_min") {
            table.put(
                &format!("S3 {n} clients: max/min grants per client"),
                kind,
                *f,
                false,
            );
        }
    }
    Ok(())
}
