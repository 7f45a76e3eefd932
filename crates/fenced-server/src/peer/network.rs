//! The Raft transport between nodes: length-prefixed frames over one
//! long-lived TCP connection per replication stream, on the peer port.
//!
//! Raft is fenced's hot path: every grant is one AppendEntries round trip to
//! each follower, and openraft follows it with a heartbeat that tells them
//! the new commit index (answered from the early copies when they vouch for
//! it, see [`crate::replication`], which drives this transport). Plain
//! frames cost one write and one read per message, where a gRPC call costs
//! HTTP/2 framing, several writes and hand-offs between tasks on both sides;
//! on a small machine that CPU is most of a commit's latency. The peer port
//! still serves gRPC (forwarded client calls, health): a Raft connection is
//! told apart by its first bytes, [`PREFACE`], which no HTTP/2 client sends.
//!
//! A connection carries one request at a time and its reply; any error or
//! timeout drops it, so a late reply can never be taken for the next one.
//!
//! Every request carries the sender's cluster time and every reply the
//! answerer's floor ([`crate::clock::floor`]): a follower learns the leader's
//! time from each heartbeat, and a candidate learns from each granted vote
//! the highest time its voter accepted, so the next leader's clock starts
//! where the last one's left off (DECISIONS.md, "Cluster time rides on every
//! Raft message").

use std::{
    collections::HashMap,
    io,
    sync::{
        atomic::{AtomicUsize, Ordering},
        Arc, Mutex, PoisonError,
    },
    time::{Duration, Instant},
};

use openraft::raft::InstallSnapshotRequest;
use serde::{de::DeserializeOwned, Serialize};
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufStream},
    net::TcpStream,
};

use fenced_core::ClusterTime;

use crate::clock::floor::LeaderTime;

use crate::{
    codec,
    security::tls::{self, NodeTls, PeerStream},
    types::{NodeId, TypeConfig},
};

/// The largest Raft message accepted or sent, in bytes.
pub const RAFT_MESSAGE_MAX_BYTES: usize = 64 * 1024 * 1024;

/// The first bytes a node sends on a Raft connection. An HTTP/2 client
/// starts with "PRI * HTTP/2.0", so the two never meet. The last byte is the
/// peer protocol's version: 2 added the time header to every frame, 3 the
/// term of that time (and of the floor in replies).
pub const PREFACE: &[u8; 8] = b"fncdrft3";
/// The previous version's preface: a node of this release still answers a
/// node of the previous one (a rolling upgrade), in that version's frames.
pub const PREFACE_V2: &[u8; 8] = b"fncdrft2";

/// The peer protocol version of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerVersion {
    /// Times without their term.
    V2,
    V3,
}

impl PeerVersion {
    /// The version a preface names, if this build speaks it.
    pub fn of_preface(head: &[u8]) -> Option<Self> {
        if head == PREFACE {
            Some(Self::V3)
        } else if head == PREFACE_V2 {
            Some(Self::V2)
        } else {
            None
        }
    }

    /// After a request frame's call byte: the sender's term and cluster
    /// time (8 bytes each, big-endian; version 2: the time alone) and a
    /// flags byte.
    pub fn request_header_len(self) -> usize {
        match self {
            Self::V2 => 9,
            Self::V3 => REQUEST_HEADER_LEN,
        }
    }
}

/// A request frame's header after its call byte, in version 3.
pub const REQUEST_HEADER_LEN: usize = 17;
/// Before a reply frame's body: the answerer's floor, its term and time (8
/// bytes each, big-endian; version 2: the time alone).
pub const REPLY_HEADER_LEN: usize = 16;

/// Flag: make the carried time durable before answering. A leader sets it
/// on the heartbeats that confirm a read, whose time a client then sees.
pub const FLAG_DURABLE_TIME: u8 = 1;

/// The time a request carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageTime {
    pub at: LeaderTime,
    pub durable: bool,
}

impl MessageTime {
    /// No time: pre-votes and early copies (their answers are the followers'
    /// own, recorded on openraft's messages).
    pub const NONE: MessageTime = MessageTime {
        at: LeaderTime::ZERO,
        durable: false,
    };

