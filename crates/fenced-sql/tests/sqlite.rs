//! The guard on SQLite, in a temporary database file: the article's
//! statement table, written only after `fenced_sql::sqlite::guard` accepts
//! the token. Each transaction is opened with BEGIN IMMEDIATE.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::{path::Path, sync::Arc, time::Duration};

use common::{bad_fences, column_update, scenarios, AFTER_ROLLBACK, COLUMN_STEPS, STATEMENTS};
use fenced_sql::{sqlite, Contract, Fence, GuardError, Verdict};
use rusqlite::{params, Connection, OptionalExtension, TransactionBehavior};

const UPSERT: &str = "
INSERT INTO account_statements (account_id, period, content, writes) VALUES (?1, '2026-07', ?2, 1)
ON CONFLICT (account_id, period)
DO UPDATE SET content = excluded.content, writes = account_statements.writes + 1";

fn open(path: &Path) -> Connection {
    let conn = Connection::open(path).unwrap();
    conn.busy_timeout(Duration::from_secs(30)).unwrap();
    conn
}

/// A fresh database file with the migration and the statement table.
fn setup() -> (tempfile::TempDir, Connection) {
    let dir = tempfile::tempdir().unwrap();
    let mut conn = open(&dir.path().join("app.db"));
    conn.pragma_update(None, "journal_mode", "WAL").unwrap();
    sqlite::migrate(&mut conn).unwrap();
    conn.execute_batch(STATEMENTS).unwrap();
    (dir, conn)
}

/// The guard, then the caller's own upsert, in one IMMEDIATE transaction.
fn save_statement(conn: &mut Connection, fence: &Fence<'_>, account: &str, body: &str) -> Verdict {
    let tx = conn
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    let verdict = sqlite::guard(&tx, fence).unwrap();
    if verdict == Verdict::Accepted {
        tx.execute(UPSERT, params![account, body]).unwrap();
    }
    tx.commit().unwrap();
    verdict
}

