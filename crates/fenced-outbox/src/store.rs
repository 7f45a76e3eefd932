//! The dispatcher's side of the outbox table, over either backend: what is
//! ready, the fenced marks, the backlog.

use std::{
    sync::{Arc, Mutex},
    time::Duration,
};

use fenced_sql::{Contract, Fence, Verdict};

use crate::{decide::Mark, Method, OutboxError};

/// The dispatcher's own fence: its lease's resource, token and owner id.
/// Every mark it makes passes the fenced-sql guard with it first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DispatcherFence {
    pub resource: String,
    pub token: u64,
    pub owner_id: String,
}

impl DispatcherFence {
    /// `at_least`: the dispatcher marks many times under one lease.
    pub(crate) fn fence(&self) -> Fence<'_> {
        Fence {
            resource: &self.resource,
            token: self.token,
            owner_id: &self.owner_id,
            operation_id: None,
            contract: Contract::AtLeast,
        }
    }
}

/// A pending operation whose turn has come.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pending {
    pub sequence: u64,
    pub resource: String,
    pub token: u64,
    pub idempotency_key: String,
    pub destination: String,
    pub method: Method,
    pub content_type: String,
    pub payload: Vec<u8>,
    /// Attempts made so far.
    pub attempts: u32,
    /// The highest token of the operations of the same resource recorded
    /// before this one (none: it is the first).
    pub earlier_max_token: Option<u64>,
}

/// One row, as the tests and tools read it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub sequence: u64,
    pub token: u64,
    pub idempotency_key: String,
    /// `pending`, `delivered`, `failed` or `superseded`.
    pub state: String,
    pub attempts: u32,
    pub last_error: Option<String>,
}

/// What a mark did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MarkOutcome {
    Marked,
    /// The row was no longer pending (marked already): nothing changed.
    NotPending,
    /// The dispatcher's token is stale: a newer dispatcher (token
    /// `highest`) marked since. Nothing changed.
    Stale {
        highest: u64,
    },
}

/// The pending operations: how many, and how long the oldest has waited
/// since it was recorded (zero when none).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Backlog {
    pub pending: u64,
    pub oldest_age: Duration,
}

/// The outbox table of one database, for the dispatcher.
#[derive(Clone)]
pub struct Store {
    backend: Backend,
}

#[derive(Clone)]
enum Backend {
    Sqlite(Arc<Mutex<rusqlite::Connection>>),
    Postgres(Arc<tokio::sync::Mutex<tokio_postgres::Client>>),
}

/// How long an SQLite statement waits for another writer's lock.
const SQLITE_BUSY_TIMEOUT: Duration = Duration::from_secs(5);

impl Store {
    /// Opens `sqlite:PATH` or connects to `postgres://...` (also
    /// `postgresql://`, or libpq's `host=... dbname=...`; without TLS: reach the server over loopback or a
    /// Unix socket). The URL is never echoed in an error (it may carry a
    /// password).
    pub async fn open(database: &str) -> Result<Store, OutboxError> {
        if let Some(path) = database.strip_prefix("sqlite:") {
            if path.is_empty() {
                return Err(OutboxError::invalid(
                    "database",
                    "sqlite: needs a path (sqlite:PATH)",
                ));
            }
            let path = path.to_string();
            let conn = tokio::task::spawn_blocking(move || -> Result<_, OutboxError> {
                let conn = rusqlite::Connection::open(path)?;
                conn.busy_timeout(SQLITE_BUSY_TIMEOUT)?;
                Ok(conn)
            })
            .await
            .map_err(|e| OutboxError::Internal(format!("opening sqlite: {e}")))??;
            return Ok(Store::sqlite(conn));
        }
        let key_value = !database.contains("://") && database.contains('=');
        if database.starts_with("postgres://") || database.starts_with("postgresql://") || key_value
        {
            let (client, connection) =
                tokio_postgres::connect(database, tokio_postgres::NoTls).await?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::error!(error = %e, "the PostgreSQL connection ended");
                }
            });
            return Ok(Store::postgres(client));
        }
        Err(OutboxError::invalid(
            "database",
            "must be sqlite:PATH, postgres://USER@HOST/DB or key=value (host=... dbname=...)",
        ))
    }

    /// A store on an open SQLite connection (set a busy timeout).
    pub fn sqlite(conn: rusqlite::Connection) -> Store {
        Store {
            backend: Backend::Sqlite(Arc::new(Mutex::new(conn))),
        }
    }

    /// A store on a connected PostgreSQL client (its connection task
    /// spawned).
    pub fn postgres(client: tokio_postgres::Client) -> Store {
        Store {
            backend: Backend::Postgres(Arc::new(tokio::sync::Mutex::new(client))),
        }
    }

    /// Whether the database connection is gone for good (PostgreSQL).
    pub fn is_closed(&self) -> bool {
        match &self.backend {
            Backend::Sqlite(_) => false,
            Backend::Postgres(c) => c.try_lock().is_ok_and(|c| c.is_closed()),
        }
    }

    /// fenced-sql's migration, then the outbox's.
    pub async fn migrate(&self) -> Result<(), OutboxError> {
        match &self.backend {
            Backend::Sqlite(c) => blocking(c, crate::sqlite::migrate).await,
            Backend::Postgres(c) => crate::postgres::migrate(&mut *c.lock().await).await,
        }
    }

    /// Passes the guard with the dispatcher's fence and commits: from then
    /// on, a dispatcher with an older token cannot mark anything.
    pub async fn claim(&self, fence: &DispatcherFence) -> Result<Verdict, OutboxError> {
        match &self.backend {
            Backend::Sqlite(c) => {
                let fence = fence.clone();
                blocking(c, move |conn| crate::sqlite::claim(conn, &fence)).await
            }
            Backend::Postgres(c) => crate::postgres::claim(&mut *c.lock().await, fence).await,
        }
    }

    /// Up to `limit` pending operations whose next attempt is due, in
    /// sequence order, at most one per resource: an operation waits for
    /// every earlier pending operation of its resource.
    pub async fn ready(&self, limit: u32) -> Result<Vec<Pending>, OutboxError> {
        match &self.backend {
            Backend::Sqlite(c) => blocking(c, move |conn| crate::sqlite::ready(conn, limit)).await,
            Backend::Postgres(c) => crate::postgres::ready(&*c.lock().await, limit).await,
        }
    }

    /// Records `mark` for operation `sequence` if it is still pending, in a
    /// transaction that first passes the guard with `fence`.
    pub async fn mark(
        &self,
        fence: &DispatcherFence,
        sequence: u64,
        mark: &Mark,
    ) -> Result<MarkOutcome, OutboxError> {
        let seq = i64::try_from(sequence)
            .map_err(|_| OutboxError::invalid("sequence", "must be at most 2^63-1"))?;
        let update = Update::of(mark);
        match &self.backend {
            Backend::Sqlite(c) => {
                let fence = fence.clone();
                blocking(c, move |conn| {
                    crate::sqlite::mark(conn, &fence, seq, &update)
                })
                .await
            }
            Backend::Postgres(c) => {
                crate::postgres::mark(&mut *c.lock().await, fence, seq, &update).await
            }
        }
    }

    /// The backlog, by the database's clock.
    pub async fn backlog(&self) -> Result<Backlog, OutboxError> {
        match &self.backend {
            Backend::Sqlite(c) => blocking(c, crate::sqlite::backlog).await,
            Backend::Postgres(c) => crate::postgres::backlog(&*c.lock().await).await,
        }
    }

    /// Every operation of `resource`, in sequence order.
    pub async fn entries(&self, resource: &str) -> Result<Vec<Entry>, OutboxError> {
        match &self.backend {
            Backend::Sqlite(c) => {
                let resource = resource.to_string();
                blocking(c, move |conn| crate::sqlite::entries(conn, &resource)).await
            }
            Backend::Postgres(c) => crate::postgres::entries(&*c.lock().await, resource).await,
        }
    }
}

