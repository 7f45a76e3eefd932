//! S5 (fenced only): writes through fenced-resource's FenceStore with a
//! real token, against the same writes without the check.

use std::{
    collections::BTreeMap,
    sync::Arc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context, Result};
use fenced_bench::{check::TokenLedger, stats::Recorder};

use super::Ctx;
use crate::{
    load::{self, Run},
    report::micros_ms,
    systems::{Kind, Target},
};

pub async fn run(cx: &mut Ctx<'_>) -> Result<()> {
    let (kind, duration) = (cx.kind, cx.duration);
    if kind != Kind::Fenced {
        return Ok(());
    }
    let table = &mut *cx.table;
    let run = measure(&cx.sut.target, duration, &cx.ledger).await?;
    for (k, v) in &run.extra {
        println!("[fenced] S5 {k}: {v:.2}");
    }
    if let Some(v) = run.extra.get("checked writes/s") {
        table.put("S5 fenced writes/s (token checked)", kind, *v, true);
    }
    if let Some(v) = run.extra.get("plain writes/s") {
        table.put("S5 same writes/s without the check", kind, *v, true);
    }
    if let Some(v) = run.extra.get("check overhead p50 (%)") {
        table.put("S5 token check overhead p50 (%)", kind, *v, false);
    }
    Ok(())
}

/// S5: writes through fenced-resource's FenceStore with a real token, against
/// the same write to the same kind of store (sled, flushed) without a check.
async fn measure(target: &Target, duration: Duration, ledger: &Arc<TokenLedger>) -> Result<Run> {
    use fenced_core::{OwnerId, ResourceName, Token};
    let mut session = target.session(false).await?;
    let resource = format!("s5-{}", load::nonce());
    let grant = session
        .acquire(&resource, Duration::from_secs(60), Duration::ZERO)
        .await?
        .context("S5 lease held")?;
    ledger.record(&resource, grant.token)?;
    let dir = tempfile::tempdir()?;
    let store = Arc::new(fenced_resource::FenceStore::open(dir.path().join("fence"))?);
    // The same store and the same durability (sled flush, then fdatasync of
    // its data file, as FenceStore does), without the read-compare-decide.
    let plain = sled::open(dir.path().join("plain"))?;
    let plain_file = std::fs::File::open(dir.path().join("plain").join("db"))
        .context("opening the plain store's data file")?;
    let name = ResourceName::new(&resource).map_err(|e| anyhow::anyhow!("{e}"))?;
    let token = Token::new(grant.token).map_err(|e| anyhow::anyhow!("{e}"))?;
    let owner = OwnerId::random();
    let half = duration / 2;
    let value = vec![7u8; 256];
    let res = tokio::task::spawn_blocking(move || -> Result<(Recorder, u64, Recorder, u64)> {
        let mut checked = Recorder::new();
        let mut n_checked: u64 = 0;
        let end = Instant::now() + half;
        while Instant::now() < end {
            let mut v = value.clone();
            v[..8].copy_from_slice(&n_checked.to_le_bytes());
            let w = fenced_resource::Write::for_resource(name.clone(), token, owner, v);
            let t = Instant::now();
            match store.write(&w)? {
                fenced_resource::WriteOutcome::Accepted { .. } => {}
                other => bail!("S5: the lease holder's write was not accepted: {other:?}"),
            }
            checked.record("write", t.elapsed());
            n_checked += 1;
        }
        let mut unchecked = Recorder::new();
        let mut n_plain: u64 = 0;
        let end = Instant::now() + half;
        while Instant::now() < end {
            let t = Instant::now();
            // A changing value, so every write really writes.
            let mut v = value.clone();
            v[..8].copy_from_slice(&n_plain.to_le_bytes());
            plain.insert(name.as_str().as_bytes(), v)?;
            plain.flush()?;
            plain_file.sync_data()?;
            unchecked.record("write", t.elapsed());
            n_plain += 1;
        }
        Ok((checked, n_checked, unchecked, n_plain))
    })
    .await
    .context("S5 writer")??;
    let _ = session.release(&resource, &grant).await;
    let (checked, n_checked, unchecked, n_plain) = res;
    let secs = half.as_secs_f64();
    let mut extra = BTreeMap::new();
    extra.insert("checked writes/s", n_checked as f64 / secs);
    extra.insert("plain writes/s", n_plain as f64 / secs);
    let p50c = micros_ms(checked.quantile_micros("write", 0.5));
    let p50p = micros_ms(unchecked.quantile_micros("write", 0.5));
    extra.insert("checked write p50 (ms)", p50c);
    extra.insert(
        "checked write p99 (ms)",
        micros_ms(checked.quantile_micros("write", 0.99)),
    );
    extra.insert("plain write p50 (ms)", p50p);
    extra.insert(
        "plain write p99 (ms)",
        micros_ms(unchecked.quantile_micros("write", 0.99)),
    );
    extra.insert("check overhead p50 (%)", (p50c / p50p - 1.0) * 100.0);
    Ok(Run {
        ops: n_checked,
        elapsed: half,
        rec: checked,
        extra,
    })
}