/// The statement's (content, writes).
fn statement(conn: &Connection, account: &str) -> Option<(String, i64)> {
    conn.query_row(
        "SELECT content, writes FROM account_statements WHERE account_id = ?1 AND period = '2026-07'",
        params![account],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .optional()
    .unwrap()
}

/// The resource's (last_accepted_token, owner_id).
fn fences_row(conn: &Connection, resource: &str) -> Option<(i64, String)> {
    conn.query_row(
        "SELECT last_accepted_token, owner_id FROM fenced_fences WHERE resource = ?1",
        params![resource],
        |r| Ok((r.get(0)?, r.get(1)?)),
    )
    .optional()
    .unwrap()
}

fn count(conn: &Connection, table: &str, resource: &str) -> i64 {
    conn.query_row(
        &format!("SELECT count(*) FROM {table} WHERE resource = ?1"),
        params![resource],
        |r| r.get(0),
    )
    .unwrap()
}

/// Runs a scenario of tests/common: A and B on separate connections.
fn run_scenario(name: &str) {
    let s = scenarios().into_iter().find(|s| s.name == name).unwrap();
    let (dir, mut a) = setup();
    let mut b = open(&dir.path().join("app.db"));
    let (account, resource) = ("1842", "statement:1842:2026-07");
    for (i, step) in s.steps.iter().enumerate() {
        let conn = if step.owner == "owner-b" {
            &mut b
        } else {
            &mut a
        };
        let got = save_statement(conn, &step.fence(resource), account, step.body);
        assert_eq!(got, step.expect, "{name}: step {i} ({})", step.body);
    }
    assert_eq!(
        statement(&a, account),
        Some((s.content.to_string(), s.writes)),
        "{name}"
    );
    assert_eq!(
        fences_row(&a, resource),
        Some((s.highest, s.owner.to_string())),
        "{name}"
    );
    assert_eq!(
        count(&a, "fenced_applied_operations", resource),
        s.operations,
        "{name}"
    );
}

#[test]
fn a_stale_owner_is_refused_and_the_newer_content_kept() {
    run_scenario("stale-owner");
}

#[test]
fn equal_tokens_pass_under_at_least() {
    run_scenario("equal-at-least");
}

#[test]
fn equal_tokens_are_stale_under_greater() {
    run_scenario("equal-greater");
}

#[test]
fn a_retried_operation_is_applied_once() {
    run_scenario("retried-operation");
}

#[test]
fn concurrent_first_writes_create_one_row_and_the_highest_token_wins() {
    const WRITERS: u64 = 8;
    for _ in 0..3 {
        let (dir, c) = setup();
        let path = Arc::new(dir.path().join("app.db"));
        let start = Arc::new(std::sync::Barrier::new(WRITERS as usize));
        // Highest token first: without the compare, a lower token landing
        // later would win.
        let threads: Vec<_> = (1..=WRITERS)
            .rev()
            .map(|token| {
                let (path, start) = (path.clone(), start.clone());
                std::thread::spawn(move || {
                    let mut conn = open(&path);
                    start.wait();
                    let owner = format!("owner-{token}");
                    let f = Fence {
                        resource: "statement:race",
                        token,
                        owner_id: &owner,
                        operation_id: None,
                        contract: Contract::Greater,
                    };
                    save_statement(&mut conn, &f, "race", &format!("token {token}"))
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        assert_eq!(count(&c, "fenced_fences", "statement:race"), 1);
        assert_eq!(
            fences_row(&c, "statement:race"),
            Some((WRITERS as i64, format!("owner-{WRITERS}")))
        );
        let (content, _) = statement(&c, "race").unwrap();
        assert_eq!(content, format!("token {WRITERS}"));
    }
}

#[test]
fn a_rolled_back_transaction_leaves_no_trace() {
    let (_dir, mut c) = setup();
    let r = "statement:rollback";
    let f = Fence {
        resource: r,
        token: 10,
        owner_id: "owner-a",
        operation_id: Some("op-10"),
        contract: Contract::AtLeast,
    };
    {
        let tx = c
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .unwrap();
        assert_eq!(sqlite::guard(&tx, &f).unwrap(), Verdict::Accepted);
        tx.execute(UPSERT, params!["rollback", "ten"]).unwrap();
        tx.rollback().unwrap();
    }
    assert_eq!(fences_row(&c, r), None);
    assert_eq!(statement(&c, "rollback"), None);
    assert_eq!(count(&c, "fenced_applied_operations", r), 0);
    for (token, op, expect) in AFTER_ROLLBACK {
        let f = Fence {
            token,
            operation_id: op,
            ..f
        };
        assert_eq!(save_statement(&mut c, &f, "rollback", "body"), expect);
    }
    assert_eq!(statement(&c, "rollback"), Some(("body".into(), 2)));
}

#[test]
fn bad_input_is_refused_before_sql() {
    let (_dir, mut c) = setup();
    let tx = c
        .transaction_with_behavior(TransactionBehavior::Immediate)
        .unwrap();
    let long = "x".repeat(300);
    for (f, field) in bad_fences(&long) {
        match sqlite::guard(&tx, &f) {
            Err(GuardError::Invalid { field: got, .. }) => assert_eq!(got, field),
            other => panic!("{field}: {other:?}"),
        }
    }
    assert_eq!(count(&tx, "fenced_fences", "r"), 0);
    // The highest token SQL can hold is accepted.
    let f = Fence {
        token: i64::MAX as u64,
        ..bad_fences(&long)[0].0
    };
    assert_eq!(sqlite::guard(&tx, &f).unwrap(), Verdict::Accepted);
    assert_eq!(fences_row(&tx, "r").map(|r| r.0), Some(i64::MAX));
}

/// The column form: one conditional UPDATE per write.
#[test]
fn the_column_form_refuses_a_stale_owner() {
    let (_dir, c) = setup();
    c.execute(UPSERT, params!["col", ""]).unwrap();
    for (token, body, contract, applied) in COLUMN_STEPS {
        let sql = column_update(contract, "?1", "?2", "?3");
        let n = c.execute(&sql, params!["col", token, body]).unwrap();
        assert_eq!(
            fenced_sql::column_verdict(n as u64).ok(),
            Some(applied),
            "{body}"
        );
    }
    assert_eq!(statement(&c, "col").unwrap().0, "B");
}

/// A retry whose operation id was applied before the resource's fences row
/// was deleted by hand is still a duplicate, and leaves no row behind.
#[test]
fn an_applied_operation_stays_a_duplicate_after_its_row_is_deleted() {
    let (_dir, mut c) = setup();
    let r = "statement:orphan";
    let f = Fence {
        resource: r,
        token: 3,
        owner_id: "owner-a",
        operation_id: Some("op-3"),
        contract: Contract::AtLeast,
    };
    assert_eq!(
        save_statement(&mut c, &f, "orphan", "once"),
        Verdict::Accepted
    );
    c.execute("DELETE FROM fenced_fences WHERE resource = ?1", params![r])
        .unwrap();
    assert_eq!(
        save_statement(&mut c, &f, "orphan", "twice"),
        Verdict::Duplicate
    );
    assert_eq!(fences_row(&c, r), None);
    assert_eq!(statement(&c, "orphan"), Some(("once".into(), 1)));
}
