//! The client's TCP transport: one write per request instead of two.
//!
//! HTTP/2 (the `h2` crate under tonic) sends a request's HEADERS as soon as
//! its connection task opens the stream, and can give the stream room for its
//! DATA only then, so a unary call leaves as two writes, HEADERS first and
//! DATA a task hand-off later. The server wakes for each, and the call waits
//! for the second. [`Coalescing`] holds a flush back for one turn of the
//! scheduler, which is when the DATA arrives, and writes both at once.

use std::{
    future::Future,
    io,
    pin::Pin,
    task::{Context, Poll},
    time::Duration,
};

use hyper_util::rt::TokioIo;
use tokio::{
    io::{AsyncRead, AsyncWrite, ReadBuf},
    net::TcpStream,
};
use tokio_rustls::TlsConnector;
use tonic::codegen::http::Uri;

use crate::tls::{self, ClientStream};

/// Bytes held before a write goes through without waiting for a flush.
const HOLD_LIMIT: usize = 64 * 1024;

/// A stream whose writes are buffered and whose first flush after a write is
/// put off once: the caller is woken at once and flushes again on its next
/// poll, with whatever it wrote in between.
pub(crate) struct Coalescing<S> {
    inner: S,
    held: Vec<u8>,
    /// A flush was put off and the next one goes through.
    deferred: bool,
}

impl<S> Coalescing<S> {
    pub(crate) fn new(inner: S) -> Self {
        Self {
            inner,
            held: Vec::new(),
            deferred: false,
        }
    }
}

impl<S: AsyncWrite + Unpin> Coalescing<S> {
    /// Writes out everything held.
    fn poll_drain(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        while !self.held.is_empty() {
            let n = match Pin::new(&mut self.inner).poll_write(cx, &self.held) {
                Poll::Ready(Ok(n)) => n,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            if n == 0 {
                return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
            }
            self.held.drain(..n);
        }
        Poll::Ready(Ok(()))
    }

    /// Room for more: writes through first once the limit is reached.
    fn poll_room(&mut self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        if self.held.len() >= HOLD_LIMIT {
            return self.poll_drain(cx);
        }
        Poll::Ready(Ok(()))
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Coalescing<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Coalescing<S> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        data: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Err(e) = std::task::ready!(this.poll_room(cx)) {
            return Poll::Ready(Err(e));
        }
        this.held.extend_from_slice(data);
        Poll::Ready(Ok(data.len()))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if let Err(e) = std::task::ready!(this.poll_room(cx)) {
            return Poll::Ready(Err(e));
        }
        let mut n = 0;
        for b in bufs {
            this.held.extend_from_slice(b);
            n += b.len();
        }
        Poll::Ready(Ok(n))
    }

    fn is_write_vectored(&self) -> bool {
        true
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.held.is_empty() && !this.deferred {
            // Let the tasks woken by this poll (a request body's) run first.
            this.deferred = true;
            cx.waker().wake_by_ref();
            return Poll::Pending;
        }
        if let Err(e) = std::task::ready!(this.poll_drain(cx)) {
            return Poll::Ready(Err(e));
        }
        this.deferred = false;
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if let Err(e) = std::task::ready!(this.poll_drain(cx)) {
            return Poll::Ready(Err(e));
        }
        Pin::new(&mut this.inner).poll_shutdown(cx)
    }
}

/// Opens TCP connections (Nagle off) for tonic, wrapped in [`Coalescing`];
/// `https://` ones then go through TLS.
#[derive(Clone, Default)]
pub(crate) struct Connector {
    pub(crate) tls: Option<TlsConnector>,
}

type Connecting =
    Pin<Box<dyn Future<Output = io::Result<TokioIo<Coalescing<ClientStream>>>> + Send>>;

impl tower_service::Service<Uri> for Connector {
    type Response = TokioIo<Coalescing<ClientStream>>;
    type Error = io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let tls = self.tls.clone();
        Box::pin(async move {
            let host = uri.host().ok_or_else(|| {
                io::Error::new(io::ErrorKind::InvalidInput, format!("no host in {uri}"))
            })?;
            // tonic refuses an https:// URI with a connector of one's own:
            // the client hands it http:// and TLS is this connector's.
            if uri.scheme_str() != Some("http") {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!("{uri}: only http:// (TLS comes from the connector)"),
                ));
            }
            let port = uri
                .port_u16()
                .unwrap_or(if tls.is_some() { 443 } else { 80 });
            // An IPv6 literal comes bracketed in a URI.
            let host = host.trim_start_matches('[').trim_end_matches(']');
            // A name's addresses are tried in turn within tonic's one
            // connect timeout; endpoints are usually addresses or names
            // with one address each.
            let stream = TcpStream::connect((host, port)).await?;
            stream.set_nodelay(true)?;
            let stream = match tls {
                None => ClientStream::Plain(stream, Some(format!("{host}:{port}"))),
                Some(tls) => tls::handshake(&tls, host, format!("{host}:{port}"), stream).await?,
            };
            Ok(TokioIo::new(Coalescing::new(stream)))
        })
    }
}

