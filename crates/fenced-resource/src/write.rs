//! What a writer presents, and what the store answers.

use std::fmt;

use fenced_core::{InvalidArgument, OwnerId, ResourceName, Token};

use crate::limits::{
    check_key, check_text, check_value, IDEMPOTENCY_KEY_MAX_BYTES, OPERATION_ID_MAX_BYTES,
};

/// The equality contract of a key: what an equal token means.
///
/// ```
/// use fenced_resource::Mode;
/// assert_eq!("strict".parse::<Mode>()?, Mode::Strict);
/// assert_eq!(Mode::AllowEqual.as_str(), "allow_equal");
/// assert!("sometimes".parse::<Mode>().is_err());
/// # Ok::<(), fenced_core::InvalidArgument>(())
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum Mode {
    /// `token >= highest`: the owner may write many times under one lease.
    #[default]
    AllowEqual,
    /// `token > highest`: exactly one write per acquisition; an equal token
    /// is answered [`WriteOutcome::AlreadyApplied`] and changes nothing.
    Strict,
}

impl Mode {
    /// The name used in the API, the CLI and the logs.
    ///
    /// ```
    /// assert_eq!(fenced_resource::Mode::Strict.as_str(), "strict");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::AllowEqual => "allow_equal",
            Mode::Strict => "strict",
        }
    }

    /// The stored code: 0 allow-equal, 1 strict.
    pub(crate) fn code(self) -> i32 {
        match self {
            Mode::AllowEqual => 0,
            Mode::Strict => 1,
        }
    }

    /// The inverse of [`Mode::code`].
    pub(crate) fn from_code(code: i32) -> Option<Mode> {
        match code {
            0 => Some(Mode::AllowEqual),
            1 => Some(Mode::Strict),
            _ => None,
        }
    }
}

impl std::str::FromStr for Mode {
    type Err = InvalidArgument;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "allow_equal" | "allow-equal" => Ok(Mode::AllowEqual),
            "strict" => Ok(Mode::Strict),
            other => Err(InvalidArgument::new(
                "mode",
                format!("must be allow_equal or strict, got {other:?}"),
            )),
        }
    }
}

impl fmt::Display for Mode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One fenced write: the value for `key`, presented by `owner` with the
/// `token` it was granted for `resource`.
///
/// Fill the optional fields directly; [`crate::FenceStore::write`] validates
/// everything before it touches the disk.
///
/// ```
/// use fenced_core::{OwnerId, ResourceName, Token};
/// use fenced_resource::{Mode, Write};
/// let resource = ResourceName::new("statement:account-1842:2026-07")?;
/// let mut write = Write::new(resource.as_str(), resource.clone(), Token::new(42)?, OwnerId::random(), "v1");
/// write.mode = Some(Mode::Strict);
/// write.idempotency_key = Some("statement-1842-final".into());
/// write.operation_id = Some("render-pdf".into());
/// assert!(write.validate().is_ok());
/// # Ok::<(), fenced_core::InvalidArgument>(())
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Write {
    /// The stored item, 1 to [`crate::KEY_MAX_BYTES`] bytes of UTF-8.
    pub key: String,
    /// The lock resource whose tokens guard `key`. The first accepted write
    /// binds the key to it; a token of another resource is refused.
    pub resource: ResourceName,
    /// The fencing token the lock service granted for `resource`.
    pub token: Token,
    /// The owner id of the acquisition that holds `token`.
    pub owner: OwnerId,
    /// The guarded value, at most [`crate::VALUE_MAX_BYTES`] bytes.
    pub value: Vec<u8>,
    /// The equality contract. `None`: the key's own (set by its first write,
    /// else the store's default). A key's contract never changes.
    pub mode: Option<Mode>,
    /// Makes the write idempotent: a retry with the same key and the same
    /// request is applied once and answered with the first answer.
    pub idempotency_key: Option<String>,
    /// The caller's name for the operation, carried into logs and rejections.
    pub operation_id: Option<String>,
    /// Optimistic concurrency: the key's version the value was computed from
    /// (`0`: the key must not exist yet). Checked in the same atomic step as
    /// the token.
    pub expected_version: Option<u64>,
    /// Orders writes by one owner under one token: each must be greater than
    /// the last one accepted for that owner and token.
    pub sequence: Option<u64>,
}

