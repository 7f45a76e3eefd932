//! Node to node: the Raft transport (`network`), gRPC channels to other
//! nodes (`peer_channel`), leadership handed over at stop (`handoff`),
//! membership changes as an operator makes them and the ids they retired.
//!
//! Architecture invariant: imports security, the clock and the leaves, never
//! replication, the state machine or the client-facing services: the
//! transport carries what replication decides.

pub mod handoff;
pub mod membership;
pub mod network;
pub mod peer_channel;
pub mod retired;
