//! An HTTP upstream like a real API that takes unconditional POSTs: it
//! records every request (idempotency key, body, arrival), applies each key
//! once (a repeated key answers 200 without applying again), and can be
//! told to answer errors or to hold a request after applying it.

use std::{
    collections::BTreeMap,
    convert::Infallible,
    net::SocketAddr,
    path::Path,
    sync::{Arc, Mutex},
    time::Instant,
};

use http_body_util::{BodyExt, Full};
use hyper::{body::Bytes, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use rustls::pki_types::{pem::PemObject, CertificateDer, PrivateKeyDer, ServerName};
use tokio::{net::TcpStream, sync::watch};

#[derive(Default)]
struct State {
    /// Every request: key, body, arrival.
    received: Vec<(String, Vec<u8>, Instant)>,
    /// Applied keys, in order, with their bodies.
    applied: Vec<(String, Vec<u8>)>,
    /// The next `n` requests answer this status without applying.
    fail_next: (usize, u16),
    /// Keys that always answer this status without applying.
    answers: BTreeMap<String, u16>,
    /// A key whose first application is held until `release`.
    hold: Option<String>,
}

pub struct Upstream {
    addr: SocketAddr,
    state: Arc<Mutex<State>>,
    released: watch::Sender<bool>,
}

impl Upstream {
    pub async fn start() -> Upstream {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let state = Arc::new(Mutex::new(State::default()));
        let (released, _) = watch::channel(false);
        let (st, rel) = (Arc::clone(&state), released.clone());
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let (st, rel) = (Arc::clone(&st), rel.clone());
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req| {
                        handle(Arc::clone(&st), rel.subscribe(), req)
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        Upstream {
            addr,
            state,
            released,
        }
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }

    pub fn hold(&self, key: &str) {
        self.state.lock().unwrap().hold = Some(key.to_string());
    }

    pub fn release(&self) {
        self.released.send_replace(true);
    }

    pub fn fail_next(&self, n: usize, status: u16) {
        self.state.lock().unwrap().fail_next = (n, status);
    }

    pub fn answer(&self, key: &str, status: u16) {
        self.state
            .lock()
            .unwrap()
            .answers
            .insert(key.to_string(), status);
    }

    pub fn received_count(&self, key: &str) -> usize {
        self.received_times(key).len()
    }

    pub fn received_times(&self, key: &str) -> Vec<Instant> {
        let s = self.state.lock().unwrap();
        s.received
            .iter()
            .filter(|r| r.0 == key)
            .map(|r| r.2)
            .collect()
    }

    pub fn applied_keys(&self) -> Vec<String> {
        let s = self.state.lock().unwrap();
        s.applied.iter().map(|a| a.0.clone()).collect()
    }

    pub fn applied_body(&self, key: &str) -> Option<Vec<u8>> {
        let s = self.state.lock().unwrap();
        s.applied.iter().find(|a| a.0 == key).map(|a| a.1.clone())
    }
}

async fn handle(
    state: Arc<Mutex<State>>,
    mut released: watch::Receiver<bool>,
    req: Request<hyper::body::Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    let key = req
        .headers()
        .get("idempotency-key")
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .to_string();
    let body = req
        .into_body()
        .collect()
        .await
        .map(|b| b.to_bytes().to_vec())
        .unwrap_or_default();
    let (status, hold) = {
        let mut s = state.lock().unwrap();
        s.received.push((key.clone(), body.clone(), Instant::now()));
        if let Some(&status) = s.answers.get(&key) {
            (status, false)
        } else if s.fail_next.0 > 0 {
            s.fail_next.0 -= 1;
            (s.fail_next.1, false)
        } else if s.applied.iter().any(|a| a.0 == key) {
            (200, false)
        } else {
            s.applied.push((key.clone(), body));
            (201, s.hold.as_deref() == Some(key.as_str()))
        }
    };
    if hold {
        let _ = released.wait_for(|r| *r).await;
    }
    let mut response = Response::new(Full::new(Bytes::from_static(b"{}")));
    *response.status_mut() = StatusCode::from_u16(status).unwrap();
    Ok(response)
}

async fn get<S>(stream: S, addr: SocketAddr, path: &str) -> Result<(u16, String), String>
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Send + Unpin + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
        .await
        .map_err(|e| e.to_string())?;
    tokio::spawn(conn);
    let req = Request::get(path)
        .header("host", addr.to_string())
        .body(Full::new(Bytes::new()))
        .unwrap();
    let response = sender.send_request(req).await.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let body = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?;
    Ok((
        status,
        String::from_utf8_lossy(&body.to_bytes()).into_owned(),
    ))
}

/// A plaintext GET.
pub async fn plain_get(addr: SocketAddr, path: &str) -> Result<(u16, String), String> {
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    get(tcp, addr, path).await
}

/// A GET over TLS trusting `ca`, showing `identity` (certificate, key) if
/// given.
pub async fn tls_get(
    addr: SocketAddr,
    ca: &Path,
    identity: Option<(&Path, &Path)>,
    path: &str,
) -> Result<(u16, String), String> {
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let builder = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .unwrap()
    .with_root_certificates(roots);
    let config = match identity {
        Some((cert, key)) => builder
            .with_client_auth_cert(
                CertificateDer::pem_file_iter(cert)
                    .unwrap()
                    .collect::<Result<Vec<_>, _>>()
                    .unwrap(),
                PrivateKeyDer::from_pem_file(key).unwrap(),
            )
            .unwrap(),
        None => builder.with_no_client_auth(),
    };
    let tcp = TcpStream::connect(addr).await.map_err(|e| e.to_string())?;
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::from(addr.ip()), tcp)
        .await
        .map_err(|e| e.to_string())?;
    get(tls, addr, path).await
}
