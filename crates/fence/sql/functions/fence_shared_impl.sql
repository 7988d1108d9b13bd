-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.fence_shared_impl(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea, p_result bytea DEFAULT '\x'::bytea, p_policy smallint DEFAULT 1, p_must_exist boolean DEFAULT false)
 RETURNS SETOF baton.fence_result
 LANGUAGE plpgsql
AS $function$
BEGIN
    -- What fence_impl checks before the full path, then the full path on
    -- the shared side.
    PERFORM baton.check_policy(p_policy);
    IF p_result IS NULL THEN
        RAISE EXCEPTION 'result is NULL; pass an empty bytea for no result' USING ERRCODE = '22023';
    END IF;
    IF p_must_exist IS NULL THEN
        RAISE EXCEPTION 'must_exist must be true or false, not NULL' USING ERRCODE = '22023';
    END IF;
    RETURN QUERY SELECT * FROM baton.fence_full(p_resource, p_token, p_operation, p_fingerprint, p_result, 0,
                                                p_policy, p_must_exist, false, true);
END $function$;
