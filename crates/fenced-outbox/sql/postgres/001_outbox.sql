-- fenced-outbox, PostgreSQL migration 001: the outbox table. Run after
-- fenced-sql's 001_fences.sql (the guard's tables and fenced_guard()).
-- Idempotent: safe to run again.
--
-- A row is written by fenced_outbox::postgres::record inside the caller's
-- transaction, after fenced_guard() accepted the caller's token with the
-- idempotency key as its operation id; the dispatcher only changes state,
-- attempts, next_attempt_at, last_error and delivered_at. Per resource the
-- guard's row lock orders the writers, so sequence order is commit order.
CREATE TABLE IF NOT EXISTS fenced_outbox (
    sequence        bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    resource        text        NOT NULL CHECK (octet_length(resource) BETWEEN 1 AND 256),
    token           bigint      NOT NULL CHECK (token >= 1),
    owner_id        text        NOT NULL CHECK (octet_length(owner_id) BETWEEN 1 AND 128),
    idempotency_key text        NOT NULL CHECK (octet_length(idempotency_key) BETWEEN 1 AND 128),
    destination     text        NOT NULL CHECK (octet_length(destination) BETWEEN 1 AND 2048),
    method          text        NOT NULL CHECK (method IN ('POST', 'PUT')),
    content_type    text        NOT NULL CHECK (octet_length(content_type) BETWEEN 1 AND 128),
    payload         bytea       NOT NULL CHECK (octet_length(payload) <= 1048576),
    state           text        NOT NULL DEFAULT 'pending'
                                CHECK (state IN ('pending', 'delivered', 'failed', 'superseded')),
    attempts        integer     NOT NULL DEFAULT 0 CHECK (attempts >= 0),
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    recorded_at     timestamptz NOT NULL DEFAULT now(),
    delivered_at    timestamptz,
    UNIQUE (resource, idempotency_key)
);

-- The dispatcher's scan: pending rows in sequence order.
CREATE INDEX IF NOT EXISTS fenced_outbox_pending ON fenced_outbox (state, sequence);
-- Per resource, in sequence order: the order of delivery and the
-- superseded check (the highest token recorded earlier).
CREATE INDEX IF NOT EXISTS fenced_outbox_resource ON fenced_outbox (resource, sequence);
