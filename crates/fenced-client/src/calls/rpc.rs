//! One method per call of the cluster's services, each over
//! [`Calls::with_retries`], and the typed answers they turn the wire's
//! messages into. The public `Client` methods of the same names are these.

use std::time::{Duration, Instant};

use fenced_core::{LostReason, OwnerId, ReleaseOutcome, RenewOutcome, Token};
use fenced_proto::{
    lost_reason_from_wire,
    v1::{
        self, acquire_response, cluster_client::ClusterClient, lock_client::LockClient,
        maintenance_client::MaintenanceClient, release_response, renew_response,
    },
};
use tonic::Status;

use super::{
    error::{classify, unavailable_message, Attempt},
    Calls, ClientError, ATTEMPT_TIMEOUT,
};
use crate::{clock::Moment, tls};

/// The answer of the Acquire call: its three final cases (a server waits
/// out a queued acquire itself, and answers a full queue or table with
/// [`ClientError::ResourceExhausted`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AcquireOutcome {
    /// The lease is yours: carry `token` with every protected write.
    Granted {
        token: Token,
        expires_at_ms: u64,
        ttl_ms: u64,
        cluster_time_ms: u64,
        /// The leader's wall clock at the grant, ms since the Unix epoch:
        /// for logs and audits, never for timing the lease. 0 when unknown
        /// (the first second of a new cluster).
        wall_time_unix_ms: u64,
    },
    /// Another owner holds it.
    Held {
        current_token: Token,
        remaining_ms: u64,
    },
    /// This owner id's lease on the resource already ended (`reason`): owner
    /// ids are single-use per attempt, so nothing was granted. Typically a
    /// retry that came after the attempt was over. Start a new attempt with a
    /// new owner id.
    Ended { reason: LostReason },
}

/// An answer with the times it was given: the cluster time of the
/// replicated step, and the leader's wall clock then (ms since the Unix
/// epoch; for logs and audits, never for timing a lease; 0 when the
/// cluster has no wall-clock anchor yet).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Dated<T> {
    pub outcome: T,
    pub cluster_time_ms: u64,
    pub wall_time_unix_ms: u64,
}

impl<T> Dated<T> {
    /// The leader's wall clock at the answer, as a time to print (for
    /// example with `humantime::format_rfc3339`); `None` when unknown.
    pub fn wall_time(&self) -> Option<std::time::SystemTime> {
        wall_time(self.wall_time_unix_ms)
    }
}

/// A `wall_time_unix_ms` of an answer as a [`std::time::SystemTime`];
/// `None` for 0 (the cluster had no wall-clock anchor yet).
pub fn wall_time(unix_ms: u64) -> Option<std::time::SystemTime> {
    (unix_ms > 0)
        .then(|| std::time::UNIX_EPOCH.checked_add(Duration::from_millis(unix_ms)))
        .flatten()
}

/// One lease of a [`Client::renew_many`](crate::Client::renew_many) call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RenewItem<'a> {
    pub resource: &'a str,
    pub owner_id: OwnerId,
    pub token: Token,
    pub ttl: Duration,
}

/// A token from an answer: tokens start at 1, so 0 is a broken answer.
pub(crate) fn answered_token(rpc: &str, field: &str, value: u64) -> Result<Token, ClientError> {
    Token::new(value)
        .map_err(|_| ClientError::Server(format!("{rpc}: the answer's {field} is 0, not a token")))
}

fn renew_outcome(resp: v1::RenewResponse) -> Result<RenewOutcome, ClientError> {
    match resp.outcome {
        Some(renew_response::Outcome::Renewed(r)) => Ok(RenewOutcome::Renewed {
            expires_at: fenced_core::ClusterTime::from_millis(r.expires_at_ms),
            ttl_ms: r.ttl_ms,
        }),
        Some(renew_response::Outcome::Lost(l)) => Ok(RenewOutcome::Lost(lost_reason_from_wire(
            l.reason,
            l.current_token,
        ))),
        None => Err(ClientError::Server("renew: empty response".into())),
    }
}

