-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.prune_operations(min_age interval)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN baton.prune_operations_impl($1);
END $function$;