/// A mark as the columns it sets.
pub(crate) struct Update {
    pub state: &'static str,
    pub attempts_added: i32,
    /// Milliseconds from now until the next attempt.
    pub delay_ms: i64,
    pub error: Option<String>,
}

impl Update {
    fn of(mark: &Mark) -> Update {
        let delay = match mark {
            Mark::Retry { delay, .. } => *delay,
            _ => Duration::ZERO,
        };
        Update {
            state: mark.state(),
            attempts_added: i32::from(mark.counts_attempt()),
            delay_ms: i64::try_from(delay.as_millis()).unwrap_or(i64::MAX),
            error: mark.error(),
        }
    }
}

/// Runs `f` on the SQLite connection on a blocking thread.
async fn blocking<T, F>(conn: &Arc<Mutex<rusqlite::Connection>>, f: F) -> Result<T, OutboxError>
where
    T: Send + 'static,
    F: FnOnce(&mut rusqlite::Connection) -> Result<T, OutboxError> + Send + 'static,
{
    let conn = Arc::clone(conn);
    tokio::task::spawn_blocking(move || {
        let mut conn = conn.lock().map_err(|_| {
            OutboxError::Internal("the sqlite connection's lock is poisoned".into())
        })?;
        f(&mut conn)
    })
    .await
    .map_err(|e| OutboxError::Internal(format!("sqlite task: {e}")))?
}

/// A stored non-negative integer as `u64`.
pub(crate) fn unsigned(field: &str, v: i64) -> Result<u64, OutboxError> {
    u64::try_from(v).map_err(|_| OutboxError::Corrupt(format!("{field} is negative ({v})")))
}

/// A stored attempt count as `u32`.
pub(crate) fn attempts(v: i64) -> Result<u32, OutboxError> {
    u32::try_from(v).map_err(|_| OutboxError::Corrupt(format!("attempts out of range ({v})")))
}

/// The raw columns of a ready row, in the order both backends select them.
pub(crate) type RawPending = (
    i64,
    String,
    i64,
    String,
    String,
    String,
    String,
    Vec<u8>,
    i64,
    Option<i64>,
);

pub(crate) fn pending_of(raw: RawPending) -> Result<Pending, OutboxError> {
    let (
        sequence,
        resource,
        token,
        idempotency_key,
        destination,
        method,
        content_type,
        payload,
        n,
        earlier,
    ) = raw;
    Ok(Pending {
        sequence: unsigned("sequence", sequence)?,
        resource,
        token: unsigned("token", token)?,
        idempotency_key,
        destination,
        method: Method::parse(&method)?,
        content_type,
        payload,
        attempts: attempts(n)?,
        earlier_max_token: earlier.map(|t| unsigned("token", t)).transpose()?,
    })
}

/// The guard's verdict on a mark or claim, and whether to go on.
pub(crate) fn stale_of(verdict: Verdict) -> Option<u64> {
    match verdict {
        Verdict::Stale { highest } => Some(highest),
        Verdict::Accepted | Verdict::Duplicate => None,
    }
}
