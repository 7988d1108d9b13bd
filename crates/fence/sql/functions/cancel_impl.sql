-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.cancel_impl(p_resource text, p_at bigint, p_policy smallint DEFAULT 1)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
DECLARE
    v_floor bigint;
BEGIN
    PERFORM baton.check_name(p_resource);
    PERFORM baton.check_token('token', p_at);
    PERFORM baton.check_policy(p_policy);
    INSERT INTO baton.resources AS x (resource, policy, generation, cancelled_at)
    VALUES (p_resource, p_policy, p_at, p_at)
    ON CONFLICT ON CONSTRAINT resources_pkey DO UPDATE
        SET generation = greatest(x.generation, p_at),
            cancelled_at = greatest(coalesce(x.cancelled_at, p_at), p_at)
    RETURNING x.cancelled_at INTO v_floor;
    RETURN v_floor;
END $function$;
