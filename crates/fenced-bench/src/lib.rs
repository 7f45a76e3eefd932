//! Pieces of `fenced-bench` that are worth testing on their own: the token
//! order checker, the latency recorder and the chart.

pub mod chart;
pub mod check;
pub mod stats;
