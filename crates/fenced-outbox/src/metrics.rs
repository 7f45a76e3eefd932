//! The dispatcher's metrics in the Prometheus text format, and the
//! `/metrics` listener: plaintext on loopback only; anywhere else TLS with
//! a required client certificate. Connections are bounded in number, in
//! header size and in time.

use std::{
    convert::Infallible,
    fmt::Write as _,
    net::SocketAddr,
    path::Path,
    sync::{
        atomic::{AtomicBool, AtomicU64, Ordering::Relaxed},
        Arc,
    },
    time::Duration,
};

use http_body_util::Full;
use hyper::{body::Bytes, header, Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls::{
    pki_types::{CertificateDer, PrivateKeyDer},
    server::WebPkiClientVerifier,
    RootCertStore, ServerConfig,
};
use rustls_pki_types::pem::PemObject;
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::{decide::Mark, Backlog, Store};

/// Most `/metrics` connections served at once; more are closed at once.
pub const MAX_CONNECTIONS: usize = 16;
/// A connection that has not finished its TLS handshake and request head
/// within this is closed.
const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(5);
/// The largest request head read.
const MAX_REQUEST_HEAD_BYTES: usize = 16 * 1024;
/// A connection is closed after this, whatever it is doing.
const CONNECTION_TIMEOUT: Duration = Duration::from_secs(30);

/// The dispatcher's counters and state.
#[derive(Debug, Default)]
pub struct Metrics {
    delivered: AtomicU64,
    failed: AtomicU64,
    retried: AtomicU64,
    superseded: AtomicU64,
    active: AtomicBool,
    /// The token of the active period (0: none).
    token: AtomicU64,
}

/// A snapshot of [`Metrics`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Counts {
    pub delivered: u64,
    pub failed: u64,
    pub retried: u64,
    pub superseded: u64,
    pub active: bool,
}

impl Metrics {
    pub(crate) fn count(&self, mark: &Mark) {
        let counter = match mark {
            Mark::Delivered => &self.delivered,
            Mark::Retry { .. } => &self.retried,
            Mark::Failed { .. } => &self.failed,
            Mark::Superseded { .. } => &self.superseded,
        };
        counter.fetch_add(1, Relaxed);
    }

    pub(crate) fn set_active(&self, token: Option<u64>) {
        self.token.store(token.unwrap_or(0), Relaxed);
        self.active.store(token.is_some(), Relaxed);
    }

    pub fn counts(&self) -> Counts {
        Counts {
            delivered: self.delivered.load(Relaxed),
            failed: self.failed.load(Relaxed),
            retried: self.retried.load(Relaxed),
            superseded: self.superseded.load(Relaxed),
            active: self.active.load(Relaxed),
        }
    }
}

fn family(out: &mut String, name: &str, help: &str, kind: &str, value: impl std::fmt::Display) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
    let _ = writeln!(out, "{name} {value}");
}

/// The exposition (Prometheus text format 0.0.4). Without a backlog (the
/// database did not answer) its two gauges are left out and
/// `fenced_outbox_backlog_up` is 0.
///
/// ```
/// use fenced_outbox::{metrics::{render, Counts}, Backlog};
/// let text = render(&Counts::default(), Some(Backlog { pending: 3, ..Backlog::default() }));
/// assert!(text.contains("\nfenced_outbox_pending 3\n"));
/// ```
pub fn render(counts: &Counts, backlog: Option<Backlog>) -> String {
    let mut out = String::with_capacity(1024);
    family(
        &mut out,
        "fenced_outbox_backlog_up",
        "Whether the backlog could be read from the database.",
        "gauge",
        u8::from(backlog.is_some()),
    );
    if let Some(b) = backlog {
        family(
            &mut out,
            "fenced_outbox_pending",
            "Operations recorded and not yet delivered, failed or superseded.",
            "gauge",
            b.pending,
        );
        family(
            &mut out,
            "fenced_outbox_oldest_pending_age_seconds",
            "How long ago the oldest pending operation was recorded (0: none).",
            "gauge",
            b.oldest_age.as_secs_f64(),
        );
    }
    family(
        &mut out,
        "fenced_outbox_delivered_total",
        "Operations this process marked delivered.",
        "counter",
        counts.delivered,
    );
    family(
        &mut out,
        "fenced_outbox_failed_total",
        "Operations this process marked failed (a permanent answer, or out of attempts).",
        "counter",
        counts.failed,
    );
    family(
        &mut out,
        "fenced_outbox_retried_total",
        "Attempts this process scheduled again after a transient failure.",
        "counter",
        counts.retried,
    );
    family(&mut out, "fenced_outbox_superseded_total", "Operations this process skipped: a newer owner's operation for the resource was recorded earlier.", "counter", counts.superseded);
    family(
        &mut out,
        "fenced_outbox_dispatcher_active",
        "1 while this process holds the dispatcher lease and delivers.",
        "gauge",
        u8::from(counts.active),
    );
    out
}

