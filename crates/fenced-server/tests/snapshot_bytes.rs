//! A node builds a snapshot once its log grew past `snapshot_log_bytes`,
//! however few entries that is (docs/SCALING.md, "One group's capacity").

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::{Duration, Instant};

use common::cluster;
use fenced_core::{AcquireOutcome, Command, OwnerId, ResourceName};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_log_past_its_byte_budget_is_snapshotted() {
    let dir = tempfile::tempdir().expect("a temp dir");
    let node = cluster(dir.path(), 1, |cfg| {
        // Far more entries than the test writes: only the bytes count.
        cfg.snapshot_logs = 1_000_000;
        cfg.snapshot_log_bytes = 16 << 10;
    })
    .await
    .remove(0);
    let ctx = node.ctx.clone();
    let snapshot = || ctx.replica.raft.metrics().borrow().snapshot;
    assert_eq!(snapshot(), None);
    // Long names: a few hundred small entries pass the budget.
    for i in 0..400 {
        let command = Command::Acquire {
            resource: ResourceName::new(&format!("{i:0>100}")).unwrap(),
            owner_id: OwnerId::random(),
            ttl_ms: 60_000,
            wait_ms: 0,
        };
        let (outcome, _) = ctx
            .replica
            .proposer
            .propose::<AcquireOutcome>(command, None)
            .await
            .unwrap();
        assert!(matches!(outcome, AcquireOutcome::Granted(_)), "{outcome:?}");
    }
    let entries = ctx
        .replica
        .raft
        .metrics()
        .borrow()
        .last_log_index
        .unwrap_or(0);
    assert!(entries < 1_000, "{entries} entries");
    let started = Instant::now();
    while snapshot().is_none() {
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "no snapshot after {entries} entries past the byte budget"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    node.shutdown().await;
}
