-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.fence_shared(resource text, token bigint, operation text, fingerprint bytea, result bytea DEFAULT '\x'::bytea, policy text DEFAULT 'one_per_generation'::text, must_exist boolean DEFAULT false)
 RETURNS SETOF baton.fence_result
 LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN QUERY SELECT * FROM baton.fence_shared_impl($1, $2, $3, $4, $5, baton.policy_code($6), $7);
END $function$;
