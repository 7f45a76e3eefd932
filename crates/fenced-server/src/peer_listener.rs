//! The peer port: accepts connections and routes each by its first bytes,
//! Raft frames ([`network::PREFACE`]) to [`serve_raft`], everything else to
//! the gRPC server (forwarded client calls, health).

use std::{
    io,
    sync::{atomic::Ordering::Relaxed, Arc},
    time::Duration,
};

use openraft::raft::AppendEntriesResponse;

use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufStream},
    net::{TcpListener, TcpStream},
    sync::mpsc,
};
use tokio_util::sync::CancellationToken;

use crate::{
    codec,
    election::{Election, PreVoteRequest},
    limits::{ConnectionLimit, LimitCounters, Limited},
    network::{
        check_snapshot_chunk, read_frame, write_frame, FrameTooLarge, MessageTime, RaftCall,
        PREFACE,
    },
    time_floor::TimeFloor,
    types::Raft,
};

/// How long a new connection may take to send the bytes that route it.
const ROUTE_TIMEOUT: Duration = Duration::from_secs(5);

/// What a Raft connection is served with.
#[derive(Clone)]
pub struct RaftPeer {
    pub raft: Raft,
    /// Told of every message from a leader; answers pre-votes.
    pub election: Arc<Election>,
    /// Takes the time of every message accepted from a leader; its value
    /// goes back with every granted vote.
    pub floor: Arc<TimeFloor>,
    /// A snapshot chunk reaching past this many bytes is refused.
    pub max_snapshot_bytes: u64,
    pub counters: Arc<LimitCounters>,
}

/// Accepts on `listener` until `stop`; gRPC connections go to `grpc`.
pub async fn accept(
    listener: TcpListener,
    peer: RaftPeer,
    limit: ConnectionLimit,
    grpc: mpsc::Sender<io::Result<Limited<TcpStream>>>,
    stop: CancellationToken,
) {
    loop {
        let accepted = tokio::select! {
            _ = stop.cancelled() => return,
            a = listener.accept() => a,
        };
        let (stream, addr) = match accepted {
            Ok(a) => a,
            Err(e) => {
                // Out of descriptors and the like: back off, keep serving.
                tracing::warn!(error = %e, "peer accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        // Beyond the limit the connection is closed at once, counted.
        let Some(permit) = limit.admit() else {
            drop(stream);
            continue;
        };
        // Nagle's algorithm would hold small replies behind unacknowledged
        // ones and add latency to every commit.
        let _ = stream.set_nodelay(true);
        let peer = peer.clone();
        let grpc = grpc.clone();
        let stop = stop.clone();
        let limit = limit.clone();
        tokio::spawn(async move {
            let routed = tokio::time::timeout(ROUTE_TIMEOUT, is_raft(&stream)).await;
            let stream = limit.wrap(stream, permit);
            match routed {
                Ok(Ok(true)) => {
                    let counters = Arc::clone(&peer.counters);
                    tokio::select! {
                        _ = stop.cancelled() => {}
                        r = serve_raft(stream, peer) => match r {
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
                            Err(e) => {
                                tracing::debug!(peer = %addr, error = %e, "raft connection closed");
                            }
                        }
                    }
                }
                Ok(Ok(false)) => {
                    let _ = grpc.send(Ok(stream)).await;
                }
                Ok(Err(_)) | Err(_) => {}
            }
        });
    }
}

/// Whether the connection starts with [`PREFACE`]; reads nothing.
async fn is_raft(stream: &TcpStream) -> io::Result<bool> {
    let mut buf = [0u8; PREFACE.len()];
    loop {
        let n = stream.peek(&mut buf).await?;
        if n == 0 {
            return Err(io::ErrorKind::UnexpectedEof.into());
        }
        if buf[..n] != PREFACE[..n] {
            return Ok(false);
        }
        if n == PREFACE.len() {
            return Ok(true);
        }
        // A prefix of the preface so far: wait for the rest (peek would
        // return the same bytes at once).
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
}

/// Answers Raft requests on one connection, one at a time, until it closes.
/// A malformed frame closes the connection; the sender reconnects.
async fn serve_raft<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    peer: RaftPeer,
) -> io::Result<()> {
    let RaftPeer {
        raft,
        election,
        floor,
        max_snapshot_bytes,
        counters,
    } = peer;
    let mut conn = BufStream::new(stream);
    let mut preface = [0u8; PREFACE.len()];
    conn.read_exact(&mut preface).await?;
    while let Some(frame) = read_frame(&mut conn).await? {
        let Some((&kind, body)) = frame.split_first() else {
            return Err(invalid("empty raft frame".into()));
        };
        let call = RaftCall::from_byte(kind)
            .ok_or_else(|| invalid(format!("unknown raft call {kind}")))?;
        let (time, body) = MessageTime::split(body)
            .ok_or_else(|| invalid(format!("{} frame shorter than its header", call.name())))?;
        let reply = match call {
            RaftCall::AppendEntries => {
                let req = decode(call, body)?;
                // Held across the append and the recording of its time, so a
                // vote granted after openraft took the append carries it.
                let _gate = floor.gate.read().await;
                let resp = raft.append_entries(req).await;
                // Anything but a refusal for a lower vote came from a leader
                // this node follows.
                if matches!(&resp, Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_))) {
                    election.heard_from_leader();
                    accept_time(&floor, time).await?;
                }
                encode(call, &resp)?
            }
            RaftCall::Vote => {
                let req = decode(call, body)?;
                let _gate = floor.gate.write().await;
                let resp = raft.vote(req).await;
                // Raft restarts a voter's election timer when it grants.
                if matches!(&resp, Ok(r) if r.vote_granted) {
                    election.heard_from_leader();
                }
                encode(call, &resp)?
            }
            RaftCall::InstallSnapshot => {
                let req: openraft::raft::InstallSnapshotRequest<crate::types::TypeConfig> =
                    decode(call, body)?;
                if let Err(e) = check_snapshot_chunk(&req, max_snapshot_bytes) {
                    counters.snapshot_chunks.fetch_add(1, Relaxed);
                    return Err(e);
                }
                let _gate = floor.gate.read().await;
                let vote = req.vote;
                let resp = raft.install_snapshot(req).await;
                if matches!(&resp, Ok(r) if r.vote <= vote) {
                    election.heard_from_leader();
                    accept_time(&floor, time).await?;
                }
                encode(call, &resp)?
            }
            RaftCall::PreVote => {
                let req: PreVoteRequest = decode(call, body)?;
                encode(call, &election.answer(&raft, &req))?
            }
        };
        // Read after the call: a granted vote answers with every time this
        // node accepted before granting it.
        let head = floor.get().as_millis().to_be_bytes();
        write_frame(&mut conn, &head, &reply).await?;
        conn.flush().await?;
    }
    Ok(())
}

/// Records the time of a message accepted from a leader; made durable
/// first when the leader asked (a read will reveal it).
async fn accept_time(floor: &TimeFloor, time: MessageTime) -> io::Result<()> {
    if time.durable {
        floor.make_durable(time.at).await.map_err(|e| {
            tracing::error!(error = %e, "cannot make the cluster time durable");
            e
        })
    } else {
        floor.raise(time.at);
        Ok(())
    }
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

fn decode<T: serde::de::DeserializeOwned>(call: RaftCall, body: &[u8]) -> io::Result<T> {
    codec::decode(call.name(), body).map_err(|e| invalid(e.to_string()))
}

fn encode<T: serde::Serialize>(call: RaftCall, value: &T) -> io::Result<Vec<u8>> {
    codec::encode(call.name(), value).map_err(|e| io::Error::other(e.to_string()))
}
