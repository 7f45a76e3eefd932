//! Giving up a restored leadership, before Raft starts: the log store's
//! side of [`super::copies::vote_after_restart`].
//!
//! openraft 0.9 makes a restarted leader lead again under the same vote (its
//! stored committed vote, checked in `openraft_contract.rs`, item 5), and
//! assign log ids again from its last durable entry. With early copies a
//! follower may hold an entry of that leader which the leader itself lost in
//! the crash (sent before its own fdatasync ended); a new entry with the same
//! log id would then be taken by that follower as one it already has, and
//! the two logs would differ under equal ids. In a new term every log id is
//! new, and Raft replaces the follower's uncommitted leftover as usual.

use std::io;

use super::copies;
use crate::{storage::log_store::LogStore, types::NodeId};

/// When this node led under the vote in `log` in its last run, replaces that
/// vote with its own uncommitted vote for the next term, durably; returns
/// that term.
pub async fn give_up_restored_leadership(log: &LogStore, me: NodeId) -> io::Result<Option<u64>> {
    let new = log
        .replace_vote(|stored| copies::vote_after_restart(stored, me))
        .await?;
    Ok(new.map(|v| v.leader_id().get_term()))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::path::Path;

    use openraft::{storage::RaftLogStorage, Vote};

    use super::*;

    /// The vote of node `leader` once it won `term`.
    fn won(term: u64, leader: NodeId) -> Vote<NodeId> {
        let mut vote = Vote::new(term, leader);
        vote.commit();
        vote
    }

    /// A log in `dir` whose vote is `vote`.
    async fn log_with_vote(dir: &Path, vote: Vote<NodeId>) -> LogStore {
        let mut log = LogStore::open(dir).unwrap();
        log.save_vote(&vote).await.unwrap();
        log
    }

    #[tokio::test]
    async fn a_restarted_leader_keeps_no_vote_of_its_last_run() {
        let dir = tempfile::tempdir().unwrap();
        drop(log_with_vote(dir.path(), won(3, 1)).await);
        let mut log = LogStore::open(dir.path()).unwrap();
        assert_eq!(give_up_restored_leadership(&log, 1).await.unwrap(), Some(4));
        let own_next = Vote::new(4, 1);
        assert_eq!(log.read_vote().await.unwrap(), Some(own_next));
        drop(log);
        // Durable: the next start sees the new vote, and leaves it alone.
        let mut log = LogStore::open(dir.path()).unwrap();
        assert_eq!(log.read_vote().await.unwrap(), Some(own_next));
        assert_eq!(give_up_restored_leadership(&log, 1).await.unwrap(), None);
        assert_eq!(log.read_vote().await.unwrap(), Some(own_next));
    }

    #[tokio::test]
    async fn a_followers_vote_survives_a_restart_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let mut log = log_with_vote(dir.path(), won(3, 2)).await;
        assert_eq!(give_up_restored_leadership(&log, 1).await.unwrap(), None);
        assert_eq!(log.read_vote().await.unwrap(), Some(won(3, 2)));
        assert_eq!(give_up_restored_leadership(&log, 2).await.unwrap(), Some(4));
    }
}
