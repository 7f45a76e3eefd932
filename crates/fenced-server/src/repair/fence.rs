//! What a node being repaired decides from the other members' answers: the
//! term it fences itself at, and the applied index it must reach before it
//! votes again. Pure: no clock, no I/O.
//!
//! A node that lost its data lost two things Raft relies on: the entries it
//! acknowledged, and its promises (the highest term it accepted and the vote
//! it gave in it). Taking part again at term 0 would let it acknowledge a
//! stale leader's entries, or vote twice in one term, and with one other
//! node that can commit or elect what the cluster already decided against.
//!
//! - **The fence.** Any promise it made that could still matter was to a
//!   candidate or leader that a majority joined, and a majority of the
//!   voters other than itself meets every such majority. The highest term
//!   such a majority reports is at least as high as every promise that
//!   matters; the node stores a vote at that term before it answers any
//!   Raft call.
//! - **The catch-up.** It votes again only once it has applied as far as
//!   the last entry in the log of a leader of the newest term, asked after
//!   the fence, that had applied an entry of its own term: such a leader
//!   holds every entry ever committed (and only entries of its own term
//!   could follow them), so the node then holds them all, as the voters
//!   that may elect a leader must.

use std::collections::BTreeSet;

use crate::types::NodeId;

/// One member's answer to `Status`, as the repair reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The node that answered (the channel checked its certificate).
    pub node: NodeId,
    pub term: u64,
    /// Whether it says it is the leader.
    pub leads: bool,
    pub last_applied: u64,
    pub last_applied_term: u64,
    pub last_log_index: u64,
    /// Its membership's index, and the voters and members it names.
    pub membership_index: u64,
    pub voters: BTreeSet<NodeId>,
    pub members: BTreeSet<NodeId>,
}

/// Why the repair cannot go on yet.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Wait {
    /// Not enough of the other voters answered.
    Voters {
        heard: BTreeSet<NodeId>,
        needed: usize,
        voters: BTreeSet<NodeId>,
    },
    /// The answers name a cluster whose only voter is this node: there is
    /// no peer to repair from.
    NoPeer,
    /// No member answered at all.
    Nobody,
    /// No member answered as the leader of the highest term reported: the
    /// fence names that term's leader, so that the node takes its entries.
    NoLeader { term: u64 },
    /// The newest membership does not name this node.
    NotMember { membership_index: u64 },
}

impl std::fmt::Display for Wait {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Wait::Voters {
                heard,
                needed,
                voters,
            } => write!(
                f,
                "heard from the voters {heard:?}; {needed} of the other voters {voters:?} must answer"
            ),
            Wait::NoPeer => write!(
                f,
                "this node is the cluster's only voter: there is no peer to repair it from \
                 (restore a backup instead: fenced restore)"
            ),
            Wait::Nobody => write!(f, "no member answered"),
            Wait::NoLeader { term } => write!(f, "no leader of term {term} answered yet"),
            Wait::NotMember { membership_index } => write!(
                f,
                "the membership at index {membership_index} does not name this node: \
                 it was removed (add it again under a new id)"
            ),
        }
    }
}

/// The fence: a term at least as high as any promise this node made that
/// could still matter, and the leader of that term. The node stores its
/// vote as one for that leader: a vote for no one is not a vote openraft
/// has, and one for itself would refuse that leader's entries for ever.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fence {
    pub term: u64,
    pub leader: NodeId,
    /// Whether this node is a voter of the newest membership; a learner
    /// neither votes nor counts towards a commit, so it needs no catch-up
    /// before voting.
    pub voter: bool,
}

/// The answer with the newest membership.
fn newest(answers: &[Answer]) -> Option<&Answer> {
    answers.iter().max_by_key(|a| a.membership_index)
}

/// How many voters make a majority of `voters`.
fn majority(voters: usize) -> usize {
    voters / 2 + 1
}

