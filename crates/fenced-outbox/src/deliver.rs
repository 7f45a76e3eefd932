//! Delivery: one HTTP/1.1 request per attempt, over TCP or TLS (rustls on
//! the ring provider), bounded by a timeout.

use std::{future::Future, path::Path, sync::Arc, time::Duration};

use http_body_util::{BodyExt, Full};
use hyper::{body::Bytes, header, Request};
use hyper_util::rt::TokioIo;
use rustls::{pki_types::CertificateDer, ClientConfig, RootCertStore};
use rustls_pki_types::{pem::PemObject, ServerName};
use tokio::{
    io::{AsyncRead, AsyncWrite},
    net::TcpStream,
};
use tokio_rustls::TlsConnector;

use crate::{decide::Outcome, operation::check_destination, Pending};

/// The header that carries the operation's idempotency key.
pub const IDEMPOTENCY_KEY_HEADER: &str = "Idempotency-Key";

/// Performs one attempt of one operation. [`HttpDelivery`] is the real one;
/// tests may put another behind the dispatcher.
pub trait Deliver: Send + Sync + 'static {
    fn deliver(&self, op: &Pending) -> impl Future<Output = Outcome> + Send;
}

/// HTTP and HTTPS delivery: a new connection per attempt, the whole attempt
/// (connect, TLS, request, response head) within `timeout`.
#[derive(Clone)]
pub struct HttpDelivery {
    timeout: Duration,
    tls: TlsConnector,
}

impl HttpDelivery {
    /// Delivery trusting the CA certificates (PEM) in `ca` for `https://`
    /// destinations, or the system's roots without one (as the gateway).
    pub fn new(ca: Option<&Path>, timeout: Duration) -> Result<HttpDelivery, String> {
        let tls = connector(ca)?;
        Ok(HttpDelivery { timeout, tls })
    }

    async fn attempt(&self, op: &Pending) -> Result<u16, String> {
        let uri = check_destination(&op.destination).map_err(|e| e.to_string())?;
        let https = uri.scheme_str() == Some("https");
        let authority = uri.authority().ok_or("destination: no host")?.clone();
        let host = authority
            .host()
            .trim_start_matches('[')
            .trim_end_matches(']');
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let tcp = TcpStream::connect((host, port))
            .await
            .map_err(|e| format!("connect {host}:{port}: {e}"))?;
        // One small request, then the answer: no delay for Nagle.
        let _ = tcp.set_nodelay(true);
        let path = uri.path_and_query().map_or("/", |p| p.as_str()).to_string();
        let request = Request::builder()
            .method(op.method.as_str())
            .uri(path)
            .header(header::HOST, authority.as_str())
            .header(header::CONTENT_TYPE, op.content_type.as_str())
            .header(IDEMPOTENCY_KEY_HEADER, op.idempotency_key.as_str())
            .header(header::USER_AGENT, "fenced-outbox")
            .body(Full::new(Bytes::from(op.payload.clone())))
            .map_err(|e| format!("building the request: {e}"))?;
        if https {
            let tls = &self.tls;
            let name = ServerName::try_from(host.to_string())
                .map_err(|e| format!("server name {host:?}: {e}"))?;
            let stream = tls
                .connect(name, tcp)
                .await
                .map_err(|e| format!("TLS with {host}:{port}: {e}"))?;
            exchange(stream, request).await
        } else {
            exchange(tcp, request).await
        }
    }
}

impl Deliver for HttpDelivery {
    async fn deliver(&self, op: &Pending) -> Outcome {
        match tokio::time::timeout(self.timeout, self.attempt(op)).await {
            Ok(Ok(status)) => Outcome::Status(status),
            Ok(Err(e)) => Outcome::Transport(e),
            Err(_) => Outcome::TimedOut,
        }
    }
}

/// Most of a response body read (and dropped) before the connection is
/// closed: the status is the answer.
const RESPONSE_BODY_MAX_BYTES: usize = 64 * 1024;

async fn exchange<S>(stream: S, request: Request<Full<Bytes>>) -> Result<u16, String>
where
    S: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| format!("HTTP handshake: {e}"))?;
    let connection = tokio::spawn(connection);
    let result = async {
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| format!("HTTP exchange: {e}"))?;
        let status = response.status().as_u16();
        // Read a bounded body so the server sees a complete exchange; its
        // content is not needed.
        let _ = http_body_util::Limited::new(response.into_body(), RESPONSE_BODY_MAX_BYTES)
            .collect()
            .await;
        Ok(status)
    }
    .await;
    connection.abort();
    result
}

fn connector(ca: Option<&Path>) -> Result<TlsConnector, String> {
    let mut roots = RootCertStore::empty();
    match ca {
        Some(ca) => {
            let bad = |e: &dyn std::fmt::Display| format!("--destination-ca {}: {e}", ca.display());
            for cert in CertificateDer::pem_file_iter(ca).map_err(|e| bad(&e))? {
                roots.add(cert.map_err(|e| bad(&e))?).map_err(|e| bad(&e))?;
            }
            if roots.is_empty() {
                return Err(bad(&"no certificate in it"));
            }
        }
        None => {
            // A system certificate rustls cannot parse is skipped, as every
            // TLS client does.
            for cert in rustls_native_certs::load_native_certs().certs {
                let _ = roots.add(cert);
            }
        }
    }
    let config =
        ClientConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()
            .map_err(|e| e.to_string())?
            .with_root_certificates(roots)
            .with_no_client_auth();
    Ok(TlsConnector::from(Arc::new(config)))
}