    pub fn encode(self) -> [u8; REQUEST_HEADER_LEN] {
        let mut h = [0u8; REQUEST_HEADER_LEN];
        h[..8].copy_from_slice(&self.at.term.to_be_bytes());
        h[8..16].copy_from_slice(&self.at.at.as_millis().to_be_bytes());
        h[16] = if self.durable { FLAG_DURABLE_TIME } else { 0 };
        h
    }

    /// Splits a request body (after the call byte) into its time and the
    /// message; `None` when it is too short. A version 2 time has no term:
    /// it is read as of term 0 here, and [`MessageTime::of_term`] gives it
    /// the term of the message it came with once that is decoded.
    pub fn split(version: PeerVersion, body: &[u8]) -> Option<(MessageTime, &[u8])> {
        let (head, rest) = body.split_at_checked(version.request_header_len())?;
        let (term, at, flags) = match version {
            PeerVersion::V3 => (be_u64(&head[..8])?, be_u64(&head[8..16])?, head[16]),
            PeerVersion::V2 => (0, be_u64(&head[..8])?, head[8]),
        };
        let at = LeaderTime::new(term, ClusterTime::from_millis(at));
        let durable = flags & FLAG_DURABLE_TIME != 0;
        Some((MessageTime { at, durable }, rest))
    }

    /// On a connection of `version`, the time of a message of `term`: a
    /// version 2 time takes the term of the message it rode on, as that
    /// version's nodes took it. A time of a later term than its message's
    /// was issued by no leader of that message: the frame is refused.
    pub fn of_term(self, version: PeerVersion, term: u64) -> io::Result<Self> {
        match version {
            PeerVersion::V3 if self.at.term > term => Err(invalid(format!(
                "a time of term {} on a message of term {term}",
                self.at.term
            ))),
            PeerVersion::V3 => Ok(self),
            PeerVersion::V2 => Ok(Self {
                at: LeaderTime::new(term, self.at.at),
                ..self
            }),
        }
    }
}

fn be_u64(bytes: &[u8]) -> Option<u64> {
    Some(u64::from_be_bytes(bytes.try_into().ok()?))
}

/// A reply's header: the answerer's floor in `version`'s layout.
pub fn reply_header(version: PeerVersion, floor: LeaderTime) -> Vec<u8> {
    let mut head = Vec::with_capacity(REPLY_HEADER_LEN);
    if version == PeerVersion::V3 {
        head.extend_from_slice(&floor.term.to_be_bytes());
    }
    head.extend_from_slice(&floor.at.as_millis().to_be_bytes());
    head
}

/// Splits a reply frame into the answerer's floor and the message.
pub fn split_reply(frame: &[u8]) -> io::Result<(LeaderTime, &[u8])> {
    let short = || {
        io::Error::new(
            io::ErrorKind::InvalidData,
            "raft reply shorter than its header",
        )
    };
    let (head, rest) = frame.split_at_checked(REPLY_HEADER_LEN).ok_or_else(short)?;
    let term = be_u64(&head[..8]).ok_or_else(short)?;
    let at = be_u64(&head[8..]).ok_or_else(short)?;
    Ok((LeaderTime::new(term, ClusterTime::from_millis(at)), rest))
}

/// How long a node waits to connect to a peer.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(1);

/// Which Raft call a request frame carries (its first byte).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RaftCall {
    AppendEntries = 1,
    Vote = 2,
    InstallSnapshot = 3,
    /// fenced's own pre-vote ([`crate::replication::pre_vote`]), not an
    /// openraft call.
    PreVote = 4,
    /// A stopping leader asks a caught-up follower to stand at once
    /// ([`crate::peer::handoff`]), not an openraft call.
    TimeoutNow = 5,
}

impl RaftCall {
    pub fn from_byte(b: u8) -> Option<Self> {
        match b {
            1 => Some(Self::AppendEntries),
            2 => Some(Self::Vote),
            3 => Some(Self::InstallSnapshot),
            4 => Some(Self::PreVote),
            5 => Some(Self::TimeoutNow),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::AppendEntries => "append_entries",
            Self::Vote => "vote",
            Self::InstallSnapshot => "install_snapshot",
            Self::PreVote => "pre_vote",
            Self::TimeoutNow => "timeout_now",
        }
    }
}

