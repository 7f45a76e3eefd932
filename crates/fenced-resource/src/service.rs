//! The gRPC service `fenced.v1.FencedResource` over a [`FenceStore`]: the
//! gateway that requires resource, token and owner on every write.
//!
//! The three may come as request fields or as metadata (`x-fencing-token`,
//! `x-fencing-resource`, `x-fencing-owner`), so a proxy can add them to a
//! request it forwards. Writes run on tokio's blocking pool; the store
//! serialises them per key and syncs each one before it is answered.
//!
//! With auth on (the lock nodes' files and identities, `fenced_server::security::auth`),
//! a put needs `lock` on its lock resource and a get `read` on the key's
//! bound resource. With the cluster check on, a put's token must be the
//! current lease of its owner id on the lock cluster ([`crate::current`]).

use std::sync::Arc;

use fenced_core::{InvalidArgument, OwnerId, ResourceName, Token};
use fenced_proto::v1::{
    self, fenced_resource_server::FencedResourceServer, put_response, FenceMode, PutAccepted,
    PutAlreadyApplied, PutRejected,
};
use fenced_server::security::auth::{Auth, Permission};
use tonic::{metadata::MetadataMap, Request, Response, Status};

use crate::{
    current::{refusal_status, CurrentCheck, Refusal},
    limits::check_key,
    FenceStore, Mode, RejectReason, Rejection, StoreError, Write, WriteOutcome,
};

/// Metadata carrying the fencing token, as decimal text.
///
/// ```
/// assert_eq!(fenced_resource::service::TOKEN_METADATA, "x-fencing-token");
/// ```
pub const TOKEN_METADATA: &str = "x-fencing-token";
/// Metadata carrying the lock resource name.
///
/// ```
/// assert_eq!(fenced_resource::service::RESOURCE_METADATA, "x-fencing-resource");
/// ```
pub const RESOURCE_METADATA: &str = "x-fencing-resource";
/// Metadata carrying the owner id, as UUID text.
///
/// ```
/// assert_eq!(fenced_resource::service::OWNER_METADATA, "x-fencing-owner");
/// ```
pub const OWNER_METADATA: &str = "x-fencing-owner";

/// The service. Cheap to clone.
///
/// ```no_run
/// # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
/// use std::sync::Arc;
/// use fenced_resource::{service::ResourceService, FenceStore};
/// let store = Arc::new(FenceStore::open("/var/lib/fenced-resource")?);
/// tonic::transport::Server::builder()
///     .add_service(ResourceService::new(store).into_server())
///     .serve("127.0.0.1:7300".parse()?)
///     .await?;
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct ResourceService {
    store: Arc<FenceStore>,
    /// Set: every write needs a token still current, for its owner id, on
    /// the lock cluster.
    current: Option<CurrentCheck>,
    /// Off unless auth files were given.
    auth: Arc<Auth>,
}

impl ResourceService {
    /// A service over `store`.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = std::sync::Arc::new(fenced_resource::FenceStore::open(dir.path())?);
    /// let _svc = fenced_resource::service::ResourceService::new(store);
    /// # Ok::<(), fenced_resource::StoreError>(())
    /// ```
    pub fn new(store: Arc<FenceStore>) -> Self {
        ResourceService {
            store,
            current: None,
            auth: Arc::new(Auth::disabled()),
        }
    }

    /// The same service authenticating and authorizing every call with
    /// `auth` (a put needs `lock`, a get `read`, on the lock resource).
    pub fn with_auth(self, auth: Arc<Auth>) -> Self {
        Self { auth, ..self }
    }

    /// The same service requiring that a write's token is the current lease
    /// of its owner id (asked of the lock cluster before the write is
    /// applied; refused when it cannot answer).
    pub fn with_current_check(self, check: CurrentCheck) -> Self {
        Self {
            current: Some(check),
            ..self
        }
    }

    /// The tonic server to add to a router.
    ///
    /// ```
    /// let dir = tempfile::tempdir()?;
    /// let store = std::sync::Arc::new(fenced_resource::FenceStore::open(dir.path())?);
    /// let _server = fenced_resource::service::ResourceService::new(store).into_server();
    /// # Ok::<(), fenced_resource::StoreError>(())
    /// ```
    pub fn into_server(self) -> FencedResourceServer<Self> {
        FencedResourceServer::new(self)
    }
}

fn metadata_text<'a>(
    md: &'a MetadataMap,
    name: &str,
    field: &'static str,
) -> Result<Option<&'a str>, InvalidArgument> {
    md.get(name)
        .map(|v| {
            v.to_str().map_err(|_| {
                InvalidArgument::new(field, format!("{name} metadata must be visible ASCII"))
            })
        })
        .transpose()
}

fn missing(field: &'static str, metadata: &str) -> InvalidArgument {
    InvalidArgument::new(
        field,
        format!("is required on every write (the request field or {metadata} metadata)"),
    )
}

