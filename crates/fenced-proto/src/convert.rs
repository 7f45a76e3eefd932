use fenced_core::{
    AcquireInSessionOutcome, AcquireOutcome, CapacityBound, ChangeKind, CloseSessionOutcome,
    ClusterTime, Command, DatedHistoryEntry, Description, InvalidArgument, JobLabel, Limits,
    LostReason, OwnerId, ReleaseOutcome, RenewLease, RenewLeases, RenewOutcome, ResourceName,
    SessionId, SessionOutcome, SessionRefusal, Token, TokenState, Validation,
};
use tonic::Status;

use crate::v1;

/// The gRPC status for a request field out of bounds.
pub fn invalid_argument(err: &InvalidArgument) -> Status {
    Status::invalid_argument(err.to_string())
}

/// A validated acquire from the wire, carrying the table-wide capacity of
/// `limits` ([`Command::AcquireBounded`]).
///
/// ```
/// use fenced_core::Limits;
/// use fenced_proto::{acquire_command, v1::AcquireRequest};
/// let req = AcquireRequest { resource: b"".to_vec(), owner_id: vec![7; 16], ttl_ms: 5_000, wait_ms: 0, label: String::new() };
/// let err = acquire_command(&req, &Limits::default()).unwrap_err();
/// assert_eq!(err.field(), "resource");
/// ```
pub fn acquire_command(
    req: &v1::AcquireRequest,
    limits: &Limits,
) -> Result<Command, InvalidArgument> {
    acquire_call(req, limits).map(|call| call.command)
}

/// A lease call from the wire, read once: the command to propose and the
/// resource and owner id it addresses, for the handler's checks and
/// answer, so that nothing takes the command apart again.
#[derive(Debug, Clone)]
pub struct LeaseCall {
    pub resource: ResourceName,
    pub owner_id: OwnerId,
    pub command: Command,
}

/// [`acquire_command`] with the resource and owner id beside it.
pub fn acquire_call(
    req: &v1::AcquireRequest,
    limits: &Limits,
) -> Result<LeaseCall, InvalidArgument> {
    let resource = ResourceName::from_bytes(&req.resource)?;
    let owner_id = OwnerId::from_bytes(&req.owner_id)?;
    let command = Command::AcquireBounded {
        resource: resource.clone(),
        owner_id,
        ttl_ms: req.ttl_ms,
        wait_ms: req.wait_ms,
        capacity: limits.capacity(),
    }
    .labelled(JobLabel::optional(&req.label)?);
    command.validate(limits)?;
    Ok(LeaseCall {
        resource,
        owner_id,
        command,
    })
}

/// A validated [`Command::AcquireInSession`] from the wire, for the caller
/// `identity` (empty without auth), carrying the table-wide capacity.
pub fn acquire_in_session_command(
    req: &v1::AcquireInSessionRequest,
    identity: &str,
    limits: &Limits,
) -> Result<Command, InvalidArgument> {
    let command = Command::AcquireInSession {
        resource: ResourceName::from_bytes(&req.resource)?,
        owner_id: OwnerId::from_bytes(&req.owner_id)?,
        session: SessionId::from_bytes(&req.session_id)?,
        identity: identity.to_string(),
        capacity: limits.capacity(),
    }
    .labelled(JobLabel::optional(&req.label)?);
    command.validate(limits)?;
    Ok(command)
}

/// A validated [`Command::OpenSession`] from the wire, for the caller
/// `identity`, carrying the session bounds of `limits`.
///
/// ```
/// use fenced_core::Limits;
/// use fenced_proto::{open_session_command, v1::OpenSessionRequest};
/// let req = OpenSessionRequest { session_id: vec![7; 16], ttl_ms: 10 };
/// let err = open_session_command(&req, "", &Limits::default()).unwrap_err();
/// assert_eq!(err.field(), "ttl_ms");
/// ```
pub fn open_session_command(
    req: &v1::OpenSessionRequest,
    identity: &str,
    limits: &Limits,
) -> Result<Command, InvalidArgument> {
    let command = Command::OpenSession {
        session: SessionId::from_bytes(&req.session_id)?,
        identity: identity.to_string(),
        ttl_ms: req.ttl_ms,
        bounds: limits.session_bounds(),
    };
    command.validate(limits)?;
    Ok(command)
}

