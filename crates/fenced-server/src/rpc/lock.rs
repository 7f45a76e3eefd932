//! The Lock service: leases, sessions, describe, history and watch.

use std::{sync::Arc, time::Duration};

use fenced_core::{AcquireInSessionOutcome, AcquireOutcome, InvalidArgument, ResourceName};
use fenced_proto::{
    acquire_call, acquire_in_session_command, acquire_in_session_reply, acquire_reply,
    close_session_command, close_session_reply, describe_reply, describe_resource, history_reply,
    history_request, invalid_argument, keep_alive_command, open_session_command, release_call,
    release_reply, renew_call, renew_many_command, renew_many_reply, renew_many_resources,
    renew_reply, session_reply,
    v1::{self, lock_server},
    validate_check, validate_checks, validate_reply, LeaseCall,
};
use tonic::{Request, Response, Status};

use crate::{deadline::deadline_of, security::auth::Permission, state_machine::parking::WaitEnd};

use super::{
    context::NodeContext,
    forward::WAIT_GRACE,
    write::{Make, Names},
};

pub struct LockService {
    ctx: NodeContext,
    /// Served on the peer port, where forwarded identities are trusted.
    peer: bool,
}

impl LockService {
    pub fn new(ctx: NodeContext, peer: bool) -> Self {
        Self { ctx, peer }
    }

    /// Authorizes `operation` on the resource named by `bytes`, read here
    /// only as far as the permission needs: the whole request becomes a
    /// command once, on the node that serves it.
    fn authorize_named<T>(
        &self,
        req: &Request<T>,
        permission: Permission,
        operation: &str,
        bytes: &[u8],
    ) -> Result<Option<String>, Status> {
        let resource = ResourceName::from_bytes(bytes).map_err(|e| invalid_argument(&e))?;
        self.authorize(req, permission, operation, &resource)
    }

    fn authorize<T>(
        &self,
        req: &Request<T>,
        permission: Permission,
        operation: &str,
        resource: &fenced_core::ResourceName,
    ) -> Result<Option<String>, Status> {
        self.ctx.policy.auth.authorize(
            req,
            self.peer,
            permission,
            operation,
            Some(resource.as_str()),
        )
    }

    async fn answer_acquire(
        &self,
        req: Request<v1::AcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        let deadline = deadline_of(&req);
        let identity =
            self.authorize_named(&req, Permission::Lock, "acquire", &req.get_ref().resource)?;
        let wait_ms = req.get_ref().wait_ms;
        // The forwarded call's budget: a wait past the bound is the
        // leader's to refuse, not this node's to wait for.
        let wait = Duration::from_millis(wait_ms.min(self.ctx.policy.limits.wait_max_ms));
        if let Some(answer) = self
            .ctx
            .to_leader_within(&req, deadline, identity.as_deref(), wait)
            .await
        {
            return answer;
        }
        let LeaseCall {
            resource,
            owner_id: owner,
            command,
        } = acquire_call(req.get_ref(), &self.ctx.policy.limits)
            .map_err(|e| invalid_argument(&e))?;
        let command = self.ctx.as_caller(command, identity.as_deref());
        let parked = if wait_ms > 0 {
            Some(
                self.ctx
                    .parking
                    .park(resource.clone(), owner)
                    .map_err(|e| Status::resource_exhausted(e.to_string()))?,
            )
        } else {
            None
        };
        let (outcome, now) = self
            .ctx
            .propose_or_refuse::<AcquireOutcome>(command, deadline)
            .await?;
        let (AcquireOutcome::Waiting { .. }, Some(mut parked)) = (&outcome, parked) else {
            return acquire_reply(&outcome, resource.as_str(), now).map(|r| self.ctx.dated(r, now));
        };
        let wait = Duration::from_millis(wait_ms) + WAIT_GRACE;
        let end = match tokio::time::timeout(wait, &mut parked.rx).await {
            Ok(Ok(end)) => end,
            Ok(Err(_)) => {
                return Err(Status::aborted(
                    "a retry with the same owner_id took over this wait; use the retry's answer",
                ))
            }
            Err(_) => return Err(Status::deadline_exceeded(
                "no answer within wait_ms; the outcome is unknown: retry with the same owner_id",
            )),
        };
        let now = self.ctx.cluster_now();
        let outcome = match end {
            WaitEnd::Granted(grant) => AcquireOutcome::Granted(grant),
            WaitEnd::Elapsed {
                current_token,
                remaining_ms,
            } => AcquireOutcome::Held {
                current_token,
                remaining_ms,
            },
            WaitEnd::TokensExhausted { limit } => AcquireOutcome::TokensExhausted { limit },
        };
        acquire_reply(&outcome, resource.as_str(), now).map(|r| self.ctx.dated(r, now))
    }

