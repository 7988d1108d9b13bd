-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.check_input(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea)
 RETURNS void
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
BEGIN
    PERFORM baton.check_name(p_resource);
    PERFORM baton.check_token('token', p_token);
    IF p_operation IS NULL OR octet_length(p_operation) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'operation id is % bytes; it must be 1 to 128 bytes', coalesce(octet_length(p_operation), 0)
            USING ERRCODE = '22023';
    END IF;
    IF p_fingerprint IS NULL OR length(p_fingerprint) NOT BETWEEN 1 AND 64 THEN
        RAISE EXCEPTION 'fingerprint is % bytes; it must be 1 to 64 bytes', coalesce(length(p_fingerprint), 0)
            USING ERRCODE = '22023';
    END IF;
END $function$;
