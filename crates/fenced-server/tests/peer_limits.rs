//! A node's peer port against a forged InstallSnapshot chunk and a frame
//! over the cap: the connection is closed, the refusal counted, and the
//! node keeps its lease table and keeps serving. And the peer protocol's
//! versions: version 3 frames carry each time with its term and the floor
//! comes back with its term; a version 2 connection (the previous release,
//! mid-upgrade) is answered in version 2's frames and its time taken as of
//! its message's term; a time of a later term than its message's is
//! refused.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, sync::atomic::Ordering::Relaxed, time::Duration};

use fenced_core::ClusterTime;
use fenced_server::{
    clock::floor::LeaderTime,
    codec,
    node::{NodeConfig, RunningNode},
    peer::network::{
        read_frame, split_reply, write_frame, MessageTime, RaftCall, PREFACE, PREFACE_V2,
        REPLY_HEADER_LEN,
    },
    types::{Node, TypeConfig},
};
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, InstallSnapshotRequest};
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

/// Below the ephemeral range, so no outgoing connection takes it first.
fn free_addr() -> std::net::SocketAddr {
    let port = fenced_testkit::free_port().unwrap();
    std::net::SocketAddr::from(([127, 0, 0, 1], port))
}

async fn single_node(max_snapshot_bytes: u64) -> (RunningNode, tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let (listen, peer) = (free_addr(), free_addr());
    let members = BTreeMap::from([(
        1,
        Node {
            peer_addr: peer.to_string(),
            client_addr: listen.to_string(),
        },
    )]);
    let mut cfg = NodeConfig::new(1, dir.path().join("data"), listen, peer, members);
    cfg.server_limits.max_snapshot_bytes = max_snapshot_bytes;
    let node = RunningNode::start(cfg).await.expect("the node starts");
    node.wait_for_leader(Duration::from_secs(10))
        .await
        .expect("a single node elects itself");
    (node, dir, peer.to_string())
}

/// Sends `frame` after the Raft preface; whether the node then closed the
/// connection without answering.
async fn closed_after(peer: &str, head: &[u8], body: &[u8]) -> bool {
    let mut conn = sent(peer, PREFACE, head, body).await;
    let mut buf = [0u8; 16];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
}

/// A connection to `peer` that sent `preface` and one frame.
async fn sent(peer: &str, preface: &[u8], head: &[u8], body: &[u8]) -> TcpStream {
    let mut conn = TcpStream::connect(peer).await.unwrap();
    conn.write_all(preface).await.unwrap();
    write_frame(&mut conn, head, body).await.unwrap();
    conn.flush().await.unwrap();
    conn
}

