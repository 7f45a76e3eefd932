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

/// Where this node's own candidacy is, as its answers to other candidates'
/// pre-votes see it. Like a Raft vote, a pre-vote grant is one at a time:
/// to this node itself or to one other candidate, for a promise's time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Candidacy {
    /// No pre-vote of its own out, none granted lately.
    Idle,
    /// It granted this candidate's pre-vote lately: it grants no other and
    /// does not stand itself until the promise ends.
    Promised(NodeId),
    /// Its promise to this candidate ended: for as long again it grants
    /// anyone but that candidate, so that one which cannot win (a shorter
    /// log than a majority's, a partition) does not hold its voters by
    /// asking again and again. (Had the candidate been elected, this node
    /// would hear from it and grant no one anyway.)
    Lapsed(NodeId),
    /// Its own pre-vote is out: it has granted itself.
    Asking,
    /// It won its pre-vote and stood lately: it grants no one.
    Stood,
}

/// A voter's answer, and whether it makes a new promise.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Answer {
    pub granted: bool,
    /// This node is now [`Candidacy::Promised`] to the candidate, from now
    /// on; a grant to the candidate it is promised to already keeps the
    /// promise's start, so asking again does not lengthen it.
    pub promises: bool,
}

/// Whether candidate `req` ranks above a node `me` whose log ends at
/// `my_last`: the longer log first (Raft's up-to-date rule), then the
/// higher node id. Of two nodes asking at once, the lower one gives its
/// grant to the higher one.
pub fn ranks_above(req: &PreVoteRequest, me: NodeId, my_last: Option<LogId<NodeId>>) -> bool {
    (req.last_log_id, req.candidate) > (my_last, me)
}

