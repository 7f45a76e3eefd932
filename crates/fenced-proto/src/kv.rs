//! Conversions for the `Kv` service (proto/fenced/v1/kv.proto): fenced
//! writes from the wire, checked; outcomes to replies.

use fenced_core::{
    ClusterTime, Command, InvalidArgument, KvBound, KvDeleteOutcome, KvEntry, KvKey, KvPutOutcome,
    KvRefusal, KvValue, Limits, LostReason, OwnerId, ResourceName, Token,
};
use tonic::Status;

use crate::v1;

/// A validated [`Command::KvPut`] from the wire, carrying the store bounds
/// of `limits`.
///
/// ```
/// use fenced_core::Limits;
/// use fenced_proto::{kv_put_command, v1::KvPutRequest};
/// let req = KvPutRequest {
///     key: b"job/state".to_vec(),
///     value: vec![0; 65_537],
///     resource: b"job".to_vec(),
///     owner_id: vec![7; 16],
///     token: 3,
/// };
/// let err = kv_put_command(&req, &Limits::default()).unwrap_err();
/// assert_eq!(err.to_string(), "value: must be at most 65536 bytes, got 65537");
/// ```
pub fn kv_put_command(req: &v1::KvPutRequest, limits: &Limits) -> Result<Command, InvalidArgument> {
    Ok(Command::KvPut {
        key: KvKey::from_bytes(&req.key)?,
        value: KvValue::new(req.value.as_slice())?,
        resource: ResourceName::from_bytes(&req.resource)?,
        owner_id: OwnerId::from_bytes(&req.owner_id)?,
        token: Token::new(req.token)?,
        bounds: limits.kv_bounds(),
    })
}

/// A validated [`Command::KvDelete`] from the wire.
pub fn kv_delete_command(req: &v1::KvDeleteRequest) -> Result<Command, InvalidArgument> {
    Ok(Command::KvDelete {
        key: KvKey::from_bytes(&req.key)?,
        resource: ResourceName::from_bytes(&req.resource)?,
        owner_id: OwnerId::from_bytes(&req.owner_id)?,
        token: Token::new(req.token)?,
    })
}

/// The validated key of a get request.
pub fn kv_get_key(req: &v1::KvGetRequest) -> Result<KvKey, InvalidArgument> {
    KvKey::from_bytes(&req.key)
}

/// RESOURCE_EXHAUSTED naming the store bound that refused a put.
pub fn kv_bound_reached(bound: KvBound, limit: u64) -> Status {
    let what = match bound {
        KvBound::Keys => "keys (tombstones of deleted keys included)",
        KvBound::TotalBytes => "bytes of keys and values (tombstoned keys included)",
        KvBound::Revisions => {
            return Status::resource_exhausted(format!(
                "kv revision: the store's revision counter is at its end ({limit}); \
                 nothing was written"
            ))
        }
    };
    Status::resource_exhausted(format!(
        "{}={limit}: the fenced store would hold more than {limit} {what}; \
         delete keys or raise the setting",
        bound.setting()
    ))
}

fn refused(refusal: &KvRefusal) -> v1::KvRefused {
    use v1::KvRefusalReason as R;
    let mut key_resource = String::new();
    let (reason, current_token) = match refusal {
        KvRefusal::Lease(LostReason::Expired) => (R::Expired, 0),
        KvRefusal::Lease(LostReason::Released) => (R::Released, 0),
        KvRefusal::Lease(LostReason::Superseded { current_token }) => {
            (R::Superseded, current_token.get())
        }
        KvRefusal::Lease(LostReason::Unknown) => (R::Unknown, 0),
        KvRefusal::KeyHasNewerToken { key_token } => (R::KeyHasNewerToken, key_token.get()),
        KvRefusal::KeyOfAnotherResource { key_resource: r } => {
            key_resource = r.as_str().to_owned();
            (R::KeyOfAnotherResource, 0)
        }
    };
    v1::KvRefused {
        reason: reason as i32,
        current_token,
        key_resource,
    }
}

