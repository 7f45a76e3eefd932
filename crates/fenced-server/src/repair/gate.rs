//! Which Raft calls a node being repaired answers, shared by its peer port
//! ([`crate::replication::follower`]) and its elections
//! ([`crate::replication::election`]).

use std::sync::atomic::{AtomicU8, Ordering};

use super::marker::Step;
use crate::peer::network::RaftCall;

const REPAIRED: u8 = 0;
const FENCE: u8 = 1;
const CATCH_UP: u8 = 2;

/// The repair's step as the running node sees it.
#[derive(Debug, Default)]
pub struct RepairGate(AtomicU8);

impl RepairGate {
    /// A gate at `step`, or open (`None`: not being repaired).
    pub fn new(step: Option<Step>) -> Self {
        Self(AtomicU8::new(match step {
            None => REPAIRED,
            Some(Step::Fence) => FENCE,
            Some(Step::CatchUp { .. }) => CATCH_UP,
        }))
    }

    pub fn set(&self, step: Option<Step>) {
        self.0
            .store(Self::new(step).0.into_inner(), Ordering::Release);
    }

    /// Whether the repair is still going on.
    pub fn repairing(&self) -> bool {
        self.0.load(Ordering::Acquire) != REPAIRED
    }

    /// Whether the node may answer `call` now: nothing before the fence is
    /// stored; the log and snapshots, but no vote, pre-vote or hand-over
    /// (which would make it stand), until it caught up.
    pub fn admits(&self, call: RaftCall) -> bool {
        admits(self.0.load(Ordering::Acquire), call)
    }

    /// Whether the node may stand for election or grant a vote.
    pub fn may_vote(&self) -> bool {
        !self.repairing()
    }
}

fn admits(step: u8, call: RaftCall) -> bool {
    match step {
        REPAIRED => true,
        CATCH_UP => matches!(call, RaftCall::AppendEntries | RaftCall::InstallSnapshot),
        _ => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const CALLS: [RaftCall; 5] = [
        RaftCall::AppendEntries,
        RaftCall::Vote,
        RaftCall::InstallSnapshot,
        RaftCall::PreVote,
        RaftCall::TimeoutNow,
    ];

    #[test]
    fn before_the_fence_no_call_is_answered() {
        let gate = RepairGate::new(Some(Step::Fence));
        assert!(CALLS.iter().all(|c| !gate.admits(*c)));
        assert!(!gate.may_vote());
    }

    #[test]
    fn while_catching_up_only_the_log_is_taken() {
        let gate = RepairGate::new(Some(Step::CatchUp { term: 3 }));
        let admitted: Vec<RaftCall> = CALLS.into_iter().filter(|c| gate.admits(*c)).collect();
        assert_eq!(
            admitted,
            vec![RaftCall::AppendEntries, RaftCall::InstallSnapshot]
        );
        assert!(!gate.may_vote());
        gate.set(None);
        assert!(CALLS.iter().all(|c| gate.admits(*c)));
        assert!(gate.may_vote() && !gate.repairing());
    }
}
