//! Node-wide limits on what a client or a peer can make a node hold:
//! connections per port (a semaphore in each accept loop), how long a
//! connection may stay silent, and the counters of every refusal.
//!
//! The table-wide bounds on live leases and waiters are not here: they are
//! decided by the replicated lease table ([`fenced_core::Capacity`]), so
//! every replica refuses the same acquire.

use std::{
    fmt::Write as _,
    future::Future,
    io,
    pin::Pin,
    sync::{
        atomic::{AtomicU64, Ordering::Relaxed},
        Arc,
    },
    task::{Context, Poll},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
    sync::{OwnedSemaphorePermit, Semaphore},
    time::{Instant, Sleep},
};
use tokio_stream::{Stream, StreamExt};
use tonic::transport::server::Connected;

use crate::histogram::label_value;

/// The node-wide limits on connections, streams and peer data, as set
/// (`fenced run --help` names each; docs/DECISIONS.md says why the defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerLimits {
    /// Open connections per listener (client port, peer port), once their
    /// TLS handshake is done.
    pub max_connections: usize,
    /// Connections per listener whose TLS handshake is not done yet; the
    /// oldest is closed to make room (see [`crate::security::admission`]).
    pub max_pending_handshakes: usize,
    /// Of those, how many may come from one address.
    pub max_pending_handshakes_per_source: usize,
    /// Concurrent HTTP/2 streams per connection.
    pub max_concurrent_streams: u32,
    /// How often an HTTP/2 ping is sent on a connection.
    pub http2_keepalive_interval: Duration,
    /// How long a ping may go unanswered before the connection is closed.
    pub http2_keepalive_timeout: Duration,
    /// How long a connection may send nothing before it is closed.
    pub idle_timeout: Duration,
    /// The largest snapshot a node receives from a leader, in bytes.
    pub max_snapshot_bytes: u64,
}

impl Default for ServerLimits {
    fn default() -> Self {
        Self {
            max_connections: 4_096,
            max_pending_handshakes: 512,
            max_pending_handshakes_per_source: 64,
            max_concurrent_streams: 1_024,
            http2_keepalive_interval: Duration::from_secs(30),
            http2_keepalive_timeout: Duration::from_secs(10),
            idle_timeout: Duration::from_secs(300),
            max_snapshot_bytes: 256 * 1024 * 1024,
        }
    }
}

impl ServerLimits {
    /// A gRPC server builder with the per-connection limits applied.
    pub fn server(&self) -> tonic::transport::Server {
        tonic::transport::Server::builder()
            .max_concurrent_streams(self.max_concurrent_streams)
            .http2_keepalive_interval(Some(self.http2_keepalive_interval))
            .http2_keepalive_timeout(Some(self.http2_keepalive_timeout))
    }
}

/// Which listener a connection came in on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Port {
    Client,
    Peer,
    /// `/metrics` and the status page.
    Metrics,
}

impl Port {
    pub(crate) const ALL: [Port; 3] = [Port::Client, Port::Peer, Port::Metrics];

    pub(crate) fn name(self) -> &'static str {
        match self {
            Port::Client => "client",
            Port::Peer => "peer",
            Port::Metrics => "metrics",
        }
    }

    fn index(self) -> usize {
        match self {
            Port::Client => 0,
            Port::Peer => 1,
            Port::Metrics => 2,
        }
    }
}

/// One counter per listener.
#[derive(Debug, Default)]
pub struct PerPort([AtomicU64; 3]);

impl PerPort {
    pub fn of(&self, port: Port) -> &AtomicU64 {
        &self.0[port.index()]
    }
}

/// Per-identity bounds' defaults: far above what one application needs,
/// far below what exhausts a node's memory.
pub const DEFAULT_MAX_LEASES_PER_IDENTITY: u64 = 10_000;
pub const DEFAULT_MAX_WAITERS_PER_IDENTITY: u64 = 1_000;

