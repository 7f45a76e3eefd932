//! A node's peer port against a forged InstallSnapshot chunk and a frame
//! over the cap: the connection is closed, the refusal counted, and the
//! node keeps its lease table and keeps serving.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::{collections::BTreeMap, sync::atomic::Ordering::Relaxed, time::Duration};

use fenced_server::{
    codec,
    network::{write_frame, MessageTime, RaftCall, PREFACE},
    node::{NodeConfig, RunningNode},
    types::{Node, TypeConfig},
};
use openraft::raft::InstallSnapshotRequest;
use tokio::{
    io::{AsyncReadExt, AsyncWriteExt},
    net::TcpStream,
};

fn free_addr() -> std::net::SocketAddr {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
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
    let mut conn = TcpStream::connect(peer).await.unwrap();
    conn.write_all(PREFACE).await.unwrap();
    write_frame(&mut conn, head, body).await.unwrap();
    conn.flush().await.unwrap();
    let mut buf = [0u8; 16];
    matches!(
        tokio::time::timeout(Duration::from_secs(5), conn.read(&mut buf)).await,
        Ok(Ok(0) | Err(_))
    )
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
    let m = node.ctx.raft.metrics().borrow().clone();
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
    assert_eq!(node.ctx.counters.limits.peer_frames.load(Relaxed), 1);
    node.shutdown().await;
}