/// How long a connection attempt may take.
pub(crate) const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    /// A sink that records each write it is given as one chunk.
    #[derive(Clone, Default)]
    struct Recorder {
        writes: Arc<Mutex<Vec<Vec<u8>>>>,
        /// Accept at most this many bytes per write (0: no limit).
        max_write: usize,
        /// While set, every write is Pending (a full socket buffer).
        full: Arc<AtomicBool>,
    }

    impl AsyncWrite for Recorder {
        fn poll_write(
            self: Pin<&mut Self>,
            _cx: &mut Context<'_>,
            data: &[u8],
        ) -> Poll<io::Result<usize>> {
            if self.full.load(Ordering::SeqCst) {
                return Poll::Pending;
            }
            let n = if self.max_write == 0 {
                data.len()
            } else {
                data.len().min(self.max_write)
            };
            self.writes.lock().unwrap().push(data[..n].to_vec());
            Poll::Ready(Ok(n))
        }
        fn poll_flush(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
        fn poll_shutdown(self: Pin<&mut Self>, _cx: &mut Context<'_>) -> Poll<io::Result<()>> {
            Poll::Ready(Ok(()))
        }
    }

    fn poll_flush(s: &mut Coalescing<Recorder>) -> Poll<io::Result<()>> {
        let waker = std::task::Waker::noop();
        Pin::new(s).poll_flush(&mut Context::from_waker(waker))
    }

    fn write(s: &mut Coalescing<Recorder>, data: &[u8]) {
        let waker = std::task::Waker::noop();
        let r = Pin::new(s).poll_write(&mut Context::from_waker(waker), data);
        assert!(matches!(r, Poll::Ready(Ok(n)) if n == data.len()));
    }

    #[test]
    fn what_is_written_before_the_second_flush_leaves_in_one_write() {
        let sink = Recorder::default();
        let mut s = Coalescing::new(sink.clone());
        write(&mut s, b"headers");
        assert!(
            poll_flush(&mut s).is_pending(),
            "the first flush waits a turn"
        );
        write(&mut s, b"+data");
        assert!(matches!(poll_flush(&mut s), Poll::Ready(Ok(()))));
        assert_eq!(*sink.writes.lock().unwrap(), vec![b"headers+data".to_vec()]);
        // Nothing held: a flush goes straight through and writes nothing.
        assert!(matches!(poll_flush(&mut s), Poll::Ready(Ok(()))));
        // The next write is held again, once.
        write(&mut s, b"next");
        assert!(poll_flush(&mut s).is_pending());
        assert!(matches!(poll_flush(&mut s), Poll::Ready(Ok(()))));
        assert_eq!(sink.writes.lock().unwrap().len(), 2);
    }

    #[test]
    fn a_put_off_flush_wakes_its_task() {
        struct Count(AtomicUsize);
        impl std::task::Wake for Count {
            fn wake(self: Arc<Self>) {
                self.0.fetch_add(1, Ordering::SeqCst);
            }
        }
        let count = Arc::new(Count(Default::default()));
        let waker = std::task::Waker::from(Arc::clone(&count));
        let mut s = Coalescing::new(Recorder::default());
        write(&mut s, b"x");
        let r = Pin::new(&mut s).poll_flush(&mut Context::from_waker(&waker));
        assert!(r.is_pending());
        assert_eq!(count.0.load(Ordering::SeqCst), 1);
    }

    #[test]
    fn partial_writes_and_shutdown_deliver_every_byte_in_order() {
        let sink = Recorder {
            max_write: 3,
            ..Recorder::default()
        };
        let mut s = Coalescing::new(sink.clone());
        write(&mut s, b"abcdefgh");
        let waker = std::task::Waker::noop();
        let r = Pin::new(&mut s).poll_shutdown(&mut Context::from_waker(waker));
        assert!(matches!(r, Poll::Ready(Ok(()))));
        assert_eq!(sink.writes.lock().unwrap().concat(), b"abcdefgh".to_vec());
    }

    #[test]
    fn a_full_socket_keeps_the_bytes_until_it_drains() {
        let sink = Recorder::default();
        let mut s = Coalescing::new(sink.clone());
        write(&mut s, b"one");
        assert!(poll_flush(&mut s).is_pending());
        sink.full.store(true, Ordering::SeqCst);
        assert!(poll_flush(&mut s).is_pending(), "the socket takes nothing");
        write(&mut s, b"+two");
        assert!(poll_flush(&mut s).is_pending());
        assert!(sink.writes.lock().unwrap().is_empty());
        sink.full.store(false, Ordering::SeqCst);
        assert!(matches!(poll_flush(&mut s), Poll::Ready(Ok(()))));
        assert_eq!(*sink.writes.lock().unwrap(), vec![b"one+two".to_vec()]);
    }

    #[tokio::test]
    async fn the_connector_dials_http_addresses_and_names_and_refuses_other_schemes() {
        use tower_service::Service;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        for url in [
            format!("http://127.0.0.1:{port}"),
            format!("http://localhost:{port}"),
        ] {
            let uri: Uri = url.parse().unwrap();
            let connected = Connector::default().call(uri).await;
            assert!(connected.is_ok(), "{url}: {:?}", connected.err());
            let (_peer, _) = listener.accept().await.unwrap();
        }
        let uri: Uri = format!("https://127.0.0.1:{port}").parse().unwrap();
        let refused = Connector::default().call(uri).await.err().unwrap();
        assert_eq!(refused.kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn past_the_limit_writes_go_through_without_a_flush() {
        let sink = Recorder::default();
        let mut s = Coalescing::new(sink.clone());
        let big = vec![7u8; HOLD_LIMIT];
        write(&mut s, &big);
        assert!(
            sink.writes.lock().unwrap().is_empty(),
            "held up to the limit"
        );
        write(&mut s, b"more");
        assert_eq!(sink.writes.lock().unwrap().concat(), big);
        assert!(poll_flush(&mut s).is_pending());
        assert!(matches!(poll_flush(&mut s), Poll::Ready(Ok(()))));
        assert_eq!(sink.writes.lock().unwrap().last().unwrap(), b"more");
    }
}
