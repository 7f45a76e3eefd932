//! Pieces of `fenced-bench` that are worth testing on their own: the token
//! order checker, the latency recorder, the chart and the soak's verdict.

pub mod chart;
pub mod check;
pub mod soak;
pub mod stats;
