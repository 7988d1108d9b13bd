-- Baton fence kit for PostgreSQL, migration 6. Upgrades migration 5 in place.
--
-- The documented functions (and baton.delete_impl) become PL/pgSQL
-- wrappers instead of SQL ones. PostgreSQL cannot inline a set-returning
-- SQL function whose body calls a volatile one, so it planned the wrapper's
-- body on every call; PL/pgSQL keeps its plans for the session. Measured
-- with pgbench (-M prepared, one client, this repository's development VM):
-- `SELECT * FROM baton.publish(...)` went from 3,301 to 3,988 calls/s (a
-- plain one-row UPDATE: 5,877/s), the same as calling baton.publish_impl,
-- which the Rust kit does. Names, defaults, results and behaviour are
-- unchanged.

INSERT INTO baton.schema_migrations (version) VALUES (6) ON CONFLICT DO NOTHING;

CREATE OR REPLACE FUNCTION baton.fence(
    resource text, token bigint, operation text, fingerprint bytea,
    result bytea DEFAULT '', seq bigint DEFAULT 0, policy text DEFAULT 'one_per_generation',
    must_exist boolean DEFAULT false)
RETURNS SETOF baton.fence_result LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM baton.fence_impl($1, $2, $3, $4, $5, $6, baton.policy_code($7), $8, false);
END $$;

CREATE OR REPLACE FUNCTION baton.fence_or_abort(
    resource text, token bigint, operation text, fingerprint bytea,
    result bytea DEFAULT '', seq bigint DEFAULT 0, policy text DEFAULT 'one_per_generation',
    must_exist boolean DEFAULT false)
RETURNS SETOF baton.fence_result LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM baton.fence_or_abort_impl($1, $2, $3, $4, $5, $6, baton.policy_code($7), $8);
END $$;

CREATE OR REPLACE FUNCTION baton.publish(resource text, token bigint, operation text, fingerprint bytea, object_key text)
RETURNS SETOF baton.fence_result LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM baton.publish_impl($1, $2, $3, $4, $5);
END $$;

CREATE OR REPLACE FUNCTION baton.delete(resource text, token bigint, operation text, fingerprint bytea)
RETURNS SETOF baton.fence_result LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM baton.delete_impl($1, $2, $3, $4);
END $$;

CREATE OR REPLACE FUNCTION baton.delete_impl(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea)
RETURNS TABLE (outcome text, token bigint, current_token bigint, current_seq bigint, detail text, result bytea)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM baton.fence_full($1, $2, $3, $4, ''::bytea, 0, 1::smallint, false, true);
END $$;

CREATE OR REPLACE FUNCTION baton.cancel(resource text, at_token bigint, policy text DEFAULT 'one_per_generation')
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN baton.cancel_impl($1, $2, baton.policy_code($3));
END $$;

CREATE OR REPLACE FUNCTION baton.recreate(resource text, token bigint)
RETURNS text LANGUAGE plpgsql AS $$
BEGIN
    RETURN baton.recreate_impl($1, $2);
END $$;

CREATE OR REPLACE FUNCTION baton.prune_operations(min_age interval)
RETURNS bigint LANGUAGE plpgsql AS $$
BEGIN
    RETURN baton.prune_operations_impl($1);
END $$;