fn request_head(call: RaftCall) -> Vec<u8> {
    let mut head = vec![call as u8];
    head.extend_from_slice(&MessageTime::NONE.encode());
    head
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_chunk_past_max_snapshot_bytes_is_refused_before_raft_sees_it() {
    let (node, _dir, peer) = single_node(1 << 20).await;
    let chunk = InstallSnapshotRequest::<TypeConfig> {
        // A vote high enough that openraft would take the chunk.
        vote: openraft::Vote::new_committed(1_000, 2),
        meta: Default::default(),
        offset: 1 << 40,
        data: vec![0; 16],
        done: false,
    };
    let body = codec::encode("install_snapshot", &chunk).unwrap();
    assert!(closed_after(&peer, &request_head(RaftCall::InstallSnapshot), &body).await);
    let counters = &node.ctx.counters.limits;
    assert_eq!(counters.snapshot_chunks.load(Relaxed), 1);
    // Nothing reached Raft: this node still leads in its own term.
    let m = node.ctx.replica.raft.metrics().borrow().clone();
    assert_eq!(m.current_leader, Some(1));
    assert!(m.current_term < 1_000, "the forged vote reached raft");
    node.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_frame_over_the_cap_closes_the_peer_connection_and_is_counted() {
    let (node, _dir, peer) = single_node(1 << 20).await;
    let mut conn = TcpStream::connect(&peer).await.unwrap();
    conn.write_all(PREFACE).await.unwrap();
    conn.write_all(&u32::MAX.to_be_bytes()).await.unwrap();
    conn.flush().await.unwrap();
    let mut buf = [0u8; 16];
    let read = tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await;
    assert!(matches!(read, Ok(Ok(0) | Err(_))), "{read:?}");
    // The listener counts the refusal once its connection task has ended,
    // which is also what closes the socket: the count may trail the close
    // this test saw by a moment.
    let counted = tokio::time::timeout(Duration::from_secs(5), async {
        while node.ctx.counters.limits.peer_frames.load(Relaxed) == 0 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    })
    .await;
    assert!(counted.is_ok(), "the frame over the cap was never counted");
    assert_eq!(node.ctx.counters.limits.peer_frames.load(Relaxed), 1);
    node.shutdown().await;
}

/// A heartbeat from node 2 as leader of `term` (nothing to append).
fn heartbeat(term: u64) -> Vec<u8> {
    let req = AppendEntriesRequest::<TypeConfig> {
        vote: openraft::Vote::new_committed(term, 2),
        prev_log_id: None,
        leader_commit: None,
        entries: vec![],
    };
    codec::encode("append_entries", &req).unwrap()
}

/// Sends one frame after `preface`; the reply frame, or `None` when the
/// node closed the connection.
async fn exchange(peer: &str, preface: &[u8], head: &[u8], body: &[u8]) -> Option<Vec<u8>> {
    let mut conn = sent(peer, preface, head, body).await;
    let reply = tokio::time::timeout(Duration::from_secs(5), read_frame(&mut conn))
        .await
        .expect("an answer or a close within 5 s");
    match reply {
        Ok(Some(frame)) => Some(frame),
        Ok(None) | Err(_) => {
            // Closed: nothing more to read.
            let mut rest = [0u8; 1];
            assert!(matches!(conn.read(&mut rest).await, Ok(0) | Err(_)));
            None
        }
    }
}

fn v3_head(term: u64, ms: u64) -> Vec<u8> {
    let mut head = vec![RaftCall::AppendEntries as u8];
    let time = MessageTime {
        at: LeaderTime::new(term, ClusterTime::from_millis(ms)),
        durable: false,
    };
    head.extend_from_slice(&time.encode());
    head
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn times_travel_with_their_term_and_a_version_2_peer_is_answered_in_its_frames() {
    let (node, _dir, peer) = single_node(1 << 20).await;
    let floor = || node.ctx.replica.time.floor().leader_time();

    // Version 2: time without a term, then flags; the reply's floor is the
    // time alone, and the time is taken as of the heartbeat's term.
    let mut v2_head = vec![RaftCall::AppendEntries as u8];
    v2_head.extend_from_slice(&7_000_000u64.to_be_bytes());
    v2_head.push(0);
    let reply = exchange(&peer, PREFACE_V2, &v2_head, &heartbeat(1_000))
        .await
        .expect("a version 2 peer is answered");
    let (floor_ms, body) = reply.split_at(8);
    let answer: Result<AppendEntriesResponse<u64>, openraft::error::RaftError<u64>> =
        codec::decode("append_entries", body).expect("a version 2 reply: 8 bytes, then the body");
    assert!(answer.is_ok(), "{answer:?}");
    assert_eq!(u64::from_be_bytes(floor_ms.try_into().unwrap()), 7_000_000);
    assert_eq!(
        floor(),
        LeaderTime::new(1_000, ClusterTime::from_millis(7_000_000))
    );

    // Version 3, the same leader later: the reply carries term and time.
    let reply = exchange(
        &peer,
        PREFACE,
        &v3_head(1_000, 7_000_500),
        &heartbeat(1_000),
    )
    .await
    .expect("answered");
    let (answered_floor, _) = split_reply(&reply).unwrap();
    assert!(reply.len() > REPLY_HEADER_LEN);
    assert_eq!(
        answered_floor,
        LeaderTime::new(1_000, ClusterTime::from_millis(7_000_500))
    );

    // A newer leader whose clock stands lower: its time is the floor now.
    exchange(
        &peer,
        PREFACE,
        &v3_head(1_001, 6_000_000),
        &heartbeat(1_001),
    )
    .await
    .expect("answered");
    assert_eq!(
        floor(),
        LeaderTime::new(1_001, ClusterTime::from_millis(6_000_000))
    );

    // The old leader's later time (it woke from a pause): refused by
    // openraft for its lower vote, and below the newer term's anyway.
    exchange(
        &peer,
        PREFACE,
        &v3_head(1_000, 9_000_000),
        &heartbeat(1_000),
    )
    .await
    .expect("answered");
    assert_eq!(
        floor(),
        LeaderTime::new(1_001, ClusterTime::from_millis(6_000_000))
    );

    // A time of a later term than its message's: the connection closes.
    assert!(
        exchange(
            &peer,
            PREFACE,
            &v3_head(1_005, 9_000_000),
            &heartbeat(1_001)
        )
        .await
        .is_none(),
        "a time of term 1005 on a heartbeat of term 1001 was taken"
    );
    assert_eq!(floor().term, 1_001);
    node.shutdown().await;
}
