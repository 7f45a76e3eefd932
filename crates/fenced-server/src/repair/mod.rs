//! Rebuilding a node whose data was damaged or lost from its peers, under
//! the same id and in the same membership (docs/OPERATIONS.md, "A damaged
//! node"; docs/DECISIONS.md, "A damaged node is repaired in place").
//!
//! `fenced repair` ([`prepare`]) moves the damaged directory aside and marks
//! a new one ([`marker`]). At its next start the node answers no Raft call
//! until it stored a vote at a term no lower than any promise it may have
//! made ([`fence`], [`run::store_fence`]); then it takes the log and
//! snapshots but neither votes nor stands ([`gate`]) until it applied as far
//! as a leader had after the repair began ([`run::finish`]).

pub mod fence;
pub mod gate;
pub mod marker;
pub mod prepare;
pub mod run;

pub use gate::RepairGate;
