-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.recreate_impl(p_resource text, p_token bigint)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
DECLARE
    r baton.resources%ROWTYPE;
BEGIN
    PERFORM baton.check_name(p_resource);
    PERFORM baton.check_token('token', p_token);
    SELECT * INTO r FROM baton.resources AS x WHERE x.resource = p_resource FOR UPDATE;
    IF NOT FOUND OR NOT r.deleted THEN
        RETURN 'not_deleted';
    END IF;
    IF p_token <= r.generation THEN
        RETURN 'stale';
    END IF;
    UPDATE baton.resources AS x
    SET generation = p_token, seq = 0, last_operation = NULL, cancelled_at = NULL, deleted = false, exclusive_token = NULL,
        incarnation = r.incarnation + 1
    WHERE x.resource = p_resource;
    RETURN 'recreated';
END $function$;
