//! Membership changes as the nemesis makes them, through the Cluster
//! service's admin calls with the run's token: a new node starts with
//! `--join`, the run's admin adds it as a learner and promotes it, a voter (the leader too) is
//! removed, a dead node is replaced by a new id.

use std::{
    collections::BTreeMap,
    sync::{Arc, Mutex, PoisonError},
    time::{Duration, Instant},
};

use anyhow::{bail, Result};
use fenced_proto::v1::{self, cluster_client::ClusterClient};
use tonic::{Code, Status};

use crate::cluster::{channel, client_addr};

/// Node ids (and network slots, 10.77.0.<id>) the membership profile may
/// use: three to start with, the rest for nodes that join. An id is never
/// used twice. A change adds at most one node, and changes run beside the
/// faults every few seconds: 29 new ids last a 180 s run.
pub const MEMBER_SLOTS: u64 = 32;

/// Whether a refused call is worth repeating: the cluster was between
/// leaders, or a learner is still catching up, or a voter has not answered
/// the removal's probe yet (a partition just healed).
fn worth_retrying(s: &Status) -> bool {
    match s.code() {
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Unknown
        | Code::Cancelled
        | Code::Aborted => true,
        Code::FailedPrecondition => {
            let m = s.message();
            m.contains("lags the leader")
                || m.contains("has not answered the leader")
                || m.contains("in contact")
                // openraft refuses a change while another is in flight.
                || m.contains("already undergoing a configuration change")
                // Leadership moved while the change was under way (a
                // node of an earlier build answered it this way).
                || m.contains("has to forward request to")
        }
        _ => false,
    }
}

