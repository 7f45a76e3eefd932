//! Loopback ports for nodes.

use std::{
    net::TcpListener,
    sync::{
        atomic::{AtomicU32, Ordering},
        OnceLock,
    },
};

use anyhow::{bail, Result};

/// A free loopback port, below the kernel's ephemeral range (32768 and up
/// on Linux): a port from `bind(0)` could be handed to another socket
/// (an outgoing connection, another process's `bind(0)`) between this check
/// and the node binding it, and the node would fail with "address in use".
/// Each call in a process moves on to the next port, from a start that
/// differs per process.
pub fn free_port() -> Result<u16> {
    const LOW: u32 = 10_000;
    const SPAN: u32 = 22_000;
    static START: OnceLock<u32> = OnceLock::new();
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let start = *START.get_or_init(|| {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.subsec_nanos());
        std::process::id().wrapping_mul(7_919).wrapping_add(nanos) % SPAN
    });
    for _ in 0..SPAN {
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = u16::try_from(LOW + (start + n) % SPAN).unwrap_or(u16::MAX);
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return Ok(port);
        }
    }
    bail!("no free loopback port between {LOW} and {}", LOW + SPAN)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn ports_are_below_the_ephemeral_range_and_not_repeated() {
        let ports: Vec<u16> = (0..50).map(|_| free_port().unwrap()).collect();
        assert!(
            ports.iter().all(|p| (10_000..32_000).contains(p)),
            "{ports:?}"
        );
        let mut unique = ports.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), ports.len());
    }
}
