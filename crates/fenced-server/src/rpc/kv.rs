//! The `Kv` gRPC service (proto/fenced/v1/kv.proto): fenced writes
//! proposed through the same log as the leases, reads by the same
//! linearizable path as `Describe`. Decides nothing: the fencing rule is
//! `LeaseTable::apply`.

use fenced_core::{ClusterTime, InvalidArgument, KvKey, ResourceName};
use fenced_proto::{
    invalid_argument, kv_delete_command, kv_delete_reply, kv_get_key, kv_get_reply, kv_put_command,
    kv_put_reply,
    v1::{self, kv_server},
};
use tonic::{Request, Response, Status};

use crate::{
    deadline::deadline_of,
    rpc::{
        write::{Make, Names},
        NodeContext,
    },
    security::auth::Permission,
};

/// The largest Kv request accepted, in bytes: room for a value one byte
/// past its bound and a long key, so that an oversized value is answered
/// INVALID_ARGUMENT naming `value` rather than cut off by the decoder.
pub const KV_MESSAGE_MAX_BYTES: usize = 2 * fenced_core::KV_VALUE_MAX_BYTES;

pub struct KvService {
    ctx: NodeContext,
    /// Served on the peer port, where forwarded identities are trusted.
    peer: bool,
}

impl KvService {
    pub fn new(ctx: NodeContext, peer: bool) -> Self {
        Self { ctx, peer }
    }

    /// A write needs the `lock` role on its resource AND on its key: holding
    /// a lease does not by itself open every key to its holder.
    fn read(&self, key: &KvKey, now: ClusterTime) -> Response<v1::KvGetResponse> {
        let reply = kv_get_reply(self.ctx.replica.shared.kv_get(key.as_str()).as_ref(), now);
        self.ctx.dated(reply, now)
    }
}

impl KvService {
    async fn answer_put(
        &self,
        req: Request<v1::KvPutRequest>,
    ) -> Result<Response<v1::KvPutResponse>, Status> {
        let names: Names<v1::KvPutRequest> = |r| key_and_resource(&r.key, &r.resource);
        let make: Make<v1::KvPutRequest> = |r, _, limits| kv_put_command(r, limits);
        self.ctx
            .write(req, ("kv_put", self.peer), names, make, kv_put_reply)
            .await
    }

    async fn answer_delete(
        &self,
        req: Request<v1::KvDeleteRequest>,
    ) -> Result<Response<v1::KvDeleteResponse>, Status> {
        let names: Names<v1::KvDeleteRequest> = |r| key_and_resource(&r.key, &r.resource);
        let make: Make<v1::KvDeleteRequest> = |r, _, _| kv_delete_command(r);
        self.ctx
            .write(req, ("kv_delete", self.peer), names, make, kv_delete_reply)
            .await
    }

    async fn answer_get(
        &self,
        req: Request<v1::KvGetRequest>,
    ) -> Result<Response<v1::KvGetResponse>, Status> {
        let key = kv_get_key(req.get_ref()).map_err(|e| invalid_argument(&e))?;
        let identity = self.ctx.policy.auth.authorize(
            &req,
            self.peer,
            Permission::Read,
            "kv_get",
            Some(key.as_str()),
        )?;
        if req.get_ref().allow_stale {
            return Ok(self.read(&key, self.ctx.replica.time.applied()));
        }
        if let Some(answer) = self
            .ctx
            .to_leader(&req, deadline_of(&req), identity.as_deref())
            .await
        {
            return answer;
        }
        let now = self.ctx.linearizable_read("kv get").await?;
        Ok(self.read(&key, now))
    }
}

/// A fenced write needs `lock` on its key and on the resource whose token
/// fences it.
fn key_and_resource(key: &[u8], resource: &[u8]) -> Result<Vec<String>, InvalidArgument> {
    Ok(vec![
        KvKey::from_bytes(key)?.as_str().to_string(),
        ResourceName::from_bytes(resource)?.as_str().to_string(),
    ])
}

// Every answer carries this node's id and the leader hint, as the Lock
// service's do, so a client sends its next call to the leader itself.
#[tonic::async_trait]
impl kv_server::Kv for KvService {
    async fn put(
        &self,
        req: Request<v1::KvPutRequest>,
    ) -> Result<Response<v1::KvPutResponse>, Status> {
        self.ctx.hinted(self.answer_put(req).await)
    }

    async fn delete(
        &self,
        req: Request<v1::KvDeleteRequest>,
    ) -> Result<Response<v1::KvDeleteResponse>, Status> {
        self.ctx.hinted(self.answer_delete(req).await)
    }

    async fn get(
        &self,
        req: Request<v1::KvGetRequest>,
    ) -> Result<Response<v1::KvGetResponse>, Status> {
        self.ctx.hinted(self.answer_get(req).await)
    }
}