/// Calls `f` on the members in turn until one answers, retrying what is
/// worth retrying, for at most `within`; each refusal retried is added to
/// `retried`.
async fn call<T, F, Fut>(
    members: &[u64],
    within: Duration,
    what: &str,
    retried: &mut Vec<String>,
    f: F,
) -> Result<T>
where
    F: Fn(ClusterClient<tonic::transport::Channel>) -> Fut,
    Fut: std::future::Future<Output = Result<tonic::Response<T>, Status>>,
{
    let deadline = Instant::now() + within;
    let mut i = 0usize;
    let mut last = String::from("no member to ask");
    while Instant::now() < deadline && !members.is_empty() {
        let id = members[i % members.len()];
        i += 1;
        match f(ClusterClient::new(channel(&client_addr(id))?)).await {
            Ok(r) => return Ok(r.into_inner()),
            Err(s) if worth_retrying(&s) => {
                last = format!("n{id}: {:?} {}", s.code(), s.message());
                retried.push(last.clone());
            }
            Err(s) => bail!("{what} refused by n{id}: {:?} {}", s.code(), s.message()),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    bail!("{what}: no answer within {within:?}: {last}")
}

fn req<T>(msg: T) -> tonic::Request<T> {
    let mut r = tonic::Request::new(msg);
    r.set_timeout(Duration::from_secs(8));
    crate::auth::authorize(&mut r);
    r
}

/// The members with their roles, from the leader: (id, voter).
pub async fn members(via: &[u64]) -> Result<Vec<(u64, bool)>> {
    let l = call(
        via,
        Duration::from_secs(10),
        "ListMembers",
        &mut Vec::new(),
        |mut c| async move { c.list_members(req(v1::ListMembersRequest {})).await },
    )
    .await?;
    Ok(l.members
        .iter()
        .filter_map(|p| p.member.as_ref().map(|m| (m.id, m.voter)))
        .collect())
}

/// Waits until node `id` is a member (learner or voter); returns how long.
pub async fn wait_joined(via: &[u64], id: u64, within: Duration) -> Result<Duration> {
    let start = Instant::now();
    loop {
        if let Ok(m) = members(via).await {
            if m.iter().any(|(n, _)| *n == id) {
                return Ok(start.elapsed());
            }
        }
        if start.elapsed() > within {
            bail!("n{id} did not join within {within:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Adds node `id` (at its namespace's address) as a learner: a node
/// certificate adds no node, so the run's admin does, as an operator
/// would. A retry that finds it a learner already is a success.
pub async fn add_learner(
    via: &[u64],
    id: u64,
    within: Duration,
    retried: &mut Vec<String>,
) -> Result<()> {
    let peer_addr = format!(
        "{}:{}",
        crate::net::node_addr(id),
        crate::cluster::PEER_PORT
    );
    call(via, within, "AddLearner", retried, |mut c| {
        let peer_addr = peer_addr.clone();
        async move {
            c.add_learner(req(v1::AddLearnerRequest {
                node_id: id,
                peer_addr,
                client_addr: client_addr(id),
            }))
            .await
        }
    })
    .await
    .map(|_| ())
}

/// Promotes learner `id`, retrying while it catches up. A retry after a
/// promotion whose answer was lost finds it a voter: that is a success.
pub async fn promote(
    via: &[u64],
    id: u64,
    within: Duration,
    retried: &mut Vec<String>,
) -> Result<()> {
    call(via, within, "PromoteLearner", retried, |mut c| async move {
        c.promote_learner(req(v1::PromoteLearnerRequest { node_id: id }))
            .await
    })
    .await
    .map(|_| ())
}

/// Removes node `id`. A retry after a removal whose answer was lost finds
/// it gone: that is a success.
pub async fn remove(
    via: &[u64],
    id: u64,
    within: Duration,
    retried: &mut Vec<String>,
) -> Result<()> {
    let r = call(via, within, "RemoveNode", retried, |mut c| async move {
        c.remove_node(req(v1::RemoveNodeRequest { node_id: id }))
            .await
    })
    .await;
    match r {
        Err(e)
            if e.to_string()
                .contains(&format!("node {id} is not a member")) =>
        {
            Ok(())
        }
        r => r.map(|_| ()),
    }
}

/// The voters as the harness knows them, shared by the fault nemesis and
/// the membership changes that run beside it, and which node each side is
/// working on: a node being removed is not killed or paused, a node being
/// killed or paused is not removed, so neither side loses a node the other
/// must bring back.
#[derive(Default)]
pub struct Members {
    ids: Mutex<Vec<u64>>,
    busy: Mutex<BTreeMap<u64, &'static str>>,
}

impl Members {
    pub fn new(ids: Vec<u64>) -> Arc<Members> {
        Arc::new(Members {
            ids: Mutex::new(ids),
            busy: Mutex::default(),
        })
    }

    pub fn ids(&self) -> Vec<u64> {
        self.ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn add(&self, id: u64) {
        let mut ids = self.ids.lock().unwrap_or_else(PoisonError::into_inner);
        if !ids.contains(&id) {
            ids.push(id);
        }
    }

    pub fn remove(&self, id: u64) {
        self.ids
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .retain(|&n| n != id);
    }

    /// Claims node `id` for `by`, unless the other side works on it.
    pub fn claim(self: &Arc<Self>, id: u64, by: &'static str) -> Option<Claim> {
        let mut busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        if busy.contains_key(&id) {
            return None;
        }
        busy.insert(id, by);
        Some(Claim {
            members: self.clone(),
            id,
        })
    }

    /// Claims one of `candidates` nobody works on, drawn by `rng`.
    pub fn claim_any(
        self: &Arc<Self>,
        candidates: &[u64],
        rng: &mut fastrand::Rng,
        by: &'static str,
    ) -> Option<Claim> {
        let free: Vec<u64> = {
            let busy = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
            candidates
                .iter()
                .copied()
                .filter(|n| !busy.contains_key(n))
                .collect()
        };
        if free.is_empty() {
            return None;
        }
        self.claim(free[rng.usize(..free.len())], by)
    }

    /// Who works on node `id`, if anyone.
    pub fn busy_with(&self, id: u64) -> Option<&'static str> {
        self.busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&id)
            .copied()
    }
}

/// A node one side works on; released when dropped.
pub struct Claim {
    members: Arc<Members>,
    pub id: u64,
}

impl Drop for Claim {
    fn drop(&mut self) {
        self.members
            .busy
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .remove(&self.id);
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::expect_used)]
    use super::*;

    #[test]
    fn only_transient_refusals_are_retried() {
        assert!(worth_retrying(&Status::unavailable("no leader")));
        assert!(worth_retrying(&Status::failed_precondition(
            "node_id: learner 4 lags the leader by 2000 entries"
        )));
        assert!(!worth_retrying(&Status::failed_precondition(
            "node_id: node 1 is the last voter"
        )));
        assert!(!worth_retrying(&Status::permission_denied("no")));
        assert!(!worth_retrying(&Status::already_exists("taken")));
        assert!(worth_retrying(&Status::failed_precondition(
            "has to forward request to: Some(1), Some(Node { .. })"
        )));
    }

    #[test]
    fn a_claimed_node_is_left_alone_until_released() {
        let m = Members::new(vec![1, 2, 3]);
        let mut rng = fastrand::Rng::with_seed(7);
        let c = m.claim(2, "change").expect("2 is free");
        assert!(m.claim(2, "fault").is_none());
        assert_eq!(m.busy_with(2), Some("change"));
        for _ in 0..50 {
            let other = m
                .claim_any(&[1, 2, 3], &mut rng, "fault")
                .expect("1 or 3 free");
            assert_ne!(other.id, 2);
        }
        let one = m.claim(1, "fault").expect("1 free");
        let three = m.claim(3, "fault").expect("3 free");
        assert!(m.claim_any(&[1, 2, 3], &mut rng, "fault").is_none());
        drop((one, three, c));
        assert_eq!(m.busy_with(2), None);
        assert!(m.claim(2, "fault").is_some());
        m.remove(2);
        m.add(4);
        m.add(4);
        assert_eq!(m.ids(), vec![1, 3, 4]);
    }
}
