//! Sans-IO: the pre-vote's messages and decisions (Raft thesis §9.6). The
//! timer, the questions to voters and openraft's election are
//! [`super::election`]'s.

use openraft::{LogId, ServerState, Vote};
use serde::{Deserialize, Serialize};

use crate::types::NodeId;

/// A candidate's question to a voter: would you vote for me now?
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PreVoteRequest {
    pub candidate: NodeId,
    pub last_log_id: Option<LogId<NodeId>>,
}

/// The voter's answer; nothing changes on the voter either way.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PreVoteResponse {
    pub granted: bool,
}

/// Whether a voter would vote for a candidate: only when it has not heard
/// from a leader within a leader lease (it is not a leader itself either)
/// and the candidate's log is at least as long as its own (Raft's
/// up-to-date rule, compared by last log id).
pub fn grants_pre_vote(
    heard_from_leader_lately: bool,
    candidate_last: Option<LogId<NodeId>>,
    my_last: Option<LogId<NodeId>>,
) -> bool {
    !heard_from_leader_lately && candidate_last >= my_last
}

/// The voter side: the answer of a node in `state` that heard from a leader
/// lately or not, whose log ends at `my_last`.
pub fn answer(
    state: ServerState,
    heard_lately: bool,
    req: &PreVoteRequest,
    my_last: Option<LogId<NodeId>>,
) -> PreVoteResponse {
    let leader = state == ServerState::Leader;
    PreVoteResponse {
        granted: grants_pre_vote(leader || heard_lately, req.last_log_id, my_last),
    }
}

/// Whether `granted` answers, this node's own included, make a majority of
/// `voters`.
pub fn is_majority(granted: usize, voters: usize) -> bool {
    voters > 0 && granted > voters / 2
}

/// What a node does at one of its periodic checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Check {
    /// A leader was heard within the lease, this node leads or stops, or it
    /// is no voter: nothing to do until the next check.
    Wait,
    /// Ask the other voters for a pre-vote.
    AskVoters,
}

/// The check of a node in `state`, voter or not, that heard from a leader
/// within the lease or not.
pub fn check(heard_lately: bool, state: ServerState, is_voter: bool) -> Check {
    if heard_lately || matches!(state, ServerState::Leader | ServerState::Shutdown) || !is_voter {
        Check::Wait
    } else {
        Check::AskVoters
    }
}

/// The answers to one pre-vote, counted as they come. The candidate's own
/// grant is counted from the start.
#[derive(Debug, Clone, Copy)]
pub struct Tally {
    voters: usize,
    /// Grants from other voters.
    granted: usize,
}

impl Tally {
    pub fn new(voters: usize) -> Self {
        Self { voters, granted: 0 }
    }

    /// Counts one answer (`None`: no answer in time, a refusal). Returns
    /// whether the grants, the candidate's own included, make a majority:
    /// the remaining voters are not waited for then.
    pub fn count(&mut self, answer: Option<PreVoteResponse>) -> bool {
        if matches!(answer, Some(PreVoteResponse { granted: true })) {
            self.granted += 1;
            return self.won();
        }
        false
    }

    /// Grants from other voters so far.
    pub fn granted(&self) -> usize {
        self.granted
    }

    pub fn won(&self) -> bool {
        is_majority(1 + self.granted, self.voters)
    }
}

/// Whether a node that won a pre-vote stands now: only if the vote it holds
/// is still the one it held when it asked (`asked_with`), and it has not
/// heard from a leader since. A voter asked at the same time may have won
/// meanwhile, this node voting for it; standing would depose it with a higher
/// term, and as this node's log may be shorter it could not win either: the
/// cluster would wait a leader lease for a third election. The vote is the
/// one the log store holds, which openraft sets before it answers a vote
/// request; its metrics follow later, and a check of the term they show let
/// a node stand a millisecond after it had voted for another (S6: grants
/// again 0.96 s after the kill instead of 0.42 s).
pub fn stands_after_pre_vote(
    won: bool,
    asked_with: Option<Vote<NodeId>>,
    vote_now: Option<Vote<NodeId>>,
    heard_lately: bool,
) -> bool {
    won && vote_now == asked_with && !heard_lately
}