/// Splits a request frame (after its length) into its call, the sender's
/// time and the message, refusing an empty frame, an unknown call byte or
/// a frame shorter than its header.
pub fn split_request(
    version: PeerVersion,
    frame: &[u8],
) -> io::Result<(RaftCall, MessageTime, &[u8])> {
    let Some((&kind, body)) = frame.split_first() else {
        return Err(invalid("empty raft frame".into()));
    };
    let call =
        RaftCall::from_byte(kind).ok_or_else(|| invalid(format!("unknown raft call {kind}")))?;
    let (time, body) = MessageTime::split(version, body)
        .ok_or_else(|| invalid(format!("{} frame shorter than its header", call.name())))?;
    Ok((call, time, body))
}

/// A malformed Raft frame: the connection closes.
pub(crate) fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, msg)
}

/// Decodes the message of a `call` frame.
pub(crate) fn decode_call<T: DeserializeOwned>(call: RaftCall, body: &[u8]) -> io::Result<T> {
    codec::decode(call.name(), body).map_err(|e| invalid(e.to_string()))
}

/// Encodes the reply to a `call`.
pub(crate) fn encode_call<T: Serialize>(call: RaftCall, value: &T) -> io::Result<Vec<u8>> {
    codec::encode(call.name(), value).map_err(|e| io::Error::other(e.to_string()))
}

/// One whole request frame as a node sends it on a connection of version 3
/// (after the preface): length, call byte, `time`, the encoded `message`.
/// For tools and tests that speak to a peer port as a node would.
pub fn request_frame<T: Serialize>(
    call: RaftCall,
    time: MessageTime,
    message: &T,
) -> io::Result<Vec<u8>> {
    let body = codec::encode(call.name(), message).map_err(|e| io::Error::other(e.to_string()))?;
    let len = u32::try_from(1 + REQUEST_HEADER_LEN + body.len())
        .ok()
        .filter(|len| *len as usize <= RAFT_MESSAGE_MAX_BYTES)
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "raft message too large"))?;
    let mut frame = Vec::with_capacity(4 + len as usize);
    frame.extend_from_slice(&len.to_be_bytes());
    frame.push(call as u8);
    frame.extend_from_slice(&time.encode());
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Writes one frame: a 4-byte big-endian length, then `head` and `body`.
/// The caller flushes.
pub async fn write_frame<W: AsyncWrite + Unpin>(
    w: &mut W,
    head: &[u8],
    body: &[u8],
) -> io::Result<()> {
    let len = head.len() + body.len();
    if len > RAFT_MESSAGE_MAX_BYTES {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("raft message of {len} bytes exceeds {RAFT_MESSAGE_MAX_BYTES}"),
        ));
    }
    w.write_all(&(len as u32).to_be_bytes()).await?;
    w.write_all(head).await?;
    w.write_all(body).await
}

/// How much of a frame is read (and allocated) at a time: a length prefix
/// alone never makes the reader allocate more than this ahead of the bytes
/// that actually arrived.
pub const FRAME_READ_CHUNK: usize = 64 * 1024;

/// A frame whose length prefix is over the cap; the connection is closed.
#[derive(Debug, thiserror::Error)]
#[error("raft frame of {len} bytes exceeds peer_frame_max_bytes={max}")]
pub struct FrameTooLarge {
    pub len: usize,
    pub max: usize,
}

impl FrameTooLarge {
    /// Whether `e` is this error.
    pub fn is(e: &io::Error) -> bool {
        e.get_ref().is_some_and(|inner| inner.is::<FrameTooLarge>())
    }
}

/// Refuses an InstallSnapshot chunk that would make the receiving buffer
/// reach past `max_bytes`: openraft seeks to the chunk's offset and writes
/// there, so an offset alone could grow the buffer without bound.
pub fn check_snapshot_chunk(
    req: &InstallSnapshotRequest<TypeConfig>,
    max_bytes: u64,
) -> io::Result<()> {
    let end = u64::try_from(req.data.len())
        .ok()
        .and_then(|len| req.offset.checked_add(len));
    match end {
        Some(end) if end <= max_bytes => Ok(()),
        _ => Err(io::Error::new(
            io::ErrorKind::InvalidData,
            format!(
                "snapshot chunk at offset {} of {} bytes reaches past max_snapshot_bytes={max_bytes}",
                req.offset,
                req.data.len()
            ),
        )),
    }
}

