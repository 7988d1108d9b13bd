-- Baton fence kit for PostgreSQL, migration 7. Upgrades migration 6 in place.
--
-- The fast paths of baton.fence_impl and baton.publish_impl (what
-- baton.fence, baton.fence_or_abort and baton.publish call) check a
-- resource name that is printable ASCII with one inlined expression,
-- baton.name_is_plain, instead of calling baton.check_name: such a name is
-- already in canonical form, so the rules left are its length, no
-- leading or trailing space and no empty ':'-separated segment. Any other
-- name (NULL included) still goes through baton.check_name, which raises
-- the error naming the rule, or lets a valid non-ASCII name through. The
-- bodies are otherwise those of migrations 2 and 5; outcomes and errors
-- are unchanged. And baton.publish now holds the publish itself instead
-- of calling baton.publish_impl, which becomes the wrapper: one PL/pgSQL
-- call per publish for SQL callers and the Rust kit alike.

INSERT INTO baton.schema_migrations (version) VALUES (7) ON CONFLICT DO NOTHING;

-- True when the name is printable ASCII and obeys every name rule; NULL
-- or false says nothing (baton.check_name decides). A one-expression SQL
-- function, so PostgreSQL inlines it where it is used.
CREATE OR REPLACE FUNCTION baton.name_is_plain(p_resource text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT octet_length($1) <= 512
       AND $1 ~ '^[!-~]([ -~]*[!-~])?$'
       AND left($1, 1) <> ':' AND right($1, 1) <> ':' AND strpos($1, '::') = 0
$$;

CREATE OR REPLACE FUNCTION baton.fence_impl(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea, p_result bytea DEFAULT '\x'::bytea, p_seq bigint DEFAULT 0, p_policy smallint DEFAULT 1, p_must_exist boolean DEFAULT false, p_delete boolean DEFAULT false)
 RETURNS TABLE(outcome text, token bigint, current_token bigint, current_seq bigint, detail text, result bytea)
 LANGUAGE plpgsql
AS $$
#variable_conflict use_column
DECLARE
    r record;
BEGIN
    -- Fast path: a live resource of this policy, a new operation, and a token
    -- the policy accepts. The row is locked first; the look-up for the
    -- operation id that follows is a new statement, so it sees an operation
    -- committed by the session that held the lock. Inputs it cannot judge go
    -- to baton.fence_full.
    IF NOT coalesce(p_delete, true) AND p_token >= 1 AND p_seq >= 0 AND octet_length(p_operation) BETWEEN 1 AND 128
       AND length(p_fingerprint) BETWEEN 1 AND 64 AND octet_length(p_result) <= 4096 THEN
        IF NOT coalesce(baton.name_is_plain(p_resource), false) THEN
            PERFORM baton.check_name(p_resource);
        END IF;
        SELECT x.policy, x.deleted, x.cancelled_at, x.generation, x.seq INTO r
        FROM baton.resources AS x WHERE x.resource = p_resource FOR UPDATE;
        IF FOUND AND r.policy = p_policy AND NOT r.deleted
           AND (r.cancelled_at IS NULL OR r.cancelled_at < p_token)
           AND (r.generation < p_token
                OR (r.generation = p_token AND (r.policy = 3 OR (r.policy = 2 AND r.seq < p_seq))))
           AND NOT EXISTS (SELECT 1 FROM baton.operations AS o WHERE o.resource = p_resource AND o.operation = p_operation) THEN
            UPDATE baton.resources AS x
            SET generation = p_token, seq = p_seq, last_operation = p_operation
            WHERE x.resource = p_resource;
            INSERT INTO baton.operations (resource, operation, token, fingerprint, result)
            VALUES (p_resource, p_operation, p_token, p_fingerprint, p_result);
            outcome := 'applied'; token := p_token; current_token := p_token; current_seq := p_seq;
            RETURN NEXT;
            RETURN;
        END IF;
    END IF;
    PERFORM baton.check_policy(p_policy);
    IF p_result IS NULL THEN
        RAISE EXCEPTION 'result is NULL; pass an empty bytea for no result' USING ERRCODE = '22023';
    END IF;
    IF p_must_exist IS NULL OR p_delete IS NULL THEN
        RAISE EXCEPTION 'must_exist and delete must be true or false, not NULL' USING ERRCODE = '22023';
    END IF;
    RETURN QUERY SELECT * FROM baton.fence_full(p_resource, p_token, p_operation, p_fingerprint, p_result, p_seq,
                                                p_policy, p_must_exist, p_delete);
END $$;

-- baton.publish holds the publish itself (it was a wrapper around
-- baton.publish_impl, so SQL callers paid two PL/pgSQL calls); the Rust
-- kit calls it too.
CREATE OR REPLACE FUNCTION baton.publish(resource text, token bigint, operation text, fingerprint bytea, object_key text)
RETURNS SETOF baton.fence_result LANGUAGE plpgsql AS $$
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
            SET generation = p_token, seq = 0, last_operation = p_operation,
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
END $$;

-- What the Rust kit called before it called baton.publish; kept for
-- kits of earlier versions.
CREATE OR REPLACE FUNCTION baton.publish_impl(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea, p_object_key text)
RETURNS TABLE (outcome text, token bigint, current_token bigint, current_seq bigint, detail text, result bytea)
LANGUAGE plpgsql AS $$
BEGIN
    RETURN QUERY SELECT * FROM baton.publish($1, $2, $3, $4, $5);
END $$;
