//! Membership changes as the nemesis makes them, through the Cluster
//! service's admin calls with the run's token: a new node joins with
//! `--join` as a learner and is promoted, a voter (the leader too) is
//! removed, a dead node is replaced by a new id.

use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use fenced_proto::v1::{self, cluster_client::ClusterClient};
use tonic::{Code, Status};

use crate::cluster::{channel, client_addr};

/// Node ids (and network slots, 10.77.0.<id>) the membership profile may
/// use: three to start with, the rest for nodes that join. An id is never
/// used twice.
pub const MEMBER_SLOTS: u64 = 24;

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
        }
        _ => false,
    }
}

/// Calls `f` on the members in turn until one answers, retrying what is
/// worth retrying, for at most `within`.
async fn call<T, F, Fut>(members: &[u64], within: Duration, what: &str, f: F) -> Result<T>
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
            Err(s) if worth_retrying(&s) => last = format!("n{id}: {}", s.message()),
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

/// Promotes learner `id`, retrying while it catches up.
pub async fn promote(via: &[u64], id: u64, within: Duration) -> Result<()> {
    call(via, within, "PromoteLearner", |mut c| async move {
        c.promote_learner(req(v1::PromoteLearnerRequest { node_id: id }))
            .await
    })
    .await
    .map(|_| ())
}

/// Removes node `id`. A retry after a removal whose answer was lost finds
/// it gone: that is a success.
pub async fn remove(via: &[u64], id: u64, within: Duration) -> Result<()> {
    let r = call(via, within, "RemoveNode", |mut c| async move {
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

#[cfg(test)]
mod tests {
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
    }
}