/// The voter side: the answer of node `me` in `state`, which heard from a
/// leader lately or not, whose log ends at `my_last`, and whose own
/// candidacy is `mine`.
///
/// Were grants not one at a time, two nodes asking at once could both win
/// and both stand in the same term; openraft lets the higher id of the two
/// take a term the lower one already won (a voter that granted the lower
/// one changes its vote until it hears from it), so the first leader would
/// be deposed a millisecond after its election. A node asking for itself
/// gives its grant up only to a candidate that ranks above it
/// ([`ranks_above`]), so two askers do not both give theirs away.
pub fn answer(
    me: NodeId,
    state: ServerState,
    heard_lately: bool,
    req: &PreVoteRequest,
    my_last: Option<LogId<NodeId>>,
    mine: Candidacy,
) -> Answer {
    let leader = state == ServerState::Leader;
    let would = grants_pre_vote(leader || heard_lately, req.last_log_id, my_last);
    let (granted, promises) = match mine {
        Candidacy::Idle => (would, would),
        Candidacy::Promised(to) => (would && to == req.candidate, false),
        Candidacy::Lapsed(to) => {
            let granted = would && to != req.candidate;
            (granted, granted)
        }
        Candidacy::Asking => {
            let granted = would && ranks_above(req, me, my_last);
            (granted, granted)
        }
        Candidacy::Stood => (false, false),
    };
    Answer { granted, promises }
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
/// within the lease or not, whose candidacy is `mine`: a node that promised
/// another candidate or stood lately waits for the promise to end.
pub fn check(heard_lately: bool, state: ServerState, is_voter: bool, mine: Candidacy) -> Check {
    if heard_lately
        || matches!(state, ServerState::Leader | ServerState::Shutdown)
        || !is_voter
        || !matches!(mine, Candidacy::Idle | Candidacy::Lapsed(_))
    {
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

/// Whether a node that won a pre-vote stands now: only if it still holds
/// its own grant (`still_asking`: it did not give it to a candidate that
/// ranks above it meanwhile), the vote it holds is still the one it held
/// when it asked (`asked_with`), and it has not heard from a leader since.
/// A voter asked at the same time may have won meanwhile, this node voting
/// for it; standing would depose it with a higher term, and as this node's
/// log may be shorter it could not win either: the cluster would wait a
/// leader lease for a third election. The vote is the one the log store
/// holds, which openraft sets before it answers a vote request; its metrics
/// follow later, and a check of the term they show let a node stand a
/// millisecond after it had voted for another (S6: grants again 0.96 s
/// after the kill instead of 0.42 s).
pub fn stands_after_pre_vote(
    won: bool,
    still_asking: bool,
    asked_with: Option<Vote<NodeId>>,
    vote_now: Option<Vote<NodeId>>,
    heard_lately: bool,
) -> bool {
    won && still_asking && vote_now == asked_with && !heard_lately
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
        let idle = Candidacy::Idle;
        let answer = |state, heard, mine| answer(1, state, heard, &req, id(2, 10), mine).granted;
        assert!(answer(ServerState::Follower, false, idle));
        assert!(!answer(ServerState::Leader, false, idle));
        assert!(!answer(ServerState::Follower, true, idle));
        assert!(!answer(ServerState::Follower, true, Candidacy::Asking));
    }

    #[test]
    fn only_a_voter_without_a_leader_or_a_promise_asks() {
        use ServerState::*;
        let idle = Candidacy::Idle;
        assert_eq!(check(false, Follower, true, idle), Check::AskVoters);
        assert_eq!(check(false, Candidate, true, idle), Check::AskVoters);
        assert_eq!(
            check(true, Follower, true, idle),
            Check::Wait,
            "heard lately"
        );
        assert_eq!(check(false, Leader, true, idle), Check::Wait);
        assert_eq!(check(false, Shutdown, true, idle), Check::Wait);
        assert_eq!(
            check(false, Learner, false, idle),
            Check::Wait,
            "not a voter"
        );
        for mine in [Candidacy::Promised(2), Candidacy::Stood, Candidacy::Asking] {
            assert_eq!(check(false, Follower, true, mine), Check::Wait, "{mine:?}");
        }
        let lapsed = Candidacy::Lapsed(2);
        assert_eq!(check(false, Follower, true, lapsed), Check::AskVoters);
    }

    #[test]
    fn a_won_pre_vote_stands_only_if_its_vote_is_unchanged_and_no_leader_came() {
        let mine = Some(Vote::new(2, 1));
        assert!(stands_after_pre_vote(true, true, mine, mine, false));
        assert!(
            !stands_after_pre_vote(false, true, mine, mine, false),
            "lost"
        );
        assert!(
            !stands_after_pre_vote(true, false, mine, mine, false),
            "it gave its grant to a candidate that ranks above it"
        );
        assert!(
            !stands_after_pre_vote(true, true, mine, Some(Vote::new(3, 2)), false),
            "it voted for another candidate meanwhile (its leader not heard from yet)"
        );
        let mut elected = Vote::new(3, 2);
        elected.commit();
        assert!(
            !stands_after_pre_vote(true, true, mine, Some(elected), false),
            "another voter was elected meanwhile"
        );
        assert!(
            !stands_after_pre_vote(true, true, None, Some(Vote::new(1, 3)), false),
            "a node that had never voted voted meanwhile"
        );
        assert!(
            !stands_after_pre_vote(true, true, mine, mine, true),
            "this node heard from a leader"
        );
    }

    #[test]
    fn candidates_rank_by_log_then_id() {
        let req = |candidate, last_log_id| PreVoteRequest {
            candidate,
            last_log_id,
        };
        assert!(
            ranks_above(&req(5, id(2, 10)), 4, id(2, 10)),
            "same log, higher id"
        );
        assert!(
            !ranks_above(&req(4, id(2, 10)), 5, id(2, 10)),
            "same log, lower id"
        );
        assert!(ranks_above(&req(1, id(2, 11)), 5, id(2, 10)), "longer log");
        assert!(!ranks_above(&req(5, id(2, 9)), 1, id(2, 10)), "shorter log");
        assert!(ranks_above(&req(2, None), 1, None), "both empty");
    }

    #[test]
    fn a_grant_is_one_at_a_time_and_an_asker_gives_way_only_upwards() {
        use ServerState::Follower;
        let req = |candidate| PreVoteRequest {
            candidate,
            last_log_id: id(2, 10),
        };
        let at = |mine, candidate| answer(3, Follower, false, &req(candidate), id(2, 10), mine);
        let yes = Answer {
            granted: true,
            promises: true,
        };
        let no = Answer {
            granted: false,
            promises: false,
        };
        assert_eq!(at(Candidacy::Idle, 2), yes, "idle: a lower one");
        assert_eq!(at(Candidacy::Idle, 4), yes, "idle: a higher one");
        assert_eq!(
            at(Candidacy::Promised(4), 4),
            Answer {
                granted: true,
                promises: false
            },
            "the same one again, the promise not lengthened"
        );
        assert_eq!(at(Candidacy::Promised(4), 5), no, "promised to another");
        assert_eq!(
            at(Candidacy::Lapsed(4), 4),
            no,
            "the one whose promise lapsed"
        );
        assert_eq!(at(Candidacy::Lapsed(4), 5), yes, "lapsed: anyone else");
        assert_eq!(at(Candidacy::Asking, 4), yes, "asking: gives way upwards");
        assert_eq!(at(Candidacy::Asking, 2), no, "asking: keeps its own grant");
        assert_eq!(at(Candidacy::Stood, 5), no, "stood: voted for itself");
        // A refusal for the log never promises.
        let shorter = PreVoteRequest {
            candidate: 9,
            last_log_id: id(2, 9),
        };
        assert_eq!(
            answer(3, Follower, false, &shorter, id(2, 10), Candidacy::Idle),
            no
        );
    }

    /// A model of nodes that all ask at once, their questions and answers
    /// delivered in a random order (seeded): never two stand; and with an
    /// election's worth of checks, one does in nearly every run.
    #[test]
    fn of_pre_votes_out_at_once_at_most_one_stands() {
        for voters in [3u64, 5] {
            let mut one_stood = 0;
            let runs = 2_000u64;
            for seed in 1..=runs {
                let standing = simulate_at_once(voters, seed);
                assert!(
                    standing <= 1,
                    "{voters} voters, seed {seed}: {standing} stood"
                );
                one_stood += standing;
            }
            assert!(
                one_stood * 10 >= runs * 8,
                "{voters} voters: someone stood in only {one_stood} of {runs} runs"
            );
        }
    }

    /// One run of the model: returns how many nodes stood.
    fn simulate_at_once(voters: u64, seed: u64) -> u64 {
        #[derive(Clone, Copy)]
        enum Msg {
            Ask { from: u64, to: u64 },
            Reply { to: u64, granted: bool },
        }
        let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        let mut next = move |n: usize| {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            (rng % n as u64) as usize
        };
        let n = voters as usize;
        let mut mine = vec![Candidacy::Idle; n + 1];
        let mut tally: Vec<Tally> = (0..=n).map(|_| Tally::new(n)).collect();
        let mut answered = vec![0usize; n + 1];
        let mut decided = vec![false; n + 1];
        let mut stood = 0;
        // Nodes start asking in a random order, interleaved with deliveries.
        let mut not_started: Vec<u64> = (1..=voters).collect();
        let mut in_flight: Vec<Msg> = Vec::new();
        while !not_started.is_empty() || !in_flight.is_empty() {
            let start = !not_started.is_empty() && (in_flight.is_empty() || next(3) == 0);
            if start {
                let me = not_started.swap_remove(next(not_started.len()));
                let m = me as usize;
                if check(false, ServerState::Follower, true, mine[m]) == Check::AskVoters {
                    mine[m] = Candidacy::Asking;
                    for to in (1..=voters).filter(|v| *v != me) {
                        in_flight.push(Msg::Ask { from: me, to });
                    }
                }
                continue;
            }
            match in_flight.swap_remove(next(in_flight.len())) {
                Msg::Ask { from, to } => {
                    let req = PreVoteRequest {
                        candidate: from,
                        last_log_id: None,
                    };
                    let t = to as usize;
                    let a = answer(to, ServerState::Follower, false, &req, None, mine[t]);
                    if a.promises {
                        mine[t] = Candidacy::Promised(from);
                    }
                    in_flight.push(Msg::Reply {
                        to: from,
                        granted: a.granted,
                    });
                }
                Msg::Reply { to, granted } => {
                    let t = to as usize;
                    if decided[t] {
                        continue;
                    }
                    answered[t] += 1;
                    let won = tally[t].count(Some(PreVoteResponse { granted }));
                    if won || answered[t] == n - 1 {
                        decided[t] = true;
                        let still_asking = mine[t] == Candidacy::Asking;
                        if stands_after_pre_vote(tally[t].won(), still_asking, None, None, false) {
                            mine[t] = Candidacy::Stood;
                            stood += 1;
                        } else if still_asking {
                            mine[t] = Candidacy::Idle;
                        }
                    }
                }
            }
        }
        stood
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
