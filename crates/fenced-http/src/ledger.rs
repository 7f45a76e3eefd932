//! Where a guard keeps, per resource, the highest token it accepted and the
//! operation ids it applied: durable before it answers. Two stores stand
//! behind the trait, both on the tables of `fenced-sql`: SQLite (one host,
//! no database server) and PostgreSQL (shared by every instance of a
//! service).

use std::{
    future::Future,
    path::Path,
    pin::Pin,
    sync::{Arc, Mutex, PoisonError},
};

use fenced_sql::{Fence, GuardError, Verdict};

/// A future a ledger returns.
pub type LedgerFuture<'a, T> = Pin<Box<dyn Future<Output = Result<T, GuardError>> + Send + 'a>>;

/// The durable record of a guard.
pub trait Ledger: Send + Sync + 'static {
    /// An operation id already applied answers [`Verdict::Duplicate`];
    /// else the token is compared with the resource's highest and, when it
    /// passes, recorded: durable before the answer. The operation id is
    /// not recorded here ([`Ledger::complete`] does, once the effect
    /// happened).
    fn admit<'a>(&'a self, fence: &'a Fence<'a>) -> LedgerFuture<'a, Verdict>;

    /// Records the fence's operation id as applied (nothing without one).
    fn complete<'a>(&'a self, fence: &'a Fence<'a>) -> LedgerFuture<'a, ()>;

    /// The highest token recorded for `resource` (`None`: never written).
    fn highest<'a>(&'a self, resource: &'a str) -> LedgerFuture<'a, Option<u64>>;

    /// Whether `operation_id` is recorded as applied for `resource` (read
    /// only: asked before anything else, so an owner whose lease has ended
    /// still learns that its operation happened).
    fn applied<'a>(&'a self, resource: &'a str, operation_id: &'a str) -> LedgerFuture<'a, bool>;
}

/// A ledger in one SQLite file, written in WAL mode with
/// `synchronous=FULL`: every commit is fsync'ed before the answer.
#[derive(Debug, Clone)]
pub struct SqliteLedger {
    conn: Arc<Mutex<rusqlite::Connection>>,
}

impl SqliteLedger {
    /// Opens (creating) `path` and runs the fences migration.
    pub fn open(path: &Path) -> Result<Self, GuardError> {
        let mut conn = rusqlite::Connection::open(path)?;
        conn.busy_timeout(std::time::Duration::from_secs(5))?;
        let mode: String = conn.query_row("PRAGMA journal_mode=WAL", [], |r| r.get(0))?;
        if !mode.eq_ignore_ascii_case("wal") {
            return Err(GuardError::Corrupt(format!(
                "{}: journal_mode stayed {mode:?}, WAL was asked",
                path.display()
            )));
        }
        conn.execute_batch("PRAGMA synchronous=FULL")?;
        fenced_sql::sqlite::migrate(&mut conn)?;
        Ok(SqliteLedger {
            conn: Arc::new(Mutex::new(conn)),
        })
    }

    /// Runs `f` in an immediate transaction on a blocking thread.
    fn in_transaction<'a, T, F>(&'a self, f: F) -> LedgerFuture<'a, T>
    where
        T: Send + 'static,
        F: FnOnce(&rusqlite::Transaction<'_>) -> Result<T, GuardError> + Send + 'static,
    {
        let conn = Arc::clone(&self.conn);
        Box::pin(async move {
            tokio::task::spawn_blocking(move || {
                let mut conn = conn.lock().unwrap_or_else(PoisonError::into_inner);
                let tx =
                    conn.transaction_with_behavior(rusqlite::TransactionBehavior::Immediate)?;
                let out = f(&tx)?;
                tx.commit()?;
                Ok(out)
            })
            .await
            .map_err(|e| GuardError::Corrupt(format!("the ledger's thread failed: {e}")))?
        })
    }
}

/// An owned copy of a fence, for a closure on another thread.
struct OwnedFence {
    resource: String,
    token: u64,
    owner_id: String,
    operation_id: Option<String>,
    contract: fenced_sql::Contract,
}

