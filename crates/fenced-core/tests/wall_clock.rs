//! Wall-clock times for people: the leader's anchors are replicated state,
//! so every table that applied the same log, or loaded its snapshot, shows
//! the same date and time for an event; older snapshots load without them.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{apply, at, streamed};
use fenced_core::*;
use serde_json::Value;

const T0: u64 = 1_800_000_000_000;

fn acquire(res: &str, owner: OwnerId) -> Command {
    Command::Acquire {
        resource: ResourceName::new(res).unwrap(),
        owner_id: owner,
        ttl_ms: 10_000,
        wait_ms: 0,
    }
}

/// A table with an anchor at 1 s, a grant at 3 s that runs out and is swept
/// by a tick at 15 s, and a second anchor at 20 s after the leader's clock
/// was stepped forward a minute.
fn anchored() -> LeaseTable {
    let mut table = LeaseTable::new();
    let out = apply(
        &mut table,
        1_000,
        vec![Command::WallClock {
            unix_ms: T0 + 1_000,
        }],
    );
    assert_eq!(out, vec![Outcome::WallClockNoted]);
    apply(
        &mut table,
        3_000,
        vec![acquire("billing/run", OwnerId::random())],
    );
    apply(&mut table, 15_000, vec![]);
    apply(
        &mut table,
        20_000,
        vec![Command::WallClock {
            unix_ms: T0 + 80_000,
        }],
    );
    table
}

#[test]
fn an_event_shows_the_wall_time_of_its_cluster_time_and_keeps_it() {
    let table = anchored();
    let granted = table.history("billing/run", 1)[0].granted_at;
    assert_eq!(table.wall_ms_at(granted), Some(T0 + 3_000));
    // Swept at 15 s, before the clock step: still 15 s after it.
    let ended = table.history("billing/run", 1)[0].end.unwrap().at;
    assert_eq!(table.wall_ms_at(ended), Some(T0 + 15_000));
    assert_eq!(table.wall_ms_at(at(21_000)), Some(T0 + 81_000));
}

#[test]
fn a_table_without_anchors_shows_no_wall_time() {
    let mut table = LeaseTable::new();
    apply(
        &mut table,
        3_000,
        vec![acquire("billing/run", OwnerId::random())],
    );
    assert_eq!(table.wall_ms_at(at(3_000)), None);
}

#[test]
fn anchors_survive_a_snapshot_both_ways_a_node_reads_one() {
    let table = anchored();
    let value = serde_json::to_value(table.snapshot()).unwrap();
    let whole = LeaseTable::from_snapshot(serde_json::from_value(value.clone()).unwrap()).unwrap();
    let seq = streamed(&value, SNAPSHOT_FIELDS);
    for loaded in [&whole, &seq] {
        assert!(loaded.snapshot() == table.snapshot());
        assert_eq!(loaded.wall_ms_at(at(3_000)), Some(T0 + 3_000));
        assert_eq!(loaded.wall_clock(), table.wall_clock());
    }
}

#[test]
fn a_version_4_snapshot_loads_without_anchors() {
    let table = anchored();
    let mut value = serde_json::to_value(table.snapshot()).unwrap();
    let map = value.as_object_mut().unwrap();
    map.remove("wall_clock");
    map.insert("format_version".into(), Value::from(4));
    let v4: TableSnapshot = serde_json::from_value(value.clone()).unwrap();
    let loaded = LeaseTable::from_snapshot(v4).unwrap();
    assert_eq!(loaded.wall_ms_at(at(3_000)), None);
    assert_eq!(
        loaded.history("billing/run", 1),
        table.history("billing/run", 1)
    );
    let seq = streamed(&value, &SNAPSHOT_FIELDS[..10]);
    assert_eq!(seq.wall_ms_at(at(3_000)), None);
}

#[test]
fn a_snapshot_with_anchors_out_of_order_is_refused() {
    let table = anchored();
    let mut value = serde_json::to_value(table.snapshot()).unwrap();
    let anchors = value["wall_clock"].as_array_mut().unwrap();
    anchors.reverse();
    let bad: TableSnapshot = serde_json::from_value(value.clone()).unwrap();
    let err = LeaseTable::from_snapshot(bad).err().unwrap();
    assert!(err.to_string().contains("wall-clock anchors"), "{err}");
}

#[test]
fn a_wall_clock_command_is_checked_and_never_made_for_an_identity() {
    let limits = Limits::default();
    assert!(Command::WallClock { unix_ms: T0 }.validate(&limits).is_ok());
    let err = Command::WallClock {
        unix_ms: MAX_UNIX_MS + 1,
    }
    .validate(&limits)
    .unwrap_err();
    assert_eq!(err.field(), "unix_ms");
    let wrapped = Command::WallClock { unix_ms: T0 }.as_identity("app", IdentityBounds::UNBOUNDED);
    assert!(wrapped.validate(&limits).is_err());
}
