-- fenced-sql, PostgreSQL migration 001: the fences table, the applied
-- operation ids and fenced_guard(). Idempotent: safe to run again.
--
-- Use inside the caller's transaction, before its own write:
--   BEGIN;
--   SELECT verdict, highest_token
--     FROM fenced_guard('statement:account-1842:2026-07', 42,
--                       '5b2f0c7e-6a43-4c09-9a8e-1d0f6f3b7a21', 'op-1', 'at_least');
--   -- 'accepted': do the write;  'duplicate' or 'stale': write nothing
--   UPDATE account_statements SET content = ... WHERE ...;
--   COMMIT;

-- Per resource, the highest token whose write was accepted.
CREATE TABLE IF NOT EXISTS fenced_fences (
    resource            text        PRIMARY KEY
                                    CHECK (octet_length(resource) BETWEEN 1 AND 256),
    last_accepted_token bigint      NOT NULL CHECK (last_accepted_token >= 1),
    owner_id            text        NOT NULL,
    updated_at          timestamptz NOT NULL DEFAULT now()
);

-- The operation ids whose write was accepted: a retry answers 'duplicate'.
CREATE TABLE IF NOT EXISTS fenced_applied_operations (
    resource     text        NOT NULL,
    operation_id text        NOT NULL CHECK (octet_length(operation_id) BETWEEN 1 AND 128),
    token        bigint      NOT NULL,
    applied_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource, operation_id)
);

-- Compares p_token with the resource's highest accepted token and, when it
-- passes, records it (and p_operation_id), all in the caller's transaction:
-- the record commits or rolls back with the caller's own write.
--   p_contract 'at_least': token >= highest passes (one owner, many writes);
--              'greater':  token >  highest passes (one write per acquisition).
-- verdict: 'accepted' (highest_token = p_token), 'duplicate' (p_operation_id
-- was already applied: skip the write; highest_token is the resource's
-- highest token, NULL if it has none) or 'stale' (highest_token is the
-- newer token; final, do not retry with this token).
CREATE OR REPLACE FUNCTION fenced_guard(
    p_resource     text,
    p_token        bigint,
    p_owner_id     text,
    p_operation_id text,
    p_contract     text,
    OUT verdict       text,
    OUT highest_token bigint)
LANGUAGE plpgsql VOLATILE AS $fenced$
DECLARE
    v_last bigint;
BEGIN
    IF p_resource IS NULL OR octet_length(p_resource) NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION 'fenced_guard: resource must be 1 to 256 bytes, got %',
            coalesce(octet_length(p_resource), 0) USING ERRCODE = '22023';
    END IF;
    IF p_token IS NULL OR p_token < 1 THEN
        RAISE EXCEPTION 'fenced_guard: token must be at least 1, got %', p_token
            USING ERRCODE = '22023';
    END IF;
    IF p_owner_id IS NULL OR octet_length(p_owner_id) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'fenced_guard: owner_id must be 1 to 128 bytes, got %',
            coalesce(octet_length(p_owner_id), 0) USING ERRCODE = '22023';
    END IF;
    IF p_operation_id IS NOT NULL AND octet_length(p_operation_id) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'fenced_guard: operation_id must be 1 to 128 bytes, got %',
            octet_length(p_operation_id) USING ERRCODE = '22023';
    END IF;
    IF p_contract IS NULL OR p_contract NOT IN ('at_least', 'greater') THEN
        RAISE EXCEPTION 'fenced_guard: contract must be at_least or greater, got %', p_contract
            USING ERRCODE = '22023';
    END IF;

    -- The first write of a resource creates its row. A concurrent first
    -- write blocks here on the primary key until this transaction ends; if
    -- it commits, the other one takes the path below and sees this row.
    INSERT INTO fenced_fences (resource, last_accepted_token, owner_id)
    VALUES (p_resource, p_token, p_owner_id)
    ON CONFLICT (resource) DO NOTHING;
    IF FOUND THEN
        IF p_operation_id IS NOT NULL THEN
            INSERT INTO fenced_applied_operations (resource, operation_id, token)
            VALUES (p_resource, p_operation_id, p_token)
            ON CONFLICT (resource, operation_id) DO NOTHING;
            IF NOT FOUND THEN
                -- Applied before the resource's row was deleted by hand:
                -- a duplicate, and the row just inserted is taken back.
                DELETE FROM fenced_fences WHERE resource = p_resource;
                verdict := 'duplicate';
                highest_token := NULL;
                RETURN;
            END IF;
        END IF;
        verdict := 'accepted';
        highest_token := p_token;
        RETURN;
    END IF;

    -- The row exists: lock it until the caller's commit or rollback. Under
    -- READ COMMITTED this waits for a concurrent guard of the same resource
    -- and then reads the row as that one left it.
    SELECT last_accepted_token INTO v_last
      FROM fenced_fences WHERE resource = p_resource FOR UPDATE;
    IF NOT FOUND THEN
        RAISE EXCEPTION 'fenced_guard: the row of resource % was deleted meanwhile; retry', p_resource
            USING ERRCODE = '40001';
    END IF;

    IF p_operation_id IS NOT NULL AND EXISTS (
        SELECT 1 FROM fenced_applied_operations
         WHERE resource = p_resource AND operation_id = p_operation_id) THEN
        verdict := 'duplicate';
        highest_token := v_last;
        RETURN;
    END IF;

    IF p_token < v_last OR (p_contract = 'greater' AND p_token = v_last) THEN
        verdict := 'stale';
        highest_token := v_last;
        RETURN;
    END IF;

    UPDATE fenced_fences
       SET last_accepted_token = p_token, owner_id = p_owner_id, updated_at = now()
     WHERE resource = p_resource;
    IF p_operation_id IS NOT NULL THEN
        INSERT INTO fenced_applied_operations (resource, operation_id, token)
        VALUES (p_resource, p_operation_id, p_token);
    END IF;
    verdict := 'accepted';
    highest_token := p_token;
END
$fenced$;
