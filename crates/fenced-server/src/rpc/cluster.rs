//! The Cluster service: status, membership changes, snapshots and the
//! maintenance calls.

use std::{
    collections::{BTreeMap, BTreeSet},
    time::Duration,
};

use fenced_proto::v1::{self, cluster_server};
use openraft::{ChangeMembers, ServerState};
use tonic::{Request, Response, Status};

use crate::{
    deadline::deadline_of,
    peer::membership,
    proposer::leader_of,
    security::auth::Permission,
    state_machine::{self},
    types::{Node, NodeId},
};

use super::{context::NodeContext, forward::not_leader};

/// How Status and the status page name a node's Raft state.
pub fn role_name(state: ServerState) -> &'static str {
    match state {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

/// A membership change refused by openraft. Leadership lost before the
/// change was committed here is UNAVAILABLE with the new leader, as for a
/// node that is not the leader: the caller retries there.
fn write_status(
    e: openraft::error::RaftError<NodeId, openraft::error::ClientWriteError<NodeId, Node>>,
) -> Status {
    use openraft::error::{ClientWriteError, RaftError};
    if let RaftError::APIError(ClientWriteError::ForwardToLeader(f)) = &e {
        let leader = f.leader_id.zip(f.leader_node.clone());
        return not_leader(leader.as_ref());
    }
    Status::failed_precondition(e.to_string())
}

pub struct ClusterService {
    ctx: NodeContext,
    /// Served on the peer port, where forwarded identities are trusted.
    peer: bool,
    /// This node's status page, told in Status so that the other nodes'
    /// pages link to it; empty when it serves none.
    status_page_url: String,
}

impl ClusterService {
    pub fn new(ctx: NodeContext, peer: bool) -> Self {
        Self {
            ctx,
            peer,
            status_page_url: String::new(),
        }
    }

    /// Tells callers of Status where this node's status page is.
    pub fn with_status_page(mut self, url: Option<String>) -> Self {
        self.status_page_url = url.unwrap_or_default();
        self
    }

    /// Membership changes and the state digest are for admins only.
    fn admin<T>(&self, req: &Request<T>, operation: &str) -> Result<Option<String>, Status> {
        self.ctx
            .policy
            .auth
            .authorize(req, self.peer, Permission::Admin, operation, None)
    }

    fn members(&self) -> Vec<v1::Member> {
        let m = self.ctx.replica.raft.metrics().borrow().clone();
        let membership = m.membership_config.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        membership
            .nodes()
            .map(|(id, node)| v1::Member {
                id: *id,
                peer_addr: node.peer_addr.clone(),
                client_addr: node.client_addr.clone(),
                voter: voters.contains(id),
            })
            .collect()
    }

    fn membership_response(&self, log_index: u64) -> v1::MembershipResponse {
        v1::MembershipResponse {
            members: self.members(),
            log_index,
        }
    }

    async fn answer_status(
        &self,
        req: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        // Only on request: hashing the whole table would stall this node's
        // runtime thread for tens of milliseconds with 100,000 leases. The
        // applied index is the one of the table digested, so replicas that
        // report the same index can be compared even while entries apply.
        // Without the digest, Status is open like the health service
        // (docs/DECISIONS.md, "Status without the digest needs no grant").
        if req.get_ref().with_digest {
            self.admin(&req, "Status with digest")?;
        }
        let (last_applied, state_digest) = if req.get_ref().with_digest {
            let (applied, snapshot) = self.ctx.replica.shared.table_snapshot();
            let digest = tokio::task::spawn_blocking(move || state_machine::digest(&snapshot))
                .await
                .map_err(|e| Status::internal(format!("state digest: {e}")))?;
            (applied, digest)
        } else {
            (self.ctx.replica.shared.last_applied(), 0)
        };
        let m = self.ctx.replica.raft.metrics().borrow().clone();
        let leader = leader_of(&self.ctx.replica.raft);
        let role = role_name(m.state);
        let c = &self.ctx.counters;
        use std::sync::atomic::Ordering::Relaxed;
        Ok(Response::new(v1::StatusResponse {
            node_id: self.ctx.replica.id,
            leader_id: leader.as_ref().map_or(0, |l| l.0),
            leader_addr: leader.map(|l| l.1.client_addr).unwrap_or_default(),
            term: m.current_term,
            members: self.members(),
            last_applied: last_applied.map_or(0, |l| l.index),
            last_log_index: m.last_log_index.unwrap_or(0),
            role: role.to_string(),
            live_leases: self.ctx.replica.shared.live_leases() as u64,
            last_token: self
                .ctx
                .replica
                .shared
                .last_token()
                .map_or(0, fenced_core::Token::get),
            log_syncs: self.ctx.replica.log.sync_count(),
            applied_entries: c.entries.load(Relaxed),
            applied_commands: c.commands.load(Relaxed),
            snapshot_index: m.snapshot.map_or(0, |l| l.index),
            purged_index: m.purged.map_or(0, |l| l.index),
            state_digest,
            membership_index: m.membership_config.log_id().map_or(0, |l| l.index),
            last_applied_term: last_applied.map_or(0, |l| l.leader_id.term),
            repairing: self.ctx.repair.repairing(),
            status_page_url: self.status_page_url.clone(),
        }))
    }

    /// Membership calls are checked against the leader's membership only.
    /// A node that knows no leader (just restarted, or cut off) may hold an
    /// old one: its "not a member" or "already a learner" would be false,
    /// and a caller that retries a removal reads "not a member" as done.
    /// This node leads, confirmed by a quorum, and has applied everything
    /// committed before the call: a membership decision then reads the
    /// cluster's membership, not the stale view of a leader that was cut
    /// off and has not noticed yet.
    async fn confirmed_leader(&self) -> Result<(), Status> {
        if self.ctx.replica.raft.metrics().borrow().state != ServerState::Leader {
            return Err(not_leader(leader_of(&self.ctx.replica.raft).as_ref()));
        }
        self.ctx.confirm_leadership("membership change").await
    }

    async fn answer_add_learner(
        &self,
        req: Request<v1::AddLearnerRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        let node_id = req.get_ref().node_id;
        // Only an admin adds a node, a joining node's own certificate
        // included (docs/DECISIONS.md, "Only an admin adds a node").
        let identity = self.admin(&req, "AddLearner").inspect_err(|_| {
            if let Some(named) = req.peer_certs().and_then(|certs| {
                certs
                    .first()
                    .and_then(|c| crate::security::tls::node_id_of(c))
            }) {
                tracing::info!(
                    certificate_node = named,
                    node = node_id,
                    "join refused: a node certificate does not add nodes; an admin must"
                );
            }
        })?;
        let node = Node {
            peer_addr: req.get_ref().peer_addr.clone(),
            client_addr: req.get_ref().client_addr.clone(),
        };
        // The addresses are checked here too, so bad input is refused
        // before anything is forwarded.
        membership::check_add(&BTreeMap::new(), node_id, &node)?;
        if let Some(answer) = self
            .ctx
            .to_leader(&req, deadline_of(&req), identity.as_deref())
            .await
        {
            return answer;
        }
        self.confirmed_leader().await?;
        // Against everything committed before the call, applied here (see
        // confirmed_leader); the window left is in docs/DECISIONS.md.
        membership::check_not_retired(&self.ctx.replica.shared.retired_ids(), node_id)?;
        let members = membership::members_of(&self.ctx.replica.raft);
        if membership::check_add(&members, node_id, &node)? == membership::AddPlan::AlreadyLearner {
            // A joining node stops asking at this answer: it must mean a
            // committed addition, not one only in this leader's log.
            if !membership::is_member(&self.ctx.replica.raft, node_id) {
                return Err(Status::unavailable(format!(
                    "node_id: the addition of learner {node_id} is not committed yet; retry"
                )));
            }
            return Ok(Response::new(
                self.membership_response(self.membership_index()),
            ));
        }
        tracing::info!(
            node = node_id,
            peer = %node.peer_addr,
            client = %node.client_addr,
            by = identity.as_deref().unwrap_or("anyone (auth off)"),
            "adding a learner"
        );
        // Not blocking: the node may not run yet (an operator adds it before
        // starting it), and it catches up on its own once it does.
        let resp = self
            .ctx
            .replica
            .raft
            .add_learner(node_id, node, false)
            .await
            .map_err(write_status)?;
        Ok(Response::new(self.membership_response(resp.log_id.index)))
    }

    async fn answer_change_membership(
        &self,
        req: Request<v1::ChangeMembershipRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        let identity = self.admin(&req, "ChangeMembership")?;
        if req.get_ref().voter_ids.is_empty() {
            return Err(Status::invalid_argument(
                "voter_ids: must name at least one node",
            ));
        }
        if let Some(answer) = self
            .ctx
            .to_leader(&req, deadline_of(&req), identity.as_deref())
            .await
        {
            return answer;
        }
        let voters: BTreeSet<NodeId> = req.into_inner().voter_ids.into_iter().collect();
        self.confirmed_leader().await?;
        let retired = self.ctx.replica.shared.retired_ids();
        for id in &voters {
            membership::check_not_retired(&retired, *id)?;
        }
        let leaving = membership::members_of(&self.ctx.replica.raft)
            .into_iter()
            .filter(|(id, m)| m.voter && !voters.contains(id) && !retired.contains(*id))
            .count();
        membership::check_retire_room(&retired, leaving)?;
        let resp = self
            .ctx
            .replica
            .raft
            .change_membership(voters, false)
            .await
            .map_err(write_status)?;
        Ok(Response::new(self.membership_response(resp.log_id.index)))
    }

    async fn answer_remove_node(
        &self,
        req: Request<v1::RemoveNodeRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        let identity = self.admin(&req, "RemoveNode")?;
        let id = req.get_ref().node_id;
        if let Some(answer) = self
            .ctx
            .to_leader(&req, deadline_of(&req), identity.as_deref())
            .await
        {
            return answer;
        }
        self.confirmed_leader().await?;
        let members = membership::members_of(&self.ctx.replica.raft);
        let voter = members.get(&id).is_some_and(|m| m.voter);
        let in_contact = if voter {
            self.voters_in_contact().await
        } else {
            BTreeSet::new()
        };
        membership::check_remove(&members, id, &in_contact)?;
        let retired = self.ctx.replica.shared.retired_ids();
        membership::check_retire_room(&retired, usize::from(!retired.contains(id)))?;
        tracing::info!(
            node = id,
            voter,
            by = identity.as_deref().unwrap_or("anyone (auth off)"),
            "removing a member"
        );
        // A voter leaves the voters and the membership in one change (joint
        // consensus, then the new set). A leader that removes itself keeps
        // leading until the change commits, then steps down, and the voters
        // left elect one of themselves.
        let change = if voter {
            ChangeMembers::RemoveVoters([id].into())
        } else {
            ChangeMembers::RemoveNodes([id].into())
        };
        let mut resp = self
            .ctx
            .replica
            .raft
            .change_membership(change, false)
            .await
            .map_err(write_status)?;
        if voter && membership::members_of(&self.ctx.replica.raft).contains_key(&id) {
            // openraft keeps a removed voter as a learner: take it out.
            resp = self
                .ctx
                .replica
                .raft
                .change_membership(ChangeMembers::RemoveNodes([id].into()), false)
                .await
                .map_err(write_status)?;
        }
        Ok(Response::new(self.membership_response(resp.log_id.index)))
    }

    async fn answer_promote_learner(
        &self,
        req: Request<v1::PromoteLearnerRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        let identity = self.admin(&req, "PromoteLearner")?;
        let id = req.get_ref().node_id;
        if let Some(answer) = self
            .ctx
            .to_leader(&req, deadline_of(&req), identity.as_deref())
            .await
        {
            return answer;
        }
        self.confirmed_leader().await?;
        membership::check_not_retired(&self.ctx.replica.shared.retired_ids(), id)?;
        let members = membership::members_of(&self.ctx.replica.raft);
        let (matched, last) = self.progress_of(id);
        if membership::check_promote(&members, id, matched, last)?
            == membership::PromotePlan::AlreadyVoter
        {
            return Ok(Response::new(
                self.membership_response(self.membership_index()),
            ));
        }
        tracing::info!(
            node = id,
            matched,
            last_log_index = last,
            by = identity.as_deref().unwrap_or("anyone (auth off)"),
            "promoting a learner to voter"
        );
        let resp = self
            .ctx
            .replica
            .raft
            .change_membership(ChangeMembers::AddVoterIds([id].into()), false)
            .await
            .map_err(write_status)?;
        Ok(Response::new(self.membership_response(resp.log_id.index)))
    }

    async fn answer_list_members(
        &self,
        req: Request<v1::ListMembersRequest>,
    ) -> Result<Response<v1::ListMembersResponse>, Status> {
        let identity = self.admin(&req, "ListMembers")?;
        if let Some(answer) = self
            .ctx
            .to_leader(&req, deadline_of(&req), identity.as_deref())
            .await
        {
            return answer;
        }
        let m = self.ctx.replica.raft.metrics().borrow().clone();
        if m.state != ServerState::Leader {
            return Err(not_leader(leader_of(&self.ctx.replica.raft).as_ref()));
        }
        let last = m.last_log_index.unwrap_or(0);
        let members = self
            .members()
            .into_iter()
            .map(|member| {
                let (matched, _) = self.progress_of(member.id);
                v1::MemberProgress {
                    leader: member.id == self.ctx.replica.id,
                    matched: matched.is_some(),
                    match_index: matched.unwrap_or(0),
                    lag: last.saturating_sub(matched.unwrap_or(0)),
                    member: Some(member),
                }
            })
            .collect();
        Ok(Response::new(v1::ListMembersResponse {
            leader_id: self.ctx.replica.id,
            term: m.current_term,
            last_log_index: last,
            members,
            promote_max_lag: membership::PROMOTE_MAX_LAG,
            retired_ids: self
                .ctx
                .replica
                .shared
                .retired_ids()
                .ids()
                .iter()
                .copied()
                .collect(),
        }))
    }
}

impl ClusterService {
    /// The index of the membership in force.
    fn membership_index(&self) -> u64 {
        self.ctx
            .replica
            .raft
            .metrics()
            .borrow()
            .membership_config
            .log_id()
            .map_or(0, |l| l.index)
    }

    /// The last index the leader knows matches on node `id` (its own last
    /// index for itself), and the leader's last log index.
    fn progress_of(&self, id: NodeId) -> (Option<u64>, u64) {
        let m = self.ctx.replica.raft.metrics();
        let m = m.borrow();
        let last = m.last_log_index.unwrap_or(0);
        if id == self.ctx.replica.id {
            return (Some(last), last);
        }
        let matched = m
            .replication
            .as_ref()
            .and_then(|r| r.get(&id).copied().flatten())
            .map(|l| l.index);
        (matched, last)
    }

    /// The voters that answered the leader just now: a fresh entry (a tick)
    /// is appended and each voter that has it within a second counts, the
    /// leader always.
    async fn voters_in_contact(&self) -> BTreeSet<NodeId> {
        let before = self
            .ctx
            .replica
            .raft
            .metrics()
            .borrow()
            .last_log_index
            .unwrap_or(0);
        self.ctx.replica.proposer.tick();
        let target = self
            .ctx
            .replica
            .raft
            .wait(Some(Duration::from_millis(500)))
            .metrics(
                |m| m.last_log_index.unwrap_or(0) > before,
                "a fresh entry to probe the voters",
            )
            .await
            .map_or(before, |m| m.last_log_index.unwrap_or(before));
        let voters: BTreeSet<NodeId> = membership::members_of(&self.ctx.replica.raft)
            .into_iter()
            .filter(|(_, m)| m.voter)
            .map(|(id, _)| id)
            .collect();
        let reached = |m: &openraft::RaftMetrics<NodeId, Node>| -> BTreeSet<NodeId> {
            let r = m.replication.clone().unwrap_or_default();
            voters
                .iter()
                .copied()
                .filter(|v| {
                    *v == self.ctx.replica.id
                        || r.get(v)
                            .copied()
                            .flatten()
                            .is_some_and(|l| l.index >= target)
                })
                .collect()
        };
        let _ = self
            .ctx
            .replica
            .raft
            .wait(Some(Duration::from_secs(1)))
            .metrics(
                |m| reached(m).len() == voters.len(),
                "every voter has the probe",
            )
            .await;
        reached(&self.ctx.replica.raft.metrics().borrow())
    }
}

#[tonic::async_trait]
impl cluster_server::Cluster for ClusterService {
    async fn status(
        &self,
        req: Request<v1::StatusRequest>,
    ) -> Result<Response<v1::StatusResponse>, Status> {
        self.ctx.hinted(self.answer_status(req).await)
    }

    async fn add_learner(
        &self,
        req: Request<v1::AddLearnerRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        self.ctx.hinted(self.answer_add_learner(req).await)
    }

    async fn change_membership(
        &self,
        req: Request<v1::ChangeMembershipRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        self.ctx.hinted(self.answer_change_membership(req).await)
    }

    async fn remove_node(
        &self,
        req: Request<v1::RemoveNodeRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        self.ctx.hinted(self.answer_remove_node(req).await)
    }

    async fn promote_learner(
        &self,
        req: Request<v1::PromoteLearnerRequest>,
    ) -> Result<Response<v1::MembershipResponse>, Status> {
        self.ctx.hinted(self.answer_promote_learner(req).await)
    }

    async fn list_members(
        &self,
        req: Request<v1::ListMembersRequest>,
    ) -> Result<Response<v1::ListMembersResponse>, Status> {
        self.ctx.hinted(self.answer_list_members(req).await)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    #[test]
    fn a_change_refused_for_lost_leadership_is_unavailable_and_names_the_leader() {
        use openraft::error::{ClientWriteError, ForwardToLeader, RaftError};
        let lost = |leader_id, leader_node| {
            write_status(RaftError::APIError(ClientWriteError::ForwardToLeader(
                ForwardToLeader {
                    leader_id,
                    leader_node,
                },
            )))
        };
        let node = Node {
            peer_addr: "10.0.0.3:7201".into(),
            client_addr: "10.0.0.3:7101".into(),
        };
        let s = lost(Some(3), Some(node));
        assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
        assert!(s.message().contains("the leader is node 3"), "{s:?}");
        let s = lost(None, None);
        assert_eq!(s.code(), tonic::Code::Unavailable, "{s:?}");
        assert!(s.message().contains("no leader"), "{s:?}");
    }
}