/// Reads one frame; `None` at a clean end of stream before a frame starts.
/// A frame is read in chunks of [`FRAME_READ_CHUNK`] under the cap
/// [`RAFT_MESSAGE_MAX_BYTES`]: one frame at a time is all a connection
/// buffers, so this caps what a connection holds.
pub async fn read_frame<R: AsyncRead + Unpin>(r: &mut R) -> io::Result<Option<Vec<u8>>> {
    read_frame_within(r, RAFT_MESSAGE_MAX_BYTES).await
}

/// [`read_frame`] under the cap `max` bytes.
pub async fn read_frame_within<R: AsyncRead + Unpin>(
    r: &mut R,
    max: usize,
) -> io::Result<Option<Vec<u8>>> {
    let mut len = [0u8; 4];
    match r.read_exact(&mut len).await {
        Ok(_) => {}
        Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(e),
    }
    let len = u32::from_be_bytes(len) as usize;
    if len > max {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            FrameTooLarge { len, max },
        ));
    }
    let mut body = Vec::with_capacity(len.min(FRAME_READ_CHUNK));
    while body.len() < len {
        let start = body.len();
        body.resize(start + (len - start).min(FRAME_READ_CHUNK), 0);
        r.read_exact(&mut body[start..]).await?;
    }
    Ok(Some(body))
}

/// How often a peer that stays unreachable is logged again.
pub const REACHABILITY_REPEAT: Duration = Duration::from_secs(30);
/// A peer unreachable for this long is no longer one still starting: it is
/// logged as a warning from then on.
pub const UNREACHABLE_WARN_AFTER: Duration = Duration::from_secs(60);

/// Which peers this node could not reach, and since when: a peer not
/// listening yet (the cluster is starting) or down is logged once, then at
/// most every [`REACHABILITY_REPEAT`], and once more when it answers again,
/// where openraft would log an error for every retry (see
/// [`crate::observe::raft_noise`]).
#[derive(Default)]
pub struct Reachability {
    /// How many peers are in `outages`: a call that succeeds checks this
    /// and takes no lock while every peer answers.
    down: AtomicUsize,
    outages: Mutex<HashMap<NodeId, Outage>>,
}

struct Outage {
    since: Instant,
    logged: Instant,
    failures: u64,
}

impl Reachability {
    /// A call to `target` at `addr` failed to connect or lost its connection.
    pub fn failed(&self, target: NodeId, addr: &str, error: &str) {
        let now = Instant::now();
        let mut outages = self.outages.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(outage) = outages.get_mut(&target) else {
            outages.insert(
                target,
                Outage {
                    since: now,
                    logged: now,
                    failures: 1,
                },
            );
            self.down.fetch_add(1, Ordering::Relaxed);
            tracing::info!(
                peer = target,
                addr,
                error,
                "peer not reachable (not listening yet, or down); retrying"
            );
            return;
        };
        outage.failures += 1;
        if now.duration_since(outage.logged) < REACHABILITY_REPEAT {
            return;
        }
        outage.logged = now;
        let down_s = now.duration_since(outage.since).as_secs();
        let failures = outage.failures;
        macro_rules! still {
            ($level:ident) => {
                tracing::$level!(
                    peer = target,
                    addr,
                    error,
                    down_s,
                    failures,
                    "peer still unreachable"
                )
            };
        }
        if now.duration_since(outage.since) >= UNREACHABLE_WARN_AFTER {
            still!(warn);
        } else {
            still!(info);
        }
    }

    /// A call to `target` got its answer.
    pub fn reached(&self, target: NodeId, addr: &str) {
        if self.down.load(Ordering::Relaxed) == 0 {
            return;
        }
        let mut outages = self.outages.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(outage) = outages.remove(&target) {
            self.down.fetch_sub(1, Ordering::Relaxed);
            tracing::info!(
                peer = target,
                addr,
                down_ms = outage.since.elapsed().as_millis() as u64,
                failures = outage.failures,
                "peer reachable"
            );
        }
    }

    /// Whether `target` is reachable as far as this node knows (no call to
    /// it failed since its last answer).
    pub fn is_reachable(&self, target: NodeId) -> bool {
        self.down.load(Ordering::Relaxed) == 0
            || !self
                .outages
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .contains_key(&target)
    }
}

