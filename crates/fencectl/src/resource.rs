//! `fencectl resource`: write to and read from a `fenced-resource` service.

use std::time::Duration;

use clap::{Subcommand, ValueEnum};
use fenced_client::{ClientError, TlsOptions};
use fenced_proto::v1::{
    fenced_resource_client::FencedResourceClient, put_response, FenceMode, GetRequest, PutRequest,
    RejectReason,
};
use serde_json::json;
use tonic::{
    metadata::{Ascii, MetadataValue},
    transport::{Certificate, Channel, ClientTlsConfig, Identity},
    Code, Request, Status,
};

use crate::{owner_id, Report};

/// How long one call to the service may take.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Clone, Copy, ValueEnum)]
pub(crate) enum ModeArg {
    #[value(name = "allow_equal", alias = "allow-equal")]
    AllowEqual,
    Strict,
}

#[derive(Subcommand)]
pub(crate) enum ResourceCmd {
    /// Write VALUE to KEY if TOKEN is not older than the highest token the
    /// service accepted for it and, unless the service runs standalone, the
    /// current lease of OWNER_ID on the cluster. Exit 3 if the write is
    /// rejected (final), 5 if refused by authentication or permission.
    #[command(after_help = "Examples:
  fencectl resource put invoice-7 --token 4 --owner-id $OWNER --value paid
  fencectl resource put report --resource reports --token 4 --owner-id $OWNER \\
    --value v2 --expected-version 3 --endpoint 127.0.0.1:7300")]
    Put {
        /// The key, 1 to 256 bytes of UTF-8.
        key: String,
        /// The fencing token of your lease.
        #[arg(long)]
        token: u64,
        /// The owner id of your lease.
        #[arg(long = "owner-id", alias = "owner")]
        owner_id: String,
        /// The value to write, at most 1 MiB.
        #[arg(long)]
        value: String,
        /// The lock resource the token was granted for; default KEY.
        #[arg(long)]
        resource: Option<String>,
        /// Equality contract: allow_equal (>=) or strict (>); default the
        /// key's own.
        #[arg(long, value_enum)]
        mode: Option<ModeArg>,
        /// A retry with the same idempotency key (at most 128 bytes) is
        /// applied once.
        #[arg(long)]
        idempotency_key: Option<String>,
        /// Your name for the operation, for logs and rejections (at most
        /// 128 bytes).
        #[arg(long)]
        operation_id: Option<String>,
        /// Write only if the key is at this version (0: does not exist).
        #[arg(long)]
        expected_version: Option<u64>,
        /// Orders writes of one owner under one token.
        #[arg(long)]
        sequence: Option<u64>,
        /// The service, host:port or http://host:port.
        #[arg(
            long,
            env = "FENCED_RESOURCE_ENDPOINT",
            default_value = "127.0.0.1:7300"
        )]
        endpoint: String,
    },
    /// Show KEY's value, highest accepted token and version.
    #[command(after_help = "Examples:
  fencectl resource get invoice-7
  fencectl resource get invoice-7 --endpoint 127.0.0.1:7300 --json")]
    Get {
        /// The key, 1 to 256 bytes of UTF-8.
        key: String,
        /// The service, host:port or http://host:port.
        #[arg(
            long,
            env = "FENCED_RESOURCE_ENDPOINT",
            default_value = "127.0.0.1:7300"
        )]
        endpoint: String,
    },
}

/// "rejected KEY: why", from the server's message, which may itself name
/// the key or say "rejected".
fn rejected_text(key: &str, message: &str) -> String {
    let why = message
        .split_once(" rejected: ")
        .map(|(_, why)| why)
        .or_else(|| message.strip_prefix(&format!("{key}: ")))
        .unwrap_or(message);
    format!("rejected {key}: {why}")
}

fn client_error(s: Status) -> ClientError {
    match s.code() {
        Code::InvalidArgument => ClientError::InvalidArgument(s.message().to_string()),
        Code::Unauthenticated => ClientError::Unauthenticated(s.message().to_string()),
        Code::PermissionDenied => ClientError::PermissionDenied(s.message().to_string()),
        Code::ResourceExhausted => ClientError::ResourceExhausted(s.message().to_string()),
        Code::Unavailable | Code::DeadlineExceeded | Code::Cancelled | Code::Unknown => {
            ClientError::Unavailable(s.message().to_string())
        }
        _ => ClientError::Server(format!("{:?}: {}", s.code(), s.message())),
    }
}

fn connect(
    endpoint: &str,
    tls: Option<&TlsOptions>,
) -> Result<FencedResourceClient<Channel>, ClientError> {
    let scheme = if tls.is_some() { "https" } else { "http" };
    let url = if endpoint.contains("://") {
        endpoint.to_string()
    } else {
        format!("{scheme}://{endpoint}")
    };
    let bad = |reason: String| ClientError::Endpoint {
        endpoint: endpoint.to_string(),
        reason,
    };
    let mut channel = Channel::from_shared(url).map_err(|e| bad(e.to_string()))?;
    if let Some(tls) = tls {
        let read = |p: &std::path::PathBuf| {
            std::fs::read(p).map_err(|e| ClientError::Tls(format!("{}: {e}", p.display())))
        };
        let ca = tls
            .ca
            .as_ref()
            .ok_or_else(|| ClientError::Tls("https:// needs the CA: --cacert".into()))?;
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(read(ca)?));
        if let (Some(cert), Some(key)) = (&tls.cert, &tls.key) {
            config = config.identity(Identity::from_pem(read(cert)?, read(key)?));
        }
        channel = channel
            .tls_config(config)
            .map_err(|e| ClientError::Tls(e.to_string()))?;
    }
    let channel = channel
        .timeout(CALL_TIMEOUT)
        .connect_timeout(CALL_TIMEOUT)
        .connect_lazy();
    Ok(FencedResourceClient::new(channel))
}

