//! Sans-IO: what one of openraft's AppendEntries does on a leader's
//! connection to a follower (answered from an early copy, or sent, with
//! which time flag), and what a follower does with a leader's message once
//! openraft answered it. [`super::transport`] and [`super::follower`]
//! execute these actions.

use openraft::raft::{AppendEntriesResponse, InstallSnapshotResponse};

use crate::{clock::floor::LeaderTime, types::NodeId};

/// What to do with one of openraft's AppendEntries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    /// Look for a stored early copy that reached its last entry and told its
    /// commit index ([`super::copies::Need::entries`]); send it if none.
    CoverEntries,
    /// Look for a stored early copy that reached the heartbeat's previous
    /// entry ([`super::copies::Need::heartbeat`]); send it if none.
    CoverHeartbeat,
    /// Send it to the follower. `durable_time`: the follower makes the
    /// carried cluster time durable before it answers (a leadership check,
    /// whose time a read reveals).
    Send { durable_time: bool },
}

/// One connection of openraft's to one follower: a replication stream's
/// (it carried entries) or a single-use client for a leadership check.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Stream {
    /// This connection has carried entries: it is a replication stream's,
    /// not one of the single-use clients openraft makes for a leadership
    /// check, which must reach the follower.
    replicates: bool,
    /// The last AppendEntries was a heartbeat answered from an early copy,
    /// so the follower may not know its commit index yet: the next one goes
    /// out.
    owes_commit: bool,
}

impl Stream {
    /// What to do with an AppendEntries with `has_entries`, when early
    /// copies exist (`early`).
    pub fn plan(&mut self, has_entries: bool, early: bool) -> Plan {
        if early {
            if has_entries {
                self.replicates = true;
                return Plan::CoverEntries;
            }
            if self.replicates && !self.owes_commit {
                return Plan::CoverHeartbeat;
            }
        }
        Plan::Send {
            durable_time: self.durable_time(has_entries),
        }
    }

    /// The plan's copy was found stored: the call is answered `Success`
    /// without the follower.
    pub fn covered(&mut self, plan: Plan) {
        match plan {
            // The copy told the follower this commit index or later.
            Plan::CoverEntries => self.owes_commit = false,
            // The commit index rides on the next copy or AppendEntries, at
            // the latest the next periodic heartbeat.
            Plan::CoverHeartbeat => self.owes_commit = true,
            Plan::Send { .. } => {}
        }
    }

    /// The time flag of a call sent to the follower (as planned, or when no
    /// stored copy vouched for it). A heartbeat on a connection that never
    /// carried entries is one of openraft's leadership checks: a read's time
    /// is revealed after it, so the follower makes it durable first.
    pub fn durable_time(&self, has_entries: bool) -> bool {
        !self.replicates && !has_entries
    }

    /// The follower answered a call sent to it. Only a follower that
    /// accepted the call took its commit index.
    pub fn answered(&mut self, answer: Option<&AppendEntriesResponse<NodeId>>) {
        if matches!(
            answer,
            Some(AppendEntriesResponse::Success | AppendEntriesResponse::PartialSuccess(_))
        ) {
            self.owes_commit = false;
        }
    }

    pub fn owes_commit(&self) -> bool {
        self.owes_commit
    }
}

/// What a follower does after openraft answered a leader's message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Heard {
    /// Refused for a lower vote, or failed: not from a leader it follows.
    Nothing,
    /// From a leader it follows: restart the pre-vote's lease and take the
    /// carried time; make it durable first when `durable`.
    Leader { at: LeaderTime, durable: bool },
}

/// After an AppendEntries: anything but a refusal for a lower vote came from
/// a leader this node follows.
pub fn after_append<E>(
    answer: &Result<AppendEntriesResponse<NodeId>, E>,
    at: LeaderTime,
    durable: bool,
) -> Heard {
    match answer {
        Ok(r) if !matches!(r, AppendEntriesResponse::HigherVote(_)) => {
            Heard::Leader { at, durable }
        }
        _ => Heard::Nothing,
    }
}

/// After an InstallSnapshot chunk sent under `sent_vote`: accepted unless the
/// follower's vote is higher.
pub fn after_snapshot<E>(
    answer: &Result<InstallSnapshotResponse<NodeId>, E>,
    sent_vote: openraft::Vote<NodeId>,
    at: LeaderTime,
    durable: bool,
) -> Heard {
    match answer {
        Ok(r) if r.vote <= sent_vote => Heard::Leader { at, durable },
        _ => Heard::Nothing,
    }
}