/// What carries Raft calls between nodes in place of TCP: the deterministic
/// simulation's network (crate `fenced-sim`). A node given none uses TCP.
/// `exchange` is one request and its reply, as [`Peer`] makes it: the call,
/// the sender's time, the encoded message; the answerer's floor and its
/// encoded reply back.
pub trait Wire: Send + Sync + 'static {
    fn exchange(
        &self,
        target: NodeId,
        call: RaftCall,
        time: MessageTime,
        payload: Vec<u8>,
    ) -> WireReply;
}

/// A [`Wire`]'s answer to come: the answerer's floor and its reply.
pub type WireReply =
    std::pin::Pin<Box<dyn std::future::Future<Output = io::Result<(LeaderTime, Vec<u8>)>> + Send>>;

/// One connection to one peer's Raft port, carrying one request at a time.
pub struct Peer {
    target: NodeId,
    addr: String,
    conn: Option<BufStream<PeerStream>>,
    /// Set: connections are mutual TLS with this node's certificate.
    tls: Option<Arc<NodeTls>>,
    /// Where this client's failures and recoveries are told; `None`: not
    /// logged (pre-votes, which count a silent voter as a refusal).
    reachability: Option<Arc<Reachability>>,
    /// Set: calls go over this instead of TCP (simulation).
    wire: Option<Arc<dyn Wire>>,
}

impl Peer {
    /// A client for node `target` at `addr`; it connects on first use.
    pub(crate) fn new(target: NodeId, addr: String) -> Self {
        Self {
            target,
            addr,
            conn: None,
            tls: None,
            reachability: None,
            wire: None,
        }
    }

    /// Sends calls over `wire` instead of TCP when set.
    pub(crate) fn with_wire(self, wire: Option<Arc<dyn Wire>>) -> Self {
        Self { wire, ..self }
    }

    pub fn target(&self) -> NodeId {
        self.target
    }

    pub fn addr(&self) -> &str {
        &self.addr
    }

    /// Drops the connection: the next exchange connects again.
    pub(crate) fn disconnect(&mut self) {
        self.conn = None;
    }

    /// Connects over mutual TLS when `tls` is set.
    pub(crate) fn with_tls(self, tls: Option<Arc<NodeTls>>) -> Self {
        Self { tls, ..self }
    }

    /// Tells `reachability` when an exchange fails or succeeds.
    pub(crate) fn with_reachability(self, reachability: Option<Arc<Reachability>>) -> Self {
        Self {
            reachability,
            ..self
        }
    }

    async fn connect(&self) -> io::Result<BufStream<PeerStream>> {
        let stream = tokio::time::timeout(CONNECT_TIMEOUT, async {
            let stream = TcpStream::connect(&self.addr).await?;
            stream.set_nodelay(true)?;
            tls::connect_peer(self.tls.as_deref(), self.target, &self.addr, stream).await
        })
        .await
        .map_err(|_| io::Error::new(io::ErrorKind::TimedOut, "connect timed out"))??;
        let mut conn = BufStream::new(stream);
        conn.write_all(PREFACE).await?;
        Ok(conn)
    }

    /// Sends one request and reads its reply on this stream's connection,
    /// connecting first if there is none.
    ///
    /// The connection is taken out for the exchange and put back only after
    /// a whole reply was read: openraft drops this future on its own
    /// timeouts, and a connection left behind with a reply still on its way
    /// would hand that reply to the next request (a wrong match index).
    pub(crate) async fn exchange(&mut self, call: RaftCall, payload: &[u8]) -> io::Result<Vec<u8>> {
        let (_, reply) = self
            .exchange_timed(call, MessageTime::NONE, payload)
            .await?;
        Ok(reply)
    }

    /// [`Peer::exchange`] with a time on the request; returns the
    /// answerer's floor beside its reply.
    pub(crate) async fn exchange_timed(
        &mut self,
        call: RaftCall,
        time: MessageTime,
        payload: &[u8],
    ) -> io::Result<(LeaderTime, Vec<u8>)> {
        let result = self.exchange_once(call, time, payload).await;
        if let Some(r) = &self.reachability {
            match &result {
                Ok(_) => r.reached(self.target, &self.addr),
                Err(e) => r.failed(self.target, &self.addr, &e.to_string()),
            }
        }
        result
    }

