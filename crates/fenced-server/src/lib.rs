//! The fenced node: openraft glue, durable storage, network and gRPC
//! services around the pure lease table of `fenced-core`.
//!
//! Data flows one way: gRPC request → validation (`fenced-proto`) →
//! [`proposer`] (batches, stamps cluster time) → openraft log (fdatasync'ed on
//! a majority) → [`state_machine`] apply (`fenced-core`, pure) → one response
//! per caller.

// openraft's StorageError is large and its trait signatures impose it.
#![allow(clippy::result_large_err)]

// The leaves: imported by any layer, importing nothing of the crate.
pub mod blocking;
pub mod codec;
pub mod deadline;
pub mod headers;
pub mod histogram;
pub mod prefixed;
pub mod types;

// The layers, each a folder, from the bottom up (docs/ARCHITECTURE.md,
// "fenced-server"; testing/module_graph.rs checks what each may import).
pub mod clock;
pub mod counters;
pub mod node;
pub mod observe;
pub mod peer;
pub mod proposer;
pub mod repair;
pub mod replication;
pub mod rpc;
pub mod security;
pub mod state_machine;
pub mod storage;
pub mod testing;
pub mod tools;