impl Write {
    /// A write with no optional fields set.
    ///
    /// ```
    /// use fenced_core::{OwnerId, ResourceName, Token};
    /// let w = fenced_resource::Write::new("k", ResourceName::new("r")?, Token::new(1)?, OwnerId::random(), b"v".to_vec());
    /// assert_eq!(w.value, b"v");
    /// # Ok::<(), fenced_core::InvalidArgument>(())
    /// ```
    pub fn new(
        key: impl Into<String>,
        resource: ResourceName,
        token: Token,
        owner: OwnerId,
        value: impl Into<Vec<u8>>,
    ) -> Self {
        Write {
            key: key.into(),
            resource,
            token,
            owner,
            value: value.into(),
            mode: None,
            idempotency_key: None,
            operation_id: None,
            expected_version: None,
            sequence: None,
        }
    }

    /// A write whose key is the resource name itself (the usual case: one
    /// lock resource guards one item).
    ///
    /// ```
    /// use fenced_core::{OwnerId, ResourceName, Token};
    /// let w = fenced_resource::Write::for_resource(ResourceName::new("billing:2026-07")?, Token::new(3)?, OwnerId::random(), "done");
    /// assert_eq!(w.key, "billing:2026-07");
    /// # Ok::<(), fenced_core::InvalidArgument>(())
    /// ```
    pub fn for_resource(
        resource: ResourceName,
        token: Token,
        owner: OwnerId,
        value: impl Into<Vec<u8>>,
    ) -> Self {
        Write::new(resource.as_str().to_string(), resource, token, owner, value)
    }

    /// Checks every bound; the error names the field and the bound.
    ///
    /// ```
    /// use fenced_core::{OwnerId, ResourceName, Token};
    /// let w = fenced_resource::Write::new("k", ResourceName::new("r")?, Token::new(1)?, OwnerId::random(), vec![0; 2 << 20]);
    /// assert_eq!(w.validate().unwrap_err().field(), "value");
    /// # Ok::<(), fenced_core::InvalidArgument>(())
    /// ```
    pub fn validate(&self) -> Result<(), InvalidArgument> {
        check_key(&self.key)?;
        check_value("value", &self.value)?;
        if let Some(k) = &self.idempotency_key {
            check_text("idempotency_key", k, IDEMPOTENCY_KEY_MAX_BYTES)?;
        }
        if let Some(op) = &self.operation_id {
            check_text("operation_id", op, OPERATION_ID_MAX_BYTES)?;
        }
        Ok(())
    }

    /// A stable 64-bit fingerprint (FNV-1a) of everything the write asks
    /// for, so a reused idempotency key with a different request is caught.
    pub(crate) fn fingerprint(&self) -> u64 {
        let mut h = Fnv::new();
        h.field(self.key.as_bytes());
        h.field(self.resource.as_str().as_bytes());
        h.field(&self.token.get().to_le_bytes());
        h.field(self.owner.as_bytes());
        h.field(&self.value);
        h.field(&self.mode.map_or(-1, Mode::code).to_le_bytes());
        h.field(&opt_bytes(self.expected_version));
        h.field(&opt_bytes(self.sequence));
        h.finish()
    }
}

fn opt_bytes(v: Option<u64>) -> [u8; 9] {
    let mut out = [0u8; 9];
    if let Some(v) = v {
        out[0] = 1;
        out[1..].copy_from_slice(&v.to_le_bytes());
    }
    out
}

/// FNV-1a, 64 bit: stable across builds and platforms (it is persisted).
struct Fnv(u64);

impl Fnv {
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }
    fn bytes(&mut self, bytes: &[u8]) {
        for b in bytes {
            self.0 ^= u64::from(*b);
            self.0 = self.0.wrapping_mul(0x0000_0100_0000_01b3);
        }
    }
    /// A length-prefixed field, so field boundaries are unambiguous.
    fn field(&mut self, bytes: &[u8]) {
        self.bytes(&(bytes.len() as u64).to_le_bytes());
        self.bytes(bytes);
    }
    fn finish(&self) -> u64 {
        self.0
    }
}