    async fn exchange_once(
        &mut self,
        call: RaftCall,
        time: MessageTime,
        payload: &[u8],
    ) -> io::Result<(LeaderTime, Vec<u8>)> {
        if let Some(wire) = &self.wire {
            return wire
                .exchange(self.target, call, time, payload.to_vec())
                .await;
        }
        let mut conn = match self.conn.take() {
            Some(c) => c,
            None => self.connect().await?,
        };
        // A peer whose certificate was revoked since the connection opened
        // gets nothing more on it.
        if let Some(tls) = self.tls.as_ref().filter(|t| t.members.revokes_any()) {
            let certs = conn.get_ref().peer_certs();
            if let Some(Err(why)) = certs
                .as_ref()
                .and_then(|c| c.first())
                .map(|c| tls.members.revoked(c))
            {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("node {}'s certificate is revoked: {why}", self.target),
                ));
            }
        }
        let mut head = [0u8; 1 + REQUEST_HEADER_LEN];
        head[0] = call as u8;
        head[1..].copy_from_slice(&time.encode());
        write_frame(&mut conn, &head, payload).await?;
        conn.flush().await?;
        let reply = read_frame(&mut conn).await?.ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::UnexpectedEof,
                "the peer closed the connection",
            )
        })?;
        let (floor, body) = split_reply(&reply)?;
        let result = (floor, body.to_vec());
        self.conn = Some(conn);
        Ok(result)
    }
}

