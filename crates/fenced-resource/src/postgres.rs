//! The same fence contract on a PostgreSQL table (feature `postgres`).
//!
//! The decision is ONE statement: an `INSERT ... ON CONFLICT (key) DO UPDATE
//! ... WHERE` whose condition compares the presented token with the stored
//! one (`token > stored`, or `token = stored` by the same owner under the
//! allow-equal contract), checks the bound resource, the expected version and
//! the sequence number, and writes the value, all in the row's one atomic
//! update. If no row comes back, the write was refused; the row is then read
//! to explain why, with the same rules as [`crate::FenceStore`]. An
//! idempotency key is claimed in the same transaction, so a retry is applied
//! once; a key remembers its newest [`IDEMPOTENCY_RECORDS_PER_KEY`] records,
//! as the sled store does (tests/tests/fence_rule_differential.rs feeds both
//! stores and a model the same writes). Tokens, versions and sequence numbers are `bigint`: above
//! `i64::MAX` they are refused.
//!
//! ```no_run
//! # async fn demo() -> Result<(), fenced_resource::StoreError> {
//! use fenced_core::{OwnerId, ResourceName, Token};
//! use fenced_resource::{postgres::PgFenceStore, Write};
//! let mut store = PgFenceStore::connect("host=127.0.0.1 user=postgres dbname=app").await?;
//! store.create_tables().await?;
//! let resource = ResourceName::new("statement:account-1842:2026-07")?;
//! let outcome = store.write(&Write::for_resource(resource, Token::new(42)?, OwnerId::random(), "body")).await?;
//! println!("{}", outcome.status());
//! # Ok(()) }
//! ```

use fenced_core::{InvalidArgument, OwnerId, ResourceName, Token};
use tokio_postgres::{types::Type, Client, NoTls, Row, Statement};
use tracing::warn;

use crate::{
    decide::{decide, Decision, KeyState},
    limits::{check_key, IDEMPOTENCY_RECORDS_PER_KEY},
    Current, Mode, StoreError, Write, WriteOutcome,
};

/// The tables, created if missing by [`PgFenceStore::create_tables`].
pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS fenced_resource (
    key        text     PRIMARY KEY,
    resource   text     NOT NULL,
    mode       smallint NOT NULL CHECK (mode IN (0, 1)),
    token      bigint   NOT NULL CHECK (token >= 1),
    owner_id   uuid     NOT NULL,
    version    bigint   NOT NULL CHECK (version >= 1),
    sequence   bigint   NULL,
    value      bytea    NOT NULL
);
CREATE TABLE IF NOT EXISTS fenced_resource_idempotency (
    key              text        NOT NULL,
    idempotency_key  text        NOT NULL,
    fingerprint      bigint      NOT NULL,
    token            bigint      NOT NULL,
    version          bigint      NOT NULL,
    created_at       timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (key, idempotency_key)
);
";

/// The fenced write: one statement. $1 key, $2 resource, $3 token,
/// $4 owner, $5 sequence, $6 value, $7 expected version, $8 mode.
const FENCED_WRITE: &str = "
INSERT INTO fenced_resource AS r (key, resource, mode, token, owner_id, version, sequence, value)
SELECT $1, $2, COALESCE($8, 0), $3, $4, 1, $5, $6
WHERE $7 IS NULL OR $7 = 0 OR EXISTS (SELECT 1 FROM fenced_resource WHERE key = $1)
ON CONFLICT (key) DO UPDATE SET
    token    = EXCLUDED.token,
    owner_id = EXCLUDED.owner_id,
    version  = r.version + 1,
    value    = EXCLUDED.value,
    sequence = CASE WHEN EXCLUDED.token > r.token THEN EXCLUDED.sequence
                    ELSE COALESCE(EXCLUDED.sequence, r.sequence) END
WHERE r.resource = EXCLUDED.resource
  AND ($8 IS NULL OR r.mode = $8)
  AND (EXCLUDED.token > r.token
       OR (EXCLUDED.token = r.token AND r.owner_id = EXCLUDED.owner_id AND r.mode = 0
           AND (EXCLUDED.sequence IS NULL OR r.sequence IS NULL OR EXCLUDED.sequence > r.sequence)))
  AND ($7 IS NULL OR r.version = $7)
