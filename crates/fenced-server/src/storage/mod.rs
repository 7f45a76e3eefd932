//! What a node keeps on disk below the state machine: the Raft log and vote
//! (`log_store`, `log_tail`), the checksum frame of every other file, and
//! the data directory's format version.
//!
//! Architecture invariant: nothing here is trusted from disk without a
//! checksum, and nothing here imports the network, replication or the
//! state machine (storage never drives the cluster).

pub mod checksum;
pub mod data_format;
pub mod log_store;
pub mod log_tail;