/// Refusals by the limit that refused them; rendered in `/metrics` as
/// `fenced_limit_refusals_total{limit="..."}`.
#[derive(Debug, Default)]
pub struct LimitCounters {
    /// Connections closed at once: `max_connections` reached.
    pub connections: PerPort,
    /// Connections closed for sending nothing for `idle_timeout_ms`.
    pub idle_connections: PerPort,
    /// Unauthenticated connections closed to make room for a newer one:
    /// the port's pending budget was full, or their source's share.
    pub pending: PerPort,
    pub pending_per_source: PerPort,
    pub live_leases: AtomicU64,
    pub waiters: AtomicU64,
    /// Acquires refused by a per-identity bound (decided by the table).
    pub leases_per_identity: AtomicU64,
    pub waiters_per_identity: AtomicU64,
    pub kv_keys: AtomicU64,
    pub kv_bytes: AtomicU64,
    pub peer_frames: AtomicU64,
    pub snapshot_chunks: AtomicU64,
    /// Raft frames claiming another node than their certificate names.
    pub peer_impersonations: AtomicU64,
    /// Raft frames (votes, appends, snapshots) from a node that is not a voter.
    pub peer_not_voter: AtomicU64,
}

impl LimitCounters {
    /// Appends the counters in the Prometheus text format.
    pub fn render(&self, out: &mut String) {
        let _ = writeln!(
            out,
            "# HELP fenced_limit_refusals_total Requests, connections and frames refused by a node-wide limit, by the setting that refused them.\n\
             # TYPE fenced_limit_refusals_total counter"
        );
        let per_port = [
            ("max_connections", &self.connections),
            ("max_pending_handshakes", &self.pending),
            (
                "max_pending_handshakes_per_source",
                &self.pending_per_source,
            ),
            ("idle_timeout_ms", &self.idle_connections),
        ];
        let mut rows = Vec::new();
        for (limit, counters) in per_port {
            for port in Port::ALL {
                // The metrics port has no connection budget nor idle timeout.
                if port != Port::Metrics || limit.starts_with("max_pending") {
                    rows.push((limit, port.name(), counters.of(port)));
                }
            }
        }
        for (limit, port, counter) in rows.into_iter().chain([
            ("max_live_leases", "client", &self.live_leases),
            ("max_waiters", "client", &self.waiters),
            ("kv_max_keys", "client", &self.kv_keys),
            ("kv_max_total_bytes", "client", &self.kv_bytes),
            ("peer_frame_max_bytes", "peer", &self.peer_frames),
            ("max_snapshot_bytes", "peer", &self.snapshot_chunks),
        ]) {
            let _ = writeln!(
                out,
                "fenced_limit_refusals_total{{limit=\"{}\",port=\"{}\"}} {}",
                label_value(limit),
                label_value(port),
                counter.load(Relaxed)
            );
        }
        let _ = writeln!(
            out,
            "# HELP fenced_peer_frames_refused_total Raft frames refused because their sender may not send them: it claims another node than its certificate names, or it is not a voter.\n\
             # TYPE fenced_peer_frames_refused_total counter"
        );
        for (reason, counter) in [
            ("impersonation", &self.peer_impersonations),
            ("not_voter", &self.peer_not_voter),
        ] {
            let _ = writeln!(
                out,
                "fenced_peer_frames_refused_total{{reason=\"{reason}\"}} {}",
                counter.load(Relaxed)
            );
        }
    }
}

/// The most connections one listener keeps open at once, and how long one
/// may send nothing.
#[derive(Clone)]
pub struct ConnectionLimit {
    port: Port,
    max: usize,
    open: Arc<Semaphore>,
    idle_timeout: Duration,
    counters: Arc<LimitCounters>,
}

impl ConnectionLimit {
    pub fn new(
        port: Port,
        max: usize,
        idle_timeout: Duration,
        counters: Arc<LimitCounters>,
    ) -> Self {
        Self {
            port,
            max,
            open: Arc::new(Semaphore::new(max)),
            idle_timeout,
            counters,
        }
    }

    /// A slot for one more connection; `None` (counted) when all are taken:
    /// the caller closes the connection at once.
    pub fn admit(&self) -> Option<OwnedSemaphorePermit> {
        let permit = Arc::clone(&self.open).try_acquire_owned().ok();
        if permit.is_none() {
            let counter = self.counters.connections.of(self.port);
            // Once per thousand: a flood would otherwise flood the log too.
            if counter.fetch_add(1, Relaxed).is_multiple_of(1_000) {
                tracing::warn!(
                    port = self.port.name(),
                    max_connections = self.max,
                    "connection refused: max_connections reached (logged once per 1000)"
                );
            }
        }
        permit
    }