/// Whether `/metrics` on `listen` must use TLS, from which TLS flags were
/// given: off loopback all three are required (the error names the first
/// one missing); on loopback none or all three.
///
/// ```
/// use fenced_outbox::metrics::{tls_required, TlsFlags};
/// let none = TlsFlags::default();
/// assert_eq!(tls_required("127.0.0.1:9752".parse().unwrap(), none), Ok(false));
/// let e = tls_required("0.0.0.0:9752".parse().unwrap(), none).unwrap_err();
/// assert!(e.starts_with("--metrics-tls-cert is required"));
/// ```
pub fn tls_required(listen: SocketAddr, given: TlsFlags) -> Result<bool, String> {
    let missing = [
        ("--metrics-tls-cert", given.cert),
        ("--metrics-tls-key", given.key),
        ("--metrics-client-ca", given.client_ca),
    ]
    .into_iter()
    .find(|(_, present)| !present)
    .map(|(flag, _)| flag);
    let any = given.cert || given.key || given.client_ca;
    match missing {
        None => Ok(true),
        Some(_) if !any && listen.ip().is_loopback() => Ok(false),
        Some(flag) if listen.ip().is_loopback() => Err(format!(
            "{flag} is required with the other --metrics-tls-* flags (TLS needs the certificate, its key and the CA of the clients)"
        )),
        Some(flag) => Err(format!(
            "{flag} is required: --metrics-listen {listen} is not loopback, and metrics off loopback are served only over TLS with client certificates (--metrics-tls-cert, --metrics-tls-key, --metrics-client-ca)"
        )),
    }
}

/// Which of the metrics TLS flags were given.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TlsFlags {
    pub cert: bool,
    pub key: bool,
    pub client_ca: bool,
}

/// The TLS acceptor of `/metrics`: this certificate and key, and a client
/// certificate signed by `client_ca` required of every client.
pub fn tls_acceptor(cert: &Path, key: &Path, client_ca: &Path) -> Result<TlsAcceptor, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let read_err =
        |flag: &str, p: &Path, e: &dyn std::fmt::Display| format!("{flag} {}: {e}", p.display());
    let mut roots = RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(client_ca)
        .map_err(|e| read_err("--metrics-client-ca", client_ca, &e))?
    {
        let c = c.map_err(|e| read_err("--metrics-client-ca", client_ca, &e))?;
        roots
            .add(c)
            .map_err(|e| read_err("--metrics-client-ca", client_ca, &e))?;
    }
    if roots.is_empty() {
        return Err(read_err(
            "--metrics-client-ca",
            client_ca,
            &"no certificate in it",
        ));
    }
    let verifier =
        WebPkiClientVerifier::builder_with_provider(Arc::new(roots), Arc::clone(&provider))
            .build()
            .map_err(|e| read_err("--metrics-client-ca", client_ca, &e))?;
    let chain = CertificateDer::pem_file_iter(cert)
        .and_then(|i| i.collect::<Result<Vec<_>, _>>())
        .map_err(|e| read_err("--metrics-tls-cert", cert, &e))?;
    let key_der =
        PrivateKeyDer::from_pem_file(key).map_err(|e| read_err("--metrics-tls-key", key, &e))?;
    let config = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| e.to_string())?
        .with_client_cert_verifier(verifier)
        .with_single_cert(chain, key_der)
        .map_err(|e| {
            format!(
                "--metrics-tls-cert {} and --metrics-tls-key: {e}",
                cert.display()
            )
        })?;
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves `GET /metrics` on `listener` until `shutdown` fires: the
/// counters of `metrics` and the backlog read from `store` at each scrape.
pub async fn serve(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    store: Store,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (stream, peer) = tokio::select! {
            _ = shutdown.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            tracing::debug!(%peer, "metrics: connection refused: {MAX_CONNECTIONS} already open");
            continue;
        };
        let (tls, store, metrics) = (tls.clone(), store.clone(), Arc::clone(&metrics));
        tokio::spawn(async move {
            let _slot = slot;
            let served = tokio::time::timeout(CONNECTION_TIMEOUT, async move {
                match tls {
                    None => serve_one(stream, store, metrics).await,
                    Some(tls) => {
                        match tokio::time::timeout(HEADER_READ_TIMEOUT, tls.accept(stream)).await {
                            Ok(Ok(stream)) => serve_one(stream, store, metrics).await,
                            Ok(Err(e)) => {
                                tracing::debug!(%peer, error = %e, "metrics: TLS handshake refused")
                            }
                            Err(_) => tracing::debug!(%peer, "metrics: TLS handshake timed out"),
                        }
                    }
                }
            })
            .await;
            if served.is_err() {
                tracing::debug!(%peer, "metrics: connection closed after {CONNECTION_TIMEOUT:?}");
            }
        });
    }
}

