-- Baton fence kit for PostgreSQL, migration 5. Upgrades migration 4 in place.
--
-- The publish hot path: the fast path of baton.publish_impl is two
-- statements (insert the operation record unless it exists, then update
-- the row guarded by every check) instead of a locking read, a probe and
-- two writes; and baton.resources leaves a fifth of each page free, so
-- the row update stays a HOT update (no index entry). The checks, the
-- outcomes and the slow path are those of migration 2.

INSERT INTO baton.schema_migrations (version) VALUES (5) ON CONFLICT DO NOTHING;

-- New pages only; `VACUUM FULL baton.resources` applies it to old ones.
ALTER TABLE baton.resources SET (fillfactor = 80);

CREATE OR REPLACE FUNCTION baton.publish_impl(
    p_resource text, p_token bigint, p_operation text, p_fingerprint bytea, p_object_key text)
RETURNS TABLE (outcome text, token bigint, current_token bigint, current_seq bigint, detail text, result bytea)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    n bigint;
    f record;
BEGIN
    IF p_token >= 1 AND octet_length(p_operation) BETWEEN 1 AND 128 AND length(p_fingerprint) BETWEEN 1 AND 64
       AND octet_length(p_object_key) BETWEEN 1 AND 4096 THEN
        PERFORM baton.check_name(p_resource);
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
            SET generation = p_token, seq = 0, last_operation = p_operation,
                published_key = p_object_key, published_token = p_token, published_operation = p_operation
            WHERE x.resource = p_resource AND x.policy = 1 AND NOT x.deleted
              AND (x.cancelled_at IS NULL OR x.cancelled_at < p_token) AND x.generation < p_token;
            GET DIAGNOSTICS n = ROW_COUNT;
            IF n = 1 THEN
                outcome := 'applied'; token := p_token; current_token := p_token; current_seq := 0;
                RETURN NEXT;
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
    outcome := f.outcome; token := f.token; current_token := f.current_token; current_seq := f.current_seq;
    detail := f.detail; result := f.result;
    RETURN NEXT;
END $$;
