//! The guard on SQLite (feature `sqlite`, on rusqlite with SQLite compiled
//! in), for one host with no database server.
//!
//! SQLite has no stored functions: [`guard`] reads the fences table, decides
//! with [`crate::decide`] and records the token, all in the caller's
//! transaction. SQLite transactions are serializable; open them with
//! `BEGIN IMMEDIATE` ([`rusqlite::TransactionBehavior::Immediate`]) so that
//! concurrent writers wait for each other (set a busy timeout) instead of
//! failing with `SQLITE_BUSY` when a read turns into a write.
//!
//! ```no_run
//! # fn demo() -> Result<(), fenced_sql::GuardError> {
//! let mut conn = rusqlite::Connection::open("/var/lib/app/app.db")?;
//! conn.busy_timeout(std::time::Duration::from_secs(5))?;
//! fenced_sql::sqlite::migrate(&mut conn)?;
//! # Ok(()) }
//! ```

use rusqlite::{params, Connection, OptionalExtension, Transaction, TransactionBehavior};

use crate::{decide, stored_token, Fence, GuardError, Verdict};

/// The migration: `sql/sqlite/001_fences.sql`. Idempotent (`IF NOT EXISTS`).
///
/// ```
/// assert!(fenced_sql::sqlite::MIGRATION.contains("CREATE TABLE IF NOT EXISTS fenced_fences"));
/// ```
pub const MIGRATION: &str = include_str!("../sql/sqlite/001_fences.sql");

/// Runs [`MIGRATION`] in its own `BEGIN IMMEDIATE` transaction.
///
/// ```
/// # fn main() -> Result<(), fenced_sql::GuardError> {
/// let mut conn = rusqlite::Connection::open_in_memory()?;
/// fenced_sql::sqlite::migrate(&mut conn)?;
/// fenced_sql::sqlite::migrate(&mut conn)?; // again: nothing changes
/// # Ok(()) }
/// ```
pub fn migrate(conn: &mut Connection) -> Result<(), GuardError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(MIGRATION)?;
    tx.commit()?;
    Ok(())
}

/// Compares the fence with the resource's highest accepted token and, when
/// it passes, records it, inside `tx`: call it before your own write, write
/// only on [`Verdict::Accepted`], then commit. Bad input is refused before
/// any SQL runs.
///
/// ```
/// # fn main() -> Result<(), fenced_sql::GuardError> {
/// use fenced_sql::{Contract, Fence, Verdict};
/// use rusqlite::TransactionBehavior;
/// let mut conn = rusqlite::Connection::open_in_memory()?;
/// fenced_sql::sqlite::migrate(&mut conn)?;
/// let fence = Fence { resource: "statement:7", token: 4, owner_id: "owner-a",
///                     operation_id: None, contract: Contract::Greater };
/// let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
/// assert_eq!(fenced_sql::sqlite::guard(&tx, &fence)?, Verdict::Accepted);
/// // ... the caller's own write ...
/// tx.commit()?;
/// let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
/// assert_eq!(fenced_sql::sqlite::guard(&tx, &fence)?, Verdict::Stale { highest: 4 });
/// # Ok(()) }
/// ```
pub fn guard(tx: &Transaction<'_>, fence: &Fence<'_>) -> Result<Verdict, GuardError> {
    let token = fence.validate()?;
    // A write first: in a deferred transaction it takes the write lock
    // before anything is read, so the read below cannot go stale.
    let inserted = tx.execute(
        "INSERT INTO fenced_fences (resource, last_accepted_token, owner_id) VALUES (?1, ?2, ?3)
         ON CONFLICT (resource) DO NOTHING",
        params![fence.resource, token, fence.owner_id],
    )?;
    let highest = if inserted == 1 {
        None
    } else {
        let last: i64 = tx.query_row(
            "SELECT last_accepted_token FROM fenced_fences WHERE resource = ?1",
            params![fence.resource],
            |r| r.get(0),
        )?;
        Some(stored_token(fence.resource, last)?)
    };
    let applied = match fence.operation_id {
        Some(op) => tx
            .query_row(
                "SELECT 1 FROM fenced_applied_operations WHERE resource = ?1 AND operation_id = ?2",
                params![fence.resource, op],
                |_| Ok(()),
            )
            .optional()?
            .is_some(),
        None => false,
    };
    let verdict = decide(highest, fence.token, fence.contract, applied);
    match verdict {
        Verdict::Accepted => {
            if highest.is_some() {
                tx.execute(
                    "UPDATE fenced_fences SET last_accepted_token = ?2, owner_id = ?3,
                         updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
                     WHERE resource = ?1",
                    params![fence.resource, token, fence.owner_id],
                )?;
            }
            if let Some(op) = fence.operation_id {
                tx.execute(
                    "INSERT INTO fenced_applied_operations (resource, operation_id, token)
                     VALUES (?1, ?2, ?3)",
                    params![fence.resource, op, token],
                )?;
            }
        }
        // An operation id recorded for a resource with no row (the row was
        // deleted by hand): undo the insert above so nothing changes.
        Verdict::Duplicate | Verdict::Stale { .. } if highest.is_none() => {
            tx.execute(
                "DELETE FROM fenced_fences WHERE resource = ?1",
                params![fence.resource],
            )?;
        }
        Verdict::Duplicate | Verdict::Stale { .. } => {}
    }
    Ok(verdict)
}