    async fn answer_renew(
        &self,
        req: Request<v1::RenewRequest>,
    ) -> Result<Response<v1::RenewResponse>, Status> {
        let names: Names<v1::RenewRequest> = |r| resource_named(&r.resource);
        let make: Make<v1::RenewRequest> = |r, _, limits| renew_call(r, limits).map(|c| c.command);
        self.ctx
            .write(req, ("renew", self.peer), names, make, renew_reply)
            .await
    }

    /// Every lease of the call in one command, hence one log entry at one
    /// cluster time. The caller must hold `lock` on every resource: a call
    /// naming one it may not renew is refused whole, before anything is
    /// proposed (docs/DECISIONS.md, "Batch renewal").
    async fn answer_renew_many(
        &self,
        req: Request<v1::RenewManyRequest>,
    ) -> Result<Response<v1::RenewManyResponse>, Status> {
        let names: Names<v1::RenewManyRequest> = |r| {
            let resources = renew_many_resources(r)?;
            Ok(resources.iter().map(|n| n.as_str().to_string()).collect())
        };
        let make: Make<v1::RenewManyRequest> = |r, _, limits| renew_many_command(r, limits);
        self.ctx
            .write(
                req,
                ("renew", self.peer),
                names,
                make,
                |outcomes: &Vec<_>, now| renew_many_reply(outcomes, now),
            )
            .await
    }

    async fn answer_release(
        &self,
        req: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        let names: Names<v1::ReleaseRequest> = |r| resource_named(&r.resource);
        let make: Make<v1::ReleaseRequest> = |r, _, _| release_call(r).map(|c| c.command);
        self.ctx
            .write(req, ("release", self.peer), names, make, |outcome, now| {
                Ok(release_reply(outcome, now))
            })
            .await
    }

    /// A lease that lives with the caller's session; never waits.
    async fn answer_acquire_in_session(
        &self,
        req: Request<v1::AcquireInSessionRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        // Named in a granted lease's answer; refused by `names` unless valid.
        let resource = String::from_utf8_lossy(&req.get_ref().resource).into_owned();
        let names: Names<v1::AcquireInSessionRequest> = |r| resource_named(&r.resource);
        self.ctx
            .write(
                req,
                ("acquire_in_session", self.peer),
                names,
                acquire_in_session_command,
                |outcome: &AcquireInSessionOutcome, now| {
                    acquire_in_session_reply(outcome, &resource, now)
                },
            )
            .await
    }

    async fn answer_open_session(
        &self,
        req: Request<v1::OpenSessionRequest>,
    ) -> Result<Response<v1::SessionResponse>, Status> {
        self.ctx
            .write(
                req,
                ("open_session", self.peer),
                no_names,
                open_session_command,
                session_reply,
            )
            .await
    }

    async fn answer_keep_alive(
        &self,
        req: Request<v1::KeepAliveRequest>,
    ) -> Result<Response<v1::SessionResponse>, Status> {
        self.ctx
            .write(
                req,
                ("keep_alive", self.peer),
                no_names,
                keep_alive_command,
                session_reply,
            )
            .await
    }

    async fn answer_close_session(
        &self,
        req: Request<v1::CloseSessionRequest>,
    ) -> Result<Response<v1::CloseSessionResponse>, Status> {
        self.ctx
            .write(
                req,
                ("close_session", self.peer),
                no_names,
                close_session_command,
                close_session_reply,
            )
            .await
    }

    async fn answer_describe(
        &self,
        req: Request<v1::DescribeRequest>,
    ) -> Result<Response<v1::DescribeResponse>, Status> {
        let resource = describe_resource(req.get_ref()).map_err(|e| invalid_argument(&e))?;
        let identity = self.authorize(&req, Permission::Read, "describe", &resource)?;
        // CANARY (planted in a `canaries` build, `canary::on`): every read
        // is served from this node's local state.
        if req.get_ref().allow_stale
            || fenced_core::canary::on(fenced_core::canary::Canary::LocalDescribe)
        {
            let now = self.ctx.replica.time.applied();
            return Ok(self.described(&resource, now));
        }
        if let Some(answer) = self
            .ctx
            .to_leader(&req, deadline_of(&req), identity.as_deref())
            .await
        {
            return answer;
        }
        let now = self.ctx.linearizable_read("describe").await?;
        Ok(self.described(&resource, now))
    }

