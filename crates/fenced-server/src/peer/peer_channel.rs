//! gRPC channels from one node to another: calls forwarded to the leader,
//! a lagging node's questions about a newer membership, a joining node's
//! request to join. Each connection is made like a Raft connection
//! ([`crate::security::tls::connect_node`]): with TLS, the answering certificate
//! must chain to the CA, be valid for the address's host, not be revoked,
//! and name the node asked, so no other certificate valid for that host
//! (a spare node's, a removed node's) can answer in its place.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
    time::Duration,
};

use http::Uri;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

use crate::{
    security::tls::{self, NodeTls, PeerStream},
    types::NodeId,
};

/// How long a connection to a peer may take, TLS included.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// A lazily connecting channel to the node at `addr`. With `tls`, this
/// node's certificate opens it and the answer must come from node
/// `expect` (any node when `None`: a joining node does not know the ids
/// of the cluster it joins).
pub(crate) fn peer_channel(
    addr: &str,
    tls: Option<&Arc<NodeTls>>,
    expect: Option<NodeId>,
) -> Result<Channel, tonic::transport::Error> {
    // TLS is the connector's: tonic is handed http:// either way.
    let endpoint = Endpoint::from_shared(format!("http://{addr}"))?
        .connect_timeout(CONNECT_TIMEOUT)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(Duration::from_secs(10))
        .keep_alive_timeout(Duration::from_secs(5));
    Ok(endpoint.connect_with_connector_lazy(NodeConnector {
        addr: addr.to_string(),
        tls: tls.cloned(),
        expect,
    }))
}

/// Opens connections to one node for a [`Channel`].
#[derive(Clone)]
struct NodeConnector {
    /// As the membership names it: the certificate is checked against its
    /// host, whatever URI tonic passes.
    addr: String,
    tls: Option<Arc<NodeTls>>,
    expect: Option<NodeId>,
}

type Connecting = Pin<Box<dyn Future<Output = io::Result<TokioIo<PeerStream>>> + Send>>;

impl tower::Service<Uri> for NodeConnector {
    type Response = TokioIo<PeerStream>;
    type Error = io::Error;
    type Future = Connecting;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, _uri: Uri) -> Self::Future {
        let this = self.clone();
        Box::pin(async move {
            let stream = TcpStream::connect(&this.addr).await?;
            stream.set_nodelay(true)?;
            let stream =
                tls::connect_node(this.tls.as_deref(), this.expect, &this.addr, stream).await?;
            Ok(TokioIo::new(stream))
        })
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::Path;

    use tokio::net::TcpListener;

    use super::*;
    use crate::{
        security::certs::{self, CertsCommand},
        security::revocation::Revocations,
        security::tls::{Members, TlsSettings},
    };

    /// Node `id`'s TLS from a CA in `dir` (certificates for 127.0.0.1),
    /// denying what `deny` lists.
    fn node_tls(dir: &Path, id: NodeId, deny: Option<&str>) -> NodeTls {
        let files = certs::run(&CertsCommand::Node {
            dir: dir.to_path_buf(),
            id,
            hosts: vec![],
            days: 1,
        })
        .unwrap();
        let members = Members::default();
        if let Some(text) = deny {
            let path = dir.join(format!("deny-{id}.toml"));
            std::fs::write(&path, text).unwrap();
            members.set_revocations(Arc::new(Revocations::load(Some(&path)).unwrap()));
        }
        let settings = TlsSettings {
            cert: files[0].clone(),
            key: files[1].clone(),
            ca: dir.join(certs::CA_CERT),
            client_cert_auth: false,
            deny: None,
        };
        crate::security::tls::load(&settings, members).unwrap()
    }

    /// Connects as `asking` to a peer port served with `answering`'s
    /// certificate, expecting node `expect`.
    async fn connect(
        asking: &NodeTls,
        answering: NodeTls,
        expect: Option<NodeId>,
    ) -> io::Result<PeerStream> {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let _held = answering.peer.accept(stream).await;
            tokio::time::sleep(Duration::from_secs(5)).await;
        });
        let stream = TcpStream::connect(&addr).await.unwrap();
        tls::connect_node(Some(asking), expect, &addr, stream).await
    }

    #[tokio::test]
    async fn only_the_node_asked_answers_a_forwarded_call() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        certs::run(&CertsCommand::Ca {
            dir: dir.to_path_buf(),
        })
        .unwrap();
        let asking = node_tls(dir, 1, None);
        // A spare node's certificate, valid for the same host as the
        // leader's: it must not answer for node 2.
        let refused = connect(&asking, node_tls(dir, 9, None), Some(2))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(refused.contains("node Some(9), not node 2"), "{refused}");
        assert!(connect(&asking, node_tls(dir, 2, None), Some(2))
            .await
            .is_ok());
        // A joining node does not know ids yet: any node's certificate.
        assert!(connect(&asking, node_tls(dir, 9, None), None).await.is_ok());
    }

    #[tokio::test]
    async fn a_revoked_node_answers_no_forwarded_call() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path();
        certs::run(&CertsCommand::Ca {
            dir: dir.to_path_buf(),
        })
        .unwrap();
        let asking = node_tls(dir, 1, Some("nodes = [2]"));
        for expect in [Some(2), None] {
            let refused = connect(&asking, node_tls(dir, 2, None), expect)
                .await
                .err()
                .unwrap()
                .to_string();
            assert!(refused.contains("revoked"), "{refused}");
        }
    }
}
