//! Admission before authentication: what a connection may hold before its
//! TLS handshake (and, on the peer port, its routing) has proven who it is.
//!
//! An unauthenticated connection holds no slot of the port's connection
//! budget ([`crate::security::limits::ConnectionLimit`]); it holds one of a small
//! budget of pending handshakes of its own. When that budget is full, or
//! its source already has its share, the *oldest* pending handshake (of
//! the source, or of the port) is closed to make room, never the new one.
//! A real handshake finishes in milliseconds, so a flood of silent sockets
//! only ever evicts itself: to keep a node's handshake out, an attacker
//! would have to open the whole budget's worth of connections within that
//! handshake's few milliseconds. [`PendingBook`] decides, with no clock and
//! no I/O; [`Admission`] is its shell.

use std::{
    collections::{BTreeMap, BTreeSet, HashMap},
    net::IpAddr,
    sync::{atomic::Ordering::Relaxed, Arc, Mutex, PoisonError},
};

use tokio_util::sync::CancellationToken;

use crate::security::limits::{LimitCounters, Port};

/// Why a pending handshake was closed before it finished.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Eviction {
    /// The port's pending budget was full; this was the port's oldest.
    PortFull,
    /// Its source had its whole share; this was the source's oldest.
    SourceFull,
}

/// The pending handshakes of one port, oldest first, by source. Each entry
/// carries a `T` (the shell's handle to close it).
#[derive(Debug)]
pub struct PendingBook<T> {
    max_total: usize,
    max_per_source: usize,
    next: u64,
    by_age: BTreeMap<u64, (IpAddr, T)>,
    by_source: HashMap<IpAddr, BTreeSet<u64>>,
}

impl<T> PendingBook<T> {
    /// A book of at most `max_total` pending handshakes, `max_per_source`
    /// of them from one address (both at least 1).
    pub fn new(max_total: usize, max_per_source: usize) -> Self {
        let max_total = max_total.max(1);
        Self {
            max_total,
            max_per_source: max_per_source.clamp(1, max_total),
            next: 0,
            by_age: BTreeMap::new(),
            by_source: HashMap::new(),
        }
    }

    /// How many handshakes are pending.
    pub fn len(&self) -> usize {
        self.by_age.len()
    }

    /// Whether none is pending.
    pub fn is_empty(&self) -> bool {
        self.by_age.is_empty()
    }

    /// How many handshakes from `source` are pending.
    pub fn of_source(&self, source: IpAddr) -> usize {
        self.by_source.get(&source).map_or(0, BTreeSet::len)
    }

    /// Admits a new handshake from `source`: its ticket, and the entries
    /// closed to make room for it (at most one; none while there is room).
    /// `None` only once 2^64 tickets were handed out.
    pub fn admit(&mut self, source: IpAddr, handle: T) -> Option<(u64, Vec<(Eviction, T)>)> {
        let ticket = self.next;
        self.next = self.next.checked_add(1)?;
        let mut evicted = Vec::new();
        if self.of_source(source) >= self.max_per_source {
            let oldest = self.by_source.get(&source).and_then(|s| s.first().copied());
            if let Some(handle) = oldest.and_then(|t| self.finish(t)) {
                evicted.push((Eviction::SourceFull, handle));
            }
        } else if self.len() >= self.max_total {
            let oldest = self.by_age.keys().next().copied();
            if let Some(handle) = oldest.and_then(|t| self.finish(t)) {
                evicted.push((Eviction::PortFull, handle));
            }
        }
        self.by_age.insert(ticket, (source, handle));
        self.by_source.entry(source).or_default().insert(ticket);
        Some((ticket, evicted))
    }

    /// Removes `ticket` (its handshake finished, failed or was evicted);
    /// its handle if it was still pending.
    pub fn finish(&mut self, ticket: u64) -> Option<T> {
        let (source, handle) = self.by_age.remove(&ticket)?;
        if let Some(tickets) = self.by_source.get_mut(&source) {
            tickets.remove(&ticket);
            if tickets.is_empty() {
                self.by_source.remove(&source);
            }
        }
        Some(handle)
    }
}

/// The shell: one per port, shared by its accept loop's tasks.
#[derive(Clone)]
pub struct Admission {
    port: Port,
    book: Arc<Mutex<PendingBook<CancellationToken>>>,
    counters: Arc<LimitCounters>,
}

impl Admission {
    pub fn new(
        port: Port,
        max_total: usize,
        max_per_source: usize,
        counters: Arc<LimitCounters>,
    ) -> Self {
        Self {
            port,
            book: Arc::new(Mutex::new(PendingBook::new(max_total, max_per_source))),
            counters,
        }
    }

