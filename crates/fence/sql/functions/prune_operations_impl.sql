-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.prune_operations_impl(p_min_age interval)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
DECLARE
    n bigint;
BEGIN
    IF p_min_age IS NULL OR p_min_age < interval '1 hour' THEN
        RAISE EXCEPTION 'operation records younger than 3600s are never pruned; asked for %', coalesce(p_min_age::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
    DELETE FROM baton.operations WHERE recorded_at < now() - p_min_age;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $function$;
