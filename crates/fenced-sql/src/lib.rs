//! Fencing for a table you already have.
//!
//! A lease from fenced tells a worker it may start; the place where its write
//! lands must refuse a worker that paused past its lease. This crate adds that
//! refusal to an existing SQL database, inside the caller's own transaction:
//!
//! 1. Run the migration once ([`postgres::MIGRATION`], [`sqlite::MIGRATION`]):
//!    a fences table (per resource, the highest accepted token) and a table of
//!    applied operation ids.
//! 2. In each write transaction, call the guard first with the lease's
//!    resource, token and owner id. On [`Verdict::Accepted`] do your own
//!    `UPDATE`/`INSERT` and commit: the guard's record and your write commit
//!    together or not at all. On [`Verdict::Duplicate`] or
//!    [`Verdict::Stale`] write nothing.
//!
//! The decision itself is [`decide`], a pure function; the database modules
//! are the shell that reads and writes the fences table around it (in
//! PostgreSQL, the SQL function `fenced_guard` of the migration makes the
//! same decision next to the data).
//!
//! ```no_run
//! # async fn demo(client: &mut tokio_postgres::Client) -> Result<(), fenced_sql::GuardError> {
//! use fenced_sql::{Contract, Fence, Verdict};
//! let tx = client.transaction().await?;
//! let fence = Fence {
//!     resource: "statement:account-1842:2026-07",
//!     token: 42,
//!     owner_id: "5b2f0c7e-6a43-4c09-9a8e-1d0f6f3b7a21",
//!     operation_id: Some("statement-1842-2026-07"),
//!     contract: Contract::AtLeast,
//! };
//! match fenced_sql::postgres::guard(&tx, &fence).await? {
//!     Verdict::Accepted => {
//!         tx.execute("UPDATE account_statements SET content = $1 WHERE account_id = $2",
//!                    &[&"...", &1842_i64]).await?;
//!         tx.commit().await?;
//!     }
//!     Verdict::Duplicate => {} // already applied by this operation id
//!     Verdict::Stale { highest } => eprintln!("token 42 is stale: {highest} wrote since"),
//! }
//! # Ok(()) }
//! ```
//!
//! **The column form.** A table that should carry its own fence can keep a
//! `last_accepted_fence bigint NOT NULL DEFAULT 0` column and make every
//! write one conditional statement,
//! `UPDATE t SET ..., last_accepted_fence = $token WHERE key = $key AND
//! last_accepted_fence <= $token` (`<` for [`Contract::Greater`]), where zero
//! rows affected means refused; [`Contract::column_comparison`] gives the
//! operator and [`column_verdict`] reads the row count.

#[cfg(feature = "postgres")]
pub mod postgres;
#[cfg(feature = "sqlite")]
pub mod sqlite;

/// The longest resource name, in bytes (the same bound as fenced's lock
/// resources).
///
/// ```
/// assert_eq!(fenced_sql::RESOURCE_MAX_BYTES, 256);
/// ```
pub const RESOURCE_MAX_BYTES: usize = 256;

/// The longest owner id, in bytes (fenced's owner ids are 36-byte UUIDs).
///
/// ```
/// assert_eq!(fenced_sql::OWNER_ID_MAX_BYTES, 128);
/// ```
pub const OWNER_ID_MAX_BYTES: usize = 128;

/// The longest operation id, in bytes.
///
/// ```
/// assert_eq!(fenced_sql::OPERATION_ID_MAX_BYTES, 128);
/// ```
pub const OPERATION_ID_MAX_BYTES: usize = 128;

/// The highest token the guard accepts: tokens are stored as SQL `bigint`
/// (signed 64 bits).
///
/// ```
/// assert_eq!(fenced_sql::TOKEN_MAX, i64::MAX as u64);
/// ```
pub const TOKEN_MAX: u64 = i64::MAX as u64;