#[cfg(test)]
mod tests {
    use openraft::CommittedLeaderId;

    use super::*;

    fn id(term: u64, index: u64) -> Option<LogId<NodeId>> {
        Some(LogId::new(CommittedLeaderId::new(term, 1), index))
    }

    #[test]
    fn a_voter_grants_only_without_a_leader_and_to_a_log_as_long_as_its_own() {
        assert!(grants_pre_vote(false, id(2, 10), id(2, 10)), "equal logs");
        assert!(grants_pre_vote(false, id(2, 11), id(2, 10)), "longer log");
        assert!(grants_pre_vote(false, id(3, 5), id(2, 10)), "later term");
        assert!(grants_pre_vote(false, id(1, 1), None), "empty voter");
        assert!(!grants_pre_vote(false, id(2, 9), id(2, 10)), "shorter log");
        assert!(!grants_pre_vote(false, id(1, 20), id(2, 10)), "older term");
        assert!(!grants_pre_vote(false, None, id(1, 1)), "empty candidate");
        assert!(
            !grants_pre_vote(true, id(2, 11), id(2, 10)),
            "a voter that hears from a leader keeps it"
        );
    }

    #[test]
    fn a_leader_refuses_every_pre_vote() {
        let req = PreVoteRequest {
            candidate: 2,
            last_log_id: id(9, 9),
        };
        assert!(answer(ServerState::Follower, false, &req, id(2, 10)).granted);
        assert!(!answer(ServerState::Leader, false, &req, id(2, 10)).granted);
        assert!(!answer(ServerState::Follower, true, &req, id(2, 10)).granted);
    }

    #[test]
    fn only_a_voter_without_a_leader_asks() {
        use ServerState::*;
        assert_eq!(check(false, Follower, true), Check::AskVoters);
        assert_eq!(check(false, Candidate, true), Check::AskVoters);
        assert_eq!(check(true, Follower, true), Check::Wait, "heard lately");
        assert_eq!(check(false, Leader, true), Check::Wait);
        assert_eq!(check(false, Shutdown, true), Check::Wait);
        assert_eq!(check(false, Learner, false), Check::Wait, "not a voter");
    }

    #[test]
    fn a_won_pre_vote_stands_only_if_its_vote_is_unchanged_and_no_leader_came() {
        let mine = Some(Vote::new(2, 1));
        assert!(stands_after_pre_vote(true, mine, mine, false));
        assert!(!stands_after_pre_vote(false, mine, mine, false), "lost");
        assert!(
            !stands_after_pre_vote(true, mine, Some(Vote::new(3, 2)), false),
            "it voted for another candidate meanwhile (its leader not heard from yet)"
        );
        let mut elected = Vote::new(3, 2);
        elected.commit();
        assert!(
            !stands_after_pre_vote(true, mine, Some(elected), false),
            "another voter was elected meanwhile"
        );
        assert!(
            !stands_after_pre_vote(true, None, Some(Vote::new(1, 3)), false),
            "a node that had never voted voted meanwhile"
        );
        assert!(
            !stands_after_pre_vote(true, mine, mine, true),
            "this node heard from a leader"
        );
    }

    #[test]
    fn a_majority_counts_the_candidate_itself() {
        assert!(!is_majority(1, 3));
        assert!(is_majority(2, 3));
        assert!(is_majority(1, 1));
        assert!(!is_majority(2, 4));
        assert!(is_majority(3, 5));
        assert!(!is_majority(0, 0));
    }

    #[test]
    fn a_tally_stops_at_a_majority_and_counts_silence_as_a_refusal() {
        let grant = Some(PreVoteResponse { granted: true });
        let refuse = Some(PreVoteResponse { granted: false });
        let mut t = Tally::new(5);
        assert!(!t.count(refuse));
        assert!(!t.count(None));
        assert!(!t.count(grant), "2 of 5");
        assert!(t.count(grant), "3 of 5");
        assert_eq!(t.granted(), 2);
        assert!(t.won());
        let mut alone = Tally::new(1);
        assert!(alone.won(), "a single voter elects itself");
        assert!(!alone.count(None));
    }
}
