//! The outbox on SQLite (rusqlite, as fenced-sql uses it): [`record`] in the
//! caller's transaction (open it with `BEGIN IMMEDIATE`), and the
//! dispatcher's statements behind [`crate::Store`]. Times are Unix
//! milliseconds of this host's clock, taken by SQLite.

use fenced_sql::{Fence, Verdict};
use rusqlite::{params, Connection, Transaction, TransactionBehavior};

use crate::{
    recorded, recording_fence,
    store::{
        attempts, pending_of, stale_of, unsigned, Backlog, DispatcherFence, Entry, MarkOutcome,
        Pending, Update,
    },
    Operation, OutboxError, Recorded,
};

/// The migration: `sql/sqlite/001_outbox.sql`, to run after
/// [`fenced_sql::sqlite::MIGRATION`]. Idempotent (`IF NOT EXISTS`).
///
/// ```
/// assert!(fenced_outbox::sqlite::MIGRATION.contains("CREATE TABLE IF NOT EXISTS fenced_outbox"));
/// ```
pub const MIGRATION: &str = include_str!("../sql/sqlite/001_outbox.sql");

/// "Now" in Unix milliseconds, by SQLite.
const NOW_MS: &str = "CAST(unixepoch('subsec') * 1000 AS INTEGER)";

/// Runs fenced-sql's migration, then [`MIGRATION`], each in its own
/// `BEGIN IMMEDIATE` transaction.
///
/// ```
/// # fn main() -> Result<(), fenced_outbox::OutboxError> {
/// let mut conn = rusqlite::Connection::open_in_memory()?;
/// fenced_outbox::sqlite::migrate(&mut conn)?;
/// fenced_outbox::sqlite::migrate(&mut conn)?; // again: nothing changes
/// # Ok(()) }
/// ```
pub fn migrate(conn: &mut Connection) -> Result<(), OutboxError> {
    fenced_sql::sqlite::migrate(conn)?;
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    tx.execute_batch(MIGRATION)?;
    tx.commit()?;
    Ok(())
}

/// Records `op` for the lease `fence` inside the caller's transaction: the
/// fenced-sql guard first (the idempotency key as its operation id), then
/// the row, only when the guard accepts. Commit on [`Recorded::New`]
/// together with your own write; on [`Recorded::Stale`] roll back. Bad
/// input is refused before any SQL runs.
pub fn record(
    tx: &Transaction<'_>,
    fence: &Fence<'_>,
    op: &Operation<'_>,
) -> Result<Recorded, OutboxError> {
    let fence = recording_fence(fence, op)?;
    let verdict = fenced_sql::sqlite::guard(tx, &fence)?;
    let sequence = if verdict.is_accepted() {
        let token = fence.validate()?;
        Some(tx.query_row(
            "INSERT INTO fenced_outbox
                 (resource, token, owner_id, idempotency_key, destination, method, content_type, payload)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)
             RETURNING sequence",
            params![
                fence.resource,
                token,
                fence.owner_id,
                op.idempotency_key,
                op.destination,
                op.method.as_str(),
                op.content_type,
                op.payload
            ],
            |r| r.get(0),
        )?)
    } else {
        None
    };
    recorded(verdict, sequence)
}

pub(crate) fn claim(
    conn: &mut Connection,
    fence: &DispatcherFence,
) -> Result<Verdict, OutboxError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    let verdict = fenced_sql::sqlite::guard(&tx, &fence.fence())?;
    tx.commit()?;
    Ok(verdict)
}

pub(crate) fn ready(conn: &mut Connection, limit: u32) -> Result<Vec<Pending>, OutboxError> {
    let sql = format!(
        "SELECT o.sequence, o.resource, o.token, o.idempotency_key, o.destination, o.method,
                o.content_type, o.payload, o.attempts,
                (SELECT max(e.token) FROM fenced_outbox e
                  WHERE e.resource = o.resource AND e.sequence < o.sequence)
           FROM fenced_outbox o
          WHERE o.state = 'pending' AND o.next_attempt_at <= {NOW_MS}
            AND NOT EXISTS (SELECT 1 FROM fenced_outbox p
                             WHERE p.resource = o.resource AND p.state = 'pending'
                               AND p.sequence < o.sequence)
          ORDER BY o.sequence
          LIMIT ?1"
    );
    let mut stmt = conn.prepare(&sql)?;
    let rows = stmt.query_map(params![limit], |r| {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
            r.get(6)?,
            r.get(7)?,
            r.get(8)?,
            r.get(9)?,
        ))
    })?;
    rows.map(|raw| pending_of(raw?)).collect()
}

pub(crate) fn mark(
    conn: &mut Connection,
    fence: &DispatcherFence,
    sequence: i64,
    update: &Update,
) -> Result<MarkOutcome, OutboxError> {
    let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
    if let Some(highest) = stale_of(fenced_sql::sqlite::guard(&tx, &fence.fence())?) {
        return Ok(MarkOutcome::Stale { highest });
    }
    let changed = tx.execute(
        &format!(
            "UPDATE fenced_outbox
                SET state = ?2,
                    attempts = min(attempts + ?3, 2147483647),
                    next_attempt_at = {NOW_MS} + ?4,
                    last_error = coalesce(?5, last_error),
                    delivered_at = CASE WHEN ?2 = 'delivered' THEN {NOW_MS} END
              WHERE sequence = ?1 AND state = 'pending'"
        ),
        params![
            sequence,
            update.state,
            update.attempts_added,
            update.delay_ms,
            update.error
        ],
    )?;
    tx.commit()?;
    Ok(if changed == 1 {
        MarkOutcome::Marked
    } else {
        MarkOutcome::NotPending
    })
}

pub(crate) fn backlog(conn: &mut Connection) -> Result<Backlog, OutboxError> {
    let (pending, oldest): (i64, Option<i64>) = conn.query_row(
        &format!(
            "SELECT count(*), {NOW_MS} - min(recorded_at) FROM fenced_outbox WHERE state = 'pending'"
        ),
        [],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )?;
    Ok(Backlog {
        pending: unsigned("count", pending)?,
        oldest_age: std::time::Duration::from_millis(
            oldest.and_then(|ms| u64::try_from(ms).ok()).unwrap_or(0),
        ),
    })
}

pub(crate) fn entries(conn: &mut Connection, resource: &str) -> Result<Vec<Entry>, OutboxError> {
    let mut stmt = conn.prepare(
        "SELECT sequence, token, idempotency_key, state, attempts, last_error
           FROM fenced_outbox WHERE resource = ?1 ORDER BY sequence",
    )?;
    let rows = stmt.query_map(params![resource], |r| {
        Ok((
            r.get(0)?,
            r.get(1)?,
            r.get(2)?,
            r.get(3)?,
            r.get(4)?,
            r.get(5)?,
        ))
    })?;
    rows.map(|row| {
        let (sequence, token, idempotency_key, state, n, last_error): (
            i64,
            i64,
            String,
            String,
            i64,
            Option<String>,
        ) = row?;
        Ok(Entry {
            sequence: unsigned("sequence", sequence)?,
            token: unsigned("token", token)?,
            idempotency_key,
            state,
            attempts: attempts(n)?,
            last_error,
        })
    })
    .collect()
}