/// A request carrying the bearer token, when one was given.
fn request<T>(body: T, bearer: Option<&MetadataValue<Ascii>>) -> Request<T> {
    let mut req = Request::new(body);
    if let Some(b) = bearer {
        req.metadata_mut().insert("authorization", b.clone());
    }
    req
}

pub(crate) async fn execute(
    command: ResourceCmd,
    tls: Option<&TlsOptions>,
    bearer: Option<&str>,
) -> Result<Report, ClientError> {
    let bearer = bearer
        .map(|t| {
            MetadataValue::try_from(format!("Bearer {t}"))
                .map_err(|_| ClientError::InvalidArgument("token: must be printable ASCII".into()))
        })
        .transpose()?;
    let bearer = bearer.as_ref();
    match command {
        ResourceCmd::Put {
            key,
            token,
            owner_id: owner,
            value,
            resource,
            mode,
            idempotency_key,
            operation_id,
            expected_version,
            sequence,
            endpoint,
        } => {
            let owner = owner_id(&owner)?;
            let request = PutRequest {
                resource: resource.unwrap_or_else(|| key.clone()).into_bytes(),
                key: key.clone().into_bytes(),
                token: Some(token),
                owner_id: owner.as_bytes().to_vec(),
                value: value.into_bytes(),
                mode: match mode {
                    None => FenceMode::Unspecified,
                    Some(ModeArg::AllowEqual) => FenceMode::AllowEqual,
                    Some(ModeArg::Strict) => FenceMode::Strict,
                } as i32,
                idempotency_key: idempotency_key.unwrap_or_default(),
                operation_id: operation_id.unwrap_or_default(),
                expected_version,
                sequence,
            };
            let reply = match connect(&endpoint, tls)?
                .put(self::request(request, bearer))
                .await
            {
                Ok(reply) => reply.into_inner(),
                // The cluster said the token is not current: an expected,
                // final refusal, like a rejection.
                Err(s) if s.code() == Code::FailedPrecondition => {
                    return Ok(Report {
                        value: json!({"status": "rejected", "key": key, "token": token,
                            "reason": "not_current", "message": s.message()}),
                        text: rejected_text(&key, s.message()),
                        code: 3,
                    })
                }
                Err(s) => return Err(client_error(s)),
            };
            Ok(match reply.outcome {
                Some(put_response::Outcome::Accepted(a)) => Report {
                    value: json!({"status": "accepted", "key": key, "token": token,
                        "highest_token": a.token, "version": a.version}),
                    text: format!("accepted {key}: token {token}, version {}", a.version),
                    code: 0,
                },
                Some(put_response::Outcome::AlreadyApplied(a)) => Report {
                    value: json!({"status": "already_applied", "key": key, "token": token,
                        "highest_token": a.token, "version": a.version}),
                    text: format!(
                        "already applied {key}: token {token} already wrote version {}",
                        a.version
                    ),
                    code: 0,
                },
                Some(put_response::Outcome::Rejected(r)) => {
                    let reason = RejectReason::try_from(r.reason)
                        .map(|r| {
                            r.as_str_name()
                                .trim_start_matches("REJECT_REASON_")
                                .to_lowercase()
                        })
                        .unwrap_or_else(|_| format!("unknown ({})", r.reason));
                    Report {
                        value: json!({"status": "rejected", "key": key, "token": token,
                            "highest_token": r.highest_token, "reason": reason,
                            "owner_id": owner.to_string(), "operation_id": r.operation_id,
                            "message": r.message}),
                        text: rejected_text(&key, &r.message),
                        code: 3,
                    }
                }
                None => return Err(ClientError::Server("reply without an outcome".into())),
            })
        }
        ResourceCmd::Get { key, endpoint } => {
            let reply = connect(&endpoint, tls)?
                .get(request(
                    GetRequest {
                        key: key.clone().into_bytes(),
                    },
                    bearer,
                ))
                .await
                .map_err(client_error)?
                .into_inner();
            if !reply.found {
                return Ok(Report {
                    value: json!({"key": key, "found": false}),
                    text: format!("{key}: never written"),
                    code: 0,
                });
            }
            let value = String::from_utf8_lossy(&reply.value).into_owned();
            let mode = FenceMode::try_from(reply.mode)
                .map(|m| {
                    m.as_str_name()
                        .trim_start_matches("FENCE_MODE_")
                        .to_lowercase()
                })
                .unwrap_or_default();
            Ok(Report {
                text: format!(
                    "{key}: token {}, version {}, resource {}, {mode}: {value}",
                    reply.token, reply.version, reply.resource
                ),
                value: json!({"key": key, "found": true, "token": reply.token,
                    "highest_token": reply.token, "version": reply.version, "value": value,
                    "resource": reply.resource, "mode": mode}),
                code: 0,
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::rejected_text;

    #[test]
    fn a_rejection_says_rejected_once() {
        assert_eq!(
            rejected_text(
                "inv",
                "write to key \"inv\" with token 1 by owner o (operation -) rejected: a newer \
                 owner wrote with token 2"
            ),
            "rejected inv: a newer owner wrote with token 2"
        );
        assert_eq!(
            rejected_text("inv", "inv: token 1 is not current on the lock cluster"),
            "rejected inv: token 1 is not current on the lock cluster"
        );
        assert_eq!(rejected_text("inv", "busy"), "rejected inv: busy");
    }
}
