//! The Raft type configuration: what the log carries and what nodes are.

use std::{fmt, io::Cursor};

use fenced_core::{Batch, Outcome};
use serde::{Deserialize, Serialize};

pub type NodeId = u64;

/// A cluster member's addresses, as stored in the replicated membership.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// host:port of the peer listener (Raft transport and forwarding).
    pub peer_addr: String,
    /// host:port of the client listener; empty when not known.
    pub client_addr: String,
}

impl fmt::Display for Node {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "peer={} client={}", self.peer_addr, self.client_addr)
    }
}

/// What `apply` returns for one entry: one outcome per command of its batch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Outcomes(pub Vec<Outcome>);

openraft::declare_raft_types!(
    pub TypeConfig:
        D = Batch,
        R = Outcomes,
        NodeId = NodeId,
        Node = Node,
        Entry = openraft::Entry<TypeConfig>,
        SnapshotData = Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

pub type Raft = openraft::Raft<TypeConfig>;
pub type LogId = openraft::LogId<NodeId>;
pub type StorageError = openraft::StorageError<NodeId>;
pub type StoredMembership = openraft::StoredMembership<NodeId, Node>;
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, Node>;
pub type Snapshot = openraft::storage::Snapshot<TypeConfig>;
pub type Entry = openraft::Entry<TypeConfig>;
