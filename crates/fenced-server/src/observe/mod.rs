//! What an operator sees of a running node: `/metrics` and its format
//! checker, the status page, gRPC health, and which of openraft's log
//! lines are kept out of the log.
//!
//! Architecture invariant: reads the node's counters and state; nothing
//! below it imports it (the services, the state machine and the proposer
//! count into `counters`, which this layer shows).

pub mod exposition;
pub mod health;
pub mod metrics;
pub mod raft_noise;
pub mod status_page;
