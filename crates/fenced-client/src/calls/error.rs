//! How a call fails: [`ClientError`], what a status from a node means
//! (refused for good, or worth another try), and the message that names
//! every endpoint tried when none could serve.

use fenced_core::Token;
use tonic::{Code, Status};

/// What went wrong with a call. Expected refusals are not errors.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The request was refused as malformed; the message names the field.
    #[error("invalid request: {0}")]
    InvalidArgument(String),
    /// The server did not accept the credentials: no token, or an unknown
    /// or revoked one.
    #[error("authentication failed: {0}")]
    Unauthenticated(String),
    /// The caller is known but not allowed this call; the message names the
    /// resource and the prefixes granted.
    #[error("{0}")]
    PermissionDenied(String),
    /// A bound was reached (waiters per resource, pending proposals, live
    /// leases or waiters in the whole cluster); the message names the setting.
    #[error("limit reached: {0}")]
    ResourceExhausted(String),
    /// No node could give an answer before the deadline. For an acquire the
    /// outcome is unknown: retry with the SAME owner id.
    #[error("cluster unavailable: {0}")]
    Unavailable(String),
    /// An endpoint is not a valid address.
    #[error("endpoint {endpoint}: {reason}")]
    Endpoint { endpoint: String, reason: String },
    /// TLS failed (a certificate refused either way, a wrong CA); the
    /// message says what to check. Not retried.
    #[error("{0}")]
    Tls(String),
    /// Any other failure reported by the server.
    #[error("server error: {0}")]
    Server(String),
    /// The lease was lost while its work ran.
    #[error("lease on {resource} (token {token}) lost: {reason}")]
    LeaseLost {
        resource: String,
        token: Token,
        reason: String,
    },
    /// The acquisition attempt's lease ended before its grant reached this
    /// client (a retry after a lost reply arrived too late): nothing is held.
    #[error(
        "acquire on {resource}: the attempt's lease already ended ({reason}); nothing is held"
    )]
    AttemptEnded { resource: String, reason: String },
    /// `lock` waited `wait` and the resource was still held.
    #[error("not granted within the wait: {resource} is held by token {current_token} for {remaining_ms} ms more")]
    NotGranted {
        resource: String,
        current_token: Token,
        remaining_ms: u64,
    },
}

impl ClientError {
    /// Whether trying again later may succeed (the cluster was unreachable or
    /// busy), as opposed to a request that is wrong as it stands.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            ClientError::Unavailable(_) | ClientError::ResourceExhausted(_)
        )
    }
}

/// What to do after an authentication refusal.
pub const TOKEN_HINT: &str = "pass a bearer token (fencectl --token, --token-file or \
    FENCED_TOKEN; the Rust client's Client::with_token); an operator makes one with \
    `fenced auth new-token` and adds its sha256 to the nodes' auth_tokens file";
/// What to do after a permission refusal.
pub const PERMISSION_HINT: &str = "an operator grants roles (lock, read, admin) on resource \
    prefixes in the nodes' auth_policy file";
/// What to do when no node answered at all.
pub const NO_CLUSTER_HINT: &str = "is a cluster running? start one with `fenced dev`, or \
    point --endpoints (FENCED_ENDPOINTS) at its nodes";

pub(crate) fn classify(status: Status) -> Result<Status, ClientError> {
    match status.code() {
        Code::InvalidArgument => Err(ClientError::InvalidArgument(status.message().to_string())),
        Code::Unauthenticated => Err(ClientError::Unauthenticated(format!(
            "{}; {TOKEN_HINT}",
            status
                .message()
                .trim_start_matches("authentication failed: ")
        ))),
        Code::PermissionDenied => Err(ClientError::PermissionDenied(format!(
            "{}; {PERMISSION_HINT}",
            status.message()
        ))),
        Code::ResourceExhausted => {
            Err(ClientError::ResourceExhausted(status.message().to_string()))
        }
        // Worth another try, on this or another node.
        Code::Unavailable
        | Code::DeadlineExceeded
        | Code::Aborted
        | Code::Unknown
        | Code::Cancelled => Ok(status),
        _ => Err(ClientError::Server(format!(
            "{:?}: {}",
            status.code(),
            status.message()
        ))),
    }
}

/// How a call to one endpoint failed, for the error that names them all.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Attempt {
    /// Nothing answered: the connection failed or broke (the text says how).
    NoAnswer(String),
    /// The node answered, but could not serve the call (no leader, say).
    Refused(String),
}

