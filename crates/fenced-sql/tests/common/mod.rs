//! The scenarios both backends run: each is a list of guarded writes to one
//! statement row, the verdict each must get, and what the row and the fences
//! table hold at the end. Every scenario fails if the guard stops comparing
//! tokens.

#![allow(dead_code)]

use fenced_sql::{Contract, Fence, Verdict};

/// The article's table, with a count of the writes the caller applied; the
/// column form uses `last_accepted_fence`, the guard leaves it at 0. The
/// same text for PostgreSQL and SQLite.
pub const STATEMENTS: &str = "
CREATE TABLE IF NOT EXISTS account_statements (
    account_id          TEXT   NOT NULL,
    period              TEXT   NOT NULL,
    content             TEXT   NOT NULL,
    writes              BIGINT NOT NULL DEFAULT 0,
    last_accepted_fence BIGINT NOT NULL DEFAULT 0,
    PRIMARY KEY (account_id, period)
);";

/// One guarded write: the caller upserts `body` when the guard accepts.
pub struct Step {
    pub token: u64,
    pub owner: &'static str,
    pub operation_id: Option<&'static str>,
    pub contract: Contract,
    pub body: &'static str,
    pub expect: Verdict,
}

impl Step {
    pub fn fence<'a>(&'a self, resource: &'a str) -> Fence<'a> {
        Fence {
            resource,
            token: self.token,
            owner_id: self.owner,
            operation_id: self.operation_id,
            contract: self.contract,
        }
    }
}

fn step(
    token: u64,
    owner: &'static str,
    contract: Contract,
    body: &'static str,
    expect: Verdict,
) -> Step {
    Step {
        token,
        owner,
        operation_id: None,
        contract,
        body,
        expect,
    }
}

fn op(operation_id: &'static str, s: Step) -> Step {
    Step {
        operation_id: Some(operation_id),
        ..s
    }
}

pub struct Scenario {
    pub name: &'static str,
    pub steps: Vec<Step>,
    /// The statement row at the end.
    pub content: &'static str,
    pub writes: i64,
    /// The fences row at the end.
    pub highest: i64,
    pub owner: &'static str,
    /// Rows in fenced_applied_operations for the resource.
    pub operations: i64,
}

use Contract::{AtLeast, Greater};
use Verdict::{Accepted, Duplicate};

fn stale(highest: u64) -> Verdict {
    Verdict::Stale { highest }
}

pub fn scenarios() -> Vec<Scenario> {
    vec![
        // Owner A (token 5) writes once and pauses past its lease; owner B
        // is granted 6 and writes; A wakes up: refused, B's content stays.
        Scenario {
            name: "stale-owner",
            steps: vec![
                step(5, "owner-a", AtLeast, "A draft", Accepted),
                step(6, "owner-b", AtLeast, "B final", Accepted),
                step(5, "owner-a", AtLeast, "A late", stale(6)),
            ],
            content: "B final",
            writes: 2,
            highest: 6,
            owner: "owner-b",
            operations: 0,
        },
        // at_least: one owner writes many times with its token.
        Scenario {
            name: "equal-at-least",
            steps: vec![
                step(7, "owner", AtLeast, "v1", Accepted),
                step(7, "owner", AtLeast, "v2", Accepted),
                step(6, "old", AtLeast, "old", stale(7)),
            ],
            content: "v2",
            writes: 2,
            highest: 7,
            owner: "owner",
            operations: 0,
        },
        // greater: one final write per acquisition; an equal token is stale.
        Scenario {
            name: "equal-greater",
            steps: vec![
                step(7, "owner", Greater, "final", Accepted),
                step(7, "owner", Greater, "again", stale(7)),
                step(8, "next", Greater, "next", Accepted),
            ],
            content: "next",
            writes: 2,
            highest: 8,
            owner: "next",
            operations: 0,
        },
        // A retry with an applied operation id is skipped, even after a newer
        // owner wrote; a new operation of the old owner is stale.
        Scenario {
            name: "retried-operation",
            steps: vec![
                op(
                    "charge-1",
                    step(5, "owner-a", AtLeast, "charge-1", Accepted),
                ),
                op(
                    "charge-1",
                    step(5, "owner-a", AtLeast, "charge-1 retry", Duplicate),
                ),
                op(
                    "charge-2",
                    step(5, "owner-a", AtLeast, "charge-2", Accepted),
                ),
                op(
                    "charge-3",
                    step(9, "owner-b", AtLeast, "charge-3", Accepted),
                ),
                op(
                    "charge-1",
                    step(5, "owner-a", AtLeast, "charge-1 late", Duplicate),
                ),
                op(
                    "charge-4",
                    step(5, "owner-a", AtLeast, "charge-4", stale(9)),
                ),
            ],
            content: "charge-3",
            writes: 3,
            highest: 9,
            owner: "owner-b",
            operations: 3,
        },
    ]
}

/// Fences every field check refuses, with the field it names.
pub fn bad_fences(long: &str) -> Vec<(Fence<'_>, &'static str)> {
    let ok = Fence {
        resource: "r",
        token: 1,
        owner_id: "o",
        operation_id: None,
        contract: AtLeast,
    };
    vec![
        (Fence { token: 0, ..ok }, "token"),
        (
            Fence {
                token: i64::MAX as u64 + 1,
                ..ok
            },
            "token",
        ),
        (Fence { resource: "", ..ok }, "resource"),
        (
            Fence {
                resource: &long[..257],
                ..ok
            },
            "resource",
        ),
        (Fence { owner_id: "", ..ok }, "owner_id"),
        (
            Fence {
                operation_id: Some(&long[..129]),
                ..ok
            },
            "operation_id",
        ),
    ]
}

/// After a rolled-back guard of token 10 with operation id "op-10": token
/// 10 never counted, so 4 is accepted and 3 is stale against 4; the
/// operation id rolled back before applies now. (token, operation id,
/// verdict), each written with the body "body".
pub const AFTER_ROLLBACK: [(u64, Option<&str>, Verdict); 3] = [
    (4, None, Verdict::Accepted),
    (3, None, Verdict::Stale { highest: 4 }),
    (5, Some("op-10"), Verdict::Accepted),
];

/// The column form's writes: (token, body, contract, applied?). Ends with
/// content "B".
pub const COLUMN_STEPS: [(i64, &str, Contract, bool); 5] = [
    (5, "A", AtLeast, true),
    (5, "A again", AtLeast, true),
    (6, "B", Greater, true),
    (6, "B again", Greater, false),
    (5, "A late", AtLeast, false),
];

/// The column form's conditional update; `account`, `token` and `body` are
/// the SQL dialect's placeholders for them.
pub fn column_update(contract: Contract, account: &str, token: &str, body: &str) -> String {
    format!(
        "UPDATE account_statements SET content = {body}, last_accepted_fence = {token}
         WHERE account_id = {account} AND period = '2026-07'
           AND last_accepted_fence {} {token}",
        contract.column_comparison()
    )
}
