-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.delete(resource text, token bigint, operation text, fingerprint bytea)
 RETURNS SETOF baton.fence_result
 LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN QUERY SELECT * FROM baton.delete_impl($1, $2, $3, $4);
END $function$;
