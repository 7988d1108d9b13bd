-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.check_token(p_what text, p_token bigint)
 RETURNS void
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
BEGIN
    IF p_token IS NULL OR p_token < 1 THEN
        RAISE EXCEPTION '% % is out of range: tokens are 1 to 9223372036854775807', p_what, coalesce(p_token::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
END $function$;
