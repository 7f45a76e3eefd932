-- fenced-sql, SQLite migration 001: the fences table and the applied
-- operation ids. Idempotent: safe to run again. SQLite has no stored
-- functions: the guard is fenced_sql::sqlite::guard, which reads and writes
-- these tables inside the caller's transaction (open it with BEGIN IMMEDIATE).

-- Per resource, the highest token whose write was accepted.
CREATE TABLE IF NOT EXISTS fenced_fences (
    resource            TEXT    NOT NULL PRIMARY KEY
                                CHECK (length(CAST(resource AS BLOB)) BETWEEN 1 AND 256),
    last_accepted_token INTEGER NOT NULL CHECK (last_accepted_token >= 1),
    owner_id            TEXT    NOT NULL,
    updated_at          TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
) STRICT;

-- The operation ids whose write was accepted: a retry answers 'duplicate'.
CREATE TABLE IF NOT EXISTS fenced_applied_operations (
    resource     TEXT    NOT NULL,
    operation_id TEXT    NOT NULL CHECK (length(CAST(operation_id AS BLOB)) BETWEEN 1 AND 128),
    token        INTEGER NOT NULL,
    applied_at   TEXT    NOT NULL DEFAULT (strftime('%Y-%m-%dT%H:%M:%fZ', 'now')),
    PRIMARY KEY (resource, operation_id)
) STRICT;