/// Which tokens pass: the comparison must match what one acquisition may do.
///
/// ```
/// use fenced_sql::Contract;
/// assert_eq!(Contract::AtLeast.as_str(), "at_least");
/// assert_eq!("greater".parse::<Contract>().ok(), Some(Contract::Greater));
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Contract {
    /// `token >= highest`: one owner may write many times under its lease.
    AtLeast,
    /// `token > highest`: one final write per acquisition; an equal token
    /// is refused as stale.
    Greater,
}

impl Contract {
    /// The name the SQL function `fenced_guard` takes.
    ///
    /// ```
    /// assert_eq!(fenced_sql::Contract::Greater.as_str(), "greater");
    /// ```
    pub fn as_str(self) -> &'static str {
        match self {
            Contract::AtLeast => "at_least",
            Contract::Greater => "greater",
        }
    }

    /// Whether `token` passes against the highest accepted one.
    ///
    /// ```
    /// use fenced_sql::Contract;
    /// assert!(Contract::AtLeast.passes(7, 7));
    /// assert!(!Contract::Greater.passes(7, 7));
    /// assert!(!Contract::AtLeast.passes(6, 7));
    /// ```
    pub fn passes(self, token: u64, highest: u64) -> bool {
        match self {
            Contract::AtLeast => token >= highest,
            Contract::Greater => token > highest,
        }
    }

    /// For the column form: the operator between the stored column and the
    /// presented token in the `WHERE` of a conditional update,
    /// `last_accepted_fence <= $token` or `last_accepted_fence < $token`.
    ///
    /// ```
    /// use fenced_sql::Contract;
    /// let sql = format!(
    ///     "UPDATE account_statements SET content = $1, last_accepted_fence = $2 \
    ///      WHERE account_id = $3 AND last_accepted_fence {} $2",
    ///     Contract::AtLeast.column_comparison()
    /// );
    /// assert!(sql.ends_with("last_accepted_fence <= $2"));
    /// ```
    pub fn column_comparison(self) -> &'static str {
        match self {
            Contract::AtLeast => "<=",
            Contract::Greater => "<",
        }
    }
}

impl std::fmt::Display for Contract {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Contract {
    type Err = GuardError;

    fn from_str(s: &str) -> Result<Self, GuardError> {
        match s {
            "at_least" => Ok(Contract::AtLeast),
            "greater" => Ok(Contract::Greater),
            other => Err(GuardError::invalid(
                "contract",
                format!("must be at_least or greater, got {other:?}"),
            )),
        }
    }
}

/// One guarded write: the lease's resource, token and owner id, an optional
/// operation id (a retry with the same id is applied once) and the contract.
///
/// ```
/// use fenced_sql::{Contract, Fence};
/// let fence = Fence {
///     resource: "statement:account-1842:2026-07",
///     token: 42,
///     owner_id: "5b2f0c7e-6a43-4c09-9a8e-1d0f6f3b7a21",
///     operation_id: None,
///     contract: Contract::AtLeast,
/// };
/// assert!(fence.validate().is_ok());
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fence<'a> {
    /// The lock resource the token was granted for (1 to 256 bytes).
    pub resource: &'a str,
    /// The lease's fencing token (1 to [`TOKEN_MAX`]).
    pub token: u64,
    /// The lease's owner id (1 to 128 bytes), recorded with the token.
    pub owner_id: &'a str,
    /// An idempotency key for this write (1 to 128 bytes).
    pub operation_id: Option<&'a str>,
    /// Which tokens pass.
    pub contract: Contract,
}

