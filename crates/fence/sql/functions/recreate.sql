-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.recreate(resource text, token bigint)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN baton.recreate_impl($1, $2);
END $function$;
