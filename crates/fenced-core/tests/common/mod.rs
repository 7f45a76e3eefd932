//! What several test files share: tables fed entries, and a table read
//! back through its snapshot the way a node's codec reads one.
#![allow(dead_code)]

use fenced_core::DEFAULT_HISTORY_PER_RESOURCE;
use fenced_core::{Batch, ClusterTime, Command, LeaseTable, Outcome, TableSeed};
use serde_json::Value;

pub fn at(ms: u64) -> ClusterTime {
    ClusterTime::from_millis(ms)
}

/// Applies one entry of `commands` at cluster time `ms`; checks the table.
pub fn apply(table: &mut LeaseTable, ms: u64, commands: Vec<Command>) -> Vec<Outcome> {
    let applied = table.apply(&Batch {
        stamp: at(ms),
        commands,
    });
    table.check_invariants().unwrap();
    applied.outcomes
}

/// The table a node's codec reads from `fields` of a snapshot's `value`,
/// in that order.
pub fn streamed(value: &Value, fields: &[&str]) -> LeaseTable {
    use serde::de::DeserializeSeed;
    let as_seq = Value::Array(fields.iter().map(|f| value[*f].clone()).collect());
    TableSeed {
        history_len: DEFAULT_HISTORY_PER_RESOURCE,
    }
    .deserialize(&as_seq)
    .unwrap()
}