/// What the store did with a write.
///
/// ```
/// use fenced_resource::WriteOutcome;
/// let outcome = WriteOutcome::Accepted { token: 7, version: 3 };
/// assert_eq!(outcome.status(), "accepted");
/// assert_eq!(outcome.highest_token(), 7);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WriteOutcome {
    /// The value is stored and durable; `token` is now the key's highest
    /// accepted token and `version` its new version. A retry with the same
    /// idempotency key answers this again.
    Accepted {
        /// The key's highest accepted token (the presented one).
        token: u64,
        /// The key's version after the write (1 for the first write).
        version: u64,
    },
    /// Strict contract, equal token: this acquisition's one write already
    /// happened. Nothing changed.
    AlreadyApplied {
        /// The key's highest accepted token (equal to the presented one).
        token: u64,
        /// The key's current version.
        version: u64,
    },
    /// Refused, and final: see [`Rejection`].
    Rejected(Rejection),
}

impl WriteOutcome {
    /// `accepted`, `already_applied` or `rejected`, as in the API and CLI.
    ///
    /// ```
    /// assert_eq!(fenced_resource::WriteOutcome::AlreadyApplied { token: 1, version: 1 }.status(), "already_applied");
    /// ```
    pub fn status(&self) -> &'static str {
        match self {
            WriteOutcome::Accepted { .. } => "accepted",
            WriteOutcome::AlreadyApplied { .. } => "already_applied",
            WriteOutcome::Rejected(_) => "rejected",
        }
    }

    /// The key's highest accepted token as the store saw it when deciding.
    ///
    /// ```
    /// assert_eq!(fenced_resource::WriteOutcome::Accepted { token: 9, version: 1 }.highest_token(), 9);
    /// ```
    pub fn highest_token(&self) -> u64 {
        match self {
            WriteOutcome::Accepted { token, .. } | WriteOutcome::AlreadyApplied { token, .. } => {
                *token
            }
            WriteOutcome::Rejected(r) => r.highest_token,
        }
    }
}

/// Why a write was refused. Every reason is final for the presented token.
///
/// ```
/// use fenced_resource::RejectReason;
/// assert_eq!(RejectReason::StaleToken.as_str(), "stale_token");
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RejectReason {
    /// A newer owner has written: the presented token is older than the
    /// key's highest accepted token.
    StaleToken,
    /// The key's highest token was written by another owner id. A token
    /// belongs to one acquisition, so this is a misused token.
    OwnerMismatch,
    /// The key is bound to another lock resource; its tokens are not
    /// comparable with the presented one.
    WrongResource {
        /// The lock resource the key is bound to.
        bound: String,
    },
    /// The key's version is not the one the value was computed from.
    VersionMismatch {
        /// The version the write expected.
        expected: u64,
        /// The key's version (0: it does not exist).
        actual: u64,
    },
    /// The owner already wrote a sequence number at least this high under
    /// this token.
    StaleSequence {
        /// The highest sequence number accepted for this owner and token.
        last: u64,
        /// The one presented.
        presented: u64,
    },
}

impl RejectReason {
    /// The reason's name in the API, the CLI and the logs.
    ///
    /// ```
    /// assert_eq!(fenced_resource::RejectReason::OwnerMismatch.as_str(), "owner_mismatch");
    /// ```
    pub fn as_str(&self) -> &'static str {
        match self {
            RejectReason::StaleToken => "stale_token",
            RejectReason::OwnerMismatch => "owner_mismatch",
            RejectReason::WrongResource { .. } => "wrong_resource",
            RejectReason::VersionMismatch { .. } => "version_mismatch",
            RejectReason::StaleSequence { .. } => "stale_sequence",
        }
    }
}

/// A refused write: everything needed to explain it in a log.
///
/// Final: retrying with the same token cannot succeed. The work belongs to an
/// obsolete owner (or an outdated read); stop it, and start again from a
/// defined boundary with a new acquisition.
///
/// ```
/// use fenced_core::OwnerId;
/// use fenced_resource::{Rejection, RejectReason};
/// let r = Rejection { key: "k".into(), token: 41, highest_token: 42, owner: OwnerId::random(),
///     operation_id: Some("render".into()), reason: RejectReason::StaleToken };
/// assert!(r.is_final());
/// assert!(r.to_string().contains("token 41"));
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejection {
    /// The key written to.
    pub key: String,
    /// The token presented.
    pub token: u64,
    /// The key's highest accepted token (0 if the key does not exist).
    pub highest_token: u64,
    /// The presenting owner id (never another owner's).
    pub owner: OwnerId,
    /// The caller's operation id, if it gave one.
    pub operation_id: Option<String>,
    /// Why.
    pub reason: RejectReason,
}

