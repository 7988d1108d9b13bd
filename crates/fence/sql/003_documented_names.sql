-- Baton fence kit for PostgreSQL, migration 3. Upgrades migration 2 in place.
--
-- The functions are called as documented: parameters are named `resource`,
-- `token`, `operation`, `fingerprint`, `result`, `seq`, `policy`,
-- `must_exist`, `object_key`, `at_token`, `min_age` (so
-- `baton.fence(..., must_exist => true)` works), and a policy is given by
-- name: 'one_per_generation' (the default), 'ordered' or 'session' (the
-- numbers 1 to 3, as text, still work).
--
-- The PL/pgSQL implementations keep their internal names and types as
-- baton.*_impl (the Rust kit calls those, with typed parameters); the
-- documented functions are thin SQL wrappers. Their rows are the type
-- baton.fence_result, whose columns (outcome, token, current_token,
-- current_seq, detail, result) may share names with the parameters.

INSERT INTO baton.schema_migrations (version) VALUES (3) ON CONFLICT DO NOTHING;

ALTER FUNCTION baton.fence(text, bigint, text, bytea, bytea, bigint, smallint, boolean, boolean) RENAME TO fence_impl;
ALTER FUNCTION baton.publish(text, bigint, text, bytea, text) RENAME TO publish_impl;
ALTER FUNCTION baton.delete(text, bigint, text, bytea) RENAME TO delete_impl;
ALTER FUNCTION baton.cancel(text, bigint, smallint) RENAME TO cancel_impl;
ALTER FUNCTION baton.recreate(text, bigint) RENAME TO recreate_impl;
ALTER FUNCTION baton.prune_operations(interval) RENAME TO prune_operations_impl;

CREATE TYPE baton.fence_result AS (
    outcome text, token bigint, current_token bigint, current_seq bigint, detail text, result bytea);

-- A policy by name (or its number as text); 22023 naming the choices otherwise.
CREATE FUNCTION baton.policy_code(policy text)
RETURNS smallint LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_code smallint;
BEGIN
    v_code := CASE lower(policy)
        WHEN 'one_per_generation' THEN 1 WHEN '1' THEN 1
        WHEN 'ordered' THEN 2 WHEN '2' THEN 2
        WHEN 'session' THEN 3 WHEN '3' THEN 3
    END;
    IF v_code IS NULL THEN
        RAISE EXCEPTION 'policy % is unknown: write one_per_generation, ordered or session',
            coalesce(quote_literal(policy), 'NULL') USING ERRCODE = '22023';
    END IF;
    RETURN v_code;
END $$;

CREATE FUNCTION baton.fence(
    resource text, token bigint, operation text, fingerprint bytea,
    result bytea DEFAULT '', seq bigint DEFAULT 0, policy text DEFAULT 'one_per_generation',
    must_exist boolean DEFAULT false)
RETURNS SETOF baton.fence_result LANGUAGE sql AS $$
    SELECT * FROM baton.fence_impl($1, $2, $3, $4, $5, $6, baton.policy_code($7), $8, false);
$$;

CREATE FUNCTION baton.publish(resource text, token bigint, operation text, fingerprint bytea, object_key text)
RETURNS SETOF baton.fence_result LANGUAGE sql AS $$
    SELECT * FROM baton.publish_impl($1, $2, $3, $4, $5);
$$;

CREATE FUNCTION baton.delete(resource text, token bigint, operation text, fingerprint bytea)
RETURNS SETOF baton.fence_result LANGUAGE sql AS $$
    SELECT * FROM baton.delete_impl($1, $2, $3, $4);
$$;

CREATE FUNCTION baton.cancel(resource text, at_token bigint, policy text DEFAULT 'one_per_generation')
RETURNS bigint LANGUAGE sql AS $$
    SELECT baton.cancel_impl($1, $2, baton.policy_code($3));
$$;

CREATE FUNCTION baton.recreate(resource text, token bigint)
RETURNS text LANGUAGE sql AS $$
    SELECT baton.recreate_impl($1, $2);
$$;

CREATE FUNCTION baton.prune_operations(min_age interval)
RETURNS bigint LANGUAGE sql AS $$
    SELECT baton.prune_operations_impl($1);
$$;
