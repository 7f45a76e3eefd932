//! A write call from the caller's permission to its reply, the one path
//! every lease, session and fenced-store write takes: authorize, hand the
//! request to the leader when another node leads, or make the command here,
//! as the caller, propose it and reply.

use fenced_core::{ClusterTime, Command, CommandOutcome, InvalidArgument, Limits};
use fenced_proto::{invalid_argument, WallTimed};
use tonic::{Request, Response, Status};

use crate::{deadline::deadline_of, security::auth::Permission};

use super::{context::NodeContext, forward::ToLeader};

/// What a write asks of its caller: `lock` on every name it returns, read
/// from the request no further than that; no names, `lock` on some prefix.
pub(crate) type Names<T> = fn(&T) -> Result<Vec<String>, InvalidArgument>;

/// Makes the command from the request, for the caller's identity (empty
/// with auth off) within the node's limits.
pub(crate) type Make<T> = fn(&T, &str, &Limits) -> Result<Command, InvalidArgument>;

impl NodeContext {
    /// Serves the write `operation`: refused here when the caller may not
    /// make it (nothing is forwarded), else answered by the leader, or here
    /// from the command `make` builds, made once on the node that serves
    /// the call. `peer`: served on the peer port, where forwarded
    /// identities are believed.
    pub(crate) async fn write<T: ToLeader, O: CommandOutcome>(
        &self,
        req: Request<T>,
        (operation, peer): (&str, bool),
        names: Names<T>,
        make: Make<T>,
        reply: impl FnOnce(&O, ClusterTime) -> Result<T::Reply, Status>,
    ) -> Result<Response<T::Reply>, Status>
    where
        T::Reply: WallTimed,
    {
        let deadline = deadline_of(&req);
        let names = names(req.get_ref()).map_err(|e| invalid_argument(&e))?;
        let auth = &self.policy.auth;
        let mut identity = None;
        if names.is_empty() {
            identity = auth.authorize(&req, peer, Permission::Lock, operation, None)?;
        }
        for name in &names {
            identity = auth.authorize(&req, peer, Permission::Lock, operation, Some(name))?;
        }
        if let Some(answer) = self.to_leader(&req, deadline, identity.as_deref()).await {
            return answer;
        }
        let who = identity.as_deref().unwrap_or("");
        let command =
            make(req.get_ref(), who, &self.policy.limits).map_err(|e| invalid_argument(&e))?;
        let command = self.as_caller(command, identity.as_deref());
        self.decide(command, deadline, reply).await
    }
}
