-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.publish(resource text, token bigint, operation text, fingerprint bytea, object_key text)
 RETURNS SETOF baton.fence_result
 LANGUAGE plpgsql
AS $function$
#variable_conflict use_column
DECLARE
    -- The parameters share names with columns; the body uses these.
    p_resource text := $1;
    p_token bigint := $2;
    p_operation text := $3;
    p_fingerprint bytea := $4;
    p_object_key text := $5;
    n bigint;
    f record;
BEGIN
    IF p_token >= 1 AND octet_length(p_operation) BETWEEN 1 AND 128 AND length(p_fingerprint) BETWEEN 1 AND 64
       AND octet_length(p_object_key) BETWEEN 1 AND 4096 THEN
        IF NOT coalesce(baton.name_is_plain(p_resource), false) THEN
            PERFORM baton.check_name(p_resource);
        END IF;
        -- The record first: a concurrent publish of the same operation id
        -- makes this insert wait for it and then do nothing (the slow path
        -- judges the replay). Then the row, guarded by every check; if a
        -- check fails, the record is taken back and the slow path says why.
        INSERT INTO baton.operations (resource, operation, token, fingerprint, result)
        VALUES (p_resource, p_operation, p_token, p_fingerprint, convert_to(p_object_key, 'UTF8'))
        ON CONFLICT (resource, operation) DO NOTHING;
        GET DIAGNOSTICS n = ROW_COUNT;
        IF n = 1 THEN
            UPDATE baton.resources AS x
            SET generation = p_token, seq = 0, last_operation = p_operation, exclusive_token = NULL,
                published_key = p_object_key, published_token = p_token, published_operation = p_operation
            WHERE x.resource = p_resource AND x.policy = 1 AND NOT x.deleted
              AND (x.cancelled_at IS NULL OR x.cancelled_at < p_token) AND x.generation < p_token;
            GET DIAGNOSTICS n = ROW_COUNT;
            IF n = 1 THEN
                RETURN NEXT ('applied', p_token, p_token, 0, NULL, NULL)::baton.fence_result;
                RETURN;
            END IF;
            DELETE FROM baton.operations AS o WHERE o.resource = p_resource AND o.operation = p_operation;
        END IF;
    END IF;
    IF p_object_key IS NULL OR octet_length(p_object_key) NOT BETWEEN 1 AND 4096 THEN
        RAISE EXCEPTION 'object key is % bytes; it must be 1 to 4096 bytes', coalesce(octet_length(p_object_key), 0)
            USING ERRCODE = '22023';
    END IF;
    SELECT * INTO f FROM baton.fence_full(p_resource, p_token, p_operation, p_fingerprint,
                                          convert_to(p_object_key, 'UTF8'), 0, 1::smallint, false, false);
    IF f.outcome = 'applied' THEN
        UPDATE baton.resources AS x
        SET published_key = p_object_key, published_token = p_token, published_operation = p_operation
        WHERE x.resource = p_resource;
    END IF;
    RETURN NEXT (f.outcome, f.token, f.current_token, f.current_seq, f.detail, f.result)::baton.fence_result;
END $function$;
