//! Sans-IO: which appends are copied early, to whom, and what a follower's
//! answer to a copy vouches for. No clock (times are passed in), no task, no
//! socket: [`super::early`] executes these decisions.

use std::collections::VecDeque;

// tokio's clock: the simulation runs it paused, and the real one otherwise.
use tokio::time::Instant;

use openraft::{raft::AppendEntriesRequest, LogId, Vote};

use crate::types::{NodeId, TypeConfig};

/// Early copies kept per follower for openraft's AppendEntries to find:
/// openraft asks for the entries just appended, so a few suffice.
pub const ANSWERS_KEPT: usize = 4;

/// Whether `vote` is the one node `me` leads under: its own, and won.
pub fn leads_under(vote: &Vote<NodeId>, me: NodeId) -> bool {
    vote.is_committed() && vote.leader_id().voted_for() == Some(me)
}

/// When this node appends as leader (under its own committed vote), that
/// vote and the entry its new entries follow (its last one); `None` for a
/// follower's or a candidate's append.
pub fn leader_append(
    vote: Option<Vote<NodeId>>,
    me: NodeId,
    last: Option<LogId<NodeId>>,
) -> Option<(Vote<NodeId>, Option<LogId<NodeId>>)> {
    vote.filter(|v| leads_under(v, me)).map(|v| (v, last))
}

/// The vote a node that led under `stored` in its last run starts with
/// instead: its own uncommitted vote for the next term. `None` when it did
/// not lead (see [`super::restart`] for why).
pub fn vote_after_restart(stored: Option<Vote<NodeId>>, me: NodeId) -> Option<Vote<NodeId>> {
    let led = stored.filter(|v| leads_under(v, me))?;
    // Checked: the term is read from disk; at its end there is no next one.
    let next = led.leader_id().get_term().checked_add(1)?;
    Some(Vote::new(next, me))
}

/// The members an early copy goes to: every one but this node.
pub fn copy_targets<'a, A: Clone + 'a>(
    members: impl IntoIterator<Item = (&'a NodeId, A)>,
    me: NodeId,
) -> Vec<(NodeId, A)> {
    members
        .into_iter()
        .filter(|(id, _)| **id != me)
        .map(|(id, a)| (*id, a))
        .collect()
}

/// How far an answer must reach to stand in for openraft's AppendEntries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Need {
    pub vote: Vote<NodeId>,
    /// The index the copy must have reached.
    pub reach: Option<u64>,
    /// The commit index the copy must have told the follower, at least.
    pub commit: Option<LogId<NodeId>>,
}

impl Need {
    /// For openraft's AppendEntries with entries: a copy that reached its
    /// last entry and told its commit index. `None` for a heartbeat.
    pub fn entries(req: &AppendEntriesRequest<TypeConfig>) -> Option<Need> {
        let last = req.entries.last()?.log_id;
        Some(Need {
            vote: req.vote,
            reach: Some(last.index),
            commit: req.leader_commit,
        })
    }

    /// For a heartbeat (no entries): a copy that reached its previous entry;
    /// the commit index it tells is owed to the next message (see
    /// [`super::stream::Stream`]). `None` for an append with entries.
    pub fn heartbeat(req: &AppendEntriesRequest<TypeConfig>) -> Option<Need> {
        if !req.entries.is_empty() {
            return None;
        }
        Some(Need {
            vote: req.vote,
            reach: req.prev_log_id.map(|p| p.index),
            commit: None,
        })
    }
}

/// One early copy sent to a follower; `A` is the adapter's handle on the
/// follower's answer.
#[derive(Debug, Clone)]
pub struct Sent<A> {
    /// openraft times a follower's acknowledgement from when it sends the
    /// AppendEntries (the quorum-ack age that readiness reads); an answer
    /// reused within `wait` of this is never timed more than that late.
    pub at: Instant,
    pub vote: Vote<NodeId>,
    pub last: LogId<NodeId>,
    pub leader_commit: Option<LogId<NodeId>>,
    pub answer: A,
}

impl<A> Sent<A> {
    /// The record of `req` sent at `at`; `None` for a heartbeat, which is
    /// never copied.
    pub fn of(req: &AppendEntriesRequest<TypeConfig>, at: Instant, answer: A) -> Option<Self> {
        let last = req.entries.last()?.log_id;
        Some(Self {
            at,
            vote: req.vote,
            last,
            leader_commit: req.leader_commit,
            answer,
        })
    }

    /// Whether this copy, if the follower stored it, answers `need` at
    /// `now`: sent within `wait`, under the same vote, reaching as far, and
    /// telling at least the commit index asked for.
    pub fn vouches(&self, need: &Need, now: Instant, wait: std::time::Duration) -> bool {
        now.saturating_duration_since(self.at) <= wait
            && self.vote == need.vote
            && Some(self.last.index) >= need.reach
            && self.leader_commit >= need.commit
    }
}

/// The copies kept for one follower, newest last.
#[derive(Debug)]
pub struct Kept<A>(VecDeque<Sent<A>>);

impl<A> Default for Kept<A> {
    fn default() -> Self {
        Self(VecDeque::new())
    }
}

impl<A> Kept<A> {
    /// Records a copy. Copies under an older vote can never match again and
    /// go; past [`ANSWERS_KEPT`] the oldest goes.
    pub fn record(&mut self, sent: Sent<A>) {
        self.0.retain(|s| s.vote == sent.vote);
        if self.0.len() == ANSWERS_KEPT {
            self.0.pop_front();
        }
        self.0.push_back(sent);
    }

