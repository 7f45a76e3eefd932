//! The peer port: accepts connections and routes each by its first bytes,
//! Raft frames ([`network::PREFACE`]) to [`serve_raft`], everything else to
//! the gRPC server (forwarded client calls, health).

use std::{
    io,
    net::SocketAddr,
    sync::{atomic::Ordering::Relaxed, Arc},
    time::Duration,
};

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufStream},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_util::sync::CancellationToken;

use crate::{
    peer::network::{
        read_frame, reply_header, split_request, write_frame, FrameTooLarge, PeerVersion, PREFACE,
    },
    replication::RaftPeer,
    security::admission::Admission,
    security::limits::ConnectionLimit,
    security::tls::{self, Members, NodeTls, PeerStream, Routed},
    types::NodeId,
};

/// How long a new connection may take to send the bytes that route it,
/// once its handshake is done.
const ROUTE_TIMEOUT: Duration = Duration::from_secs(3);

/// Accepts on `listener` until `stop`; gRPC connections go to `grpc`. With
/// `tls`, each connection is a mutual-TLS handshake first (members only,
/// see [`crate::security::tls::MemberVerifier`]) and is routed on the decrypted bytes.
/// Until it is routed a connection holds only a pending slot of
/// `admission` (the oldest is closed to make room for a newer one); a
/// routed connection takes a slot of `limit`, or is closed at once.
pub async fn accept(
    listener: TcpListener,
    peer: RaftPeer,
    tls: Option<Arc<NodeTls>>,
    admission: Admission,
    limit: ConnectionLimit,
    grpc: mpsc::Sender<io::Result<Routed>>,
    stop: CancellationToken,
) {
    while let Some((stream, addr)) = tls::accept_one(&listener, &stop, "peer").await {
        let Some(pending) = admission.enter(addr.ip()) else {
            continue;
        };
        let limit = limit.clone();
        let peer = peer.clone();
        let grpc = grpc.clone();
        let stop = stop.clone();
        let tls = tls.clone();
        tokio::spawn(async move {
            let routed = tokio::select! {
                _ = pending.evicted() => return,
                r = handshake_and_route(stream, addr, tls.as_deref()) => r,
            };
            drop(pending);
            let Some((stream, head)) = routed else {
                return;
            };
            let Some(permit) = limit.admit() else {
                return;
            };
            let version = PeerVersion::of_preface(&head);
            if version.is_none() && head[..PREFACE.len() - 1] == PREFACE[..PREFACE.len() - 1] {
                // Another version of the Raft protocol: say so, and close.
                tracing::warn!(
                    peer = %addr,
                    version = %char::from(head[PREFACE.len() - 1]).escape_default(),
                    supported = "2, 3",
                    "a peer speaks a version of the Raft protocol this build does not; \
                     connection closed"
                );
                return;
            }
            let Some(version) = version else {
                let stream = limit.wrap(stream, permit);
                let _ = grpc.send(Ok(Routed::new(head.to_vec(), stream))).await;
                return;
            };
            // With TLS, the node the certificate names (the handshake made
            // sure there is one); it must stay a member.
            let from = match &tls {
                None => None,
                Some(t) => match (stream.peer_node(), stream.peer_certs()) {
                    (Some(id), Some(certs)) => Some(Sender {
                        id,
                        members: t.members.clone(),
                        certs,
                    }),
                    _ => return,
                },
            };
            let stream = limit.wrap(stream, permit);
            let counters = Arc::clone(&peer.counters);
            tokio::select! {
                _ = stop.cancelled() => {}
                r = serve_raft(stream, version, peer, from) => match r {
                    Ok(()) => {}
                    Err(e) if FrameTooLarge::is(&e) => {
                        counters.peer_frames.fetch_add(1, Relaxed);
                        tracing::warn!(peer = %addr, error = %e, "raft frame over the cap; connection closed");
                    }
                    // A peer speaking another codec version (a
                    // rolling upgrade) or garbage: worth a warning.
                    Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                        tracing::warn!(peer = %addr, error = %e, "malformed raft frame; connection closed");
                    }
                    // A node removed from the membership.
                    Err(e) if e.kind() == io::ErrorKind::PermissionDenied => {
                        tracing::warn!(peer = %addr, error = %e, "raft connection closed");
                    }
                    Err(e) => {
                        tracing::debug!(peer = %addr, error = %e, "raft connection closed");
                    }
                }
            }
        });
    }
}

/// The handshake (with `tls`) and the first bytes, which route the
/// connection; `None` when either fails or takes too long.
async fn handshake_and_route(
    stream: TcpStream,
    addr: SocketAddr,
    tls: Option<&NodeTls>,
) -> Option<(PeerStream, [u8; PREFACE.len()])> {
    let mut stream = match tls {
        None => PeerStream::Plain(stream),
        Some(tls) => {
            let s = tls::handshake(&tls.peer, stream, addr, "peer").await?;
            PeerStream::Tls(Box::new(tokio_rustls::TlsStream::Server(s)))
        }
    };
    // Both a Raft preface and HTTP/2's (24 bytes) are this long at least.
    let mut head = [0u8; PREFACE.len()];
    match tokio::time::timeout(ROUTE_TIMEOUT, stream.read_exact(&mut head)).await {
        Ok(Ok(_)) => Some((stream, head)),
        Ok(Err(_)) | Err(_) => None,
    }
}

/// The other end of a Raft connection over mutual TLS.
struct Sender {
    /// The node its certificate names.
    id: NodeId,
    members: Members,
    certs: Arc<Vec<rustls::pki_types::CertificateDer<'static>>>,
}

/// Answers Raft requests on one connection, one at a time, until it closes.
/// A malformed frame closes the connection; the sender reconnects. With
/// `from`, the connection closes as soon as that node is no longer a member
/// or its certificate is revoked.
async fn serve_raft<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    version: PeerVersion,
    peer: RaftPeer,
    from: Option<Sender>,
) -> io::Result<()> {
    let mut conn = BufStream::new(stream);
    while let Some(frame) = read_frame(&mut conn).await? {
        if let Some(Sender { id, members, certs }) = &from {
            if !members.admits(*id) {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("node {id} is no longer a member"),
                ));
            }
            if let Some(Err(why)) = certs.first().map(|c| members.revoked(c)) {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("node {id}'s certificate is revoked: {why}"),
                ));
            }
        }
        let (call, time, body) = split_request(version, &frame)?;
        let sender = from.as_ref().map(|s| (s.id, &s.members));
        let reply = peer.answer(call, version, time, body, sender).await?;
        // Read after the call: a granted vote answers with every time this
        // node accepted before granting it.
        let head = reply_header(version, peer.floor.leader_time());
        write_frame(&mut conn, &head, &reply).await?;
        conn.flush().await?;
    }
    Ok(())
}
