-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.check_policy(p_policy smallint)
 RETURNS void
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
BEGIN
    IF p_policy IS NULL OR p_policy NOT IN (1, 2, 3) THEN
        RAISE EXCEPTION 'policy % is unknown: 1 one per generation, 2 ordered, 3 session', coalesce(p_policy::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
END $function$;