/// After a vote request: Raft restarts a voter's election timer when it
/// grants (no time is taken from a candidate).
pub fn after_vote<E>(answer: &Result<openraft::raft::VoteResponse<NodeId>, E>) -> bool {
    matches!(answer, Ok(r) if r.vote_granted)
}

#[cfg(test)]
mod tests {
    use openraft::Vote;

    use super::*;

    #[test]
    fn entries_look_for_a_copy_and_settle_what_was_owed() {
        let mut s = Stream::default();
        assert_eq!(s.plan(true, true), Plan::CoverEntries);
        s.covered(Plan::CoverEntries);
        assert!(!s.owes_commit());
        // Without early copies everything is sent, never durable for entries.
        let mut plain = Stream::default();
        assert_eq!(
            plain.plan(true, false),
            Plan::Send {
                durable_time: false
            }
        );
        assert!(
            !s.durable_time(true),
            "entries not covered are sent as usual"
        );
    }

    #[test]
    fn a_fresh_connection_s_heartbeat_is_a_leadership_check_and_goes_durable() {
        let mut s = Stream::default();
        assert_eq!(s.plan(false, true), Plan::Send { durable_time: true });
        assert_eq!(s.plan(false, false), Plan::Send { durable_time: true });
    }

    #[test]
    fn one_heartbeat_stays_home_then_the_next_goes_until_the_commit_is_told() {
        let mut s = Stream::default();
        assert_eq!(s.plan(true, true), Plan::CoverEntries);
        s.covered(Plan::CoverEntries);
        assert_eq!(s.plan(false, true), Plan::CoverHeartbeat);
        s.covered(Plan::CoverHeartbeat);
        assert!(s.owes_commit());
        // Owed: the next heartbeat goes, on a replication stream not durable.
        assert_eq!(
            s.plan(false, true),
            Plan::Send {
                durable_time: false
            }
        );
        // A refusal does not settle it.
        s.answered(Some(&AppendEntriesResponse::Conflict));
        s.answered(None);
        assert!(s.owes_commit());
        s.answered(Some(&AppendEntriesResponse::Success));
        assert!(!s.owes_commit());
        assert_eq!(s.plan(false, true), Plan::CoverHeartbeat);
        // A copy carrying entries settles it too.
        s.covered(Plan::CoverHeartbeat);
        assert_eq!(s.plan(true, true), Plan::CoverEntries);
        s.covered(Plan::CoverEntries);
        assert!(!s.owes_commit());
        s.covered(Plan::CoverHeartbeat);
        s.answered(Some(&AppendEntriesResponse::PartialSuccess(None)));
        assert!(!s.owes_commit());
    }

    #[test]
    fn a_follower_hears_a_leader_in_anything_but_a_refusal_for_a_lower_vote() {
        let at = LeaderTime::new(2, fenced_core::ClusterTime::from_millis(7));
        let ok: Result<_, ()> = Ok(AppendEntriesResponse::<NodeId>::Success);
        assert_eq!(
            after_append(&ok, at, true),
            Heard::Leader { at, durable: true }
        );
        let conflict: Result<_, ()> = Ok(AppendEntriesResponse::<NodeId>::Conflict);
        assert_eq!(
            after_append(&conflict, at, false),
            Heard::Leader { at, durable: false },
            "a conflict still comes from the leader it follows"
        );
        let higher: Result<_, ()> = Ok(AppendEntriesResponse::HigherVote(Vote::new(9, 3)));
        assert_eq!(after_append(&higher, at, true), Heard::Nothing);
        let failed: Result<AppendEntriesResponse<NodeId>, ()> = Err(());
        assert_eq!(after_append(&failed, at, true), Heard::Nothing);
    }

    #[test]
    fn a_snapshot_chunk_is_from_a_leader_unless_the_follower_s_vote_is_higher() {
        let at = LeaderTime::new(2, fenced_core::ClusterTime::from_millis(7));
        let sent = Vote::new(3, 1);
        let answer = |vote| -> Result<_, ()> { Ok(InstallSnapshotResponse { vote }) };
        assert_eq!(
            after_snapshot(&answer(sent), sent, at, false),
            Heard::Leader { at, durable: false }
        );
        assert_eq!(
            after_snapshot(&answer(Vote::new(4, 2)), sent, at, false),
            Heard::Nothing
        );
    }

    #[test]
    fn only_a_granted_vote_restarts_the_lease() {
        let vote = Vote::new(3, 1);
        let answer = |vote_granted| -> Result<_, ()> {
            Ok(openraft::raft::VoteResponse {
                vote,
                vote_granted,
                last_log_id: None,
            })
        };
        assert!(after_vote(&answer(true)));
        assert!(!after_vote(&answer(false)));
    }
}