    /// A pending slot for a new connection from `source`, closing the
    /// oldest one (counted) when there is no room. `None` never happens in
    /// practice (the ticket counter ran out): the connection is closed.
    pub fn enter(&self, source: IpAddr) -> Option<Pending> {
        let evicted = CancellationToken::new();
        let (ticket, closed) = {
            let mut book = self.book.lock().unwrap_or_else(PoisonError::into_inner);
            book.admit(source, evicted.clone())?
        };
        for (why, handle) in closed {
            handle.cancel();
            let counter = match why {
                Eviction::PortFull => self.counters.pending.of(self.port),
                Eviction::SourceFull => self.counters.pending_per_source.of(self.port),
            };
            // Once per thousand: a flood would otherwise flood the log too.
            if counter.fetch_add(1, Relaxed).is_multiple_of(1_000) {
                tracing::warn!(
                    port = self.port.name(),
                    reason = ?why,
                    "an unauthenticated connection closed to make room for a new one \
                     (logged once per 1000)"
                );
            }
        }
        Some(Pending {
            ticket,
            evicted,
            book: Arc::clone(&self.book),
        })
    }
}

/// A pending handshake's slot, given back when dropped.
pub struct Pending {
    ticket: u64,
    evicted: CancellationToken,
    book: Arc<Mutex<PendingBook<CancellationToken>>>,
}

impl Pending {
    /// Resolves once this handshake was closed to make room for a newer one.
    pub async fn evicted(&self) {
        self.evicted.cancelled().await;
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        self.book
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .finish(self.ticket);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn ip(last: u8) -> IpAddr {
        IpAddr::from([10, 0, 0, last])
    }

    #[test]
    fn a_source_at_its_share_evicts_only_its_own_oldest() {
        let mut book = PendingBook::new(10, 2);
        let (a1, none) = book.admit(ip(1), "a1").unwrap();
        assert!(none.is_empty());
        book.admit(ip(2), "b1").unwrap();
        book.admit(ip(1), "a2").unwrap();
        let (_, evicted) = book.admit(ip(1), "a3").unwrap();
        assert_eq!(evicted, vec![(Eviction::SourceFull, "a1")]);
        assert_eq!(book.of_source(ip(1)), 2);
        assert_eq!(book.of_source(ip(2)), 1);
        // The evicted ticket is gone: finishing it again gives nothing.
        assert_eq!(book.finish(a1), None);
    }

    #[test]
    fn a_full_port_evicts_its_oldest_whatever_the_source() {
        let mut book = PendingBook::new(3, 3);
        book.admit(ip(1), 1).unwrap();
        book.admit(ip(2), 2).unwrap();
        book.admit(ip(3), 3).unwrap();
        let (_, evicted) = book.admit(ip(4), 4).unwrap();
        assert_eq!(evicted, vec![(Eviction::PortFull, 1)]);
        assert_eq!(book.len(), 3);
        assert_eq!(book.of_source(ip(1)), 0);
    }

    #[test]
    fn a_flood_from_many_sources_never_keeps_a_new_handshake_out() {
        // The attack: the budget full of silent sockets from many
        // addresses, then a node connects, then the flood goes on. The
        // node's handshake is evicted only after a whole budget's worth of
        // newer connections.
        let (max, share) = (64, 8);
        let mut book = PendingBook::new(max, share);
        for i in 0..10 * max {
            book.admit(ip((i % 200) as u8 + 1), "flood").unwrap();
        }
        let (node, _) = book.admit(IpAddr::from([192, 168, 0, 1]), "node").unwrap();
        for i in 0..max - 1 {
            let (_, evicted) = book.admit(ip((i % 200) as u8 + 1), "flood").unwrap();
            assert!(evicted.iter().all(|(_, h)| *h == "flood"));
        }
        assert_eq!(book.finish(node), Some("node"));
        assert!(book.len() <= max);
    }

    #[test]
    fn one_source_flooding_never_evicts_another_source() {
        let mut book = PendingBook::new(16, 4);
        let (other, _) = book.admit(ip(9), "other").unwrap();
        for _ in 0..10_000 {
            let (_, evicted) = book.admit(ip(1), "flood").unwrap();
            assert!(evicted.iter().all(|(_, h)| *h == "flood"));
        }
        assert_eq!(book.of_source(ip(1)), 4);
        assert_eq!(book.finish(other), Some("other"));
    }

    #[test]
    fn the_book_is_bounded_and_forgets_finished_sources() {
        let mut book = PendingBook::new(5, 2);
        let tickets: Vec<_> = (0..50u8)
            .map(|i| book.admit(ip(i), ()).unwrap().0)
            .collect();
        assert_eq!(book.len(), 5);
        for t in tickets {
            book.finish(t);
        }
        assert!(book.is_empty());
        assert!(book.by_source.is_empty());
    }

    #[test]
    fn settings_below_one_still_admit_one() {
        let mut book = PendingBook::new(0, 0);
        let (_, evicted) = book.admit(ip(1), 1).unwrap();
        assert!(evicted.is_empty());
        let (_, evicted) = book.admit(ip(2), 2).unwrap();
        assert_eq!(evicted, vec![(Eviction::PortFull, 1)]);
    }
}