/// The fence `me` may take from `answers`, or why not yet. Only answers
/// from the voters other than `me` count: a majority of the cluster's
/// voters, `me` left out (all of the others in a three-voter cluster).
pub fn fence(me: NodeId, answers: &[Answer]) -> Result<Fence, Wait> {
    let Some(view) = newest(answers) else {
        return Err(Wait::Nobody);
    };
    if !view.members.contains(&me) {
        return Err(Wait::NotMember {
            membership_index: view.membership_index,
        });
    }
    let voter = view.voters.contains(&me);
    let others: BTreeSet<NodeId> = view.voters.iter().copied().filter(|v| *v != me).collect();
    if others.is_empty() {
        return Err(Wait::NoPeer);
    }
    let needed = majority(view.voters.len()).min(others.len());
    let heard: BTreeSet<NodeId> = answers
        .iter()
        .map(|a| a.node)
        .filter(|n| others.contains(n))
        .collect();
    if heard.len() < needed {
        return Err(Wait::Voters {
            heard,
            needed,
            voters: others,
        });
    }
    let term = answers.iter().map(|a| a.term).max().unwrap_or(0);
    let Some(leader) = answers
        .iter()
        .find(|a| a.leads && a.term == term && a.node != me)
        .map(|a| a.node)
    else {
        return Err(Wait::NoLeader { term });
    };
    Ok(Fence {
        term,
        leader,
        voter,
    })
}

/// What a node being repaired must apply before it votes again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target {
    /// The term of the leader that set it.
    pub term: u64,
    pub index: u64,
}

/// The index this node must apply before it votes, from `answers` asked
/// after a fence at `fence_term`: the last log index of a leader of the
/// newest term heard (at least the fence's) that has applied an entry of
/// its own term. Every entry ever committed is in its log, so at or below
/// that index. A leader of an older term (one cut off, which openraft does
/// not depose until it hears of the newer term) sets nothing: its log may
/// lack entries the newer leader committed. `None` while no such leader
/// answered.
pub fn catch_up_target(answers: &[Answer], fence_term: u64) -> Option<Target> {
    let newest = answers.iter().map(|a| a.term).max()?;
    answers
        .iter()
        .filter(|a| {
            a.leads && a.term == newest && a.term >= fence_term && a.last_applied_term == a.term
        })
        .map(|a| Target {
            term: a.term,
            index: a.last_log_index.max(a.last_applied),
        })
        .max_by_key(|t| t.index)
}

