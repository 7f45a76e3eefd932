//! The fenced node: openraft glue, durable storage, network and gRPC
//! services around the pure lease table of `fenced-core`.
//!
//! Data flows one way: gRPC request → validation (`fenced-proto`) →
//! [`proposer`] (batches, stamps cluster time) → openraft log (fdatasync'ed on
//! a majority) → [`state_machine`] apply (`fenced-core`, pure) → one response
//! per caller.

// openraft's StorageError is large and its trait signatures impose it.
#![allow(clippy::result_large_err)]

pub mod admission;
pub mod auth;
pub mod backup;
pub mod blocking;
pub mod certs;
pub mod checksum;
pub mod clock;
pub mod codec;
pub mod config;
pub mod counters;
pub mod data_format;
pub mod deadline;
pub mod dev;
pub mod disk_check;
pub mod exposition;
#[doc(hidden)]
pub mod fuzzing;
pub mod handoff;
pub mod headers;
pub mod health;
pub mod histogram;
pub mod limits;
pub mod log_store;
pub mod log_tail;
pub mod maintenance;
pub mod membership;
pub mod metrics;
pub mod network;
pub mod node;
pub mod parking;
pub mod peer_channel;
pub mod peer_listener;
pub mod prefixed;
pub mod proposer;
pub mod raft_noise;
pub mod repair;
pub mod replication;
pub mod retired;
pub mod revocation;
pub mod rpc;
pub mod rpc_metrics;
pub mod shutdown;
pub mod state_machine;
pub mod status_page;
pub mod tls;
pub mod types;
pub mod watch;

#[cfg(test)]
mod decoder_props;
#[cfg(test)]
mod module_graph;
#[cfg(test)]
mod openraft_contract;