/// An acquire's answer; `None` when it says the session it named is gone.
pub(crate) fn acquire_outcome(
    resp: v1::AcquireResponse,
) -> Result<Option<AcquireOutcome>, ClientError> {
    let outcome = match resp.outcome {
        Some(acquire_response::Outcome::Granted(g)) => AcquireOutcome::Granted {
            token: answered_token("acquire", "token", g.token)?,
            expires_at_ms: g.expires_at_ms,
            ttl_ms: g.ttl_ms,
            cluster_time_ms: resp.cluster_time_ms,
            wall_time_unix_ms: resp.wall_time_unix_ms,
        },
        Some(acquire_response::Outcome::Held(h)) => AcquireOutcome::Held {
            current_token: answered_token("acquire", "current_token", h.current_token)?,
            remaining_ms: h.remaining_ms,
        },
        Some(acquire_response::Outcome::Ended(e)) => AcquireOutcome::Ended {
            reason: lost_reason_from_wire(e.reason, e.current_token),
        },
        Some(acquire_response::Outcome::SessionGone(_)) => return Ok(None),
        None => return Err(ClientError::Server("acquire: empty response".into())),
    };
    Ok(Some(outcome))
}

pub(crate) fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl Calls {
    /// The Acquire call ([`crate::Client::acquire_once`]), with when the
    /// answered attempt was sent.
    pub(crate) async fn acquire_sent(
        &self,
        resource: &str,
        owner_id: OwnerId,
        ttl: Duration,
        wait: Duration,
    ) -> Result<(AcquireOutcome, Moment), ClientError> {
        let started = Instant::now();
        let (resp, sent) = self
            .with_retries(self.inner.settings.call_timeout + wait, |ch, left| {
                // A retry waits only for what is left of the caller's wait.
                let wait_left = wait.saturating_sub(started.elapsed());
                let req = v1::AcquireRequest {
                    resource: resource.as_bytes().to_vec(),
                    owner_id: owner_id.as_bytes().to_vec(),
                    ttl_ms: millis(ttl),
                    wait_ms: millis(wait_left),
                    label: self.job_label().to_string(),
                };
                let req = self.request(req, left.min(wait_left + ATTEMPT_TIMEOUT));
                async move { LockClient::new(ch).acquire(req).await }
            })
            .await?;
        let outcome = acquire_outcome(resp.into_inner())?
            .ok_or_else(|| ClientError::Server("acquire: a session's answer".into()))?;
        Ok((outcome, sent))
    }

    /// The Renew call, within `budget`, with when the answered attempt was
    /// sent.
    pub(crate) async fn renew_sent(
        &self,
        resource: &str,
        owner_id: OwnerId,
        token: Token,
        ttl: Duration,
        budget: Duration,
    ) -> Result<(RenewOutcome, Moment), ClientError> {
        self.renew_sent_dated(resource, owner_id, token, ttl, budget)
            .await
            .map(|(d, sent)| (d.outcome, sent))
    }

    /// [`Calls::renew_sent`], with the times of the answer.
    pub(crate) async fn renew_sent_dated(
        &self,
        resource: &str,
        owner_id: OwnerId,
        token: Token,
        ttl: Duration,
        budget: Duration,
    ) -> Result<(Dated<RenewOutcome>, Moment), ClientError> {
        let req = v1::RenewRequest {
            resource: resource.as_bytes().to_vec(),
            owner_id: owner_id.as_bytes().to_vec(),
            token: token.get(),
            ttl_ms: millis(ttl),
        };
        let (resp, sent) = self
            .with_retries(budget, |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { LockClient::new(ch).renew(req).await }
            })
            .await?;
        let resp = resp.into_inner();
        let (cluster_time_ms, wall_time_unix_ms) = (resp.cluster_time_ms, resp.wall_time_unix_ms);
        let dated = Dated {
            outcome: renew_outcome(resp)?,
            cluster_time_ms,
            wall_time_unix_ms,
        };
        Ok((dated, sent))
    }

    /// The RenewMany call ([`crate::Client::renew_many`]), within `budget`,
    /// with when the answered attempt was sent.
    pub(crate) async fn renew_many_sent(
        &self,
        leases: &[RenewItem<'_>],
        budget: Duration,
    ) -> Result<(Vec<RenewOutcome>, Moment), ClientError> {
        let req = v1::RenewManyRequest {
            leases: leases
                .iter()
                .map(|l| v1::RenewRequest {
                    resource: l.resource.as_bytes().to_vec(),
                    owner_id: l.owner_id.as_bytes().to_vec(),
                    token: l.token.get(),
                    ttl_ms: millis(l.ttl),
                })
                .collect(),
        };
        let (resp, sent) = self
            .with_retries(budget, |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { LockClient::new(ch).renew_many(req).await }
            })
            .await?;
        let results = resp.into_inner().results;
        if results.len() != leases.len() {
            return Err(ClientError::Server(format!(
                "renew_many: {} results for {} leases",
                results.len(),
                leases.len()
            )));
        }
        let outcomes = results
            .into_iter()
            .map(renew_outcome)
            .collect::<Result<_, _>>()?;
        Ok((outcomes, sent))
    }

    /// [`crate::Client::release`]'s call.
    pub(crate) async fn release(
        &self,
        resource: &str,
        owner_id: OwnerId,
        token: Token,
    ) -> Result<ReleaseOutcome, ClientError> {
        self.release_dated(resource, owner_id, token)
            .await
            .map(|d| d.outcome)
    }

    /// [`crate::Client::release_dated`]'s call.
    pub(crate) async fn release_dated(
        &self,
        resource: &str,
        owner_id: OwnerId,
        token: Token,
    ) -> Result<Dated<ReleaseOutcome>, ClientError> {
        let req = v1::ReleaseRequest {
            resource: resource.as_bytes().to_vec(),
            owner_id: owner_id.as_bytes().to_vec(),
            token: token.get(),
        };
        let resp = self
            .unary(req, |ch, req| async move {
                LockClient::new(ch).release(req).await
            })
            .await?;
        let outcome = match resp.outcome {
            Some(release_response::Outcome::Released(_)) => ReleaseOutcome::Released,
            Some(release_response::Outcome::NotHolder(n)) => {
                ReleaseOutcome::NotHolder(lost_reason_from_wire(n.reason, n.current_token))
            }
            None => return Err(ClientError::Server("release: empty response".into())),
        };
        Ok(Dated {
            outcome,
            cluster_time_ms: resp.cluster_time_ms,
            wall_time_unix_ms: resp.wall_time_unix_ms,
        })
    }

    /// [`crate::Client::describe`]'s call.
    pub(crate) async fn describe(
        &self,
        resource: &str,
    ) -> Result<v1::DescribeResponse, ClientError> {
        let req = v1::DescribeRequest {
            resource: resource.as_bytes().to_vec(),
            allow_stale: false,
        };
        self.unary(req, |ch, req| async move {
            LockClient::new(ch).describe(req).await
        })
        .await
    }

    /// [`crate::Client::validate_token`]'s call.
    pub(crate) async fn validate_token(
        &self,
        resource: &str,
        token: Token,
    ) -> Result<v1::ValidateTokenResponse, ClientError> {
        let req = v1::ValidateTokenRequest {
            resource: resource.as_bytes().to_vec(),
            token: token.get(),
            owner_id: Vec::new(),
        };
        self.unary(req, |ch, req| async move {
            LockClient::new(ch).validate_token(req).await
        })
        .await
    }

    /// [`crate::Client::validate_tokens`]'s call.
    pub(crate) async fn validate_tokens(
        &self,
        checks: &[(&str, Token)],
    ) -> Result<v1::ValidateTokensResponse, ClientError> {
        let req = v1::ValidateTokensRequest {
            checks: checks
                .iter()
                .map(|(r, t)| v1::ValidateTokenRequest {
                    resource: r.as_bytes().to_vec(),
                    token: t.get(),
                    owner_id: Vec::new(),
                })
                .collect(),
        };
        self.unary(req, |ch, req| async move {
            LockClient::new(ch).validate_tokens(req).await
        })
        .await
    }

    /// [`crate::Client::history`]'s call.
    pub(crate) async fn history(
        &self,
        resource: &str,
        limit: u32,
    ) -> Result<v1::HistoryResponse, ClientError> {
        let req = v1::HistoryRequest {
            resource: resource.as_bytes().to_vec(),
            limit,
        };
        self.unary(req, |ch, req| async move {
            LockClient::new(ch).history(req).await
        })
        .await
    }

    /// [`crate::Client::watch`]'s call.
    pub(crate) async fn watch(
        &self,
        prefix: &str,
        from_revision: u64,
    ) -> Result<tonic::Streaming<v1::WatchResponse>, ClientError> {
        let req = v1::WatchRequest {
            prefix: prefix.as_bytes().to_vec(),
            from_revision,
        };
        Ok(self
            .with_retries(self.inner.settings.call_timeout, |ch, _| {
                let mut req = tonic::Request::new(req.clone());
                if let Some(bearer) = &self.inner.settings.bearer {
                    req.metadata_mut().insert("authorization", bearer.clone());
                }
                async move { LockClient::new(ch).watch(req).await }
            })
            .await?
            .0
            .into_inner())
    }

    /// [`crate::Client::status`]'s call.
    pub(crate) async fn status(&self) -> Result<v1::StatusResponse, ClientError> {
        Ok(self
            .with_retries(self.inner.settings.call_timeout, |ch, left| {
                let req = self.request(v1::StatusRequest::default(), left.min(ATTEMPT_TIMEOUT));
                async move { ClusterClient::new(ch).status(req).await }
            })
            .await?
            .0
            .into_inner())
    }

    /// [`crate::Client::save_snapshot`]'s call.
    pub(crate) async fn save_snapshot(
        &self,
        max_bytes: u64,
    ) -> Result<(v1::SnapshotSummary, Vec<u8>), ClientError> {
        Ok(self
            .with_retries(self.inner.settings.call_timeout, |ch, left| {
                let req = self.request(v1::SaveSnapshotRequest {}, left);
                async move {
                    let (metadata, mut stream, extensions) = MaintenanceClient::new(ch)
                        .save_snapshot(req)
                        .await?
                        .into_parts();
                    let summary = stream
                        .message()
                        .await?
                        .and_then(|c| c.summary)
                        .ok_or_else(|| Status::internal("snapshot save: no summary"))?;
                    if summary.total_bytes > max_bytes {
                        return Err(Status::internal(format!(
                            "snapshot save: {} bytes, more than the bound {max_bytes}",
                            summary.total_bytes
                        )));
                    }
                    let mut bytes = Vec::with_capacity(
                        usize::try_from(summary.total_bytes).unwrap_or(usize::MAX),
                    );
                    while let Some(chunk) = stream.message().await? {
                        if (bytes.len() + chunk.data.len()) as u64 > summary.total_bytes {
                            return Err(Status::internal(
                                "snapshot save: more bytes than the summary announced",
                            ));
                        }
                        bytes.extend_from_slice(&chunk.data);
                    }
                    if bytes.len() as u64 != summary.total_bytes {
                        // Cut short: worth another try.
                        return Err(Status::unavailable(format!(
                            "snapshot save: stream ended after {} of {} bytes",
                            bytes.len(),
                            summary.total_bytes
                        )));
                    }
                    // The answer's metadata, so a leader it names is learnt.
                    Ok(tonic::Response::from_parts(
                        metadata,
                        (summary, bytes),
                        extensions,
                    ))
                }
            })
            .await?
            .0
            .into_inner())
    }

    /// The status of every endpoint, each on its own (no retries), with
    /// how each failed for an error that names them all.
    pub(crate) async fn status_each(
        &self,
    ) -> (
        Vec<(String, Result<v1::StatusResponse, ClientError>)>,
        Vec<(String, Option<Attempt>)>,
    ) {
        let mut out = Vec::new();
        let mut attempts = Vec::new();
        for (i, e) in self.inner.endpoints.iter().enumerate() {
            let name = &e.name;
            let req = self.request(v1::StatusRequest::default(), Duration::from_secs(2));
            let mut attempt = None;
            let r = ClusterClient::new(e.channel.clone())
                .status(req)
                .await
                .map(|r| {
                    // Learns which node each endpoint is; follows no hint.
                    let _ = self.inner.endpoints.learn(i, r.metadata());
                    r.into_inner()
                })
                .map_err(|s| match tls::failure(&s) {
                    Some(tls) => ClientError::Tls(tls),
                    None => match classify(s) {
                        Err(refused) => refused,
                        Ok(s) => {
                            let a = Attempt::of(&s);
                            let e = unavailable_message(&[(name.clone(), Some(a.clone()))]);
                            attempt = Some(a);
                            ClientError::Unavailable(e)
                        }
                    },
                });
            attempts.push((name.clone(), attempt));
            out.push((name.clone(), r));
        }
        (out, attempts)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_wall_time_is_a_system_time_and_0_is_unknown() {
        let at = wall_time(1_800_000_000_123);
        assert_eq!(
            at.and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()),
            Some(Duration::from_millis(1_800_000_000_123))
        );
        assert_eq!(wall_time(0), None);
        let dated = Dated {
            outcome: (),
            cluster_time_ms: 5,
            wall_time_unix_ms: 0,
        };
        assert_eq!(dated.wall_time(), None);
    }
}
