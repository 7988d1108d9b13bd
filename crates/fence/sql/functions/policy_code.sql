-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.policy_code(policy text)
 RETURNS smallint
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
DECLARE
    v_code smallint;
BEGIN
    v_code := CASE lower(policy)
        WHEN 'one_per_generation' THEN 1 WHEN '1' THEN 1
        WHEN 'ordered' THEN 2 WHEN '2' THEN 2
        WHEN 'session' THEN 3 WHEN '3' THEN 3
    END;
    IF v_code IS NULL THEN
        RAISE EXCEPTION 'policy % is unknown: write one_per_generation, ordered or session',
            coalesce(quote_literal(policy), 'NULL') USING ERRCODE = '22023';
    END IF;
    RETURN v_code;
END $function$;
