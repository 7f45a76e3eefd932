//! Fenced writes to the cluster's own key-value store (the `Kv` service):
//! a put carries a lease (resource, owner id, token) and is applied only if
//! that lease is the resource's current one when the write is decided.
//! The calls are [`Calls`] methods, so a [`Lease`] writes without a
//! [`Client`]; `Client`'s and `Lease`'s kv methods are both over them.

use fenced_core::{KvRefusal, OwnerId, Token};
use fenced_proto::{
    kv_refusal_from_wire,
    v1::{self, kv_client::KvClient, kv_delete_response, kv_put_response},
};

use crate::{
    calls::{answered_token, Calls, ClientError, ATTEMPT_TIMEOUT},
    client::Client,
    lease::Lease,
};

/// The result of a fenced put or delete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvWrite {
    /// Committed on a majority. `revision` is the store's revision after
    /// it; `existed` says whether the key had a value before.
    Applied {
        revision: u64,
        existed: bool,
        cluster_time_ms: u64,
    },
    Refused(KvRefusal),
}

/// A key's value and the write that put it there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KvRead {
    pub value: Vec<u8>,
    /// The resource and token of the lease that wrote it.
    pub resource: String,
    pub token: Token,
    pub revision: u64,
}

fn written(
    applied: Option<Result<v1::KvApplied, v1::KvRefused>>,
    cluster_time_ms: u64,
    rpc: &str,
) -> Result<KvWrite, ClientError> {
    match applied {
        Some(Ok(a)) => Ok(KvWrite::Applied {
            revision: a.revision,
            existed: a.existed,
            cluster_time_ms,
        }),
        Some(Err(r)) => Ok(KvWrite::Refused(kv_refusal_from_wire(&r))),
        None => Err(ClientError::Server(format!("{rpc}: empty response"))),
    }
}

impl Calls {
    /// [`Client::kv_put`]'s call.
    pub(crate) async fn kv_put(
        &self,
        key: &str,
        value: &[u8],
        resource: &str,
        owner_id: OwnerId,
        token: Token,
    ) -> Result<KvWrite, ClientError> {
        let req = v1::KvPutRequest {
            key: key.as_bytes().to_vec(),
            value: value.to_vec(),
            resource: resource.as_bytes().to_vec(),
            owner_id: owner_id.as_bytes().to_vec(),
            token: token.get(),
        };
        let resp = self
            .with_retries(self.call_timeout(), |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { KvClient::new(ch).put(req).await }
            })
            .await?
            .0
            .into_inner();
        let outcome = resp.outcome.map(|o| match o {
            kv_put_response::Outcome::Applied(a) => Ok(a),
            kv_put_response::Outcome::Refused(r) => Err(r),
        });
        written(outcome, resp.cluster_time_ms, "put")
    }

    /// [`Client::kv_delete`]'s call.
    pub(crate) async fn kv_delete(
        &self,
        key: &str,
        resource: &str,
        owner_id: OwnerId,
        token: Token,
    ) -> Result<KvWrite, ClientError> {
        let req = v1::KvDeleteRequest {
            key: key.as_bytes().to_vec(),
            resource: resource.as_bytes().to_vec(),
            owner_id: owner_id.as_bytes().to_vec(),
            token: token.get(),
        };
        let resp = self
            .with_retries(self.call_timeout(), |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { KvClient::new(ch).delete(req).await }
            })
            .await?
            .0
            .into_inner();
        let outcome = resp.outcome.map(|o| match o {
            kv_delete_response::Outcome::Applied(a) => Ok(a),
            kv_delete_response::Outcome::Refused(r) => Err(r),
        });
        written(outcome, resp.cluster_time_ms, "delete")
    }

    /// [`Client::kv_get_with`]'s call.
    pub(crate) async fn kv_get_with(
        &self,
        key: &str,
        allow_stale: bool,
    ) -> Result<Option<KvRead>, ClientError> {
        let req = v1::KvGetRequest {
            key: key.as_bytes().to_vec(),
            allow_stale,
        };
        let resp = self
            .with_retries(self.call_timeout(), |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { KvClient::new(ch).get(req).await }
            })
            .await?
            .0
            .into_inner();
        if !resp.found {
            return Ok(None);
        }
        Ok(Some(KvRead {
            token: answered_token("kv_get", "token", resp.token)?,
            value: resp.value,
            resource: resp.resource,
            revision: resp.revision,
        }))
    }
}

impl Client {
    /// Writes `value` under `key` if (`resource`, `owner_id`, `token`) is the
    /// resource's current lease when the write is applied.
    pub async fn kv_put(
        &self,
        key: &str,
        value: &[u8],
        resource: &str,
        owner_id: OwnerId,
        token: Token,
    ) -> Result<KvWrite, ClientError> {
        self.calls()
            .kv_put(key, value, resource, owner_id, token)
            .await
    }

    /// Removes `key` under the same rule as [`Client::kv_put`].
    pub async fn kv_delete(
        &self,
        key: &str,
        resource: &str,
        owner_id: OwnerId,
        token: Token,
    ) -> Result<KvWrite, ClientError> {
        self.calls().kv_delete(key, resource, owner_id, token).await
    }

    /// Reads `key`, linearizably (`allow_stale`: from whichever node
    /// answers, possibly behind). `None`: the key has no value.
    pub async fn kv_get_with(
        &self,
        key: &str,
        allow_stale: bool,
    ) -> Result<Option<KvRead>, ClientError> {
        self.calls().kv_get_with(key, allow_stale).await
    }

    /// Reads `key` linearizably.
    pub async fn kv_get(&self, key: &str) -> Result<Option<KvRead>, ClientError> {
        self.kv_get_with(key, false).await
    }
}

impl Lease {
    /// Writes `value` under `key`, fenced by this lease: applied only while
    /// it is still the resource's current lease in the cluster.
    pub async fn kv_put(&self, key: &str, value: &[u8]) -> Result<KvWrite, ClientError> {
        self.calls()
            .kv_put(key, value, self.resource(), self.owner_id(), self.token())
            .await
    }

    /// Removes `key`, fenced by this lease.
    pub async fn kv_delete(&self, key: &str) -> Result<KvWrite, ClientError> {
        self.calls()
            .kv_delete(key, self.resource(), self.owner_id(), self.token())
            .await
    }
}