impl Attempt {
    /// Tells apart a status the node sent from one the client made because
    /// the connection failed (it carries the transport error as source).
    pub(crate) fn of(status: &Status) -> Attempt {
        match std::error::Error::source(status) {
            None => Attempt::Refused(status.message().to_string()),
            Some(source) => {
                // The innermost cause says it best ("Connection refused").
                let mut cause: &dyn std::error::Error = source;
                while let Some(next) = cause.source() {
                    cause = next;
                }
                Attempt::NoAnswer(short_cause(&cause.to_string()))
            }
        }
    }
}

/// Whether the connection was refused: nothing listens at the address (a
/// node that is down), unlike a timeout, which a partition also gives.
pub(crate) fn connection_refused(status: &Status) -> bool {
    let mut cause = std::error::Error::source(status);
    while let Some(e) = cause {
        if let Some(io) = e.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        cause = e.source();
    }
    false
}

/// "Connection refused (os error 111)" as "connection refused".
fn short_cause(text: &str) -> String {
    let text = text.split(" (os error").next().unwrap_or(text).trim();
    let mut chars = text.chars();
    match chars.next() {
        Some(first) => first.to_lowercase().chain(chars).collect(),
        None => "no answer".into(),
    }
}

/// The message of an [`ClientError::Unavailable`] after every endpoint
/// failed: which endpoints were tried, what each said, and what to do.
pub(crate) fn unavailable_message(attempts: &[(String, Option<Attempt>)]) -> String {
    let tried: Vec<&str> = attempts.iter().map(|(e, _)| e.as_str()).collect();
    let no_answer: Vec<&String> = attempts
        .iter()
        .filter_map(|(_, a)| match a {
            Some(Attempt::NoAnswer(why)) => Some(why),
            _ => None,
        })
        .collect();
    if no_answer.len() == attempts.len() {
        let mut causes = no_answer.clone();
        causes.sort();
        causes.dedup();
        let causes: Vec<&str> = causes.iter().map(|c| c.as_str()).collect();
        return format!(
            "no node answered at {} ({}): {NO_CLUSTER_HINT}",
            tried.join(", "),
            causes.join("; ")
        );
    }
    let each: Vec<String> = attempts
        .iter()
        .map(|(endpoint, a)| match a {
            Some(Attempt::Refused(why)) => format!("{endpoint}: {why}"),
            Some(Attempt::NoAnswer(why)) => format!("{endpoint}: no answer ({why})"),
            None => format!("{endpoint}: not tried in time"),
        })
        .collect();
    format!(
        "no node could serve the call ({}); it may succeed once a majority of the \
         members runs and has elected a leader",
        each.join("; ")
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unavailable_cluster_names_every_endpoint_and_the_next_step() {
        let refused = || Some(Attempt::NoAnswer("connection refused".into()));
        let none = unavailable_message(&[
            ("127.0.0.1:7101".into(), refused()),
            ("127.0.0.1:7102".into(), refused()),
        ]);
        assert_eq!(
            none,
            format!(
                "no node answered at 127.0.0.1:7101, 127.0.0.1:7102 (connection refused): \
                 {NO_CLUSTER_HINT}"
            )
        );
        let some = unavailable_message(&[
            (
                "127.0.0.1:7101".into(),
                Some(Attempt::Refused(
                    "node 1 has no leader: 1 of 3 members reachable".into(),
                )),
            ),
            ("127.0.0.1:7102".into(), refused()),
            ("127.0.0.1:7103".into(), None),
        ]);
        assert!(
            some.contains("127.0.0.1:7101: node 1 has no leader: 1 of 3 members reachable")
                && some.contains("127.0.0.1:7102: no answer (connection refused)")
                && some.contains("127.0.0.1:7103: not tried in time"),
            "{some}"
        );
        assert_eq!(
            short_cause("Connection refused (os error 111)"),
            "connection refused"
        );
    }

    #[test]
    fn refusals_say_how_to_get_a_token_or_a_role() {
        let e = classify(Status::unauthenticated(
            "authentication failed: unknown or revoked token",
        ))
        .err();
        assert!(
            matches!(&e, Some(ClientError::Unauthenticated(m)) if m.starts_with("unknown or revoked token; ") && m.contains("fenced auth new-token")),
            "{e:?}"
        );
        let e = classify(Status::permission_denied(
            "permission denied: identity \"a\" may not acquire",
        ))
        .err();
        assert!(
            matches!(&e, Some(ClientError::PermissionDenied(m)) if m.contains("may not acquire") && m.contains("auth_policy")),
            "{e:?}"
        );
    }
}
