//! The outbox on PostgreSQL (tokio-postgres, as fenced-sql uses it):
//! [`record`] in the caller's transaction, and the dispatcher's statements
//! behind [`crate::Store`]. Times are the database server's.

use fenced_sql::{Fence, Verdict};
use tokio_postgres::{Client, Row, Transaction};

use crate::{
    recorded, recording_fence,
    store::{
        attempts, pending_of, stale_of, unsigned, Backlog, DispatcherFence, Entry, MarkOutcome,
        Pending, Update,
    },
    Operation, OutboxError, Recorded,
};

/// The migration: `sql/postgres/001_outbox.sql`, to run after
/// [`fenced_sql::postgres::MIGRATION`]. Idempotent (`IF NOT EXISTS`).
///
/// ```
/// assert!(fenced_outbox::postgres::MIGRATION.contains("CREATE TABLE IF NOT EXISTS fenced_outbox"));
/// ```
pub const MIGRATION: &str = include_str!("../sql/postgres/001_outbox.sql");

/// An advisory lock key (next to fenced-sql's) that serializes concurrent
/// migrations.
const MIGRATION_LOCK: i64 = 7_300_734;

/// Runs fenced-sql's migration, then [`MIGRATION`] in its own transaction
/// under an advisory lock.
pub async fn migrate(client: &mut Client) -> Result<(), OutboxError> {
    fenced_sql::postgres::migrate(client).await?;
    let tx = client.transaction().await?;
    tx.execute("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK])
        .await?;
    tx.batch_execute(MIGRATION).await?;
    tx.commit().await?;
    Ok(())
}

/// Records `op` for the lease `fence` inside the caller's transaction: the
/// fenced-sql guard first (the idempotency key as its operation id), then
/// the row, only when the guard accepts. Commit on [`Recorded::New`]
/// together with your own write; on [`Recorded::Stale`] roll back. Bad
/// input is refused before any SQL is sent.
pub async fn record(
    tx: &Transaction<'_>,
    fence: &Fence<'_>,
    op: &Operation<'_>,
) -> Result<Recorded, OutboxError> {
    let fence = recording_fence(fence, op)?;
    let verdict = fenced_sql::postgres::guard(tx, &fence).await?;
    let sequence = if verdict.is_accepted() {
        let token = fence.validate()?;
        let row = tx
            .query_one(
                "INSERT INTO fenced_outbox
                     (resource, token, owner_id, idempotency_key, destination, method, content_type, payload)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8)
                 RETURNING sequence",
                &[
                    &fence.resource,
                    &token,
                    &fence.owner_id,
                    &op.idempotency_key,
                    &op.destination,
                    &op.method.as_str(),
                    &op.content_type,
                    &op.payload,
                ],
            )
            .await?;
        Some(row.try_get(0)?)
    } else {
        None
    };
    recorded(verdict, sequence)
}

pub(crate) async fn claim(
    client: &mut Client,
    fence: &DispatcherFence,
) -> Result<Verdict, OutboxError> {
    let tx = client.transaction().await?;
    let verdict = fenced_sql::postgres::guard(&tx, &fence.fence()).await?;
    tx.commit().await?;
    Ok(verdict)
}

pub(crate) async fn ready(client: &Client, limit: u32) -> Result<Vec<Pending>, OutboxError> {
    let rows = client
        .query(
            "SELECT o.sequence, o.resource, o.token, o.idempotency_key, o.destination, o.method,
                    o.content_type, o.payload, o.attempts::bigint,
                    (SELECT max(e.token) FROM fenced_outbox e
                      WHERE e.resource = o.resource AND e.sequence < o.sequence)
               FROM fenced_outbox o
              WHERE o.state = 'pending' AND o.next_attempt_at <= now()
                AND NOT EXISTS (SELECT 1 FROM fenced_outbox p
                                 WHERE p.resource = o.resource AND p.state = 'pending'
                                   AND p.sequence < o.sequence)
              ORDER BY o.sequence
              LIMIT $1",
            &[&i64::from(limit)],
        )
        .await?;
    rows.iter().map(|r| pending_of(raw(r)?)).collect()
}

fn raw(r: &Row) -> Result<crate::store::RawPending, tokio_postgres::Error> {
    Ok((
        r.try_get(0)?,
        r.try_get(1)?,
        r.try_get(2)?,
        r.try_get(3)?,
        r.try_get(4)?,
        r.try_get(5)?,
        r.try_get(6)?,
        r.try_get(7)?,
        r.try_get(8)?,
        r.try_get(9)?,
    ))
}

pub(crate) async fn mark(
    client: &mut Client,
    fence: &DispatcherFence,
    sequence: i64,
    update: &Update,
) -> Result<MarkOutcome, OutboxError> {
    let tx = client.transaction().await?;
    if let Some(highest) = stale_of(fenced_sql::postgres::guard(&tx, &fence.fence()).await?) {
        return Ok(MarkOutcome::Stale { highest });
    }
    let changed = tx
        .execute(
            "UPDATE fenced_outbox
                SET state = $2::text,
                    attempts = least(attempts::bigint + $3::int, 2147483647)::int,
                    next_attempt_at = now() + $4::bigint * interval '1 millisecond',
                    last_error = coalesce($5::text, last_error),
                    delivered_at = CASE WHEN $2::text = 'delivered' THEN now() END
              WHERE sequence = $1 AND state = 'pending'",
            &[
                &sequence,
                &update.state,
                &update.attempts_added,
                &update.delay_ms,
                &update.error,
            ],
        )
        .await?;
    tx.commit().await?;
    Ok(if changed == 1 {
        MarkOutcome::Marked
    } else {
        MarkOutcome::NotPending
    })
}

pub(crate) async fn backlog(client: &Client) -> Result<Backlog, OutboxError> {
    let row = client
        .query_one(
            "SELECT count(*),
                    (extract(epoch FROM (now() - min(recorded_at))) * 1000)::bigint
               FROM fenced_outbox WHERE state = 'pending'",
            &[],
        )
        .await?;
    let pending: i64 = row.try_get(0)?;
    let oldest: Option<i64> = row.try_get(1)?;
    Ok(Backlog {
        pending: unsigned("count", pending)?,
        oldest_age: std::time::Duration::from_millis(
            oldest.and_then(|ms| u64::try_from(ms).ok()).unwrap_or(0),
        ),
    })
}

pub(crate) async fn entries(client: &Client, resource: &str) -> Result<Vec<Entry>, OutboxError> {
    let rows = client
        .query(
            "SELECT sequence, token, idempotency_key, state, attempts::bigint, last_error
               FROM fenced_outbox WHERE resource = $1 ORDER BY sequence",
            &[&resource],
        )
        .await?;
    rows.iter()
        .map(|r| {
            Ok(Entry {
                sequence: unsigned("sequence", r.try_get(0)?)?,
                token: unsigned("token", r.try_get(1)?)?,
                idempotency_key: r.try_get(2)?,
                state: r.try_get(3)?,
                attempts: attempts(r.try_get(4)?)?,
                last_error: r.try_get(5)?,
            })
        })
        .collect()
}
