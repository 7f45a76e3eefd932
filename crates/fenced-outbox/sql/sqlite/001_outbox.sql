-- fenced-outbox, SQLite migration 001: the outbox table. Run after
-- fenced-sql's 001_fences.sql (the guard's tables). Idempotent: safe to run
-- again. Times are Unix milliseconds of the database host's clock.
--
-- A row is written by fenced_outbox::sqlite::record inside the caller's
-- transaction, after the fenced-sql guard accepted the caller's token with
-- the idempotency key as its operation id; the dispatcher only changes
-- state, attempts, next_attempt_at, last_error and delivered_at.
CREATE TABLE IF NOT EXISTS fenced_outbox (
    sequence        INTEGER PRIMARY KEY AUTOINCREMENT,
    resource        TEXT    NOT NULL CHECK (length(CAST(resource AS BLOB)) BETWEEN 1 AND 256),
    token           INTEGER NOT NULL CHECK (token >= 1),
    owner_id        TEXT    NOT NULL CHECK (length(CAST(owner_id AS BLOB)) BETWEEN 1 AND 128),
    idempotency_key TEXT    NOT NULL CHECK (length(CAST(idempotency_key AS BLOB)) BETWEEN 1 AND 128),
    destination     TEXT    NOT NULL CHECK (length(CAST(destination AS BLOB)) BETWEEN 1 AND 2048),
    method          TEXT    NOT NULL CHECK (method IN ('POST', 'PUT')),
    content_type    TEXT    NOT NULL CHECK (length(CAST(content_type AS BLOB)) BETWEEN 1 AND 128),
    payload         BLOB    NOT NULL CHECK (length(payload) <= 1048576),
    state           TEXT    NOT NULL DEFAULT 'pending'
                            CHECK (state IN ('pending', 'delivered', 'failed', 'superseded')),
    attempts        INTEGER NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    last_error      TEXT,
    recorded_at     INTEGER NOT NULL DEFAULT (CAST(unixepoch('subsec') * 1000 AS INTEGER)),
    delivered_at    INTEGER,
    UNIQUE (resource, idempotency_key)
) STRICT;

-- The dispatcher's scan: pending rows in sequence order.
CREATE INDEX IF NOT EXISTS fenced_outbox_pending ON fenced_outbox (state, sequence);
-- Per resource, in sequence order: the order of delivery and the
-- superseded check (the highest token recorded earlier).
CREATE INDEX IF NOT EXISTS fenced_outbox_resource ON fenced_outbox (resource, sequence);