impl OwnedFence {
    fn of(f: &Fence<'_>) -> Self {
        OwnedFence {
            resource: f.resource.to_string(),
            token: f.token,
            owner_id: f.owner_id.to_string(),
            operation_id: f.operation_id.map(str::to_string),
            contract: f.contract,
        }
    }
    fn fence(&self) -> Fence<'_> {
        Fence {
            resource: &self.resource,
            token: self.token,
            owner_id: &self.owner_id,
            operation_id: self.operation_id.as_deref(),
            contract: self.contract,
        }
    }
}

impl Ledger for SqliteLedger {
    fn admit<'a>(&'a self, fence: &'a Fence<'a>) -> LedgerFuture<'a, Verdict> {
        let f = OwnedFence::of(fence);
        self.in_transaction(move |tx| {
            if let Some(op) = &f.operation_id {
                if fenced_sql::sqlite::operation_applied(tx, &f.resource, op)? {
                    return Ok(Verdict::Duplicate);
                }
            }
            let token_only = Fence {
                operation_id: None,
                ..f.fence()
            };
            fenced_sql::sqlite::guard(tx, &token_only)
        })
    }

    fn complete<'a>(&'a self, fence: &'a Fence<'a>) -> LedgerFuture<'a, ()> {
        let f = OwnedFence::of(fence);
        self.in_transaction(move |tx| {
            if let Some(op) = &f.operation_id {
                fenced_sql::sqlite::record_operation(tx, &f.resource, op, f.token)?;
            }
            Ok(())
        })
    }

    fn highest<'a>(&'a self, resource: &'a str) -> LedgerFuture<'a, Option<u64>> {
        let resource = resource.to_string();
        self.in_transaction(move |tx| fenced_sql::sqlite::highest(tx, &resource))
    }

    fn applied<'a>(&'a self, resource: &'a str, operation_id: &'a str) -> LedgerFuture<'a, bool> {
        let (resource, op) = (resource.to_string(), operation_id.to_string());
        self.in_transaction(move |tx| fenced_sql::sqlite::operation_applied(tx, &resource, &op))
    }
}

/// A ledger in PostgreSQL, on `connections` sessions; one resource always
/// uses the same session. Commits are durable as the server is configured
/// (`synchronous_commit`, a synchronous standby).
pub struct PostgresLedger {
    sessions: Vec<tokio::sync::Mutex<tokio_postgres::Client>>,
}

impl std::fmt::Debug for PostgresLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PostgresLedger")
            .field("sessions", &self.sessions.len())
            .finish()
    }
}

/// The most sessions a [`PostgresLedger`] opens.
pub const POSTGRES_SESSIONS_MAX: usize = 64;

impl PostgresLedger {
    /// Connects `connections` sessions (1 to [`POSTGRES_SESSIONS_MAX`]) to
    /// `url` without TLS (a loopback or private-network server) and runs
    /// the fences migration.
    pub async fn connect(url: &str, connections: usize) -> Result<Self, GuardError> {
        if connections == 0 || connections > POSTGRES_SESSIONS_MAX {
            return Err(GuardError::Invalid {
                field: "connections",
                reason: format!("must be 1 to {POSTGRES_SESSIONS_MAX}, got {connections}"),
            });
        }
        let mut sessions = Vec::with_capacity(connections);
        for _ in 0..connections {
            let (mut client, connection) =
                tokio_postgres::connect(url, tokio_postgres::NoTls).await?;
            tokio::spawn(async move {
                if let Err(e) = connection.await {
                    tracing::warn!(error = %e, "ledger: the PostgreSQL session ended");
                }
            });
            if sessions.is_empty() {
                fenced_sql::postgres::migrate(&mut client).await?;
            }
            sessions.push(tokio::sync::Mutex::new(client));
        }
        Ok(PostgresLedger { sessions })
    }