/// A validated [`Command::KeepAlive`] from the wire.
pub fn keep_alive_command(
    req: &v1::KeepAliveRequest,
    identity: &str,
    limits: &Limits,
) -> Result<Command, InvalidArgument> {
    let command = Command::KeepAlive {
        session: SessionId::from_bytes(&req.session_id)?,
        identity: identity.to_string(),
    };
    command.validate(limits)?;
    Ok(command)
}

/// A validated [`Command::CloseSession`] from the wire.
pub fn close_session_command(
    req: &v1::CloseSessionRequest,
    identity: &str,
    limits: &Limits,
) -> Result<Command, InvalidArgument> {
    let command = Command::CloseSession {
        session: SessionId::from_bytes(&req.session_id)?,
        identity: identity.to_string(),
    };
    command.validate(limits)?;
    Ok(command)
}

/// PERMISSION_DENIED for a session command by an identity that did not open
/// the session.
fn not_owner() -> Status {
    Status::permission_denied(
        "session_id: the session belongs to another identity; only the identity that \
         opened it may keep it alive, close it or acquire in it",
    )
}

/// The status of a refused session command, or `None` for
/// [`SessionRefusal::Gone`], which is an answer, not an error.
fn session_refused(refusal: SessionRefusal) -> Option<Status> {
    match refusal {
        SessionRefusal::Gone => None,
        SessionRefusal::NotOwner => Some(not_owner()),
        SessionRefusal::Bound { bound, limit } => Some(Status::resource_exhausted(format!(
            "{}={limit}: that many sessions are open already; close one, or let one lapse",
            bound.setting()
        ))),
    }
}

/// The reply to an open or a keep-alive.
pub fn session_reply(
    outcome: &SessionOutcome,
    now: ClusterTime,
) -> Result<v1::SessionResponse, Status> {
    use v1::session_response::Outcome as O;
    let outcome = match outcome {
        SessionOutcome::Alive {
            expires_at,
            ttl_ms,
            leases,
        } => O::Alive(v1::SessionAlive {
            expires_at_ms: expires_at.as_millis(),
            ttl_ms: *ttl_ms,
            leases: *leases,
        }),
        SessionOutcome::Refused(r) => match session_refused(*r) {
            None => O::Gone(v1::SessionGone {}),
            Some(status) => return Err(status),
        },
    };
    Ok(v1::SessionResponse {
        outcome: Some(outcome),
        cluster_time_ms: now.as_millis(),
        wall_time_unix_ms: 0, // set by the server: `WallTimed`
    })
}

/// The reply to a close.
pub fn close_session_reply(
    outcome: &CloseSessionOutcome,
    now: ClusterTime,
) -> Result<v1::CloseSessionResponse, Status> {
    match outcome {
        CloseSessionOutcome::Closed { leases } => Ok(v1::CloseSessionResponse {
            leases_ended: *leases,
            cluster_time_ms: now.as_millis(),
            wall_time_unix_ms: 0, // set by the server: `WallTimed`
        }),
        CloseSessionOutcome::NotOwner => Err(not_owner()),
    }
}

/// A validated [`Command::Renew`] from the wire.
pub fn renew_command(req: &v1::RenewRequest, limits: &Limits) -> Result<Command, InvalidArgument> {
    renew_call(req, limits).map(|call| call.command)
}

/// [`renew_command`] with the resource and owner id beside it.
pub fn renew_call(req: &v1::RenewRequest, limits: &Limits) -> Result<LeaseCall, InvalidArgument> {
    let resource = ResourceName::from_bytes(&req.resource)?;
    let owner_id = OwnerId::from_bytes(&req.owner_id)?;
    let command = Command::Renew {
        resource: resource.clone(),
        owner_id,
        token: Token::new(req.token)?,
        ttl_ms: req.ttl_ms,
    };
    command.validate(limits)?;
    Ok(LeaseCall {
        resource,
        owner_id,
        command,
    })
}

