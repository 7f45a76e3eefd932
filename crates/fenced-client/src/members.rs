//! Membership calls (admin): list, add a learner, promote, remove. Each is
//! safe to retry: adding a learner already there at the same addresses and
//! promoting a voter change nothing; a retried remove of a node already gone
//! says it is not a member.

use std::time::Duration;

use fenced_proto::v1::{self, cluster_client::ClusterClient};

use crate::{
    calls::{Calls, ClientError},
    client::Client,
};

/// One attempt of a membership change may take this long: a removal first
/// checks which voters answer (up to about 1.5 s), then commits two
/// configurations.
const CHANGE_ATTEMPT_TIMEOUT: Duration = Duration::from_secs(8);

impl Client {
    /// Every member with its replication progress, from the leader.
    pub async fn list_members(&self) -> Result<v1::ListMembersResponse, ClientError> {
        self.calls()
            .membership_call(v1::ListMembersRequest {}, |mut c, req| async move {
                c.list_members(req).await
            })
            .await
    }

    /// Adds node `node_id` as a learner at these addresses.
    pub async fn add_learner(
        &self,
        node_id: u64,
        peer_addr: &str,
        client_addr: &str,
    ) -> Result<v1::MembershipResponse, ClientError> {
        let msg = v1::AddLearnerRequest {
            node_id,
            peer_addr: peer_addr.to_string(),
            client_addr: client_addr.to_string(),
        };
        self.calls()
            .membership_call(msg, |mut c, req| async move { c.add_learner(req).await })
            .await
    }

    /// Makes learner `node_id` a voter; refused while it lags.
    pub async fn promote_learner(
        &self,
        node_id: u64,
    ) -> Result<v1::MembershipResponse, ClientError> {
        let msg = v1::PromoteLearnerRequest { node_id };
        self.calls()
            .membership_call(
                msg,
                |mut c, req| async move { c.promote_learner(req).await },
            )
            .await
    }

    /// Takes node `node_id` out of the voters and the membership.
    pub async fn remove_node(&self, node_id: u64) -> Result<v1::MembershipResponse, ClientError> {
        let msg = v1::RemoveNodeRequest { node_id };
        self.calls()
            .membership_call(msg, |mut c, req| async move { c.remove_node(req).await })
            .await
    }
}

impl Calls {
    /// One membership RPC, retried like any call but with a longer
    /// attempt timeout.
    pub(crate) async fn membership_call<M, R, F, Fut>(
        &self,
        msg: M,
        call: F,
    ) -> Result<R, ClientError>
    where
        M: Clone,
        F: Fn(ClusterClient<tonic::transport::Channel>, tonic::Request<M>) -> Fut,
        Fut: std::future::Future<Output = Result<tonic::Response<R>, tonic::Status>>,
    {
        Ok(self
            .with_retries(self.call_timeout(), |ch, left| {
                let req = self.request(msg.clone(), left.min(CHANGE_ATTEMPT_TIMEOUT));
                call(ClusterClient::new(ch), req)
            })
            .await?
            .0
            .into_inner())
    }
}