impl Fence<'_> {
    /// Checks every field against its bound and returns the token as the
    /// `bigint` the database stores.
    ///
    /// ```
    /// use fenced_sql::{Contract, Fence};
    /// let mut fence = Fence { resource: "r", token: u64::MAX, owner_id: "o",
    ///                         operation_id: None, contract: Contract::Greater };
    /// let e = fence.validate().unwrap_err();
    /// assert!(e.to_string().starts_with("token: must be at most 9223372036854775807"));
    /// fence.token = 3;
    /// assert_eq!(fence.validate().ok(), Some(3_i64));
    /// ```
    pub fn validate(&self) -> Result<i64, GuardError> {
        check_len("resource", self.resource, RESOURCE_MAX_BYTES)?;
        check_len("owner_id", self.owner_id, OWNER_ID_MAX_BYTES)?;
        if let Some(op) = self.operation_id {
            check_len("operation_id", op, OPERATION_ID_MAX_BYTES)?;
        }
        if self.token == 0 {
            return Err(GuardError::invalid(
                "token",
                "must be at least 1, got 0 (fenced issues tokens from 1)",
            ));
        }
        i64::try_from(self.token).map_err(|_| {
            GuardError::invalid(
                "token",
                format!(
                    "must be at most {TOKEN_MAX} (SQL bigint), got {}",
                    self.token
                ),
            )
        })
    }
}

/// The bounds of an operation id recorded on its own.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn check_operation(resource: &str, operation_id: &str) -> Result<(), GuardError> {
    check_len("resource", resource, RESOURCE_MAX_BYTES)?;
    check_len("operation_id", operation_id, OPERATION_ID_MAX_BYTES)
}

/// [`check_operation`] and the token as the `bigint` stored.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn check_operation_token(
    resource: &str,
    operation_id: &str,
    token: u64,
) -> Result<i64, GuardError> {
    Fence {
        resource,
        token,
        owner_id: "-",
        operation_id: Some(operation_id),
        contract: Contract::AtLeast,
    }
    .validate()
}

fn check_len(field: &'static str, value: &str, max: usize) -> Result<(), GuardError> {
    if value.is_empty() || value.len() > max {
        return Err(GuardError::invalid(
            field,
            format!("must be 1 to {max} bytes, got {}", value.len()),
        ));
    }
    Ok(())
}

/// The idempotency key a destination that cannot check a token receives
/// for one operation on one resource (the gateway's `Idempotency-Key`, the
/// outbox's): `fenced-` and 64 hex digits of SHA-256 over the resource and
/// the operation id, each length-prefixed. The same operation gets the same
/// key whoever sends it; two resources' operations never share one, even
/// with the same operation id.
///
/// ```
/// let a = fenced_sql::idempotency_key("statement:7", "op-1");
/// assert_eq!(a.len(), 7 + 64);
/// assert!(a.starts_with("fenced-"));
/// assert_eq!(a, fenced_sql::idempotency_key("statement:7", "op-1"));
/// assert_ne!(a, fenced_sql::idempotency_key("statement:8", "op-1"));
/// assert_ne!(fenced_sql::idempotency_key("ab", "c"), fenced_sql::idempotency_key("a", "bc"));
/// ```
pub fn idempotency_key(resource: &str, operation_id: &str) -> String {
    use sha2::{Digest, Sha256};
    let mut h = Sha256::new();
    for field in [resource.as_bytes(), operation_id.as_bytes()] {
        h.update((field.len() as u64).to_be_bytes());
        h.update(field);
    }
    let mut out = String::with_capacity(7 + 64);
    out.push_str("fenced-");
    for b in h.finalize().iter() {
        out.push_str(&format!("{b:02x}"));
    }
    out
}

/// The guard's answer.
///
/// ```
/// use fenced_sql::Verdict;
/// let v = Verdict::Stale { highest: 6 };
/// assert!(!v.is_accepted());
/// assert_eq!(v.to_string(), "stale (highest accepted token 6)");
/// ```
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// The token passed and is recorded: do the write, then commit.
    Accepted,
    /// The operation id was already applied: skip the write (committing or
    /// rolling back changes nothing).
    Duplicate,
    /// The token is stale: a newer owner wrote with `highest`. Write nothing;
    /// final for this token, do not retry it.
    Stale {
        /// The highest token accepted for the resource.
        highest: u64,
    },
}