/// A peer at a local port for tests: after the preface, every frame (call
/// byte first) goes to `answer`, whose reply is sent back; `None` sends
/// nothing and the peer reads on.
#[cfg(test)]
#[allow(clippy::expect_used)]
pub(crate) async fn fake_peer<F, Fut>(answer: F) -> String
where
    F: Fn(Vec<u8>) -> Fut + Send + Sync + 'static,
    Fut: std::future::Future<Output = Option<Vec<u8>>> + Send,
{
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("a local port for a fake peer");
    let addr = listener
        .local_addr()
        .expect("the fake peer's address")
        .to_string();
    let answer = Arc::new(answer);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let answer = Arc::clone(&answer);
            tokio::spawn(async move {
                let mut conn = BufStream::new(stream);
                let mut preface = [0u8; PREFACE.len()];
                conn.read_exact(&mut preface).await?;
                assert_eq!(&preface, PREFACE);
                while let Some(frame) = read_frame(&mut conn).await? {
                    // The call byte, then the message without its time.
                    let mut plain = frame[..1].to_vec();
                    plain.extend_from_slice(&frame[1 + REQUEST_HEADER_LEN..]);
                    if let Some(reply) = answer(plain).await {
                        write_frame(&mut conn, &[0; REPLY_HEADER_LEN], &reply).await?;
                        conn.flush().await?;
                    }
                }
                Ok::<_, io::Error>(())
            });
        }
    });
    addr
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// A peer that echoes each request body, after 300 ms when it is "slow".
    async fn echo_peer() -> String {
        fake_peer(|frame| async move {
            let body = frame[1..].to_vec();
            if body == b"slow" {
                tokio::time::sleep(Duration::from_millis(300)).await;
            }
            Some(body)
        })
        .await
    }

    #[tokio::test]
    async fn a_dropped_exchange_never_hands_its_reply_to_the_next_request() {
        let mut peer = Peer::new(2, echo_peer().await);
        assert_eq!(
            peer.exchange(RaftCall::AppendEntries, b"first")
                .await
                .unwrap(),
            b"first"
        );
        // openraft gives up on a slow call by dropping its future.
        let slow = tokio::time::timeout(
            Duration::from_millis(50),
            peer.exchange(RaftCall::AppendEntries, b"slow"),
        )
        .await;
        assert!(slow.is_err(), "the slow call should have been cut off");
        let next = peer
            .exchange(RaftCall::AppendEntries, b"next")
            .await
            .unwrap();
        assert_eq!(next, b"next", "the next request read another's reply");
    }

    /// A reader that hands out `data` and records the largest buffer it
    /// was asked to fill: what the caller had allocated ahead of the bytes.
    struct Recording<'a> {
        data: &'a [u8],
        largest_ask: usize,
    }

    impl AsyncRead for Recording<'_> {
        fn poll_read(
            mut self: std::pin::Pin<&mut Self>,
            _: &mut std::task::Context<'_>,
            buf: &mut tokio::io::ReadBuf<'_>,
        ) -> std::task::Poll<io::Result<()>> {
            self.largest_ask = self.largest_ask.max(buf.remaining());
            let n = buf.remaining().min(self.data.len());
            buf.put_slice(&self.data[..n]);
            self.data = &self.data[n..];
            std::task::Poll::Ready(Ok(()))
        }
    }

    #[tokio::test]
    async fn a_length_prefix_alone_allocates_no_more_than_one_chunk() {
        // Claims 60 MiB, sends 10 bytes, then ends.
        let mut bytes = (60u32 << 20).to_be_bytes().to_vec();
        bytes.extend_from_slice(&[7; 10]);
        let mut r = Recording {
            data: &bytes,
            largest_ask: 0,
        };
        let err = read_frame(&mut r).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
        assert!(
            r.largest_ask <= FRAME_READ_CHUNK,
            "asked to fill {} bytes at once",
            r.largest_ask
        );
        // A frame of several chunks still arrives whole.
        let body: Vec<u8> = (0..3 * FRAME_READ_CHUNK + 5).map(|i| i as u8).collect();
        let mut framed = Vec::new();
        write_frame(&mut framed, &[], &body).await.unwrap();
        let mut r = Recording {
            data: &framed,
            largest_ask: 0,
        };
        assert_eq!(read_frame(&mut r).await.unwrap().unwrap(), body);
    }

    #[tokio::test]
    async fn a_frame_over_the_cap_is_refused_as_too_large() {
        let mut bytes = 101u32.to_be_bytes().to_vec();
        bytes.extend_from_slice(&[0; 101]);
        let err = read_frame_within(&mut &bytes[..], 100).await.unwrap_err();
        assert!(FrameTooLarge::is(&err), "{err}");
        assert!(
            err.to_string().contains("peer_frame_max_bytes=100"),
            "{err}"
        );
        let ok = read_frame_within(&mut &bytes[..], 101).await.unwrap();
        assert_eq!(ok.map(|f| f.len()), Some(101));
    }

    fn chunk(offset: u64, len: usize) -> InstallSnapshotRequest<TypeConfig> {
        InstallSnapshotRequest {
            vote: openraft::Vote::new_committed(1, 1),
            meta: Default::default(),
            offset,
            data: vec![0; len],
            done: false,
        }
    }

    #[test]
    fn a_snapshot_chunk_past_the_maximum_is_refused() {
        assert!(check_snapshot_chunk(&chunk(0, 1024), 1024).is_ok());
        assert!(check_snapshot_chunk(&chunk(1000, 24), 1024).is_ok());
        let err = check_snapshot_chunk(&chunk(1000, 25), 1024).unwrap_err();
        assert!(err.to_string().contains("max_snapshot_bytes=1024"), "{err}");
        // An offset alone, far past the end, or one that overflows.
        assert!(check_snapshot_chunk(&chunk(1 << 40, 0), 1024).is_err());
        assert!(check_snapshot_chunk(&chunk(u64::MAX, 1), u64::MAX).is_err());
    }

    #[tokio::test]
    async fn frames_round_trip_and_oversized_lengths_are_refused() {
        let mut buf = Vec::new();
        write_frame(&mut buf, &[2], b"abc").await.unwrap();
        assert_eq!(buf, [0, 0, 0, 4, 2, b'a', b'b', b'c']);
        let mut r = &buf[..];
        assert_eq!(
            read_frame(&mut r).await.unwrap().unwrap(),
            [2, b'a', b'b', b'c']
        );
        assert!(read_frame(&mut r).await.unwrap().is_none(), "clean end");
        let huge = ((RAFT_MESSAGE_MAX_BYTES + 1) as u32).to_be_bytes();
        let err = read_frame(&mut &huge[..]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidData);
        // A frame cut short is an error, not a clean end.
        let err = read_frame(&mut &buf[..6]).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::UnexpectedEof);
    }
}