/// Builds a validated [`Write`] from a request and its metadata.
///
/// ```
/// use fenced_proto::v1::PutRequest;
/// let mut req = tonic::Request::new(PutRequest { key: b"k".to_vec(), resource: b"k".to_vec(),
///     owner_id: vec![7; 16], value: b"v".to_vec(), ..Default::default() });
/// // no token in the request or the metadata
/// assert_eq!(fenced_resource::service::write_from_request(&req).unwrap_err().field(), "token");
/// req.metadata_mut().insert("x-fencing-token", "42".parse().unwrap());
/// assert_eq!(fenced_resource::service::write_from_request(&req).unwrap().token.get(), 42);
/// ```
pub fn write_from_request(req: &Request<v1::PutRequest>) -> Result<Write, InvalidArgument> {
    let md = req.metadata();
    let body = req.get_ref();
    let key = std::str::from_utf8(&body.key).map_err(|e| {
        InvalidArgument::new(
            "key",
            format!("must be UTF-8, invalid byte at offset {}", e.valid_up_to()),
        )
    })?;
    check_key(key)?;

    let md_resource = metadata_text(md, RESOURCE_METADATA, "resource")?;
    let resource = match (body.resource.is_empty(), md_resource) {
        (false, Some(m)) if m.as_bytes() != body.resource.as_slice() => {
            return Err(InvalidArgument::new(
                "resource",
                format!("the field and {RESOURCE_METADATA} metadata disagree"),
            ))
        }
        (false, _) => ResourceName::from_bytes(&body.resource)?,
        (true, Some(m)) => ResourceName::new(m)?,
        (true, None) => return Err(missing("resource", RESOURCE_METADATA)),
    };

    let md_token = metadata_text(md, TOKEN_METADATA, "token")?
        .map(|t| {
            t.trim().parse::<u64>().map_err(|_| {
                InvalidArgument::new(
                    "token",
                    format!("{TOKEN_METADATA} metadata must be a decimal number, got {t:?}"),
                )
            })
        })
        .transpose()?;
    let token = match (body.token, md_token) {
        (Some(f), Some(m)) if f != m => {
            return Err(InvalidArgument::new(
                "token",
                format!("the field ({f}) and {TOKEN_METADATA} metadata ({m}) disagree"),
            ))
        }
        (Some(t), _) | (None, Some(t)) => Token::new(t)?,
        (None, None) => return Err(missing("token", TOKEN_METADATA)),
    };

    let md_owner = metadata_text(md, OWNER_METADATA, "owner_id")?
        .map(OwnerId::parse)
        .transpose()?;
    let owner = match (body.owner_id.is_empty(), md_owner) {
        (false, m) => {
            let owner = OwnerId::from_bytes(&body.owner_id)?;
            if m.is_some_and(|m| m != owner) {
                return Err(InvalidArgument::new(
                    "owner_id",
                    format!("the field and {OWNER_METADATA} metadata disagree"),
                ));
            }
            owner
        }
        (true, Some(m)) => m,
        (true, None) => return Err(missing("owner_id", OWNER_METADATA)),
    };

    let mode = match FenceMode::try_from(body.mode) {
        Ok(FenceMode::Unspecified) => None,
        Ok(FenceMode::AllowEqual) => Some(Mode::AllowEqual),
        Ok(FenceMode::Strict) => Some(Mode::Strict),
        Err(_) => {
            return Err(InvalidArgument::new(
                "mode",
                format!(
                    "unknown value {}; use FENCE_MODE_ALLOW_EQUAL (1) or FENCE_MODE_STRICT (2)",
                    body.mode
                ),
            ))
        }
    };
    let non_empty = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let write = Write {
        key: key.to_string(),
        resource,
        token,
        owner,
        value: body.value.clone(),
        mode,
        idempotency_key: non_empty(&body.idempotency_key),
        operation_id: non_empty(&body.operation_id),
        expected_version: body.expected_version,
        sequence: body.sequence,
    };
    write.validate()?;
    Ok(write)
}

fn fence_mode(mode: Mode) -> FenceMode {
    match mode {
        Mode::AllowEqual => FenceMode::AllowEqual,
        Mode::Strict => FenceMode::Strict,
    }
}