impl Verdict {
    /// Whether the caller should do its write.
    ///
    /// ```
    /// assert!(fenced_sql::Verdict::Accepted.is_accepted());
    /// ```
    pub fn is_accepted(self) -> bool {
        self == Verdict::Accepted
    }
}

impl std::fmt::Display for Verdict {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Verdict::Accepted => f.write_str("accepted"),
            Verdict::Duplicate => f.write_str("duplicate"),
            Verdict::Stale { highest } => write!(f, "stale (highest accepted token {highest})"),
        }
    }
}

/// The fence decision, a pure function: `highest` is the resource's highest
/// accepted token (`None`: the resource was never written), `operation_applied`
/// whether the write's operation id is already recorded. A recorded operation
/// id answers [`Verdict::Duplicate`] before any token is compared, so a retry
/// of an applied write is skipped even after a newer owner wrote.
///
/// ```
/// use fenced_sql::{decide, Contract, Verdict};
/// assert_eq!(decide(None, 5, Contract::Greater, false), Verdict::Accepted);
/// assert_eq!(decide(Some(6), 5, Contract::AtLeast, false), Verdict::Stale { highest: 6 });
/// assert_eq!(decide(Some(6), 5, Contract::AtLeast, true), Verdict::Duplicate);
/// ```
pub fn decide(
    highest: Option<u64>,
    token: u64,
    contract: Contract,
    operation_applied: bool,
) -> Verdict {
    if operation_applied {
        return Verdict::Duplicate;
    }
    match highest {
        None => Verdict::Accepted,
        Some(h) if contract.passes(token, h) => Verdict::Accepted,
        Some(h) => Verdict::Stale { highest: h },
    }
}

/// For the column form: reads the rows affected by the conditional update
/// (`... WHERE key = $key AND last_accepted_fence <= $token`) of one existing
/// row. One row: accepted. None: refused, either the token is stale or the
/// row does not exist (read it to tell which). More than one: the `WHERE`
/// does not name one row, an error.
///
/// ```
/// use fenced_sql::column_verdict;
/// assert_eq!(column_verdict(1).ok(), Some(true));
/// assert_eq!(column_verdict(0).ok(), Some(false));
/// assert!(column_verdict(2).is_err());
/// ```
pub fn column_verdict(rows_affected: u64) -> Result<bool, GuardError> {
    match rows_affected {
        0 => Ok(false),
        1 => Ok(true),
        n => Err(GuardError::invalid(
            "rows_affected",
            format!("a fenced update must name one row, it changed {n}"),
        )),
    }
}