/// The target to wait for after a round: a newer leader's replaces the one
/// held (entries of an older leader's log beyond the commit may never
/// commit); the same leader's does not, so a busy cluster is not chased.
pub fn next_target(held: Option<Target>, heard: Option<Target>) -> Option<Target> {
    match (held, heard) {
        (Some(h), Some(n)) if n.term > h.term => Some(n),
        (Some(h), _) => Some(h),
        (None, n) => n,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(v: &[NodeId]) -> BTreeSet<NodeId> {
        v.iter().copied().collect()
    }

    fn answer(node: NodeId, term: u64, leads: bool) -> Answer {
        Answer {
            node,
            term,
            leads,
            last_applied: 40,
            last_applied_term: term,
            last_log_index: 42,
            membership_index: 3,
            voters: ids(&[1, 2, 3]),
            members: ids(&[1, 2, 3]),
        }
    }

    #[test]
    fn in_three_voters_both_others_must_answer() {
        let one = [answer(1, 7, true)];
        assert_eq!(
            fence(3, &one),
            Err(Wait::Voters {
                heard: ids(&[1]),
                needed: 2,
                voters: ids(&[1, 2]),
            })
        );
        // The node's own answer (a stale process on its address) counts for
        // nothing.
        let with_self = [answer(1, 7, true), answer(3, 9, false)];
        assert!(matches!(fence(3, &with_self), Err(Wait::Voters { .. })));
    }

    #[test]
    fn the_fence_is_the_highest_term_a_majority_of_the_others_reports() {
        // Node 2 stood in term 9 and lost: it may hold this node's vote of
        // before the damage, so the fence must be above the leader's term.
        // Until a leader of term 9 answers, the node waits.
        let answers = [answer(1, 7, true), answer(2, 9, false)];
        assert_eq!(fence(3, &answers), Err(Wait::NoLeader { term: 9 }));
        let settled = [answer(1, 10, true), answer(2, 9, false)];
        assert_eq!(
            fence(3, &settled),
            Ok(Fence {
                term: 10,
                leader: 1,
                voter: true
            })
        );
    }

    #[test]
    fn five_voters_need_three_of_the_other_four() {
        let five = |node, term| Answer {
            voters: ids(&[1, 2, 3, 4, 5]),
            members: ids(&[1, 2, 3, 4, 5]),
            ..answer(node, term, node == 5)
        };
        assert!(matches!(
            fence(3, &[five(1, 4), five(5, 6)]),
            Err(Wait::Voters { needed: 3, .. })
        ));
        assert_eq!(
            fence(3, &[five(1, 4), five(2, 4), five(5, 6)]).map(|f| f.term),
            Ok(6)
        );
    }

    #[test]
    fn the_newest_membership_decides_who_must_answer() {
        // An old view still lists node 4 as a voter; the newer one does not.
        let old = Answer {
            membership_index: 2,
            voters: ids(&[1, 2, 3, 4]),
            members: ids(&[1, 2, 3, 4]),
            ..answer(4, 5, false)
        };
        let answers = [old, answer(1, 6, true), answer(2, 6, false)];
        assert_eq!(fence(3, &answers).map(|f| f.term), Ok(6));
    }

    #[test]
    fn a_removed_node_and_a_lone_voter_are_not_repaired_from_peers() {
        let removed = Answer {
            voters: ids(&[1, 2, 4]),
            members: ids(&[1, 2, 4]),
            ..answer(1, 3, true)
        };
        assert_eq!(
            fence(3, &[removed]),
            Err(Wait::NotMember {
                membership_index: 3
            })
        );
        let lone = Answer {
            voters: ids(&[3]),
            members: ids(&[3, 4]),
            ..answer(4, 2, false)
        };
        assert_eq!(fence(3, &[lone]), Err(Wait::NoPeer));
        assert_eq!(fence(3, &[]), Err(Wait::Nobody));
    }

    #[test]
    fn a_learner_is_fenced_without_a_majority_of_voters_to_wait_for() {
        let learner = |node, term, leads| Answer {
            voters: ids(&[1, 2]),
            members: ids(&[1, 2, 3]),
            ..answer(node, term, leads)
        };
        assert_eq!(
            fence(3, &[learner(1, 4, true), learner(2, 4, false)]),
            Ok(Fence {
                term: 4,
                leader: 1,
                voter: false
            })
        );
    }

    #[test]
    fn only_a_leader_of_the_newest_term_that_applied_in_it_sets_the_target() {
        let fresh_leader = Answer {
            last_applied_term: 6,
            ..answer(1, 7, true)
        };
        assert_eq!(
            catch_up_target(std::slice::from_ref(&fresh_leader), 7),
            None
        );
        assert_eq!(catch_up_target(&[answer(2, 7, false)], 7), None);
        let applied = Answer {
            last_log_index: 130,
            ..answer(1, 7, true)
        };
        assert_eq!(
            catch_up_target(&[fresh_leader, applied.clone()], 7),
            Some(Target {
                term: 7,
                index: 130
            })
        );
        // A leader cut off in term 6 still says it leads: it sets nothing,
        // whether it is the only leader heard or answers beside the newer.
        let cut_off = Answer {
            last_log_index: 20,
            ..answer(2, 6, true)
        };
        assert_eq!(catch_up_target(std::slice::from_ref(&cut_off), 7), None);
        let newer = Answer {
            node: 3,
            ..answer(3, 8, false)
        };
        assert_eq!(catch_up_target(&[cut_off, applied, newer], 7), None);
    }

    #[test]
    fn a_newer_leaders_target_replaces_the_one_held_and_the_same_leaders_does_not() {
        let t = |term, index| Some(Target { term, index });
        assert_eq!(next_target(None, t(7, 10)), t(7, 10));
        assert_eq!(next_target(t(7, 10), t(7, 90)), t(7, 10));
        assert_eq!(next_target(t(7, 10), t(8, 12)), t(8, 12));
        assert_eq!(next_target(t(7, 10), None), t(7, 10));
    }
}
