//! Conversions for the `Kv` service (proto/fenced/v1/kv.proto): fenced
//! writes from the wire, checked; outcomes to replies.

use fenced_core::{
    ClusterTime, Command, InvalidArgument, KvBound, KvEntry, KvKey, KvRefusal, KvValue, Limits,
    LostReason, Outcome, OwnerId, ResourceName, Token,
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
        owner: OwnerId::from_bytes(&req.owner_id)?,
        token: Token::new(req.token)?,
        bounds: limits.kv_bounds(),
    })
}

/// A validated [`Command::KvDelete`] from the wire.
pub fn kv_delete_command(req: &v1::KvDeleteRequest) -> Result<Command, InvalidArgument> {
    Ok(Command::KvDelete {
        key: KvKey::from_bytes(&req.key)?,
        resource: ResourceName::from_bytes(&req.resource)?,
        owner: OwnerId::from_bytes(&req.owner_id)?,
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
        KvBound::Keys => "keys",
        KvBound::TotalBytes => "bytes of keys and values",
    };
    Status::resource_exhausted(format!(
        "{}={limit}: the fenced store would hold more than {limit} {what}; \
         delete keys or raise the setting",
        bound.setting()
    ))
}

fn refused(refusal: KvRefusal) -> Result<v1::KvRefused, Status> {
    use v1::KvRefusalReason as R;
    let (reason, current_token) = match refusal {
        KvRefusal::Lease(LostReason::Expired) => (R::Expired, 0),
        KvRefusal::Lease(LostReason::Released) => (R::Released, 0),
        KvRefusal::Lease(LostReason::Superseded { current_token }) => {
            (R::Superseded, current_token.get())
        }
        KvRefusal::Lease(LostReason::Unknown) => (R::Unknown, 0),
        KvRefusal::KeyHasNewerToken { key_token } => (R::KeyHasNewerToken, key_token.get()),
        KvRefusal::Bound { bound, limit } => return Err(kv_bound_reached(bound, limit)),
    };
    Ok(v1::KvRefused {
        reason: reason as i32,
        current_token,
    })
}

/// A write's outcome: applied, or refused with why.
fn written(outcome: &Outcome, rpc: &str) -> Result<Result<v1::KvApplied, v1::KvRefused>, Status> {
    match outcome {
        Outcome::KvApplied { revision, existed } => Ok(Ok(v1::KvApplied {
            revision: *revision,
            existed: *existed,
        })),
        Outcome::KvRefused(r) => refused(*r).map(Err),
        other => Err(Status::internal(format!(
            "{rpc}: unexpected outcome {other:?}"
        ))),
    }
}

/// The reply to a put.
pub fn kv_put_reply(outcome: &Outcome, now: ClusterTime) -> Result<v1::KvPutResponse, Status> {
    use v1::kv_put_response::Outcome as O;
    Ok(v1::KvPutResponse {
        outcome: Some(match written(outcome, "put")? {
            Ok(applied) => O::Applied(applied),
            Err(refused) => O::Refused(refused),
        }),
        cluster_time_ms: now.as_millis(),
    })
}

/// The reply to a delete.
pub fn kv_delete_reply(
    outcome: &Outcome,
    now: ClusterTime,
) -> Result<v1::KvDeleteResponse, Status> {
    use v1::kv_delete_response::Outcome as O;
    Ok(v1::KvDeleteResponse {
        outcome: Some(match written(outcome, "delete")? {
            Ok(applied) => O::Applied(applied),
            Err(refused) => O::Refused(refused),
        }),
        cluster_time_ms: now.as_millis(),
    })
}

/// The reply to a get: the value and the write that put it there.
pub fn kv_get_reply(entry: Option<&KvEntry>, now: ClusterTime) -> v1::KvGetResponse {
    match entry {
        None => v1::KvGetResponse {
            cluster_time_ms: now.as_millis(),
            ..Default::default()
        },
        Some(e) => v1::KvGetResponse {
            found: true,
            value: e.value.as_bytes().to_vec(),
            resource: e.resource.as_str().to_owned(),
            token: e.token.get(),
            revision: e.revision,
            cluster_time_ms: now.as_millis(),
        },
    }
}
