//! Loopback ports for nodes.

use std::{
    net::TcpListener,
    sync::{
        atomic::{AtomicU32, Ordering},
        OnceLock,
    },
};

use anyhow::{bail, Result};

const LOW: u32 = 10_000;
const SPAN: u32 = 22_000;
/// Under cargo-nextest, one stripe of the range per test running at once.
const STRIPES: u32 = 8;

/// The loopback ports this process hands out, as (first, count).
///
/// Under cargo-nextest every test is a process of its own and several run
/// at once; `NEXTEST_TEST_GLOBAL_SLOT`, unique among the tests running,
/// gives each a stripe of its own, so two tests never pick the same port
/// between its check and its bind. Elsewhere a process has the whole range
/// (the tests of one binary share its counter).
pub fn port_range() -> (u32, u32) {
    let slot = std::env::var("NEXTEST_TEST_GLOBAL_SLOT")
        .ok()
        .and_then(|s| s.parse::<u32>().ok());
    match slot {
        Some(slot) => {
            let stripe = SPAN / STRIPES;
            (LOW + (slot % STRIPES) * stripe, stripe)
        }
        None => (LOW, SPAN),
    }
}

/// A free loopback port, below the kernel's ephemeral range (32768 and up
/// on Linux): a port from `bind(0)` could be handed to another socket
/// (an outgoing connection, another process's `bind(0)`) between this check
/// and the node binding it, and the node would fail with "address in use".
/// Each call in a process moves on to the next port, from a start that
/// differs per process, within [`port_range`].
pub fn free_port() -> Result<u16> {
    static START: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let (low, span) = port_range();
    let start = *START.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        std::process::id().wrapping_mul(7_919).wrapping_add(nanos) % span
    });
    for _ in 0..span {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(low + (start + n) % span).unwrap_or(u16::MAX);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free loopback port between {low} and {}", low + span)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_not_repeated() {
        let (low, span) = port_range();
        assert!(low >= LOW && low + span <= LOW + SPAN, "{low} {span}");
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        assert!(
            ports
                .iter()
                .all(|p| (low..low + span).contains(&u32::from(*p))),
            "{ports:?} outside {low}+{span}"
        );
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len());
    }
}
