-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.publish_impl(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea, p_object_key text)
 RETURNS TABLE(outcome text, token bigint, current_token bigint, current_seq bigint, detail text, result bytea)
 LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN QUERY SELECT * FROM baton.publish($1, $2, $3, $4, $5);
END $function$;
