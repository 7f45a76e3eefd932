//! The data commands an operator runs on a node's state: backups and
//! restores (`fenced backup`, `fenced restore`, the `SaveSnapshot` call's
//! file) and the check of a stopped node's data directory (`fenced check`).
//!
//! Architecture invariant: reads and writes through the state machine and
//! storage as a node does; imports no service and no node.

pub mod backup;
pub mod disk_check;