/// Whether `operation_id` is recorded as applied for `resource`, inside
/// `tx`. For a caller that records the operation only once its effect
/// happened ([`record_operation`]) rather than in [`guard`].
///
/// ```
/// # fn main() -> Result<(), fenced_sql::GuardError> {
/// let mut conn = rusqlite::Connection::open_in_memory()?;
/// fenced_sql::sqlite::migrate(&mut conn)?;
/// let tx = conn.transaction()?;
/// assert!(!fenced_sql::sqlite::operation_applied(&tx, "statement:7", "op-1")?);
/// assert!(fenced_sql::sqlite::record_operation(&tx, "statement:7", "op-1", 4)?);
/// assert!(fenced_sql::sqlite::operation_applied(&tx, "statement:7", "op-1")?);
/// assert!(!fenced_sql::sqlite::record_operation(&tx, "statement:7", "op-1", 4)?);
/// # Ok(()) }
/// ```
pub fn operation_applied(
    tx: &Transaction<'_>,
    resource: &str,
    operation_id: &str,
) -> Result<bool, GuardError> {
    crate::check_operation(resource, operation_id)?;
    Ok(tx
        .query_row(
            "SELECT 1 FROM fenced_applied_operations WHERE resource = ?1 AND operation_id = ?2",
            params![resource, operation_id],
            |_| Ok(()),
        )
        .optional()?
        .is_some())
}

/// Records `operation_id` as applied for `resource` under `token`, inside
/// `tx`; false when it already was (nothing changes then).
pub fn record_operation(
    tx: &Transaction<'_>,
    resource: &str,
    operation_id: &str,
    token: u64,
) -> Result<bool, GuardError> {
    let token = crate::check_operation_token(resource, operation_id, token)?;
    let inserted = tx.execute(
        "INSERT INTO fenced_applied_operations (resource, operation_id, token) VALUES (?1, ?2, ?3)
         ON CONFLICT (resource, operation_id) DO NOTHING",
        params![resource, operation_id, token],
    )?;
    Ok(inserted == 1)
}

/// The highest token accepted for `resource` (`None`: never written).
pub fn highest(tx: &Transaction<'_>, resource: &str) -> Result<Option<u64>, GuardError> {
    crate::check_len("resource", resource, crate::RESOURCE_MAX_BYTES)?;
    tx.query_row(
        "SELECT last_accepted_token FROM fenced_fences WHERE resource = ?1",
        params![resource],
        |r| r.get::<_, i64>(0),
    )
    .optional()?
    .map(|v| stored_token(resource, v))
    .transpose()
}