    /// The newest copy that vouches for `need` at `now` (if stored).
    pub fn find(&self, need: &Need, now: Instant, wait: std::time::Duration) -> Option<&A> {
        self.0
            .iter()
            .rev()
            .find(|s| s.vouches(need, now, wait))
            .map(|s| &s.answer)
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use openraft::{CommittedLeaderId, EntryPayload};

    use super::*;
    use crate::types::Entry;

    fn id(index: u64) -> LogId<NodeId> {
        LogId::new(CommittedLeaderId::new(2, 1), index)
    }

    fn won(term: u64, leader: NodeId) -> Vote<NodeId> {
        let mut v = Vote::new(term, leader);
        v.commit();
        v
    }

    fn request(index: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: won(2, 1),
            prev_log_id: Some(id(index - 1)),
            entries: vec![Entry {
                log_id: id(index),
                payload: EntryPayload::Blank,
            }],
            leader_commit: Some(id(index - 2)),
        }
    }

    fn heartbeat(prev: u64, commit: u64) -> AppendEntriesRequest<TypeConfig> {
        AppendEntriesRequest {
            vote: won(2, 1),
            prev_log_id: Some(id(prev)),
            entries: Vec::new(),
            leader_commit: Some(id(commit)),
        }
    }

    #[test]
    fn only_a_leaders_own_appends_are_copied_early() {
        let last = Some(id(41));
        let leading = won(2, 1);
        assert_eq!(
            leader_append(Some(leading), 1, last),
            Some((leading, last)),
            "the leader's append follows its last entry"
        );
        assert_eq!(leader_append(Some(leading), 1, None), Some((leading, None)));
        // A follower appends what node 1 sent it.
        assert_eq!(leader_append(Some(leading), 2, last), None);
        // A candidate's vote for itself is not a leader's.
        assert_eq!(leader_append(Some(Vote::new(4, 1)), 1, last), None);
        assert_eq!(leader_append(None, 1, last), None);
    }

    #[test]
    fn only_a_restored_leadership_is_given_up_for_the_next_term() {
        assert_eq!(
            vote_after_restart(Some(won(3, 1)), 1),
            Some(Vote::new(4, 1))
        );
        assert_eq!(vote_after_restart(Some(won(3, 2)), 1), None, "followed 2");
        assert_eq!(
            vote_after_restart(Some(Vote::new(3, 1)), 1),
            None,
            "a candidate's vote was never a leader's"
        );
        assert_eq!(vote_after_restart(None, 1), None);
    }

    #[test]
    fn copies_go_to_every_other_member() {
        let members = [(1, "a"), (2, "b"), (3, "c")];
        let targets = copy_targets(members.iter().map(|(id, a)| (id, *a)), 1);
        assert_eq!(targets, vec![(2, "b"), (3, "c")]);
        assert!(copy_targets([(&1, "a")], 1).is_empty(), "a single node");
    }

    #[test]
    fn a_copy_vouches_only_under_the_same_vote_reaching_as_far_within_the_wait() {
        let t0 = Instant::now();
        let wait = Duration::from_millis(50);
        let sent = Sent::of(&request(7), t0, ()).unwrap();
        let need = |r: &AppendEntriesRequest<TypeConfig>| Need::entries(r).unwrap();
        assert!(sent.vouches(&need(&request(7)), t0, wait));
        assert!(sent.vouches(&need(&request(6)), t0, wait), "reached past");
        assert!(!sent.vouches(&need(&request(8)), t0, wait), "not copied");
        let mut other = request(7);
        other.vote = won(3, 1);
        assert!(!sent.vouches(&need(&other), t0, wait), "another vote");
        let mut newer_commit = request(7);
        newer_commit.leader_commit = Some(id(7));
        assert!(
            !sent.vouches(&need(&newer_commit), t0, wait),
            "the follower must still learn the newer commit index"
        );
        assert!(
            !sent.vouches(&need(&request(7)), t0 + Duration::from_millis(60), wait),
            "sent longer ago than the wait"
        );
        assert!(Need::entries(&heartbeat(7, 7)).is_none());
        assert!(Sent::of(&heartbeat(7, 7), t0, ()).is_none(), "never copied");
    }

    #[test]
    fn a_heartbeat_needs_a_copy_reaching_its_previous_entry_whatever_its_commit() {
        let t0 = Instant::now();
        let wait = Duration::from_secs(1);
        let sent = Sent::of(&request(7), t0, ()).unwrap();
        let hb = |prev, commit| Need::heartbeat(&heartbeat(prev, commit)).unwrap();
        assert!(sent.vouches(&hb(7, 7), t0, wait));
        assert!(!sent.vouches(&hb(8, 7), t0, wait), "past the copy");
        assert!(Need::heartbeat(&request(7)).is_none());
    }

    #[test]
    fn a_few_copies_under_the_newest_vote_are_kept_and_the_newest_matching_found() {
        let t0 = Instant::now();
        let wait = Duration::from_secs(1);
        let mut kept = Kept::default();
        let mut old = request(3);
        old.vote = won(1, 1);
        kept.record(Sent::of(&old, t0, 0).unwrap());
        for i in 4..=9 {
            kept.record(Sent::of(&request(i), t0, i).unwrap());
        }
        assert_eq!(kept.len(), ANSWERS_KEPT, "the old vote's copy went first");
        let need = Need::entries(&request(5)).unwrap();
        assert_eq!(kept.find(&need, t0, wait), Some(&9), "the newest");
        let mut under_old = request(3);
        under_old.vote = won(1, 1);
        assert_eq!(
            kept.find(&Need::entries(&under_old).unwrap(), t0, wait),
            None
        );
    }
}