/// A refusal from the wire. A code this build does not know, or a token
/// of 0 (or a resource name that is not one) where one is due, reads as an
/// unknown lease.
pub fn kv_refusal_from_wire(refused: &v1::KvRefused) -> KvRefusal {
    use v1::KvRefusalReason as R;
    let token = Token::new(refused.current_token);
    match (R::try_from(refused.reason), token) {
        (Ok(R::Expired), _) => KvRefusal::Lease(LostReason::Expired),
        (Ok(R::Released), _) => KvRefusal::Lease(LostReason::Released),
        (Ok(R::Superseded), Ok(current_token)) => {
            KvRefusal::Lease(LostReason::Superseded { current_token })
        }
        (Ok(R::KeyHasNewerToken), Ok(key_token)) => KvRefusal::KeyHasNewerToken { key_token },
        (Ok(R::KeyOfAnotherResource), _) => match ResourceName::new(&refused.key_resource) {
            Ok(key_resource) => KvRefusal::KeyOfAnotherResource { key_resource },
            Err(_) => KvRefusal::Lease(LostReason::Unknown),
        },
        _ => KvRefusal::Lease(LostReason::Unknown),
    }
}

fn applied(revision: u64, existed: bool) -> v1::KvApplied {
    v1::KvApplied { revision, existed }
}

/// The reply to a put; a full store is RESOURCE_EXHAUSTED naming its setting.
pub fn kv_put_reply(outcome: &KvPutOutcome, now: ClusterTime) -> Result<v1::KvPutResponse, Status> {
    use v1::kv_put_response::Outcome as O;
    let outcome = match outcome {
        KvPutOutcome::Applied { revision, existed } => O::Applied(applied(*revision, *existed)),
        KvPutOutcome::Refused(r) => O::Refused(refused(r)),
        KvPutOutcome::BoundReached { bound, limit } => {
            return Err(kv_bound_reached(*bound, *limit))
        }
    };
    Ok(v1::KvPutResponse {
        outcome: Some(outcome),
        cluster_time_ms: now.as_millis(),
        wall_time_unix_ms: 0, // set by the server: `WallTimed`
    })
}

/// The reply to a delete; a revision counter at its end is
/// RESOURCE_EXHAUSTED.
pub fn kv_delete_reply(
    outcome: &KvDeleteOutcome,
    now: ClusterTime,
) -> Result<v1::KvDeleteResponse, Status> {
    use v1::kv_delete_response::Outcome as O;
    let outcome = match outcome {
        KvDeleteOutcome::Applied { revision, existed } => O::Applied(applied(*revision, *existed)),
        KvDeleteOutcome::Refused(r) => O::Refused(refused(r)),
        KvDeleteOutcome::BoundReached { bound, limit } => {
            return Err(kv_bound_reached(*bound, *limit))
        }
    };
    Ok(v1::KvDeleteResponse {
        outcome: Some(outcome),
        cluster_time_ms: now.as_millis(),
        wall_time_unix_ms: 0, // set by the server: `WallTimed`
    })
}

/// The reply to a get: the value and the write that put it there.
pub fn kv_get_reply(entry: Option<&KvEntry>, now: ClusterTime) -> v1::KvGetResponse {
    match entry {
        None => v1::KvGetResponse {
            cluster_time_ms: now.as_millis(),
            wall_time_unix_ms: 0, // set by the server: `WallTimed`
            ..Default::default()
        },
        Some(e) => v1::KvGetResponse {
            found: true,
            value: e.value.as_bytes().to_vec(),
            resource: e.resource.as_str().to_owned(),
            token: e.token.get(),
            revision: e.revision,
            cluster_time_ms: now.as_millis(),
            wall_time_unix_ms: 0, // set by the server: `WallTimed`
        },
    }
}