    /// `stream` holding `permit` for as long as it is open.
    pub fn wrap<S>(&self, stream: S, permit: OwnedSemaphorePermit) -> Limited<S> {
        Limited {
            inner: stream,
            _permit: permit,
            idle_timeout: self.idle_timeout,
            last_read: Instant::now(),
            idle: Box::pin(tokio::time::sleep(self.idle_timeout)),
            port: self.port,
            counters: Arc::clone(&self.counters),
        }
    }

    /// The accepted connections of `incoming` that fit under the limit;
    /// the others are closed as they arrive.
    pub fn incoming<I>(self, incoming: I) -> impl Stream<Item = io::Result<Limited<TcpStream>>>
    where
        I: Stream<Item = io::Result<TcpStream>>,
    {
        incoming.filter_map(move |accepted| match accepted {
            Ok(stream) => self.admit().map(|p| Ok(self.wrap(stream, p))),
            Err(e) => Some(Err(e)),
        })
    }
}

/// A connection that holds its slot under a [`ConnectionLimit`] and ends
/// with `TimedOut` once its peer has sent nothing for the idle timeout.
/// HTTP/2 keep-alive pings are answered by a live client, so only a silent
/// (dead, stuck or never-speaking) peer is cut off.
pub struct Limited<S> {
    inner: S,
    _permit: OwnedSemaphorePermit,
    idle_timeout: Duration,
    last_read: Instant,
    idle: Pin<Box<Sleep>>,
    port: Port,
    counters: Arc<LimitCounters>,
}

impl<S> Limited<S> {
    pub fn get_ref(&self) -> &S {
        &self.inner
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Limited<S> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        match Pin::new(&mut this.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    // The timer is moved only when it fires: cheaper than
                    // resetting it on every read.
                    this.last_read = Instant::now();
                }
                Poll::Ready(r)
            }
            Poll::Pending => loop {
                if this.idle.as_mut().poll(cx).is_pending() {
                    return Poll::Pending;
                }
                let deadline = this.last_read + this.idle_timeout;
                if deadline > Instant::now() {
                    this.idle.as_mut().reset(deadline);
                    continue;
                }
                let counter = this.counters.idle_connections.of(this.port);
                counter.fetch_add(1, Relaxed);
                return Poll::Ready(Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!(
                        "nothing received for idle_timeout_ms={}",
                        this.idle_timeout.as_millis()
                    ),
                )));
            },
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Limited<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }
}

impl<S: Connected> Connected for Limited<S> {
    type ConnectInfo = S::ConnectInfo;

    fn connect_info(&self) -> S::ConnectInfo {
        self.inner.connect_info()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    fn limit(max: usize, idle: Duration) -> ConnectionLimit {
        ConnectionLimit::new(Port::Client, max, idle, Arc::default())
    }

    #[test]
    fn connections_beyond_the_limit_are_refused_and_counted_and_a_slot_frees_on_close() {
        let l = limit(2, Duration::from_secs(60));
        let a = l.admit().expect("first");
        let _b = l.admit().expect("second");
        assert!(l.admit().is_none());
        assert!(l.admit().is_none());
        assert_eq!(l.counters.connections.of(Port::Client).load(Relaxed), 2);
        drop(a);
        assert!(l.admit().is_some(), "a closed connection frees its slot");
        let mut out = String::new();
        l.counters.render(&mut out);
        assert!(out
            .contains("fenced_limit_refusals_total{limit=\"max_connections\",port=\"client\"} 2"));
    }

    #[tokio::test]
    async fn a_silent_connection_is_closed_after_the_idle_timeout_and_a_talking_one_is_not() {
        let l = limit(4, Duration::from_millis(300));
        let (near, mut far) = tokio::io::duplex(64);
        let mut conn = l.wrap(near, l.admit().unwrap());
        let mut buf = [0u8; 8];
        // Bytes every 180 ms keep it open past the timeout.
        let start = Instant::now();
        for _ in 0..3 {
            tokio::time::sleep(Duration::from_millis(180)).await;
            far.write_all(b"x").await.unwrap();
            assert_eq!(conn.read(&mut buf).await.unwrap(), 1);
        }
        assert!(start.elapsed() > Duration::from_millis(500));
        let silent_from = Instant::now();
        let err = conn.read(&mut buf).await.unwrap_err();
        assert!(silent_from.elapsed() >= Duration::from_millis(250));
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        assert!(err.to_string().contains("idle_timeout_ms=300"), "{err}");
        assert_eq!(
            l.counters.idle_connections.of(Port::Client).load(Relaxed),
            1
        );
    }
}
