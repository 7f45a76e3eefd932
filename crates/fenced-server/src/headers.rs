//! The metadata every gRPC answer carries, read by clients and by a node
//! that asked another.

/// On every answer, success or error: `<leader id>,<leader client address>`
/// as the answering node knows it, so a client can send its next call
/// to the leader itself (docs/DECISIONS.md, "Every answer names the
/// leader"). Absent while no leader is known.
pub const LEADER_HEADER: &str = "x-fenced-leader";
/// On every answer: the id of the node that answered, so a client learns
/// which of its endpoints is which node.
pub const NODE_HEADER: &str = "x-fenced-node";
