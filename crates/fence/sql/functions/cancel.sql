-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.cancel(resource text, at_token bigint, policy text DEFAULT 'one_per_generation'::text)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN baton.cancel_impl($1, $2, baton.policy_code($3));
END $function$;
