-- Installs the Baton fence kit into this database, or upgrades it to this
-- release's version, in one transaction; harmless when run again. A
-- database whose fence kit is newer than this release is refused, naming
-- both versions, and left as it was. From psql (any directory):
--
--   psql -v ON_ERROR_STOP=1 -d app -f crates/fence/sql/install.sql
--
-- It keeps the version record of `PgFence::migrate` (table
-- baton.schema_migrations), so either may install and the other upgrade.
-- The migrations (NNN_*.sql) run once each, those the database lacks, in
-- order; then every function's definition in force (functions/*.sql) is
-- applied, as migrate does. A test checks that this file names every
-- migration and every function file, in order.

\set ON_ERROR_STOP on
\set QUIET on
BEGIN;
SELECT pg_advisory_xact_lock(hashtext('baton.fence.migrate')) AS baton_locked \gset

-- The installed version (0: none). Read through PL/pgSQL, whose statements
-- are planned only when they run: the table may not exist yet.
CREATE TEMP TABLE baton_install_from (version integer NOT NULL) ON COMMIT DROP;
DO $$
BEGIN
    IF to_regclass('baton.schema_migrations') IS NULL THEN
        INSERT INTO baton_install_from VALUES (0);
    ELSE
        INSERT INTO baton_install_from
            SELECT coalesce(max(version), 0) FROM baton.schema_migrations;
    END IF;
END
$$;
SELECT version AS baton_installed FROM baton_install_from \gset
SELECT :baton_installed > 10 AS baton_newer \gset
\if :baton_newer
DO $$
BEGIN
    RAISE EXCEPTION 'the fence kit in this database is at version %, newer than this install (version 10): install that release or a later one, never an older one over it',
        (SELECT version FROM baton_install_from);
END
$$;
\endif

SELECT :baton_installed < 1 AS baton_need \gset
\if :baton_need
\ir 001_baton_fence.sql
\endif
SELECT :baton_installed < 2 AS baton_need \gset
\if :baton_need
\ir 002_names_and_races.sql
\endif
SELECT :baton_installed < 3 AS baton_need \gset
\if :baton_need
\ir 003_documented_names.sql
\endif
SELECT :baton_installed < 4 AS baton_need \gset
\if :baton_need
\ir 004_pipelined_fence.sql
\endif
SELECT :baton_installed < 5 AS baton_need \gset
\if :baton_need
\ir 005_publish_hot_path.sql
\endif
SELECT :baton_installed < 6 AS baton_need \gset
\if :baton_need
\ir 006_plpgsql_wrappers.sql
\endif
SELECT :baton_installed < 7 AS baton_need \gset
\if :baton_need
\ir 007_plain_names.sql
\endif
SELECT :baton_installed < 8 AS baton_need \gset
\if :baton_need
\ir 008_outbox.sql
\endif
SELECT :baton_installed < 9 AS baton_need \gset
\if :baton_need
\ir 009_invisible_names.sql
\endif
SELECT :baton_installed < 10 AS baton_need \gset
\if :baton_need
\ir 010_shared_writes.sql
\endif

-- The definitions in force, every time.
\ir functions/cancel.sql
\ir functions/cancel_impl.sql
\ir functions/check_input.sql
\ir functions/check_name.sql
\ir functions/check_policy.sql
\ir functions/check_token.sql
\ir functions/delete.sql
\ir functions/delete_impl.sql
\ir functions/fence.sql
\ir functions/fence_full.sql
\ir functions/fence_impl.sql
\ir functions/fence_or_abort.sql
\ir functions/fence_or_abort_impl.sql
\ir functions/fence_shared.sql
\ir functions/fence_shared_impl.sql
\ir functions/name_is_plain.sql
\ir functions/outbox_begin_send.sql
\ir functions/outbox_cancel.sql
\ir functions/outbox_claim.sql
\ir functions/outbox_confirm.sql
\ir functions/outbox_enqueue.sql
\ir functions/outbox_is_final.sql
\ir functions/outbox_record.sql
\ir functions/outbox_resolve.sql
\ir functions/policy_code.sql
\ir functions/prune_operations.sql
\ir functions/prune_operations_impl.sql
\ir functions/publish.sql
\ir functions/publish_impl.sql
\ir functions/recreate.sql
\ir functions/recreate_impl.sql

COMMIT;
