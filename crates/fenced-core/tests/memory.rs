//! Resident bytes per live lease: the memory budget of one group
//! (docs/SCALING.md). Alone in its binary, so no other test allocates
//! while it measures; the delta of the process's resident memory (Linux's
//! /proc/self/status) over a fill is the table's memory, allocator
//! overhead included.
#![allow(clippy::unwrap_used)]

use fenced_core::{Batch, ClusterTime, Command, LeaseTable, OwnerId, ResourceName};

fn rss_bytes() -> usize {
    let text = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = text.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    let kb: usize = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

const LEASES: usize = 200_000;

/// The bound this table's layout keeps, in resident bytes per live lease
/// with a 26-byte name and the default history (one grant remembered per
/// resource), under the system allocator: 246 measured; 380 before the
/// record fitted 96 bytes, the live grant's history entry was made from the
/// lease and the two large indexes were rebuilt as they grew; 711 before
/// the history moved into the record, records were boxed and an empty wait
/// queue became one pointer. docs/SCALING.md has the breakdown.
const BYTES_PER_LEASE_BOUND: usize = 260;

fn fill(table: &mut LeaseTable, at: u64) {
    // Batches as the proposer makes them (up to 4,096 commands an entry).
    for start in (0..LEASES).step_by(4_096) {
        let chunk: Vec<ResourceName> = (start..LEASES.min(start + 4_096))
            .map(|i| ResourceName::new(&format!("million-1a2b3c4d:{i:08}")).unwrap())
            .collect();
        let batch = Batch {
            stamp: ClusterTime::from_millis(at),
            commands: chunk
                .iter()
                .map(|r| Command::Acquire {
                    resource: r.clone(),
                    owner_id: OwnerId::random(),
                    ttl_ms: 3_600_000,
                    wait_ms: 0,
                })
                .collect(),
        };
        let applied = table.apply(&batch);
        assert_eq!(applied.outcomes.len(), chunk.len());
    }
}

#[test]
fn a_live_lease_costs_at_most_its_bound_in_resident_memory() {
    let mut table = LeaseTable::new();
    let before = rss_bytes();
    fill(&mut table, 1);
    let after = rss_bytes();
    assert_eq!(table.live_leases(), LEASES);
    let per_lease = after.saturating_sub(before) / LEASES;
    println!("{per_lease} resident bytes per live lease ({LEASES} leases)");
    assert!(
        per_lease <= BYTES_PER_LEASE_BOUND,
        "{per_lease} bytes per lease, bound {BYTES_PER_LEASE_BOUND}"
    );
}
