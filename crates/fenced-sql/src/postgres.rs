//! The guard on PostgreSQL (feature `postgres`, on tokio-postgres).
//!
//! [`MIGRATION`] creates the fences table, the applied operation ids and the
//! SQL function `fenced_guard(resource, token, owner_id, operation_id,
//! contract)`, which any language can call inside its transaction:
//! `SELECT verdict, highest_token FROM fenced_guard($1, $2, $3, $4, $5)`.
//! [`guard`] checks the bounds and calls it.
//!
//! Under READ COMMITTED (PostgreSQL's default) the function never fails
//! because of a concurrent guard of the same resource: it waits for that
//! transaction's row lock and decides on what it committed. Under
//! REPEATABLE READ or SERIALIZABLE it can fail with a serialization error
//! (SQLSTATE 40001) instead; roll back and run the transaction again.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fenced_sql::GuardError> {
//! let (mut client, connection) =
//!     tokio_postgres::connect("host=127.0.0.1 user=app dbname=app", tokio_postgres::NoTls).await?;
//! tokio::spawn(connection);
//! fenced_sql::postgres::migrate(&mut client).await?;
//! # Ok(()) }
//! ```

use tokio_postgres::{Client, Transaction};

use crate::{stored_token, Fence, GuardError, Verdict};

/// The migration: `sql/postgres/001_fences.sql`. Idempotent (`IF NOT EXISTS`,
/// `CREATE OR REPLACE`); run it with [`migrate`] or with your own migration
/// tool.
///
/// ```
/// assert!(fenced_sql::postgres::MIGRATION.contains("CREATE OR REPLACE FUNCTION fenced_guard("));
/// ```
pub const MIGRATION: &str = include_str!("../sql/postgres/001_fences.sql");

/// The call [`guard`] makes: $1 resource, $2 token (bigint), $3 owner id,
/// $4 operation id (NULL for none), $5 contract (`at_least` or `greater`).
///
/// ```
/// assert!(fenced_sql::postgres::GUARD_CALL.starts_with("SELECT verdict, highest_token FROM fenced_guard("));
/// ```
pub const GUARD_CALL: &str =
    "SELECT verdict, highest_token FROM fenced_guard($1::text, $2::bigint, $3::text, $4::text, $5::text)";

/// An arbitrary advisory lock key that serializes concurrent migrations
/// (concurrent `CREATE ... IF NOT EXISTS` of one table can fail).
const MIGRATION_LOCK: i64 = 7_300_732;

/// Runs [`MIGRATION`] in its own transaction, under an advisory lock so that
/// several processes starting at once do not collide.
///
/// ```no_run
/// # async fn demo(client: &mut tokio_postgres::Client) -> Result<(), fenced_sql::GuardError> {
/// fenced_sql::postgres::migrate(client).await?;
/// # Ok(()) }
/// ```
pub async fn migrate(client: &mut Client) -> Result<(), GuardError> {
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(MIGRATION).await?;
    tx.commit().await?;
    Ok(())
}

/// Compares the fence with the resource's highest accepted token and, when
/// it passes, records it, inside `tx`: call it before your own write, write
/// only on [`Verdict::Accepted`], then commit. The record commits or rolls
/// back with your write. Bad input is refused before any SQL is sent.
///
/// ```no_run
/// # async fn demo(client: &mut tokio_postgres::Client, pdf: &[u8]) -> Result<(), fenced_sql::GuardError> {
/// use fenced_sql::{Contract, Fence, Verdict};
/// let tx = client.transaction().await?;
/// let fence = Fence { resource: "statement:account-1842:2026-07", token: 42,
///                     owner_id: "5b2f0c7e-6a43-4c09-9a8e-1d0f6f3b7a21",
///                     operation_id: None, contract: Contract::Greater };
/// if fenced_sql::postgres::guard(&tx, &fence).await? == Verdict::Accepted {
///     tx.execute("INSERT INTO statements (account_id, period, content) VALUES ($1, $2, $3)",
///                &[&1842_i64, &"2026-07", &pdf]).await?;
///     tx.commit().await?;
/// }
/// # Ok(()) }
/// ```
pub async fn guard(tx: &Transaction<'_>, fence: &Fence<'_>) -> Result<Verdict, GuardError> {
    let token = fence.validate()?;
    let row = tx
        .query_one(
            GUARD_CALL,
            &[
                &fence.resource,
                &token,
                &fence.owner_id,
                &fence.operation_id,
                &fence.contract.as_str(),
            ],
        )
        .await?;
    let verdict: &str = row.try_get(0)?;
    let highest: Option<i64> = row.try_get(1)?;
    match (verdict, highest) {
        ("accepted", _) => Ok(Verdict::Accepted),
        ("duplicate", _) => Ok(Verdict::Duplicate),
        ("stale", Some(highest)) => Ok(Verdict::Stale {
            highest: stored_token(fence.resource, highest)?,
        }),
        (other, highest) => Err(GuardError::Corrupt(format!(
            "fenced_guard answered {other:?} (highest token {highest:?}) for resource {:?}",
            fence.resource
        ))),
    }
}

/// Whether `operation_id` is recorded as applied for `resource`, inside
/// `tx`. For a caller that records the operation only once its effect
/// happened ([`record_operation`]) rather than in [`guard`].
pub async fn operation_applied(
    tx: &Transaction<'_>,
    resource: &str,
    operation_id: &str,
) -> Result<bool, GuardError> {
    crate::check_operation(resource, operation_id)?;
    Ok(tx
        .query_opt(
            "SELECT 1 FROM fenced_applied_operations WHERE resource = $1 AND operation_id = $2",
            &[&resource, &operation_id],
        )
        .await?
        .is_some())
}

/// Records `operation_id` as applied for `resource` under `token`, inside
/// `tx`; false when it already was (nothing changes then).
pub async fn record_operation(
    tx: &Transaction<'_>,
    resource: &str,
    operation_id: &str,
    token: u64,
) -> Result<bool, GuardError> {
    let token = crate::check_operation_token(resource, operation_id, token)?;
    let inserted = tx
        .execute(
            "INSERT INTO fenced_applied_operations (resource, operation_id, token)
             VALUES ($1, $2, $3) ON CONFLICT (resource, operation_id) DO NOTHING",
            &[&resource, &operation_id, &token],
        )
        .await?;
    Ok(inserted == 1)
}

/// The highest token accepted for `resource` (`None`: never written).
pub async fn highest(tx: &Transaction<'_>, resource: &str) -> Result<Option<u64>, GuardError> {
    crate::check_len("resource", resource, crate::RESOURCE_MAX_BYTES)?;
    tx.query_opt(
        "SELECT last_accepted_token FROM fenced_fences WHERE resource = $1",
        &[&resource],
    )
    .await?
    .map(|row| stored_token(resource, row.try_get::<_, i64>(0)?))
    .transpose()
}
