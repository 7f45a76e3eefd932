//! validate (fenced only): ValidateToken throughput, one pair per call, by
//! client count; then ValidateTokens batches at the last count.

use anyhow::Result;

use super::Ctx;
use crate::{load, report::micros_ms, systems::Target};

pub async fn run(cx: &mut Ctx<'_>) -> Result<()> {
    let (args, kind, duration) = (cx.args, cx.kind, cx.duration);
    let (sut, table) = (&mut cx.sut, &mut *cx.table);
    let Target::Fenced { endpoints } = &sut.target else {
        return Ok(());
    };
    let batch = usize::try_from(args.validate_batch).unwrap_or(64);
    let runs = args
        .validate_clients
        .iter()
        .map(|&n| (n, 1))
        .chain(args.validate_clients.last().map(|&n| (n, batch)));
    for (n, batch) in runs {
        let e = endpoints.clone();
        let name = if batch > 1 {
            format!("validate {n} clients, batches of {batch}")
        } else {
            format!("validate {n} clients")
        };
        let run = sut
            .measure(&name, || async move {
                load::validate(&e, n, batch, duration).await
            })
            .await?;
        table.put(
            &format!("{name}: checks/s"),
            kind,
            run.ops_per_second(),
            true,
        );
        table.put(
            &format!("{name}: call p99 (ms)"),
            kind,
            micros_ms(run.rec.quantile_micros("validate", 0.99)),
            false,
        );
    }
    Ok(())
}
