//! The guard against a real PostgreSQL: the article's statement table,
//! written only after `fenced_sql::postgres::guard` accepts the token.
//!
//! Needs FENCED_TEST_POSTGRES_URL (`source .ci/postgres.sh` starts a
//! throwaway server and sets it); without it the tests skip with a notice,
//! except under CI, where they fail.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::{bad_fences, column_update, scenarios, AFTER_ROLLBACK, COLUMN_STEPS, STATEMENTS};
use fenced_sql::{postgres, Contract, Fence, GuardError, Verdict};
use tokio_postgres::{Client, GenericClient, NoTls};

/// The same rule as the workspace tests' `postgres_url()`.
fn postgres_url() -> Option<String> {
    match std::env::var("FENCED_TEST_POSTGRES_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "FENCED_TEST_POSTGRES_URL is not set: .ci/run starts PostgreSQL with .ci/postgres.sh"
            );
            eprintln!(
                "NOTICE: skipping a PostgreSQL test: set FENCED_TEST_POSTGRES_URL (source .ci/postgres.sh)"
            );
            None
        }
    }
}

const UPSERT: &str = "
INSERT INTO account_statements (account_id, period, content, writes) VALUES ($1, '2026-07', $2, 1)
ON CONFLICT (account_id, period)
DO UPDATE SET content = EXCLUDED.content, writes = account_statements.writes + 1";

async fn connect(url: &str) -> Client {
    let (client, connection) = tokio_postgres::connect(url, NoTls).await.unwrap();
    tokio::spawn(connection);
    client
}

/// A connection with the migration and the statement table in place.
async fn setup(url: &str) -> Client {
    let mut client = connect(url).await;
    postgres::migrate(&mut client).await.unwrap();
    let tx = client.transaction().await.unwrap();
    tx.execute("SELECT pg_advisory_xact_lock(7300733)", &[])
        .await
        .unwrap();
    tx.batch_execute(STATEMENTS).await.unwrap();
    tx.commit().await.unwrap();
    client
}

