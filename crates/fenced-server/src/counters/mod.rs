//! The node's counters: updated where things happen (the state machine,
//! the proposer, the servers' layers, the limits), read by
//! [`crate::observe::metrics`] at scrape time; with them, each RPC's
//! latency and status (`rpc_metrics`). It imports only the types of the
//! counters it holds and the limits whose refusals it counts.

pub mod rpc_metrics;

use std::sync::{atomic::AtomicU64, Arc};

use crate::histogram::{Histogram, BATCH_BOUNDS, LATENCY_US_BOUNDS, SNAPSHOT_US_BOUNDS};

/// What this node has done so far, for metrics and benchmarks.
#[derive(Debug)]
pub struct Counters {
    pub entries: AtomicU64,
    pub commands: AtomicU64,
    pub grants: AtomicU64,
    pub refusals: AtomicU64,
    pub renewals: AtomicU64,
    pub lost: AtomicU64,
    pub releases: AtomicU64,
    pub expiries: AtomicU64,
    /// Sessions opened or kept alive, and sessions that lapsed.
    pub keep_alives: AtomicU64,
    pub session_expiries: AtomicU64,
    /// Fenced writes applied, and refused by the fencing rule.
    pub kv_applied: AtomicU64,
    pub kv_refused: AtomicU64,
    /// New leaders (id or term) this node has seen, the first one included.
    pub leader_changes: AtomicU64,
    /// Commands per log entry this node proposed as leader.
    pub batch_commands: Histogram,
    /// Microseconds to apply one entry of commands to the lease table.
    pub apply_us: Histogram,
    /// Refusals by a node-wide limit (connections, frames, capacity).
    pub limits: Arc<crate::security::limits::LimitCounters>,
    /// Snapshots this node built and wrote (a discarded stale build not
    /// counted), and snapshots it installed from a leader.
    pub snapshots_built: AtomicU64,
    pub snapshots_installed: AtomicU64,
    /// Size in bytes of the snapshot on disk (0 before the first).
    pub snapshot_bytes: AtomicU64,
    /// Microseconds to build (encode and make durable) one snapshot.
    pub snapshot_build_us: Histogram,
    /// Latency and status code per RPC, filled by the servers' layer.
    pub rpc: Arc<crate::counters::rpc_metrics::RpcMetrics>,
}

impl Default for Counters {
    fn default() -> Self {
        Self {
            entries: AtomicU64::new(0),
            commands: AtomicU64::new(0),
            grants: AtomicU64::new(0),
            refusals: AtomicU64::new(0),
            renewals: AtomicU64::new(0),
            lost: AtomicU64::new(0),
            releases: AtomicU64::new(0),
            expiries: AtomicU64::new(0),
            keep_alives: AtomicU64::new(0),
            session_expiries: AtomicU64::new(0),
            kv_applied: AtomicU64::new(0),
            kv_refused: AtomicU64::new(0),
            leader_changes: AtomicU64::new(0),
            batch_commands: Histogram::new(BATCH_BOUNDS),
            apply_us: Histogram::new(LATENCY_US_BOUNDS),
            limits: Arc::default(),
            snapshots_built: AtomicU64::new(0),
            snapshots_installed: AtomicU64::new(0),
            snapshot_bytes: AtomicU64::new(0),
            snapshot_build_us: Histogram::new(SNAPSHOT_US_BOUNDS),
            rpc: Arc::default(),
        }
    }
}