impl Rejection {
    /// Always true: a rejection is not a transient failure.
    ///
    /// ```
    /// # use fenced_core::OwnerId;
    /// # use fenced_resource::{Rejection, RejectReason};
    /// # let r = Rejection { key: "k".into(), token: 1, highest_token: 2, owner: OwnerId::random(), operation_id: None, reason: RejectReason::StaleToken };
    /// assert!(r.is_final());
    /// ```
    pub fn is_final(&self) -> bool {
        true
    }
}

impl fmt::Display for Rejection {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "write to key {:?} with token {} by owner {} (operation {}) rejected: ",
            self.key,
            self.token,
            self.owner,
            self.operation_id.as_deref().unwrap_or("-"),
        )?;
        match &self.reason {
            RejectReason::StaleToken => write!(
                f,
                "a newer owner wrote with token {}",
                self.highest_token
            )?,
            RejectReason::OwnerMismatch => write!(
                f,
                "token {} was written by another owner id",
                self.highest_token
            )?,
            RejectReason::WrongResource { bound } => write!(
                f,
                "the key is guarded by lock resource {bound:?}, not by the one presented"
            )?,
            RejectReason::VersionMismatch { expected, actual } => write!(
                f,
                "expected version {expected}, the key is at version {actual}"
            )?,
            RejectReason::StaleSequence { last, presented } => write!(
                f,
                "sequence {presented} is not above {last}, the last accepted for this owner and token"
            )?,
        }
        f.write_str("; final, do not retry with this token")
    }
}

/// The key's current state, as a read returns it.
///
/// ```
/// use fenced_resource::Current;
/// let c = Current { key: "k".into(), resource: "k".into(), token: 3, version: 2, mode: Default::default(), value: b"v".to_vec() };
/// assert_eq!(c.token, 3);
/// ```
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Current {
    /// The key.
    pub key: String,
    /// The lock resource the key is bound to.
    pub resource: String,
    /// The highest accepted token.
    pub token: u64,
    /// The number of accepted writes (1 after the first).
    pub version: u64,
    /// The key's equality contract.
    pub mode: Mode,
    /// The value written with the latest accepted write.
    pub value: Vec<u8>,
}

/// A failure that is not a decision about the write.
///
/// ```
/// use fenced_resource::StoreError;
/// let err = StoreError::InvalidArgument(fenced_core::InvalidArgument::new("key", "must be 1 to 256 bytes"));
/// assert!(!err.is_transient());
/// ```
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    /// A field is outside its bound; nothing was written. Fix the request.
    #[error("invalid argument: {0}")]
    InvalidArgument(#[from] InvalidArgument),
    /// The disk or database failed; the write may or may not have happened.
    /// The current owner may retry with the same token and idempotency key
    /// while its lease is valid.
    #[error("storage failure: {0}")]
    Storage(String),
    /// A stored record could not be read back (a bug or a damaged disk).
    #[error("stored record for key {key:?} is unreadable: {reason}")]
    Corrupt {
        /// The key whose record is bad.
        key: String,
        /// What was wrong with it.
        reason: String,
    },
}

impl StoreError {
    /// Whether the same request may succeed later (storage failures only).
    ///
    /// ```
    /// assert!(fenced_resource::StoreError::Storage("disk full".into()).is_transient());
    /// ```
    pub fn is_transient(&self) -> bool {
        matches!(self, StoreError::Storage(_))
    }
}

impl From<sled::Error> for StoreError {
    fn from(e: sled::Error) -> Self {
        StoreError::Storage(e.to_string())
    }
}

impl From<std::io::Error> for StoreError {
    fn from(e: std::io::Error) -> Self {
        StoreError::Storage(e.to_string())
    }
}