/// A validated [`Command::RenewMany`] from the wire: 1 to
/// [`fenced_core::MAX_RENEW_BATCH`] leases within
/// [`fenced_core::MAX_RENEW_BATCH_BYTES`]. A bad lease is named by its index
/// (`leases[3].token`).
///
/// ```
/// use fenced_core::Limits;
/// use fenced_proto::{renew_many_command, v1::{RenewManyRequest, RenewRequest}};
/// let lease = RenewRequest { resource: b"a".to_vec(), owner_id: vec![7; 16], token: 0, ttl_ms: 5_000 };
/// let err = renew_many_command(&RenewManyRequest { leases: vec![lease] }, &Limits::default()).unwrap_err();
/// assert_eq!(err.field(), "leases");
/// assert!(err.to_string().starts_with("leases: leases[0].token: must be at least 1"));
/// ```
pub fn renew_many_command(
    req: &v1::RenewManyRequest,
    limits: &Limits,
) -> Result<Command, InvalidArgument> {
    check_batch_size(req)?;
    let leases = req
        .leases
        .iter()
        .enumerate()
        .map(|(i, l)| {
            let lease = || {
                Ok::<_, InvalidArgument>(RenewLease {
                    resource: ResourceName::from_bytes(&l.resource)?,
                    owner_id: OwnerId::from_bytes(&l.owner_id)?,
                    token: Token::new(l.token)?,
                    ttl_ms: l.ttl_ms,
                })
            };
            lease().map_err(|e| InvalidArgument::new("leases", format!("leases[{i}].{e}")))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let command = Command::RenewMany {
        leases: RenewLeases::new(leases)?,
    };
    command.validate(limits)?;
    Ok(command)
}

/// The resources a batch renewal names, read no further than a caller's
/// permissions need (the node that serves the call makes the command).
///
/// ```
/// use fenced_proto::{renew_many_resources, v1::{RenewManyRequest, RenewRequest}};
/// let lease = |r: &[u8]| RenewRequest { resource: r.to_vec(), ..Default::default() };
/// let names = renew_many_resources(&RenewManyRequest { leases: vec![lease(b"a"), lease(b"b")] }).unwrap();
/// assert_eq!(names.iter().map(|n| n.as_str()).collect::<Vec<_>>(), ["a", "b"]);
/// let err = renew_many_resources(&RenewManyRequest { leases: vec![lease(b"")] }).unwrap_err();
/// assert!(err.to_string().starts_with("leases: leases[0].resource"));
/// ```
pub fn renew_many_resources(
    req: &v1::RenewManyRequest,
) -> Result<Vec<ResourceName>, InvalidArgument> {
    check_batch_size(req)?;
    req.leases
        .iter()
        .enumerate()
        .map(|(i, l)| {
            ResourceName::from_bytes(&l.resource)
                .map_err(|e| InvalidArgument::new("leases", format!("leases[{i}].{e}")))
        })
        .collect()
}

/// 1 to [`fenced_core::MAX_RENEW_BATCH`] leases, counted before anything
/// is parsed: an oversized call costs no more.
fn check_batch_size(req: &v1::RenewManyRequest) -> Result<(), InvalidArgument> {
    let max = fenced_core::MAX_RENEW_BATCH;
    let n = req.leases.len();
    if n == 0 || n > max {
        return Err(InvalidArgument::new(
            "leases",
            format!("must hold 1 to {max} leases, got {n}"),
        ));
    }
    Ok(())
}

/// The reply to a batch renewal: one [`renew_reply`] per lease.
pub fn renew_many_reply(
    each: &[RenewOutcome],
    now: ClusterTime,
) -> Result<v1::RenewManyResponse, Status> {
    Ok(v1::RenewManyResponse {
        results: each
            .iter()
            .map(|o| renew_reply(o, now))
            .collect::<Result<_, _>>()?,
        cluster_time_ms: now.as_millis(),
        wall_time_unix_ms: 0, // set by the server: `WallTimed`
    })
}

/// A validated [`Command::Release`] from the wire.
pub fn release_command(req: &v1::ReleaseRequest) -> Result<Command, InvalidArgument> {
    release_call(req).map(|call| call.command)
}

/// [`release_command`] with the resource and owner id beside it.
pub fn release_call(req: &v1::ReleaseRequest) -> Result<LeaseCall, InvalidArgument> {
    let resource = ResourceName::from_bytes(&req.resource)?;
    let owner_id = OwnerId::from_bytes(&req.owner_id)?;
    let command = Command::Release {
        resource: resource.clone(),
        owner_id,
        token: Token::new(req.token)?,
    };
    Ok(LeaseCall {
        resource,
        owner_id,
        command,
    })
}

/// The validated resource name of a describe request.
pub fn describe_resource(req: &v1::DescribeRequest) -> Result<ResourceName, InvalidArgument> {
    ResourceName::from_bytes(&req.resource)
}

/// A loss reason as the wire carries it: the reason and, when superseded,
/// the newest token (0 otherwise).
pub fn lost_reason_parts(reason: LostReason) -> (v1::LostReason, u64) {
    let (r, current) = match reason {
        LostReason::Expired => (v1::LostReason::Expired, 0),
        LostReason::Released => (v1::LostReason::Released, 0),
        LostReason::Superseded { current_token } => {
            (v1::LostReason::Superseded, current_token.get())
        }
        LostReason::Unknown => (v1::LostReason::Unknown, 0),
    };
    (r, current)
}

/// A loss reason from the wire; an unknown code is [`LostReason::Unknown`],
/// and a superseded one without a valid newest token too (tokens start at 1).
pub fn lost_reason_from_wire(reason: i32, current_token: u64) -> LostReason {
    match v1::LostReason::try_from(reason) {
        Ok(v1::LostReason::Expired) => LostReason::Expired,
        Ok(v1::LostReason::Released) => LostReason::Released,
        Ok(v1::LostReason::Superseded) => match Token::new(current_token) {
            Ok(current_token) => LostReason::Superseded { current_token },
            Err(_) => LostReason::Unknown,
        },
        _ => LostReason::Unknown,
    }
}

/// RESOURCE_EXHAUSTED naming the setting that refused an acquire and its value.
pub fn capacity_reached(bound: CapacityBound, limit: u64) -> Status {
    let what = match bound {
        CapacityBound::LiveLeases => "live leases",
        CapacityBound::Waiters => "waiters",
        // The caller's own bound; its name is not repeated back.
        CapacityBound::LeasesPerIdentity => {
            return Status::resource_exhausted(format!(
                "max_leases_per_identity ({limit}) reached: this identity holds that many live \
                 leases; release one first"
            ))
        }
        CapacityBound::WaitersPerIdentity => {
            return Status::resource_exhausted(format!(
                "max_waiters_per_identity ({limit}) reached: this identity has that many \
                 blocking acquires waiting; retry later or with wait 0"
            ))
        }
    };
    Status::resource_exhausted(format!(
        "{}={limit}: the cluster already holds {limit} {what}; \
         retry after some are released or expire",
        bound.setting()
    ))
}

/// FAILED_PRECONDITION naming the resource and the bound: the table's token
/// counter reached it, so no grant can get a token above every one before.
/// Not worth a retry: it stays so on this cluster.
pub fn tokens_exhausted(resource: &str, limit: u64) -> Status {
    Status::failed_precondition(format!(
        "resource {resource}: fencing tokens exhausted: the cluster's token counter \
         reached its bound {limit} (2^63), so no lease can be granted with a token above \
         every one before; nothing changed"
    ))
}

/// The reply to an acquire of `resource` whose outcome is final: a
/// `Waiting` outcome (answered later, when the wait ends) is UNAVAILABLE
/// here, outcome unknown.
pub fn acquire_reply(
    outcome: &AcquireOutcome,
    resource: &str,
    now: ClusterTime,
) -> Result<v1::AcquireResponse, Status> {
    use v1::acquire_response::Outcome as O;
    let outcome = match outcome {
        AcquireOutcome::Granted(g) => O::Granted(v1::Granted {
            token: g.token.get(),
            expires_at_ms: g.expires_at.as_millis(),
            ttl_ms: g.ttl_ms,
        }),
        AcquireOutcome::Held {
            current_token,
            remaining_ms,
        } => O::Held(v1::Held {
            current_token: current_token.get(),
            remaining_ms: *remaining_ms,
        }),
        AcquireOutcome::Ended(reason) => {
            let (reason, current_token) = lost_reason_parts(*reason);
            O::Ended(v1::Ended {
                reason: reason as i32,
                current_token,
            })
        }
        AcquireOutcome::WaitQueueFull { max_waiters } => {
            return Err(Status::resource_exhausted(format!(
                "wait_ms: the resource already has the maximum of {max_waiters} waiters; \
                 retry later or acquire without waiting"
            )))
        }
        AcquireOutcome::CapacityReached { bound, limit } => {
            return Err(capacity_reached(*bound, *limit))
        }
        AcquireOutcome::TokensExhausted { limit } => {
            return Err(tokens_exhausted(resource, *limit))
        }
        AcquireOutcome::Waiting { .. } => {
            return Err(Status::unavailable(
                "acquire: still waiting, the outcome is unknown; retry with the same owner_id",
            ))
        }
    };
    Ok(v1::AcquireResponse {
        outcome: Some(outcome),
        cluster_time_ms: now.as_millis(),
        wall_time_unix_ms: 0, // set by the server: `WallTimed`
    })
}

/// The reply to an acquire in a session: an acquire's reply, or the end of
/// the session (an answer) or a refusal (an error).
pub fn acquire_in_session_reply(
    outcome: &AcquireInSessionOutcome,
    resource: &str,
    now: ClusterTime,
) -> Result<v1::AcquireResponse, Status> {
    match outcome {
        AcquireInSessionOutcome::Acquire(o) => acquire_reply(o, resource, now),
        AcquireInSessionOutcome::SessionRefused(r) => match session_refused(*r) {
            None => Ok(v1::AcquireResponse {
                outcome: Some(v1::acquire_response::Outcome::SessionGone(
                    v1::SessionGone {},
                )),
                cluster_time_ms: now.as_millis(),
                wall_time_unix_ms: 0, // set by the server: `WallTimed`
            }),
            Some(status) => Err(status),
        },
    }
}

/// The reply to a renew.
pub fn renew_reply(outcome: &RenewOutcome, now: ClusterTime) -> Result<v1::RenewResponse, Status> {
    use v1::renew_response::Outcome as O;
    let outcome = match outcome {
        RenewOutcome::Renewed { expires_at, ttl_ms } => O::Renewed(v1::Renewed {
            expires_at_ms: expires_at.as_millis(),
            ttl_ms: *ttl_ms,
        }),
        RenewOutcome::Lost(reason) => {
            let (reason, current_token) = lost_reason_parts(*reason);
            O::Lost(v1::Lost {
                reason: reason as i32,
                current_token,
            })
        }
        RenewOutcome::KeptBySession => {
            return Err(Status::failed_precondition(
                "the lease lives with its session and has no expiry of its own: keep the \
                 session alive (KeepAlive) instead of renewing the lease",
            ))
        }
    };
    Ok(v1::RenewResponse {
        outcome: Some(outcome),
        cluster_time_ms: now.as_millis(),
        wall_time_unix_ms: 0, // set by the server: `WallTimed`
    })
}

/// The reply to a release.
pub fn release_reply(outcome: &ReleaseOutcome, now: ClusterTime) -> v1::ReleaseResponse {
    use v1::release_response::Outcome as O;
    let outcome = match outcome {
        ReleaseOutcome::Released => O::Released(v1::Released {}),
        ReleaseOutcome::NotHolder(reason) => {
            let (reason, current_token) = lost_reason_parts(*reason);
            O::NotHolder(v1::NotHolder {
                reason: reason as i32,
                current_token,
            })
        }
    };
    v1::ReleaseResponse {
        outcome: Some(outcome),
        cluster_time_ms: now.as_millis(),
        wall_time_unix_ms: 0, // set by the server: `WallTimed`
    }
}

/// The reply to a describe.
pub fn describe_reply(d: &Description, now: ClusterTime) -> v1::DescribeResponse {
    v1::DescribeResponse {
        last_token: d.last_token.map_or(0, Token::get),
        held: d.held,
        remaining_ms: d.remaining_ms,
        waiters: d.waiters,
        cluster_time_ms: now.as_millis(),
        wall_time_unix_ms: 0, // set by the server: `WallTimed`
        label: String::new(), // set by the server from the table
    }
}

/// A validated check: the resource, the token and, when asked, the owner id
/// the token's lease must have been granted to.
pub type TokenCheck = (ResourceName, Token, Option<OwnerId>);

/// A validated (resource, token[, owner id]) check.
///
/// ```
/// use fenced_proto::{validate_check, v1::ValidateTokenRequest};
/// let req = ValidateTokenRequest { resource: b"r".to_vec(), token: 1, owner_id: vec![7; 3] };
/// assert_eq!(validate_check(&req).unwrap_err().field(), "owner_id");
/// ```
pub fn validate_check(req: &v1::ValidateTokenRequest) -> Result<TokenCheck, InvalidArgument> {
    Ok((
        ResourceName::from_bytes(&req.resource)?,
        Token::new(req.token)?,
        (!req.owner_id.is_empty())
            .then(|| OwnerId::from_bytes(&req.owner_id))
            .transpose()?,
    ))
}

/// The validated checks of a batch: 1 to [`fenced_core::MAX_VALIDATE_BATCH`].
/// A bad check is named by its index (`checks[3].token`).
///
/// ```
/// use fenced_proto::{validate_checks, v1::ValidateTokensRequest};
/// let err = validate_checks(&ValidateTokensRequest { checks: vec![] }).unwrap_err();
/// assert_eq!(err.field(), "checks");
/// ```
pub fn validate_checks(
    req: &v1::ValidateTokensRequest,
) -> Result<Vec<TokenCheck>, InvalidArgument> {
    let max = fenced_core::MAX_VALIDATE_BATCH;
    let n = req.checks.len();
    if n == 0 || n > max {
        return Err(InvalidArgument::new(
            "checks",
            format!("must hold 1 to {max} pairs, got {n}"),
        ));
    }
    req.checks
        .iter()
        .enumerate()
        .map(|(i, c)| {
            validate_check(c)
                .map_err(|e| InvalidArgument::new("checks", format!("checks[{i}].{e}")))
        })
        .collect()
}

/// The wire form of a token's state. `owner_matches`: `None` when no owner
/// id was asked about, else whether the token's lease is that owner's; a
/// current lease of another owner answers OWNER_MISMATCH.
///
/// ```
/// use fenced_core::{ClusterTime, Token, TokenState, Validation};
/// use fenced_proto::{validate_reply, v1};
/// let v = Validation { state: TokenState::Current { remaining_ms: 5 }, current_token: Token::new(3).ok() };
/// let now = ClusterTime::ZERO;
/// assert_eq!(validate_reply(&v, None, now).state, v1::TokenState::Current as i32);
/// let mismatch = validate_reply(&v, Some(false), now);
/// assert_eq!(mismatch.state, v1::TokenState::OwnerMismatch as i32);
/// assert_eq!((mismatch.remaining_ms, mismatch.owner_checked), (0, true));
/// ```
pub fn validate_reply(
    v: &Validation,
    owner_matches: Option<bool>,
    now: ClusterTime,
) -> v1::ValidateTokenResponse {
    let (state, remaining_ms) = match v.state {
        TokenState::Current { .. } if owner_matches == Some(false) => {
            (v1::TokenState::OwnerMismatch, 0)
        }
        TokenState::Current { remaining_ms } => (v1::TokenState::Current, remaining_ms),
        TokenState::Superseded => (v1::TokenState::Superseded, 0),
        TokenState::Expired => (v1::TokenState::Expired, 0),
        TokenState::Released => (v1::TokenState::Released, 0),
        TokenState::Unknown => (v1::TokenState::Unknown, 0),
    };
    v1::ValidateTokenResponse {
        state: state as i32,
        current_token: v.current_token.map_or(0, Token::get),
        remaining_ms,
        cluster_time_ms: now.as_millis(),
        owner_checked: owner_matches.is_some(),
    }
}

/// The validated resource of a history request and its limit: 0 means all
/// kept, else 1 to [`fenced_core::MAX_HISTORY_PER_RESOURCE`].
pub fn history_request(req: &v1::HistoryRequest) -> Result<(ResourceName, usize), InvalidArgument> {
    let resource = ResourceName::from_bytes(&req.resource)?;
    let max = fenced_core::MAX_HISTORY_PER_RESOURCE;
    let limit = usize::try_from(req.limit).unwrap_or(usize::MAX);
    if limit > max {
        return Err(InvalidArgument::new(
            "limit",
            format!("must be 0 (all kept) to {max}, got {limit}"),
        ));
    }
    Ok((resource, if limit == 0 { max } else { limit }))
}

/// The wire form of how a lease ended.
pub fn event_kind(kind: ChangeKind) -> v1::EventKind {
    match kind {
        ChangeKind::Granted => v1::EventKind::Granted,
        ChangeKind::Released => v1::EventKind::Released,
        ChangeKind::Expired => v1::EventKind::Expired,
        ChangeKind::Superseded => v1::EventKind::Superseded,
    }
}

/// The wire form of a resource's remembered grants, with the leader's wall
/// clock at each grant and end where known.
pub fn history_reply(entries: &[DatedHistoryEntry], now: ClusterTime) -> v1::HistoryResponse {
    v1::HistoryResponse {
        entries: entries
            .iter()
            .map(|dated| {
                let e = &dated.entry;
                v1::HistoryEntry {
                    token: e.token.get(),
                    owner_id: e.owner_id.as_bytes().to_vec(),
                    granted_at_ms: e.granted_at.as_millis(),
                    ended_at_ms: e.end.map_or(0, |end| end.at.as_millis()),
                    ended: e
                        .end
                        .map_or(v1::EventKind::Unspecified, |end| event_kind(end.how))
                        as i32,
                    granted_at_unix_ms: dated.granted_at_unix_ms.unwrap_or(0),
                    ended_at_unix_ms: dated.ended_at_unix_ms.unwrap_or(0),
                }
            })
            .collect(),
        cluster_time_ms: now.as_millis(),
        wall_time_unix_ms: 0, // set by the server: `WallTimed`
    }
}