    /// The Describe answer for `resource` at `now`, with its lease's job
    /// label and dated.
    fn described(
        &self,
        resource: &ResourceName,
        now: fenced_core::ClusterTime,
    ) -> Response<v1::DescribeResponse> {
        let (d, label) = self
            .ctx
            .replica
            .shared
            .describe_labelled(resource.as_str(), now);
        let mut reply = describe_reply(&d, now);
        reply.label = label.map(|l| l.as_str().to_string()).unwrap_or_default();
        self.ctx.dated(reply, now)
    }

    async fn answer_validate_token(
        &self,
        req: Request<v1::ValidateTokenRequest>,
    ) -> Result<Response<v1::ValidateTokenResponse>, Status> {
        let check = validate_check(req.get_ref()).map_err(|e| invalid_argument(&e))?;
        let identity = self.authorize(&req, Permission::Read, "validate_token", &check.0)?;
        if let Some(answer) = self
            .ctx
            .to_leader(&req, deadline_of(&req), identity.as_deref())
            .await
        {
            return answer;
        }
        let now = self.ctx.linearizable_read("validate_token").await?;
        let answers = self
            .ctx
            .replica
            .shared
            .validate_all(std::slice::from_ref(&check), now);
        let (v, owner) = answers
            .first()
            .ok_or_else(|| Status::internal("validate_token: no answer for the check"))?;
        Ok(Response::new(validate_reply(v, *owner, now)))
    }

    async fn answer_validate_tokens(
        &self,
        req: Request<v1::ValidateTokensRequest>,
    ) -> Result<Response<v1::ValidateTokensResponse>, Status> {
        let checks = validate_checks(req.get_ref()).map_err(|e| invalid_argument(&e))?;
        // Every resource of the batch must be readable by the caller.
        let mut identity = None;
        for (resource, _, _) in &checks {
            identity = self.authorize(&req, Permission::Read, "validate_tokens", resource)?;
        }
        if let Some(answer) = self
            .ctx
            .to_leader(&req, deadline_of(&req), identity.as_deref())
            .await
        {
            return answer;
        }
        let now = self.ctx.linearizable_read("validate_tokens").await?;
        let results = self
            .ctx
            .replica
            .shared
            .validate_all(&checks, now)
            .iter()
            .map(|(v, owner)| validate_reply(v, *owner, now))
            .collect();
        Ok(Response::new(v1::ValidateTokensResponse {
            results,
            cluster_time_ms: now.as_millis(),
        }))
    }

    async fn answer_watch(
        &self,
        req: Request<v1::WatchRequest>,
    ) -> Result<Response<WatchStream>, Status> {
        let prefix =
            fenced_core::watch_prefix(&req.get_ref().prefix).map_err(|e| invalid_argument(&e))?;
        // The permission covers the prefix: every resource under it.
        let identity = self.ctx.policy.auth.authorize(
            &req,
            self.peer,
            Permission::Read,
            "watch",
            Some(prefix.as_str()),
        )?;
        // Served from this node's applied state: revisions are the same on
        // every node, so the stream may move between nodes.
        let slot = self
            .ctx
            .watchers
            .admit(identity.as_deref())?
            .showing_owners(self.ctx.policy.auth.shows_owner_ids(identity.as_deref()));
        tracing::debug!(
            prefix,
            from_revision = req.get_ref().from_revision,
            identity = identity.as_deref().unwrap_or(""),
            "watch started"
        );
        // The stream outlives this check: its caller is authorized again
        // while it is open, from the same credentials.
        let credentials = Request::from_parts(req.metadata().clone(), req.extensions().clone(), ());
        let (auth, peer, watched) = (Arc::clone(&self.ctx.policy.auth), self.peer, prefix.clone());
        let recheck: crate::rpc::watch::Recheck = Box::new(move || {
            auth.authorize(
                &credentials,
                peer,
                Permission::Read,
                "watch",
                Some(&watched),
            )
            .map(|_| ())
        });
        let rx = crate::rpc::watch::start(
            Arc::clone(&self.ctx.replica.shared),
            slot,
            prefix,
            req.get_ref().from_revision,
            recheck,
        );
        Ok(Response::new(tokio_stream::wrappers::ReceiverStream::new(
            rx,
        )))
    }

