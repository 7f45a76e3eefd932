//! A client's sessions: leases acquired through a [`crate::Client`] live
//! with a session of that client, which its keeper keeps alive in one call
//! per renewal interval however many leases it holds (docs/DECISIONS.md,
//! "Sessions"). The session calls are [`Calls`] methods, so the keeper
//! makes them without a `Client`.

use std::{
    sync::{Mutex, PoisonError},
    time::Duration,
};

use fenced_core::{OwnerId, SessionId, Token};
use fenced_proto::v1::{self, lock_client::LockClient, session_response};

use crate::{
    calls::{acquire_outcome, millis, AcquireOutcome, Calls, ClientError, ATTEMPT_TIMEOUT},
    clock::Moment,
    loss::LeaseLoss,
    LostReason,
};

/// One session as the client keeps it.
pub(crate) struct ClientSession {
    pub(crate) id: SessionId,
    pub(crate) ttl: Duration,
    /// The local deadline of the session and of every lease in it: from
    /// when the last successful open or keep-alive was sent, its TTL less
    /// the safety margin.
    deadline: Mutex<Moment>,
    next_keep: Mutex<Moment>,
    /// Why the session is over, once the cluster said so.
    ended: Mutex<Option<LeaseLoss>>,
}

impl ClientSession {
    pub(crate) fn new(id: SessionId, ttl: Duration, deadline: Moment, next_keep: Moment) -> Self {
        Self {
            id,
            ttl,
            deadline: Mutex::new(deadline),
            next_keep: Mutex::new(next_keep),
            ended: Mutex::new(None),
        }
    }

    pub(crate) fn deadline(&self) -> Moment {
        *self.deadline.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Moves the deadline later (never earlier).
    pub(crate) fn extend(&self, d: Moment) {
        let mut deadline = self.deadline.lock().unwrap_or_else(PoisonError::into_inner);
        *deadline = (*deadline).max(d);
    }

    pub(crate) fn next_keep(&self) -> Moment {
        *self
            .next_keep
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    pub(crate) fn set_next_keep(&self, at: Moment) {
        *self
            .next_keep
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = at;
    }

    /// Why the session is over: the cluster ended it, or its local deadline
    /// passed.
    pub(crate) fn ended(&self) -> Option<LeaseLoss> {
        if let Some(reason) = self
            .ended
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
        {
            return Some(reason);
        }
        self.deadline()
            .has_passed()
            .then_some(LeaseLoss::DeadlinePassed)
    }

    /// Records that the session is over (the first reason stays).
    pub(crate) fn end(&self, reason: LeaseLoss) {
        let mut ended = self.ended.lock().unwrap_or_else(PoisonError::into_inner);
        if ended.is_none() {
            tracing::warn!(session = %self.id, %reason, "session over; its leases are lost");
            *ended = Some(reason);
        }
    }
}

/// The cluster's answer to an open or a keep-alive.
pub(crate) enum SessionAnswer {
    /// Open, holding `leases` leases.
    Alive { leases: u64 },
    /// The session is not open: every lease it held has ended.
    Gone,
}

/// The cluster's answer to an acquire in a session.
pub(crate) enum InSession {
    Outcome(AcquireOutcome),
    /// The session is not open: nothing was granted.
    Gone,
}

/// The reason a lease of a session that the cluster no longer has open is
/// lost: it lapsed (or was closed, which this client never does while a
/// lease is in it).
pub(crate) const SESSION_GONE: LeaseLoss = LeaseLoss::Refused(LostReason::Expired);

impl Calls {
    /// Opens session `id` for `ttl`; returns the answer and when the
    /// answered attempt was sent.
    pub(crate) async fn open_session_sent(
        &self,
        id: SessionId,
        ttl: Duration,
    ) -> Result<(SessionAnswer, Moment), ClientError> {
        let req = v1::OpenSessionRequest {
            session_id: id.as_bytes().to_vec(),
            ttl_ms: millis(ttl),
        };
        let (resp, sent) = self
            .with_retries(self.call_timeout(), |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { LockClient::new(ch).open_session(req).await }
            })
            .await?;
        Ok((session_answer(resp.into_inner(), "open_session")?, sent))
    }

    /// Keeps session `id` alive, within `budget`.
    pub(crate) async fn keep_alive_sent(
        &self,
        id: SessionId,
        budget: Duration,
    ) -> Result<(SessionAnswer, Moment), ClientError> {
        let req = v1::KeepAliveRequest {
            session_id: id.as_bytes().to_vec(),
        };
        let (resp, sent) = self
            .with_retries(budget, |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { LockClient::new(ch).keep_alive(req).await }
            })
            .await?;
        Ok((session_answer(resp.into_inner(), "keep_alive")?, sent))
    }

    /// Acquires `resource` in session `id`, without waiting. Retries use
    /// the same `owner`.
    pub(crate) async fn acquire_in_session_sent(
        &self,
        resource: &str,
        owner: OwnerId,
        id: SessionId,
    ) -> Result<(InSession, Moment), ClientError> {
        let req = v1::AcquireInSessionRequest {
            resource: resource.as_bytes().to_vec(),
            owner_id: owner.as_bytes().to_vec(),
            session_id: id.as_bytes().to_vec(),
            label: self.job_label().to_string(),
        };
        let (resp, sent) = self
            .with_retries(self.call_timeout(), |ch, left| {
                let req = self.request(req.clone(), left.min(ATTEMPT_TIMEOUT));
                async move { LockClient::new(ch).acquire_in_session(req).await }
            })
            .await?;
        let answer = match acquire_outcome(resp.into_inner())? {
            Some(outcome) => InSession::Outcome(outcome),
            None => InSession::Gone,
        };
        Ok((answer, sent))
    }
}

/// Why a lease whose token `ValidateTokens` answered with `v` is over, or
/// `None` while it is current.
pub(crate) fn ended_reason(v: &v1::ValidateTokenResponse) -> Option<LostReason> {
    match v1::TokenState::try_from(v.state) {
        Ok(v1::TokenState::Current) => None,
        Ok(v1::TokenState::Superseded) => Some(match Token::new(v.current_token) {
            Ok(current_token) => LostReason::Superseded { current_token },
            Err(_) => LostReason::Unknown,
        }),
        Ok(v1::TokenState::Released) => Some(LostReason::Released),
        Ok(v1::TokenState::Expired) => Some(LostReason::Expired),
        _ => Some(LostReason::Unknown),
    }
}

fn session_answer(resp: v1::SessionResponse, rpc: &str) -> Result<SessionAnswer, ClientError> {
    match resp.outcome {
        Some(session_response::Outcome::Alive(a)) => Ok(SessionAnswer::Alive { leases: a.leases }),
        Some(session_response::Outcome::Gone(_)) => Ok(SessionAnswer::Gone),
        None => Err(ClientError::Server(format!("{rpc}: empty response"))),
    }
}

/// Whether `e` says the cluster has no sessions (a build from before them):
/// leases are then kept by batch renewal.
pub(crate) fn sessions_unsupported(e: &ClientError) -> bool {
    matches!(e, ClientError::Server(m) if m.starts_with("Unimplemented"))
}