/// An account no other test (or earlier run on the same server) uses.
fn unique(prefix: &str) -> String {
    use std::sync::atomic::{AtomicU64, Ordering};
    static N: AtomicU64 = AtomicU64::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos();
    format!(
        "{prefix}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// One guarded write of the statement `account`/2026-07: the guard, then
/// the caller's own upsert, in one transaction.
async fn save_statement(
    client: &mut Client,
    fence: &Fence<'_>,
    account: &str,
    body: &str,
) -> Verdict {
    let tx = client.transaction().await.unwrap();
    let verdict = postgres::guard(&tx, fence).await.unwrap();
    if verdict == Verdict::Accepted {
        tx.execute(UPSERT, &[&account, &body]).await.unwrap();
    }
    tx.commit().await.unwrap();
    verdict
}

/// The statement's (content, writes).
async fn statement(client: &Client, account: &str) -> Option<(String, i64)> {
    client
        .query_opt(
            "SELECT content, writes FROM account_statements WHERE account_id = $1 AND period = '2026-07'",
            &[&account],
        )
        .await
        .unwrap()
        .map(|r| (r.get(0), r.get(1)))
}

/// The resource's (last_accepted_token, owner_id).
async fn fences_row(client: &Client, resource: &str) -> Option<(i64, String)> {
    client
        .query_opt(
            "SELECT last_accepted_token, owner_id FROM fenced_fences WHERE resource = $1",
            &[&resource],
        )
        .await
        .unwrap()
        .map(|r| (r.get(0), r.get(1)))
}

async fn count(client: &impl GenericClient, table: &str, resource: &str) -> i64 {
    client
        .query_one(
            &format!("SELECT count(*) FROM {table} WHERE resource = $1"),
            &[&resource],
        )
        .await
        .unwrap()
        .get(0)
}

/// Runs a scenario of tests/common: A and B on separate connections.
async fn run_scenario(name: &str) {
    let Some(url) = postgres_url() else { return };
    let s = scenarios().into_iter().find(|s| s.name == name).unwrap();
    let mut a = setup(&url).await;
    let mut b = connect(&url).await;
    let account = unique(name);
    let resource = format!("statement:{account}:2026-07");
    for (i, step) in s.steps.iter().enumerate() {
        let conn = if step.owner == "owner-b" {
            &mut b
        } else {
            &mut a
        };
        let got = save_statement(conn, &step.fence(&resource), &account, step.body).await;
        assert_eq!(got, step.expect, "{name}: step {i} ({})", step.body);
    }
    assert_eq!(
        statement(&a, &account).await,
        Some((s.content.to_string(), s.writes)),
        "{name}"
    );
    assert_eq!(
        fences_row(&a, &resource).await,
        Some((s.highest, s.owner.to_string())),
        "{name}"
    );
    assert_eq!(
        count(&a, "fenced_applied_operations", &resource).await,
        s.operations,
        "{name}"
    );
}

#[tokio::test]
async fn a_stale_owner_is_refused_and_the_newer_content_kept() {
    run_scenario("stale-owner").await;
}

#[tokio::test]
async fn equal_tokens_pass_under_at_least() {
    run_scenario("equal-at-least").await;
}

#[tokio::test]
async fn equal_tokens_are_stale_under_greater() {
    run_scenario("equal-greater").await;
}

#[tokio::test]
async fn a_retried_operation_is_applied_once() {
    run_scenario("retried-operation").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_first_writes_create_one_row_and_the_highest_token_wins() {
    let Some(url) = postgres_url() else { return };
    drop(setup(&url).await);
    const WRITERS: u64 = 16;
    for round in 0..3 {
        let account = unique(&format!("race{round}"));
        let r = format!("statement:{account}");
        let start = Arc::new(tokio::sync::Barrier::new(WRITERS as usize));
        let mut tasks = Vec::new();
        // Highest token first: without the compare, a lower token landing
        // later would win.
        for token in (1..=WRITERS).rev() {
            let (url, r, account, start) = (url.clone(), r.clone(), account.clone(), start.clone());
            tasks.push(tokio::spawn(async move {
                let mut c = connect(&url).await;
                start.wait().await;
                let owner = format!("owner-{token}");
                let f = Fence {
                    resource: &r,
                    token,
                    owner_id: &owner,
                    operation_id: None,
                    contract: Contract::Greater,
                };
                save_statement(&mut c, &f, &account, &format!("token {token}")).await
            }));
        }
        for t in tasks {
            t.await.unwrap();
        }
        let c = connect(&url).await;
        assert_eq!(count(&c, "fenced_fences", &r).await, 1);
        assert_eq!(
            fences_row(&c, &r).await,
            Some((WRITERS as i64, format!("owner-{WRITERS}")))
        );
        let (content, _) = statement(&c, &account).await.unwrap();
        assert_eq!(content, format!("token {WRITERS}"));
    }
}

#[tokio::test]
async fn a_rolled_back_transaction_leaves_no_trace() {
    let Some(url) = postgres_url() else { return };
    let mut c = setup(&url).await;
    let account = unique("rollback");
    let r = format!("statement:{account}");
    let f = Fence {
        resource: &r,
        token: 10,
        owner_id: "owner-a",
        operation_id: Some("op-10"),
        contract: Contract::AtLeast,
    };
    let tx = c.transaction().await.unwrap();
    assert_eq!(postgres::guard(&tx, &f).await.unwrap(), Verdict::Accepted);
    tx.execute(UPSERT, &[&account, &"ten"]).await.unwrap();
    tx.rollback().await.unwrap();
    assert_eq!(fences_row(&c, &r).await, None);
    assert_eq!(statement(&c, &account).await, None);
    assert_eq!(count(&c, "fenced_applied_operations", &r).await, 0);
    for (token, op, expect) in AFTER_ROLLBACK {
        let f = Fence {
            token,
            operation_id: op,
            ..f
        };
        assert_eq!(save_statement(&mut c, &f, &account, "body").await, expect);
    }
    assert_eq!(statement(&c, &account).await, Some(("body".into(), 2)));
}

#[tokio::test]
async fn bad_input_is_refused_before_sql_and_by_the_function() {
    let Some(url) = postgres_url() else { return };
    let mut c = setup(&url).await;
    let tx = c.transaction().await.unwrap();
    let long = "x".repeat(300);
    for (f, field) in bad_fences(&long) {
        match postgres::guard(&tx, &f).await {
            Err(GuardError::Invalid { field: got, .. }) => assert_eq!(got, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    // Nothing was sent: the transaction is still usable.
    assert_eq!(count(&tx, "fenced_fences", "r").await, 0);
    // Called from SQL directly, the function checks the same bounds.
    let e = tx
        .query_one(
            "SELECT verdict FROM fenced_guard('r', 0, 'o', NULL, 'at_least')",
            &[],
        )
        .await
        .unwrap_err();
    assert!(
        format!("{e:?}").contains("token must be at least 1"),
        "{e:?}"
    );
    tx.rollback().await.unwrap();
}

/// The column form: the article's `LastAcceptedFence`, one conditional
/// UPDATE per write, zero rows affected meaning refused.
#[tokio::test]
async fn the_column_form_refuses_a_stale_owner() {
    let Some(url) = postgres_url() else { return };
    let c = setup(&url).await;
    let account = unique("column");
    c.execute(UPSERT, &[&account, &""]).await.unwrap();
    for (token, body, contract, applied) in COLUMN_STEPS {
        let sql = column_update(contract, "$1", "$2", "$3");
        let n = c.execute(&sql, &[&account, &token, &body]).await.unwrap();
        assert_eq!(fenced_sql::column_verdict(n).ok(), Some(applied), "{body}");
    }
    assert_eq!(statement(&c, &account).await.unwrap().0, "B");
}

/// A retry whose operation id was applied before the resource's fences row
/// was deleted by hand is still a duplicate, and leaves no row behind.
#[tokio::test]
async fn an_applied_operation_stays_a_duplicate_after_its_row_is_deleted() {
    let Some(url) = postgres_url() else { return };
    let mut c = setup(&url).await;
    let account = unique("orphan");
    let r = format!("statement:{account}");
    let f = Fence {
        resource: &r,
        token: 3,
        owner_id: "owner-a",
        operation_id: Some("op-3"),
        contract: Contract::AtLeast,
    };
    assert_eq!(
        save_statement(&mut c, &f, &account, "once").await,
        Verdict::Accepted
    );
    c.execute("DELETE FROM fenced_fences WHERE resource = $1", &[&r])
        .await
        .unwrap();
    assert_eq!(
        save_statement(&mut c, &f, &account, "twice").await,
        Verdict::Duplicate
    );
    assert_eq!(fences_row(&c, &r).await, None);
    assert_eq!(statement(&c, &account).await, Some(("once".into(), 1)));
}
