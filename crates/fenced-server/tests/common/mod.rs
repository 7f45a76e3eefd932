//! Nodes of one cluster started in the test's process.

use std::{collections::BTreeMap, net::SocketAddr, time::Duration};

use fenced_server::{
    node::{NodeConfig, RunningNode},
    types::Node,
};

/// A loopback address no test running at the same time picks: a port from
/// `bind(0)` is in the ephemeral range, where another process's outgoing
/// connection can take it before the node binds it.
fn free_addr() -> SocketAddr {
    let port = fenced_testkit::free_port().expect("a free loopback port");
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Starts nodes `1..=n` of one cluster in this process, each configured by
/// `configure` after the defaults; returns them once they know a leader.
pub async fn cluster(
    dir: &std::path::Path,
    n: u64,
    configure: impl Fn(&mut NodeConfig),
) -> Vec<RunningNode> {
    let addrs: BTreeMap<u64, (SocketAddr, SocketAddr)> =
        (1..=n).map(|id| (id, (free_addr(), free_addr()))).collect();
    let members: BTreeMap<u64, Node> = addrs
        .iter()
        .map(|(id, (listen, peer))| {
            let node = Node {
                peer_addr: peer.to_string(),
                client_addr: listen.to_string(),
            };
            (*id, node)
        })
        .collect();
    let mut nodes = Vec::new();
    for (id, (listen, peer)) in addrs {
        let data = dir.join(format!("node{id}"));
        let mut cfg = NodeConfig::new(id, data, listen, peer, members.clone());
        configure(&mut cfg);
        nodes.push(RunningNode::start(cfg).await.expect("the node starts"));
    }
    for node in &nodes {
        assert!(
            node.wait_for_leader(Duration::from_secs(10))
                .await
                .is_some(),
            "node {} knows a leader",
            node.ctx.replica.id
        );
    }
    nodes
}
