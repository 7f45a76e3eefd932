-- The article's statement table, fenced from any language that speaks SQL:
-- run after crates/fenced-sql/sql/postgres/001_fences.sql, with psql
-- variables account, resource, token, owner, content. One transaction: the
-- guard decides, the write happens only on 'accepted', both commit together.
--
--   psql -v account=1842 -v resource=statement:account-1842:2026-07 \
--        -v token=7 -v owner=5b2f0c7e-... -v content='July' -f account-statements.sql

SET client_min_messages = warning;
-- A schema of its own, so that an account_statements table already in the
-- database is left alone; fenced_guard and its tables are found in public.
CREATE SCHEMA IF NOT EXISTS fenced_examples;
SET search_path = fenced_examples, public;

CREATE TABLE IF NOT EXISTS account_statements (
    account_id  bigint PRIMARY KEY,
    content     text   NOT NULL,
    last_accepted_fence bigint NOT NULL
);

BEGIN;
SELECT verdict, highest_token
  FROM fenced_guard(:'resource', :token, :'owner', NULL, 'at_least') \gset
SELECT (:'verdict' = 'accepted') AS write_it \gset
\if :write_it
    INSERT INTO account_statements (account_id, content, last_accepted_fence)
    VALUES (:account, :'content', :token)
    ON CONFLICT (account_id) DO UPDATE SET content = EXCLUDED.content,
        last_accepted_fence = EXCLUDED.last_accepted_fence;
    \echo written: :verdict
\else
    \echo refused: :verdict, highest accepted token :highest_token
\endif
COMMIT;