async fn serve_one<S>(stream: S, store: Store, metrics: Arc<Metrics>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<hyper::body::Incoming>| {
        let (store, metrics) = (store.clone(), Arc::clone(&metrics));
        async move { Ok::<_, Infallible>(answer(&req, &store, &metrics).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_REQUEST_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service)
        .await;
}

async fn answer<B>(req: &Request<B>, store: &Store, metrics: &Metrics) -> Response<Full<Bytes>> {
    let (status, body) = match (req.method(), req.uri().path()) {
        (&Method::GET, "/metrics") => {
            let backlog = match store.backlog().await {
                Ok(b) => Some(b),
                Err(e) => {
                    tracing::warn!(error = %e, "metrics: could not read the backlog");
                    None
                }
            };
            (StatusCode::OK, render(&metrics.counts(), backlog))
        }
        (_, "/metrics") => (StatusCode::METHOD_NOT_ALLOWED, "GET only\n".to_string()),
        _ => (StatusCode::NOT_FOUND, "not found: /metrics\n".to_string()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
    );
    response
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use super::*;

    fn flags(cert: bool, key: bool, client_ca: bool) -> TlsFlags {
        TlsFlags {
            cert,
            key,
            client_ca,
        }
    }

    #[test]
    fn off_loopback_needs_all_three_tls_flags() {
        let public: SocketAddr = "0.0.0.0:9752".parse().unwrap();
        let v6: SocketAddr = "[::]:9752".parse().unwrap();
        let local: SocketAddr = "127.0.0.1:9752".parse().unwrap();
        let local6: SocketAddr = "[::1]:9752".parse().unwrap();
        for addr in [public, v6] {
            for (given, named) in [
                (flags(false, false, false), "--metrics-tls-cert"),
                (flags(true, false, false), "--metrics-tls-key"),
                (flags(true, true, false), "--metrics-client-ca"),
                (flags(false, true, true), "--metrics-tls-cert"),
            ] {
                let e = tls_required(addr, given).unwrap_err();
                assert!(e.starts_with(&format!("{named} is required")), "{e}");
                assert!(e.contains("not loopback"), "{e}");
            }
            assert_eq!(tls_required(addr, flags(true, true, true)), Ok(true));
        }
        for addr in [local, local6] {
            assert_eq!(tls_required(addr, flags(false, false, false)), Ok(false));
            assert_eq!(tls_required(addr, flags(true, true, true)), Ok(true));
            let e = tls_required(addr, flags(true, true, false)).unwrap_err();
            assert!(e.starts_with("--metrics-client-ca is required"), "{e}");
        }
    }

    #[test]
    fn the_exposition_without_a_backlog() {
        let text = render(
            &Counts {
                delivered: 2,
                active: true,
                ..Counts::default()
            },
            None,
        );
        assert!(text.contains("\nfenced_outbox_backlog_up 0\n"));
        assert!(!text.contains("fenced_outbox_pending"));
        assert!(text.contains("\nfenced_outbox_delivered_total 2\n"));
        assert!(text.ends_with("fenced_outbox_dispatcher_active 1\n"));
    }
}