    async fn answer_history(
        &self,
        req: Request<v1::HistoryRequest>,
    ) -> Result<Response<v1::HistoryResponse>, Status> {
        let (resource, limit) = history_request(req.get_ref()).map_err(|e| invalid_argument(&e))?;
        let identity = self.authorize(&req, Permission::Read, "history", &resource)?;
        if let Some(answer) = self
            .ctx
            .to_leader(&req, deadline_of(&req), identity.as_deref())
            .await
        {
            return answer;
        }
        let now = self.ctx.linearizable_read("history").await?;
        let entries = self
            .ctx
            .replica
            .shared
            .dated_history(resource.as_str(), limit);
        let mut reply = history_reply(&entries, now);
        // Owner ids only to an admin (docs/DECISIONS.md, "Owner ids are
        // shown to admins only").
        if !self.ctx.policy.auth.shows_owner_ids(identity.as_deref()) {
            for e in &mut reply.entries {
                e.owner_id.clear();
            }
        }
        Ok(self.ctx.dated(reply, now))
    }
}

/// The resource a lease call names, as the permission check reads it.
fn resource_named(bytes: &[u8]) -> Result<Vec<String>, InvalidArgument> {
    Ok(vec![ResourceName::from_bytes(bytes)?.as_str().to_string()])
}

/// A session call names no resource: its caller needs `lock` on some prefix.
fn no_names<T>(_: &T) -> Result<Vec<String>, InvalidArgument> {
    Ok(Vec::new())
}

#[tonic::async_trait]
impl lock_server::Lock for LockService {
    async fn acquire(
        &self,
        req: Request<v1::AcquireRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        self.ctx.hinted(self.answer_acquire(req).await)
    }

    async fn renew(
        &self,
        req: Request<v1::RenewRequest>,
    ) -> Result<Response<v1::RenewResponse>, Status> {
        self.ctx.hinted(self.answer_renew(req).await)
    }

    async fn renew_many(
        &self,
        req: Request<v1::RenewManyRequest>,
    ) -> Result<Response<v1::RenewManyResponse>, Status> {
        self.ctx.hinted(self.answer_renew_many(req).await)
    }

    async fn release(
        &self,
        req: Request<v1::ReleaseRequest>,
    ) -> Result<Response<v1::ReleaseResponse>, Status> {
        self.ctx.hinted(self.answer_release(req).await)
    }

    async fn open_session(
        &self,
        req: Request<v1::OpenSessionRequest>,
    ) -> Result<Response<v1::SessionResponse>, Status> {
        self.ctx.hinted(self.answer_open_session(req).await)
    }

    async fn acquire_in_session(
        &self,
        req: Request<v1::AcquireInSessionRequest>,
    ) -> Result<Response<v1::AcquireResponse>, Status> {
        self.ctx.hinted(self.answer_acquire_in_session(req).await)
    }

    async fn keep_alive(
        &self,
        req: Request<v1::KeepAliveRequest>,
    ) -> Result<Response<v1::SessionResponse>, Status> {
        self.ctx.hinted(self.answer_keep_alive(req).await)
    }

    async fn close_session(
        &self,
        req: Request<v1::CloseSessionRequest>,
    ) -> Result<Response<v1::CloseSessionResponse>, Status> {
        self.ctx.hinted(self.answer_close_session(req).await)
    }

    async fn describe(
        &self,
        req: Request<v1::DescribeRequest>,
    ) -> Result<Response<v1::DescribeResponse>, Status> {
        self.ctx.hinted(self.answer_describe(req).await)
    }

    async fn validate_token(
        &self,
        req: Request<v1::ValidateTokenRequest>,
    ) -> Result<Response<v1::ValidateTokenResponse>, Status> {
        self.ctx.hinted(self.answer_validate_token(req).await)
    }

    async fn validate_tokens(
        &self,
        req: Request<v1::ValidateTokensRequest>,
    ) -> Result<Response<v1::ValidateTokensResponse>, Status> {
        self.ctx.hinted(self.answer_validate_tokens(req).await)
    }

    type WatchStream = WatchStream;

    async fn watch(&self, req: Request<v1::WatchRequest>) -> Result<Response<WatchStream>, Status> {
        self.ctx.hinted(self.answer_watch(req).await)
    }

    async fn history(
        &self,
        req: Request<v1::HistoryRequest>,
    ) -> Result<Response<v1::HistoryResponse>, Status> {
        self.ctx.hinted(self.answer_history(req).await)
    }
}

/// The body of a Watch answer.
pub type WatchStream = tokio_stream::wrappers::ReceiverStream<Result<v1::WatchResponse, Status>>;
