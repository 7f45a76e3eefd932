//! fenced-jepsen: real `fenced` nodes in network namespaces, faults injected
//! by nftables, signals and libfaketime, a recorded history and checkers that
//! can fail.

pub mod auth;
pub mod calls;
pub mod check;
pub mod cluster;
pub mod history;
pub mod membership;
pub mod nemesis;
pub mod net;
pub mod run;
pub mod tls;
pub mod workload;