/// Why the guard gave no verdict. The caller's transaction should be rolled
/// back (the guard may have done part of its work in it).
///
/// ```
/// use fenced_sql::{Contract, Fence, GuardError};
/// let fence = Fence { resource: "", token: 1, owner_id: "o", operation_id: None,
///                     contract: Contract::AtLeast };
/// match fence.validate() {
///     Err(GuardError::Invalid { field, .. }) => assert_eq!(field, "resource"),
///     other => panic!("{other:?}"),
/// }
/// ```
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GuardError {
    /// A field is out of its bound; nothing was sent to the database.
    #[error("{field}: {reason}")]
    Invalid {
        /// The field, as named in [`Fence`].
        field: &'static str,
        /// The bound and the value presented.
        reason: String,
    },
    /// The fences table holds something the guard never writes (a
    /// negative token, an unknown verdict): the migration was changed.
    #[error("the fences table is inconsistent: {0}")]
    Corrupt(String),
    /// PostgreSQL refused or failed a statement.
    #[cfg(feature = "postgres")]
    #[error("postgresql: {0}")]
    Postgres(#[from] tokio_postgres::Error),
    /// SQLite refused or failed a statement.
    #[cfg(feature = "sqlite")]
    #[error("sqlite: {0}")]
    Sqlite(#[from] rusqlite::Error),
}

impl GuardError {
    fn invalid(field: &'static str, reason: impl Into<String>) -> Self {
        GuardError::Invalid {
            field,
            reason: reason.into(),
        }
    }
}

/// A stored token read back as `u64`; negative values are never written.
#[cfg(any(feature = "postgres", feature = "sqlite"))]
fn stored_token(resource: &str, v: i64) -> Result<u64, GuardError> {
    u64::try_from(v).map_err(|_| {
        GuardError::Corrupt(format!(
            "resource {resource:?} has a negative last_accepted_token ({v})"
        ))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fence(token: u64) -> Fence<'static> {
        Fence {
            resource: "statement:1",
            token,
            owner_id: "owner",
            operation_id: None,
            contract: Contract::AtLeast,
        }
    }

    #[test]
    fn decide_follows_each_contract() {
        for c in [Contract::AtLeast, Contract::Greater] {
            assert_eq!(decide(None, 1, c, false), Verdict::Accepted);
            assert_eq!(decide(Some(5), 6, c, false), Verdict::Accepted);
            assert_eq!(decide(Some(5), 4, c, false), Verdict::Stale { highest: 5 });
        }
        assert_eq!(
            decide(Some(5), 5, Contract::AtLeast, false),
            Verdict::Accepted
        );
        assert_eq!(
            decide(Some(5), 5, Contract::Greater, false),
            Verdict::Stale { highest: 5 }
        );
    }

    #[test]
    fn an_applied_operation_is_a_duplicate_whatever_the_token() {
        for c in [Contract::AtLeast, Contract::Greater] {
            for (h, t) in [(None, 1), (Some(5), 4), (Some(5), 5), (Some(5), 9)] {
                assert_eq!(decide(h, t, c, true), Verdict::Duplicate);
            }
        }
    }

    #[test]
    fn bounds_name_the_field() {
        let err = |f: Fence<'_>| match f.validate() {
            Err(GuardError::Invalid { field, reason }) => format!("{field}: {reason}"),
            other => panic!("{other:?}"),
        };
        assert_eq!(
            err(fence(0)),
            "token: must be at least 1, got 0 (fenced issues tokens from 1)"
        );
        assert_eq!(
            err(fence(TOKEN_MAX + 1)),
            "token: must be at most 9223372036854775807 (SQL bigint), got 9223372036854775808"
        );
        assert_eq!(fence(TOKEN_MAX).validate().ok(), Some(i64::MAX));
        let long = "x".repeat(257);
        assert_eq!(
            err(Fence {
                resource: "",
                ..fence(1)
            }),
            "resource: must be 1 to 256 bytes, got 0"
        );
        assert_eq!(
            err(Fence {
                resource: &long,
                ..fence(1)
            }),
            "resource: must be 1 to 256 bytes, got 257"
        );
        assert!(Fence {
            resource: &long[..256],
            ..fence(1)
        }
        .validate()
        .is_ok());
        assert_eq!(
            err(Fence {
                owner_id: "",
                ..fence(1)
            }),
            "owner_id: must be 1 to 128 bytes, got 0"
        );
        assert_eq!(
            err(Fence {
                operation_id: Some(&long[..129]),
                ..fence(1)
            }),
            "operation_id: must be 1 to 128 bytes, got 129"
        );
        assert_eq!(
            err(Fence {
                operation_id: Some(""),
                ..fence(1)
            }),
            "operation_id: must be 1 to 128 bytes, got 0"
        );
    }

    #[test]
    fn contract_names_round_trip() {
        for c in [Contract::AtLeast, Contract::Greater] {
            assert_eq!(c.as_str().parse::<Contract>().ok(), Some(c));
        }
        assert!(matches!(
            "gt".parse::<Contract>(),
            Err(GuardError::Invalid {
                field: "contract",
                ..
            })
        ));
    }
}
