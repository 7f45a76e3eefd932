//! A stopping leader hands its leadership to a caught-up follower, so the
//! cluster has a new leader within a round trip or two instead of an
//! election timeout plus a leader lease.
//!
//! openraft 0.9 has no leadership transfer. What it has is enough: the
//! leader stops proposing (the log stops growing), waits until a voter has
//! every entry it has, and sends it `TimeoutNow` (peer call 5). The
//! follower, if the sender is the leader it follows in the same term,
//! stands at once (`trigger().elect()`, without a pre-vote). Its vote
//! request reaches the old leader, whose log it matches; a leader's own
//! leader lease is dated from its election, so one that has led longer than
//! a lease grants it, and the two make a majority of three. The third voter
//! follows the new leader's first append. If anything fails (no voter
//! catches up in time, an older peer that does not know the call, a
//! refused vote), the node just stops after the bound and the cluster
//! elects as it would after a crash.

use std::{sync::Arc, time::Duration};

use openraft::ServerState;
use serde::{Deserialize, Serialize};

use crate::{
    codec,
    peer::network::{Peer, RaftCall},
    security::tls::NodeTls,
    types::{NodeId, Raft},
};

/// The leader's request: stand now.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TimeoutNow {
    pub leader: NodeId,
    pub term: u64,
}

/// Whether the follower started an election.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TimeoutNowAnswer {
    pub standing: bool,
}

/// Whether a node should stand when asked: only when the request comes
/// from the leader it follows, in its current term (and, over mutual TLS,
/// from that leader's own certificate), and it is a voter.
pub fn should_stand(
    req: &TimeoutNow,
    sender: Option<NodeId>,
    leader: Option<NodeId>,
    term: u64,
    state: ServerState,
    voter: bool,
) -> bool {
    sender.is_none_or(|s| s == req.leader)
        && leader == Some(req.leader)
        && term == req.term
        && state == ServerState::Follower
        && voter
}

/// The follower side of `TimeoutNow`.
pub async fn answer(raft: &Raft, sender: Option<NodeId>, req: &TimeoutNow) -> TimeoutNowAnswer {
    let stand = {
        let m = raft.metrics();
        let m = m.borrow();
        let voter = m
            .membership_config
            .membership()
            .voter_ids()
            .any(|v| v == m.id);
        should_stand(
            req,
            sender,
            m.current_leader,
            m.current_term,
            m.state,
            voter,
        )
    };
    if !stand {
        tracing::info!(
            leader = req.leader,
            term = req.term,
            "asked to stand for election by a node that is not my leader; refused"
        );
        return TimeoutNowAnswer { standing: false };
    }
    tracing::info!(
        leader = req.leader,
        term = req.term,
        "the leader is stopping and hands over: standing now"
    );
    TimeoutNowAnswer {
        standing: raft.trigger().elect().await.is_ok(),
    }
}

/// Hands leadership over, waiting at most `within`; returns the new
/// leader, or `None` if this node does not lead or the handover did not
/// happen in time. The caller has stopped proposing.
pub async fn hand_over(raft: &Raft, tls: Option<Arc<NodeTls>>, within: Duration) -> Option<NodeId> {
    let deadline = tokio::time::Instant::now() + within;
    let (me, term) = {
        let m = raft.metrics().borrow().clone();
        if m.state != ServerState::Leader {
            return None;
        }
        (m.id, m.current_term)
    };
    // A voter that has every entry of this leader's log, once the last
    // one is replicated.
    let mut metrics = raft.metrics();
    let target = loop {
        let found = {
            let m = metrics.borrow_and_update();
            if m.state != ServerState::Leader {
                return m.current_leader.filter(|l| *l != me);
            }
            let membership = m.membership_config.membership();
            let last = m.last_log_index;
            m.replication.as_ref().and_then(|repl| {
                membership
                    .voter_ids()
                    .filter(|v| *v != me)
                    .find(|v| {
                        repl.get(v)
                            .and_then(|matched| matched.as_ref())
                            .map(|l| l.index)
                            == last
                    })
                    .and_then(|v| membership.get_node(&v).map(|n| (v, n.peer_addr.clone())))
            })
        };
        if let Some(t) = found {
            break t;
        }
        if tokio::time::timeout_at(deadline, metrics.changed())
            .await
            .map_or(true, |r| r.is_err())
        {
            tracing::warn!("no follower caught up in time: stopping without a handover");
            return None;
        }
    };
    let (target, addr) = target;
    let payload = codec::encode("timeout_now", &TimeoutNow { leader: me, term }).ok()?;
    let mut peer = Peer::new(target, addr).with_tls(tls);
    let asked = tokio::time::timeout_at(deadline, peer.exchange(RaftCall::TimeoutNow, &payload))
        .await
        .ok()
        .and_then(Result::ok)
        .and_then(|reply| codec::decode::<TimeoutNowAnswer>("timeout_now", &reply).ok());
    if asked != Some(TimeoutNowAnswer { standing: true }) {
        tracing::warn!(
            target,
            answer = ?asked,
            "the follower did not stand: stopping without a handover"
        );
        return None;
    }
    let elected = raft
        .wait(Some(
            deadline.saturating_duration_since(tokio::time::Instant::now()),
        ))
        .metrics(
            |m| m.current_leader.is_some_and(|l| l != me) && m.current_term > term,
            "a new leader",
        )
        .await
        .ok()
        .and_then(|m| m.current_leader);
    match elected {
        Some(leader) => tracing::info!(leader, term, "leadership handed over"),
        None => tracing::warn!(target, "no new leader in time: stopping anyway"),
    }
    elected
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_node_stands_only_for_the_leader_it_follows_in_its_term() {
        let req = TimeoutNow { leader: 1, term: 5 };
        let f = ServerState::Follower;
        assert!(should_stand(&req, None, Some(1), 5, f, true));
        assert!(should_stand(&req, Some(1), Some(1), 5, f, true));
        // Another member's certificate, another leader, another term, a
        // learner, a candidate: no.
        assert!(!should_stand(&req, Some(2), Some(1), 5, f, true));
        assert!(!should_stand(&req, None, Some(2), 5, f, true));
        assert!(!should_stand(&req, None, Some(1), 6, f, true));
        assert!(!should_stand(&req, None, Some(1), 5, f, false));
        assert!(!should_stand(
            &req,
            None,
            Some(1),
            5,
            ServerState::Candidate,
            true
        ));
    }
}