RETURNING r.token, r.version";

const READ: &str =
    "SELECT resource, mode, token, owner_id, version, sequence, value FROM fenced_resource WHERE key = $1";

const CLAIM: &str =
    "INSERT INTO fenced_resource_idempotency (key, idempotency_key, fingerprint, token, version)
VALUES ($1, $2, $3, 0, 0) ON CONFLICT DO NOTHING RETURNING 1";
const RECALL: &str = "SELECT fingerprint, token, version FROM fenced_resource_idempotency
WHERE key = $1 AND idempotency_key = $2";
const RECORD: &str = "UPDATE fenced_resource_idempotency SET token = $3, version = $4
WHERE key = $1 AND idempotency_key = $2";
/// Keeps the newest [`IDEMPOTENCY_RECORDS_PER_KEY`] records of a key (by the
/// version their write produced), as the sled store does: an older retry is
/// decided afresh against the fence. $1 key, $2 how many to keep less one.
const TRIM: &str = "DELETE FROM fenced_resource_idempotency
WHERE key = $1 AND version < (
    SELECT version FROM fenced_resource_idempotency WHERE key = $1
    ORDER BY version DESC OFFSET $2 LIMIT 1)";

/// The offset of the oldest record [`TRIM`] keeps.
const NEWEST_KEPT_OFFSET: i64 = IDEMPOTENCY_RECORDS_PER_KEY as i64 - 1;

/// How often a write is decided again when the row changed between the
/// refused statement and the read that explains it.
const ATTEMPTS_MAX: usize = 8;

/// A fence store on one PostgreSQL connection.
///
/// ```no_run
/// # async fn demo() -> Result<(), fenced_resource::StoreError> {
/// let store = fenced_resource::postgres::PgFenceStore::connect("host=127.0.0.1 user=postgres").await?;
/// store.create_tables().await?;
/// assert!(store.get("statement:1").await?.is_none());
/// # Ok(()) }
/// ```
pub struct PgFenceStore {
    client: Client,
    write: Statement,
    read: Statement,
}

fn pg(e: tokio_postgres::Error) -> StoreError {
    StoreError::Storage(format!("postgresql: {e}"))
}

fn as_bigint(field: &'static str, v: u64) -> Result<i64, InvalidArgument> {
    i64::try_from(v).map_err(|_| {
        InvalidArgument::new(
            field,
            format!("must be at most {} for PostgreSQL, got {v}", i64::MAX),
        )
    })
}

fn as_u64(key: &str, column: &str, v: i64) -> Result<u64, StoreError> {
    u64::try_from(v).map_err(|_| StoreError::Corrupt {
        key: key.to_string(),
        reason: format!("{column} is negative ({v})"),
    })
}

fn state_of(key: &str, row: &Row) -> Result<KeyState, StoreError> {
    let corrupt = |reason: String| StoreError::Corrupt {
        key: key.to_string(),
        reason,
    };
    let resource: String = row.try_get(0).map_err(pg)?;
    let mode: i16 = row.try_get(1).map_err(pg)?;
    let token: i64 = row.try_get(2).map_err(pg)?;
    let owner: uuid::Uuid = row.try_get(3).map_err(pg)?;
    let version: i64 = row.try_get(4).map_err(pg)?;
    let sequence: Option<i64> = row.try_get(5).map_err(pg)?;
    Ok(KeyState {
        resource: ResourceName::new(&resource).map_err(|e| corrupt(e.to_string()))?,
        mode: Mode::from_code(i32::from(mode))
            .ok_or_else(|| corrupt(format!("unknown mode {mode}")))?,
        token: Token::new(as_u64(key, "token", token)?).map_err(|e| corrupt(e.to_string()))?,
        owner: OwnerId::new(owner).map_err(|e| corrupt(e.to_string()))?,
        version: as_u64(key, "version", version)?,
        sequence: sequence.map(|s| as_u64(key, "sequence", s)).transpose()?,
        value: row.try_get(6).map_err(pg)?,
        remembered: Default::default(),
    })
}

