//! Checkers: linearizability per resource (long-TTL workload) and invariants
//! over the whole history and the final state.

pub mod invariants;
pub mod kv;
pub mod linear;