    fn session(&self, resource: &str) -> &tokio::sync::Mutex<tokio_postgres::Client> {
        // FNV-1a: stable, so a resource keeps its session.
        let mut h: u64 = 0xcbf2_9ce4_8422_2325;
        for b in resource.bytes() {
            h = (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
        }
        let n = self.sessions.len().max(1) as u64;
        let i = usize::try_from(h % n).unwrap_or(0);
        &self.sessions[i.min(self.sessions.len().saturating_sub(1))]
    }
}

impl Ledger for PostgresLedger {
    fn admit<'a>(&'a self, fence: &'a Fence<'a>) -> LedgerFuture<'a, Verdict> {
        Box::pin(async move {
            let mut client = self.session(fence.resource).lock().await;
            let tx = client.transaction().await?;
            if let Some(op) = fence.operation_id {
                if fenced_sql::postgres::operation_applied(&tx, fence.resource, op).await? {
                    return Ok(Verdict::Duplicate);
                }
            }
            let token_only = Fence {
                operation_id: None,
                ..*fence
            };
            let verdict = fenced_sql::postgres::guard(&tx, &token_only).await?;
            tx.commit().await?;
            Ok(verdict)
        })
    }

    fn complete<'a>(&'a self, fence: &'a Fence<'a>) -> LedgerFuture<'a, ()> {
        Box::pin(async move {
            let Some(op) = fence.operation_id else {
                return Ok(());
            };
            let mut client = self.session(fence.resource).lock().await;
            let tx = client.transaction().await?;
            fenced_sql::postgres::record_operation(&tx, fence.resource, op, fence.token).await?;
            tx.commit().await?;
            Ok(())
        })
    }

    fn highest<'a>(&'a self, resource: &'a str) -> LedgerFuture<'a, Option<u64>> {
        Box::pin(async move {
            let mut client = self.session(resource).lock().await;
            let tx = client.transaction().await?;
            let highest = fenced_sql::postgres::highest(&tx, resource).await?;
            tx.commit().await?;
            Ok(highest)
        })
    }

    fn applied<'a>(&'a self, resource: &'a str, operation_id: &'a str) -> LedgerFuture<'a, bool> {
        Box::pin(async move {
            let mut client = self.session(resource).lock().await;
            let tx = client.transaction().await?;
            let applied =
                fenced_sql::postgres::operation_applied(&tx, resource, operation_id).await?;
            tx.commit().await?;
            Ok(applied)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use fenced_sql::Contract;

    fn fence<'a>(token: u64, owner: &'a str, op: Option<&'a str>) -> Fence<'a> {
        Fence {
            resource: "statement:7",
            token,
            owner_id: owner,
            operation_id: op,
            contract: Contract::AtLeast,
        }
    }

    #[tokio::test]
    async fn sqlite_admits_records_and_survives_reopening() -> Result<(), GuardError> {
        let dir = tempfile::tempdir().map_err(|e| GuardError::Corrupt(e.to_string()))?;
        let path = dir.path().join("ledger.db");
        let ledger = SqliteLedger::open(&path)?;
        assert_eq!(ledger.highest("statement:7").await?, None);
        assert_eq!(
            ledger.admit(&fence(4, "a", Some("op-1"))).await?,
            Verdict::Accepted
        );
        // Not completed yet: a retry runs again (at least once).
        assert_eq!(
            ledger.admit(&fence(4, "a", Some("op-1"))).await?,
            Verdict::Accepted
        );
        ledger.complete(&fence(4, "a", Some("op-1"))).await?;
        assert_eq!(
            ledger.admit(&fence(4, "a", Some("op-1"))).await?,
            Verdict::Duplicate
        );
        assert_eq!(ledger.admit(&fence(5, "b", None)).await?, Verdict::Accepted);
        assert_eq!(
            ledger.admit(&fence(4, "a", Some("op-2"))).await?,
            Verdict::Stale { highest: 5 }
        );
        drop(ledger);
        let ledger = SqliteLedger::open(&path)?;
        assert_eq!(ledger.highest("statement:7").await?, Some(5));
        assert_eq!(
            ledger.admit(&fence(4, "a", None)).await?,
            Verdict::Stale { highest: 5 }
        );
        // An applied operation stays a duplicate after a newer owner wrote.
        assert_eq!(
            ledger.admit(&fence(4, "a", Some("op-1"))).await?,
            Verdict::Duplicate
        );
        Ok(())
    }
}
