//! The listeners: callers (TLS when configured, a connection bound, a
//! handshake and header timeout) and the metrics port.

use std::{convert::Infallible, path::Path, sync::Arc, time::Duration};

use bytes::Bytes;
use fenced_server::security::auth::Principal;

use crate::gateway::Peer;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use rustls_pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer};
use tokio::{net::TcpListener, sync::Semaphore};
use tokio_rustls::TlsAcceptor;
use tokio_util::sync::CancellationToken;

use crate::{gateway::State, metrics::Metrics};

/// How long a TLS handshake may take.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a request head may take to arrive.
pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a new connection waits for a slot when every one is taken.
pub const SLOT_WAIT: Duration = Duration::from_millis(500);

/// The largest request head, in bytes.
pub const MAX_HEAD_BYTES: usize = 64 * 1024;

/// A server TLS configuration: `cert`/`key` PEM, and with `client_ca` a
/// client certificate that CA signed is verified and names the caller
/// (callers without one may still present a bearer token).
pub fn server_tls(
    cert: &Path,
    key: &Path,
    client_ca: Option<&Path>,
    require_client_cert: bool,
) -> Result<TlsAcceptor, String> {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let chain = CertificateDer::pem_file_iter(cert)
        .map_err(|e| format!("tls_cert: {}: {e}", cert.display()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| format!("tls_cert: {}: {e}", cert.display()))?;
    let key = PrivateKeyDer::from_pem_file(key)
        .map_err(|e| format!("tls_key: {}: {e}", key.display()))?;
    let builder = rustls::ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(|e| format!("TLS: {e}"))?;
    let builder = match client_ca {
        None => builder.with_no_client_auth(),
        Some(ca) => {
            let mut roots = rustls::RootCertStore::empty();
            for c in CertificateDer::pem_file_iter(ca)
                .map_err(|e| format!("client_ca: {}: {e}", ca.display()))?
            {
                let c = c.map_err(|e| format!("client_ca: {}: {e}", ca.display()))?;
                roots
                    .add(c)
                    .map_err(|e| format!("client_ca: {}: {e}", ca.display()))?;
            }
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            );
            let verifier = if require_client_cert {
                verifier.build()
            } else {
                verifier.allow_unauthenticated().build()
            }
            .map_err(|e| format!("client_ca: {e}"))?;
            builder.with_client_cert_verifier(verifier)
        }
    };
    let mut config = builder
        .with_single_cert(chain, key)
        .map_err(|e| format!("tls_cert/tls_key: {e}"))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(TlsAcceptor::from(Arc::new(config)))
}

/// Serves callers on `listener` until `stop`, at most `max_connections`
/// at once (beyond, a new connection is closed at once and counted).
pub async fn serve_callers(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    state: Arc<State>,
    max_connections: usize,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(max_connections));
    let connections = tokio_util::task::TaskTracker::new();
    loop {
        let (stream, _addr) = tokio::select! {
            () = stop.cancelled() => {
                // Every connection in progress ends within the grace.
                connections.close();
                let _ = tokio::time::timeout(SHUTDOWN_GRACE, connections.wait()).await;
                return;
            }
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "gateway: accept failed");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        // A connection that just closed may not have given its slot back
        // yet: wait a moment for one before refusing.
        let Ok(Ok(slot)) =
            tokio::time::timeout(SLOT_WAIT, Arc::clone(&slots).acquire_owned()).await
        else {
            state.metrics.connection_refused();
            continue;
        };
        let _ = stream.set_nodelay(true);
        let (state, tls, stop) = (Arc::clone(&state), tls.clone(), stop.clone());
        connections.spawn(async move {
            let _slot = slot;
            match tls {
                None => serve_connection(stream, state, None, stop).await,
                Some(tls) => {
                    let Ok(Ok(s)) =
                        tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await
                    else {
                        return;
                    };
                    let peer = s
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|c| {
                            Some(Peer {
                                principal: Principal(fenced_server::security::tls::client_name(c)?),
                                der: c.to_vec(),
                            })
                        });
                    serve_connection(s, state, peer, stop).await;
                }
            }
        });
    }
}

