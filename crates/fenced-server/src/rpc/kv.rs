//! The `Kv` gRPC service (proto/fenced/v1/kv.proto): fenced writes
//! proposed through the same log as the leases, reads by the same
//! linearizable path as `Describe`. Decides nothing: the fencing rule is
//! `LeaseTable::apply`.

use fenced_core::{ClusterTime, KvKey};
use fenced_proto::{
    invalid_argument, kv_delete_command, kv_delete_reply, kv_get_key, kv_get_reply, kv_put_command,
    kv_put_reply,
    v1::{self, kv_client::KvClient, kv_server},
};
use tonic::{Request, Response, Status};

use crate::{auth::Permission, deadline::deadline_of, rpc::NodeContext};

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
    fn authorize_write<T>(
        &self,
        req: &Request<T>,
        operation: &str,
        command: &fenced_core::Command,
    ) -> Result<Option<String>, Status> {
        let (key, resource) = match command {
            fenced_core::Command::KvPut { key, resource, .. }
            | fenced_core::Command::KvDelete { key, resource, .. } => (key.as_str(), resource),
            _ => return Err(Status::internal("not a fenced write")),
        };
        let auth = &self.ctx.auth;
        let identity = auth.authorize(
            req,
            self.peer,
            Permission::Lock,
            operation,
            Some(resource.as_str()),
        )?;
        auth.authorize(req, self.peer, Permission::Lock, operation, Some(key))?;
        Ok(identity)
    }

    fn read(&self, key: &KvKey, now: ClusterTime) -> Response<v1::KvGetResponse> {
        let reply = kv_get_reply(self.ctx.shared.kv_get(key.as_str()).as_ref(), now);
        self.ctx.dated(reply, now)
    }
}

impl KvService {
    async fn answer_put(
        &self,
        req: Request<v1::KvPutRequest>,
    ) -> Result<Response<v1::KvPutResponse>, Status> {
        let deadline = deadline_of(&req);
        let command =
            kv_put_command(req.get_ref(), &self.ctx.limits).map_err(|e| invalid_argument(&e))?;
        let identity = self.authorize_write(&req, "kv_put", &command)?;
        crate::forward_or!(self.ctx, req, deadline, identity, KvClient, put);
        let command = self.ctx.as_caller(command, identity.as_deref());
        self.ctx.decide(command, deadline, kv_put_reply).await
    }

    async fn answer_delete(
        &self,
        req: Request<v1::KvDeleteRequest>,
    ) -> Result<Response<v1::KvDeleteResponse>, Status> {
        let deadline = deadline_of(&req);
        let command = kv_delete_command(req.get_ref()).map_err(|e| invalid_argument(&e))?;
        let identity = self.authorize_write(&req, "kv_delete", &command)?;
        crate::forward_or!(self.ctx, req, deadline, identity, KvClient, delete);
        let command = self.ctx.as_caller(command, identity.as_deref());
        self.ctx.decide(command, deadline, kv_delete_reply).await
    }

    async fn answer_get(
        &self,
        req: Request<v1::KvGetRequest>,
    ) -> Result<Response<v1::KvGetResponse>, Status> {
        let key = kv_get_key(req.get_ref()).map_err(|e| invalid_argument(&e))?;
        let identity = self.ctx.auth.authorize(
            &req,
            self.peer,
            Permission::Read,
            "kv_get",
            Some(key.as_str()),
        )?;
        if req.get_ref().allow_stale {
            return Ok(self.read(&key, self.ctx.time.applied()));
        }
        crate::forward_or!(self.ctx, req, deadline_of(&req), identity, KvClient, get);
        let now = self.ctx.linearizable_read("kv get").await?;
        Ok(self.read(&key, now))
    }
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
