//! The harness runs the cluster with TLS on: at run start the `fenced`
//! binary under test makes a CA, a certificate per node (naming
//! `fenced://node/<id>` and the node's address) and one for the harness, in
//! the run's directory. Nodes serve TLS only (mutual between them); every
//! call the harness makes goes over TLS with the harness's certificate, and
//! still carries the bearer token.

use std::{
    path::Path,
    sync::{Arc, RwLock},
    time::Duration,
};

use anyhow::{Context, Result};
use fenced_proto::v1::{cluster_client::ClusterClient, StatusRequest};
use fenced_testkit::Pki;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

/// The harness's client certificate names `fenced://client/<this>`. No
/// policy grants this identity anything, so every call is authorized by the
/// token alone (the auth gate checks it).
pub const CLIENT_NAME: &str = "jepsen-harness";

/// Makes the run's certificates in `dir` with `bin certs ...`: a CA, one
/// for each `(id, address)` node and the harness's client certificate.
pub fn make_pki(bin: &Path, dir: &Path, nodes: &[(u64, String)]) -> Result<Pki> {
    let pki = Pki::new(bin, dir)?;
    for (id, host) in nodes {
        pki.node(*id, host)?;
    }
    pki.client(CLIENT_NAME)?;
    Ok(pki)
}

/// The harness's side: the CA and its client certificate and key.
pub fn client_tls(pki: &Pki) -> Result<ClientTls> {
    let read =
        |path: &Path| std::fs::read(path).with_context(|| format!("reading {}", path.display()));
    let (cert, key) = pki.client(CLIENT_NAME)?;
    Ok(ClientTls {
        ca: read(&pki.ca())?,
        cert: read(&cert)?,
        key: read(&key)?,
    })
}

/// What the harness's TLS connections trust and show, in PEM.
#[derive(Debug, Clone)]
pub struct ClientTls {
    ca: Vec<u8>,
    cert: Vec<u8>,
    key: Vec<u8>,
}

impl ClientTls {
    fn config(&self, with_identity: bool) -> ClientTlsConfig {
        let config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&self.ca));
        if with_identity {
            config.identity(Identity::from_pem(&self.cert, &self.key))
        } else {
            config
        }
    }
}

/// The current run's client side; runs follow each other, each with its own
/// CA, so each run installs its own before it starts the nodes.
static CURRENT: RwLock<Option<Arc<ClientTls>>> = RwLock::new(None);

pub fn install(tls: ClientTls) {
    let mut current = CURRENT.write().unwrap_or_else(|e| e.into_inner());
    *current = Some(Arc::new(tls));
}

fn current() -> Result<Arc<ClientTls>> {
    CURRENT
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone()
        .context("no TLS configuration installed for this run")
}

/// A lazily connecting TLS channel to `addr` (`ip:port`; the node's
/// certificate names the IP), showing the harness's certificate when
/// `with_identity`.
pub fn channel(addr: &str, with_identity: bool) -> Result<Channel> {
    let config = current()?.config(with_identity);
    Ok(Endpoint::from_shared(format!("https://{addr}"))
        .context("endpoint")?
        .tls_config(config)
        .context("TLS configuration")?
        .connect_timeout(Duration::from_millis(500))
        .connect_lazy())
}

async fn status_call(
    ch: Channel,
) -> Result<tonic::Response<fenced_proto::v1::StatusResponse>, tonic::Status> {
    let mut req = tonic::Request::new(StatusRequest { with_digest: false });
    crate::auth::authorize(&mut req);
    req.set_timeout(Duration::from_secs(2));
    match tokio::time::timeout(Duration::from_secs(3), ClusterClient::new(ch).status(req)).await {
        Ok(answer) => answer,
        Err(_) => Err(tonic::Status::deadline_exceeded("no answer within 3 s")),
    }
}

/// Fails unless the node at `addr` serves TLS only: a status call over TLS
/// is answered and the same call in plaintext, token included, is not.
pub async fn check_enforced(addr: &str) -> Result<()> {
    status_call(channel(addr, true)?)
        .await
        .with_context(|| format!("{addr} did not answer a status call over TLS"))?;
    plaintext_refused(addr).await
}

fn is_transport_failure(status: &tonic::Status) -> bool {
    std::error::Error::source(status)
        .is_some_and(|e| e.downcast_ref::<tonic::transport::Error>().is_some())
}

/// Fails unless a plaintext status call to `addr`, token included, fails
/// to connect: the port speaks no HTTP/2 without TLS.
pub async fn plaintext_refused(addr: &str) -> Result<()> {
    let plaintext = Endpoint::from_shared(format!("http://{addr}"))
        .context("endpoint")?
        .connect_timeout(Duration::from_millis(500))
        .connect_lazy();
    match status_call(plaintext).await {
        // The connection failed (its code varies with when the node drops
        // it); any status the node itself sent means it spoke plaintext.
        Err(s) if is_transport_failure(&s) => Ok(()),
        other => {
            anyhow::bail!("{addr} answered a plaintext call with {other:?}: TLS is off or optional")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_status_the_node_sent_is_not_a_failed_connection() {
        // What a plaintext node would answer: the gate must not take it
        // for a refused connection.
        for s in [
            tonic::Status::unauthenticated("no token"),
            tonic::Status::unavailable("no leader"),
            tonic::Status::cancelled("operation was canceled"),
        ] {
            assert!(!is_transport_failure(&s), "{s:?}");
        }
    }
}
