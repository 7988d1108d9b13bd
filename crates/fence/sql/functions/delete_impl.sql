-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.delete_impl(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea)
 RETURNS TABLE(outcome text, token bigint, current_token bigint, current_seq bigint, detail text, result bytea)
 LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN QUERY SELECT * FROM baton.fence_full($1, $2, $3, $4, ''::bytea, 0, 1::smallint, false, true);
END $function$;