async fn serve_connection<S>(
    stream: S,
    state: Arc<State>,
    peer: Option<Peer>,
    stop: CancellationToken,
) where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
        let (state, peer) = (Arc::clone(&state), peer.clone());
        async move { Ok::<_, Infallible>(crate::gateway::handle(state, req, peer).await) }
    });
    let conn = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(HEADER_READ_TIMEOUT)
        .max_buf_size(MAX_HEAD_BYTES)
        .serve_connection(TokioIo::new(stream), service);
    tokio::pin!(conn);
    let ended = tokio::select! {
        r = conn.as_mut() => Some(r),
        () = stop.cancelled() => None,
    };
    let ended = match ended {
        Some(r) => r,
        None => {
            // Stop taking requests, and let the ones in progress end (their
            // forwarding tasks go on regardless), within the shutdown bound.
            conn.as_mut().graceful_shutdown();
            match tokio::time::timeout(SHUTDOWN_GRACE, conn.as_mut()).await {
                Ok(r) => r,
                Err(_) => return,
            }
        }
    };
    if let Err(e) = ended {
        tracing::debug!(error = %e, "gateway connection");
    }
}

/// How long a connection in progress may take to end on SIGTERM.
pub const SHUTDOWN_GRACE: Duration = Duration::from_secs(30);

/// Serves `GET /metrics` on `listener` until `stop`: 16 connections at
/// most, TLS with a required client certificate when `tls` is set.
pub async fn serve_metrics(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    metrics: Arc<Metrics>,
    auth: Arc<fenced_server::security::auth::Auth>,
    stop: CancellationToken,
) {
    let slots = Arc::new(Semaphore::new(16));
    loop {
        let stream = tokio::select! {
            () = stop.cancelled() => return,
            accepted = listener.accept() => match accepted {
                Ok((s, _)) => s,
                Err(_) => { tokio::time::sleep(Duration::from_millis(100)).await; continue; }
            },
        };
        let Ok(slot) = Arc::clone(&slots).try_acquire_owned() else {
            continue;
        };
        let (metrics, tls, auth) = (Arc::clone(&metrics), tls.clone(), Arc::clone(&auth));
        tokio::spawn(async move {
            let _slot = slot;
            // The connection's certificate, checked against the deny list
            // at every request (set once the handshake is done).
            let certificate: Arc<std::sync::OnceLock<Vec<u8>>> = Arc::default();
            let seen = Arc::clone(&certificate);
            let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                let (metrics, auth, seen) =
                    (Arc::clone(&metrics), Arc::clone(&auth), Arc::clone(&seen));
                async move {
                    let revoked = seen
                        .get()
                        .and_then(|der| auth.certificate_in_force(der).err());
                    let (status, body) = if let Some(refused) = revoked {
                        (StatusCode::UNAUTHORIZED, format!("{}\n", refused.message()))
                    } else if req.uri().path() == "/metrics" {
                        (StatusCode::OK, metrics.render())
                    } else {
                        (
                            StatusCode::NOT_FOUND,
                            "metrics are at /metrics\n".to_string(),
                        )
                    };
                    let mut r = Response::new(Full::new(Bytes::from(body)));
                    *r.status_mut() = status;
                    Ok::<_, Infallible>(r)
                }
            });
            let builder = {
                let mut b = hyper::server::conn::http1::Builder::new();
                b.timer(TokioTimer::new())
                    .header_read_timeout(HEADER_READ_TIMEOUT)
                    .max_buf_size(MAX_HEAD_BYTES);
                b
            };
            let served = async {
                match tls {
                    None => {
                        let _ = builder
                            .serve_connection(TokioIo::new(stream), service)
                            .await;
                    }
                    Some(tls) => {
                        if let Ok(Ok(s)) =
                            tokio::time::timeout(HANDSHAKE_TIMEOUT, tls.accept(stream)).await
                        {
                            if let Some(der) =
                                s.get_ref().1.peer_certificates().and_then(|c| c.first())
                            {
                                let _ = certificate.set(der.to_vec());
                            }
                            let _ = builder.serve_connection(TokioIo::new(s), service).await;
                        }
                    }
                }
            };
            let _ = tokio::time::timeout(Duration::from_secs(30), served).await;
        });
    }
}