/// The wire form of a rejection.
///
/// ```
/// use fenced_core::OwnerId;
/// use fenced_resource::{Rejection, RejectReason};
/// let r = Rejection { key: "k".into(), token: 1, highest_token: 2, owner: OwnerId::random(), operation_id: None, reason: RejectReason::StaleToken };
/// let wire = fenced_resource::service::rejected_reply(&r);
/// assert_eq!((wire.token, wire.highest_token), (1, 2));
/// ```
pub fn rejected_reply(r: &Rejection) -> PutRejected {
    let mut wire = PutRejected {
        key: r.key.clone(),
        token: r.token,
        highest_token: r.highest_token,
        owner_id: r.owner.as_bytes().to_vec(),
        operation_id: r.operation_id.clone().unwrap_or_default(),
        message: r.to_string(),
        ..Default::default()
    };
    let reason = match &r.reason {
        RejectReason::StaleToken => v1::RejectReason::StaleToken,
        RejectReason::OwnerMismatch => v1::RejectReason::OwnerMismatch,
        RejectReason::WrongResource { bound } => {
            wire.bound_resource = bound.clone();
            v1::RejectReason::WrongResource
        }
        RejectReason::VersionMismatch { expected, actual } => {
            wire.expected_version = *expected;
            wire.actual_version = *actual;
            v1::RejectReason::VersionMismatch
        }
        RejectReason::StaleSequence { last, presented } => {
            wire.last_sequence = *last;
            wire.presented_sequence = *presented;
            v1::RejectReason::StaleSequence
        }
    };
    wire.reason = reason as i32;
    wire
}

/// The wire form of a write the cluster check refused: final for its token.
fn not_current_reply(write: &Write, cluster_token: u64, message: String) -> PutRejected {
    PutRejected {
        key: write.key.clone(),
        token: write.token.get(),
        owner_id: write.owner.as_bytes().to_vec(),
        operation_id: write.operation_id.clone().unwrap_or_default(),
        reason: v1::RejectReason::NotCurrent as i32,
        message: format!(
            "{}: {message} (cluster's newest token {cluster_token})",
            write.key
        ),
        ..Default::default()
    }
}

fn store_status(e: StoreError) -> Status {
    match e {
        StoreError::InvalidArgument(e) => Status::invalid_argument(e.to_string()),
        StoreError::Storage(m) => {
            Status::unavailable(format!("storage failure, outcome unknown: {m}"))
        }
        e @ StoreError::Corrupt { .. } => Status::data_loss(e.to_string()),
    }
}

#[tonic::async_trait]
impl v1::fenced_resource_server::FencedResource for ResourceService {
    async fn put(
        &self,
        request: Request<v1::PutRequest>,
    ) -> Result<Response<v1::PutResponse>, Status> {
        let write = write_from_request(&request).map_err(|e| {
            tracing::warn!(error = %e, "put refused as invalid");
            Status::invalid_argument(e.to_string())
        })?;
        self.auth.authorize(
            &request,
            false,
            Permission::Lock,
            "put",
            Some(write.resource.as_str()),
        )?;
        if let Some(check) = &self.current {
            match check
                .require(&write.resource, write.token, write.owner)
                .await
            {
                Ok(()) => {}
                Err(Refusal::NotCurrent {
                    current_token,
                    message,
                    ..
                }) => {
                    return Ok(Response::new(v1::PutResponse {
                        outcome: Some(put_response::Outcome::Rejected(not_current_reply(
                            &write,
                            current_token,
                            message,
                        ))),
                    }))
                }
                Err(r) => return Err(refusal_status(&r)),
            }
        }
        let store = self.store.clone();
        let outcome = tokio::task::spawn_blocking(move || store.write(&write))
            .await
            .map_err(|e| Status::internal(format!("write task failed: {e}")))?
            .map_err(store_status)?;
        let outcome = match outcome {
            WriteOutcome::Accepted { token, version } => {
                put_response::Outcome::Accepted(PutAccepted { token, version })
            }
            WriteOutcome::AlreadyApplied { token, version } => {
                put_response::Outcome::AlreadyApplied(PutAlreadyApplied { token, version })
            }
            WriteOutcome::Rejected(r) => put_response::Outcome::Rejected(rejected_reply(&r)),
        };
        Ok(Response::new(v1::PutResponse {
            outcome: Some(outcome),
        }))
    }

    async fn get(
        &self,
        request: Request<v1::GetRequest>,
    ) -> Result<Response<v1::GetResponse>, Status> {
        let key = std::str::from_utf8(&request.get_ref().key)
            .map_err(|e| {
                Status::invalid_argument(format!(
                    "key: must be UTF-8, invalid byte at offset {}",
                    e.valid_up_to()
                ))
            })?
            .to_string();
        check_key(&key).map_err(|e| Status::invalid_argument(e.to_string()))?;
        let store = self.store.clone();
        let lookup = key.clone();
        let current = tokio::task::spawn_blocking(move || store.get(&lookup))
            .await
            .map_err(|e| Status::internal(format!("read task failed: {e}")))?
            .map_err(store_status)?;
        // A bound key is read under its lock resource's grants, an unbound
        // one under its own name's (no answer before the check either way).
        let resource = current
            .as_ref()
            .map_or(key.as_str(), |c| c.resource.as_str());
        self.auth
            .authorize(&request, false, Permission::Read, "get", Some(resource))?;
        Ok(Response::new(match current {
            None => v1::GetResponse::default(),
            Some(c) => v1::GetResponse {
                found: true,
                token: c.token,
                version: c.version,
                value: c.value,
                resource: c.resource,
                mode: fence_mode(c.mode) as i32,
            },
        }))
    }
}
