//! Pieces of `fenced-bench` that are worth testing on their own: the token
//! order checker and the latency recorder.

pub mod check;
pub mod stats;