impl PgFenceStore {
    /// Connects with a libpq-style connection string (no TLS; use it on a
    /// trusted network or a local socket), creates the tables if missing and
    /// prepares the statements.
    ///
    /// ```no_run
    /// # async fn demo() -> Result<(), fenced_resource::StoreError> {
    /// let store = fenced_resource::postgres::PgFenceStore::connect("postgresql://postgres@127.0.0.1:5432/app").await?;
    /// # Ok(()) }
    /// ```
    pub async fn connect(config: &str) -> Result<Self, StoreError> {
        let (client, connection) = tokio_postgres::connect(config, NoTls).await.map_err(pg)?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                warn!(error = %e, "postgresql connection ended");
            }
        });
        create_tables(&client).await?;
        let write = client
            .prepare_typed(
                FENCED_WRITE,
                &[
                    Type::TEXT,
                    Type::TEXT,
                    Type::INT8,
                    Type::UUID,
                    Type::INT8,
                    Type::BYTEA,
                    Type::INT8,
                    Type::INT2,
                ],
            )
            .await
            .map_err(pg)?;
        let read = client
            .prepare_typed(READ, &[Type::TEXT])
            .await
            .map_err(pg)?;
        Ok(PgFenceStore {
            client,
            write,
            read,
        })
    }

    /// Creates the tables ([`SCHEMA`]) if they do not exist. Idempotent.
    ///
    /// ```no_run
    /// # async fn demo(store: fenced_resource::postgres::PgFenceStore) -> Result<(), fenced_resource::StoreError> {
    /// store.create_tables().await?;
    /// # Ok(()) }
    /// ```
    pub async fn create_tables(&self) -> Result<(), StoreError> {
        create_tables(&self.client).await
    }

    /// Decides and applies `write` with the contract of
    /// [`crate::FenceStore::write`]; the answer comes after the commit.
    ///
    /// ```no_run
    /// # async fn demo(mut store: fenced_resource::postgres::PgFenceStore) -> Result<(), Box<dyn std::error::Error>> {
    /// use fenced_core::{OwnerId, ResourceName, Token};
    /// use fenced_resource::Write;
    /// let w = Write::for_resource(ResourceName::new("r")?, Token::new(1)?, OwnerId::random(), "v");
    /// let outcome = store.write(&w).await?;
    /// # Ok(()) }
    /// ```
    pub async fn write(&mut self, write: &Write) -> Result<WriteOutcome, StoreError> {
        write.validate()?;
        let token = as_bigint("token", write.token.get())?;
        let expected = write
            .expected_version
            .map(|v| as_bigint("expected_version", v))
            .transpose()?;
        let sequence = write
            .sequence
            .map(|v| as_bigint("sequence", v))
            .transpose()?;
        let mode = write.mode.map(|m| m.code() as i16);
        // The fingerprint is stored as the bigint with the same bits.
        let fingerprint = i64::from_ne_bytes(write.fingerprint().to_ne_bytes());
        for _ in 0..ATTEMPTS_MAX {
            let tx = self.client.transaction().await.map_err(pg)?;
            if let Some(ik) = &write.idempotency_key {
                let claimed = tx
                    .query_opt(CLAIM, &[&write.key, ik, &fingerprint])
                    .await
                    .map_err(pg)?;
                if claimed.is_none() {
                    let row = tx.query_one(RECALL, &[&write.key, ik]).await.map_err(pg)?;
                    let (fp, t, v): (i64, i64, i64) = (
                        row.try_get(0).map_err(pg)?,
                        row.try_get(1).map_err(pg)?,
                        row.try_get(2).map_err(pg)?,
                    );
                    if fp != fingerprint {
                        return Err(InvalidArgument::new(
                            "idempotency_key",
                            format!(
                                "{ik:?} was already used for a different write to key {:?}; use a new idempotency key for a new write",
                                write.key
                            ),
                        )
                        .into());
                    }
                    return Ok(WriteOutcome::Accepted {
                        token: as_u64(&write.key, "token", t)?,
                        version: as_u64(&write.key, "version", v)?,
                    });
                }
            }
            let applied = tx
                .query_opt(
                    &self.write,
                    &[
                        &write.key,
                        &write.resource.as_str(),
                        &token,
                        &write.owner.as_uuid(),
                        &sequence,
                        &write.value,
                        &expected,
                        &mode,
                    ],
                )
                .await
                .map_err(pg)?;
            if let Some(row) = applied {
                let t: i64 = row.try_get(0).map_err(pg)?;
                let v: i64 = row.try_get(1).map_err(pg)?;
                if let Some(ik) = &write.idempotency_key {
                    tx.execute(RECORD, &[&write.key, ik, &t, &v])
                        .await
                        .map_err(pg)?;
                    tx.execute(TRIM, &[&write.key, &NEWEST_KEPT_OFFSET])
                        .await
                        .map_err(pg)?;
                }
                tx.commit().await.map_err(pg)?;
                let outcome = WriteOutcome::Accepted {
                    token: as_u64(&write.key, "token", t)?,
                    version: as_u64(&write.key, "version", v)?,
                };
                log(write, &outcome);
                return Ok(outcome);
            }
            // Refused: explain from the row as it is now. The claim on the
            // idempotency key is rolled back, so nothing is written.
            let row = tx.query_opt(&self.read, &[&write.key]).await.map_err(pg)?;
            tx.rollback().await.map_err(pg)?;
            let state = row.map(|r| state_of(&write.key, &r)).transpose()?;
            match decide(state.as_ref(), write, Mode::AllowEqual) {
                Decision::Answer(outcome) => {
                    log(write, &outcome);
                    return Ok(outcome);
                }
                Decision::Invalid(e) => return Err(e.into()),
                // The row changed since the statement ran: decide again.
                Decision::Apply(_) => continue,
            }
        }
        Err(StoreError::Storage(format!(
            "key {:?} kept changing while the write was decided; retry",
            write.key
        )))
    }

    /// The key's current value and highest accepted token.
    ///
    /// ```no_run
    /// # async fn demo(store: fenced_resource::postgres::PgFenceStore) -> Result<(), fenced_resource::StoreError> {
    /// if let Some(c) = store.get("statement:1").await? { println!("token {}", c.token); }
    /// # Ok(()) }
    /// ```
    pub async fn get(&self, key: &str) -> Result<Option<Current>, StoreError> {
        check_key(key)?;
        let row = self
            .client
            .query_opt(&self.read, &[&key])
            .await
            .map_err(pg)?;
        Ok(row
            .map(|r| state_of(key, &r))
            .transpose()?
            .map(|s| s.current(key)))
    }
}

/// Creates the tables under an advisory lock: concurrent `CREATE TABLE IF
/// NOT EXISTS` of the same table can otherwise fail in PostgreSQL.
async fn create_tables(client: &Client) -> Result<(), StoreError> {
    client
        .batch_execute(&format!(
            "BEGIN; SELECT pg_advisory_xact_lock(7300731); {SCHEMA} COMMIT;"
        ))
        .await
        .map_err(pg)
}

/// The owner id is a capability: logged at debug level only.
fn log(write: &Write, outcome: &WriteOutcome) {
    let op = write.operation_id.as_deref().unwrap_or("-");
    tracing::debug!(key = %write.key, owner = %write.owner, token = write.token.get(), operation_id = op, "write by");
    match outcome {
        WriteOutcome::Rejected(r) => warn!(
            key = %write.key, resource = %write.resource,
            token = write.token.get(), highest_token = r.highest_token,
            reason = r.reason.as_str(), operation_id = op, "write rejected: {r}"
        ),
        other => tracing::info!(
            key = %write.key, resource = %write.resource,
            token = write.token.get(), status = other.status(), operation_id = op, "write decided"
        ),
    }
}
