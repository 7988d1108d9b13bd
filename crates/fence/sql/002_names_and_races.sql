-- Baton fence kit for PostgreSQL, migration 2. Upgrades an installed
-- migration 1 in place (same function signatures, new bodies).
--
-- 1. Resource names follow the lease service's rules and must be canonical
--    (Unicode NFC): `cafe` + U+0301 is refused, naming `café`, instead of
--    becoming a second row for the same lease. baton.check_name holds the
--    rules; every function checks its resource with it.
-- 2. Every function validates its arguments first and raises 22023
--    (invalid_parameter_value) naming the rule and the value, never a
--    constraint error (23502, 23514).
-- 3. The fast paths of baton.fence and baton.publish lock the resource row
--    before they look for the operation id. Before, a second session reusing
--    an operation id that a first session had in flight waited on the row,
--    then inserted the operation a second time and failed with 23505 on
--    operations_pkey; now it gets 'replayed' or 'conflict'. Every insert into
--    baton.operations happens while its resource row is locked, so a look-up
--    made after taking the lock sees every committed operation of it.

DO $$
BEGIN
    IF current_setting('server_encoding') <> 'UTF8' THEN
        RAISE EXCEPTION 'the baton fence kit needs a UTF8 database (this one is %): resource names are compared in Unicode NFC',
            current_setting('server_encoding') USING ERRCODE = '22023';
    END IF;
END $$;

INSERT INTO baton.schema_migrations (version) VALUES (2) ON CONFLICT DO NOTHING;

-- The lease service's name rules (baton_core::ResourceName), in SQL.
CREATE OR REPLACE FUNCTION baton.check_name(p_resource text)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
DECLARE
    v_canonical text;
    v_at integer;
BEGIN
    IF p_resource IS NULL OR p_resource = '' THEN
        RAISE EXCEPTION 'resource name is empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_resource) > 2048 THEN
        RAISE EXCEPTION 'resource name is % bytes long; the limit is 512 bytes (after NFC normalization)',
            octet_length(p_resource) USING ERRCODE = '22023';
    END IF;
    -- Printable ASCII is already canonical: skip the normalizer on the common path.
    IF p_resource ~ '^[ -~]+$' THEN
        v_canonical := p_resource;
    ELSE
        v_canonical := normalize(p_resource, NFC);
    END IF;
    IF octet_length(v_canonical) > 512 THEN
        RAISE EXCEPTION 'resource name is % bytes long; the limit is 512 bytes (after NFC normalization)',
            octet_length(v_canonical) USING ERRCODE = '22023';
    END IF;
    v_at := position(substring(v_canonical from '[\u0001-\u001F\u007F-\u009F]') in v_canonical);
    IF v_at > 0 THEN
        RAISE EXCEPTION 'resource name contains control character U+% at character %; control characters are not allowed',
            lpad(upper(to_hex(ascii(substr(v_canonical, v_at, 1)))), 4, '0'), v_at - 1 USING ERRCODE = '22023';
    END IF;
    IF v_canonical ~ '^[ \u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]'
       OR v_canonical ~ '[ \u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]$' THEN
        RAISE EXCEPTION 'resource name has leading or trailing whitespace; trim it' USING ERRCODE = '22023';
    END IF;
    IF v_canonical LIKE ':%' OR v_canonical LIKE '%:' OR position('::' in v_canonical) > 0 THEN
        RAISE EXCEPTION 'resource name % has an empty '':''-separated segment; segments must be non-empty',
            quote_literal(v_canonical) USING ERRCODE = '22023';
    END IF;
    IF v_canonical <> p_resource THEN
        RAISE EXCEPTION 'resource name % is not in canonical form (Unicode NFC); write it as %, the name the lease service returns',
            quote_literal(p_resource), quote_literal(v_canonical) USING ERRCODE = '22023';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION baton.check_token(p_what text, p_token bigint)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_token IS NULL OR p_token < 1 THEN
        RAISE EXCEPTION '% % is out of range: tokens are 1 to 9223372036854775807', p_what, coalesce(p_token::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION baton.check_policy(p_policy smallint)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_policy IS NULL OR p_policy NOT IN (1, 2, 3) THEN
        RAISE EXCEPTION 'policy % is unknown: 1 one per generation, 2 ordered, 3 session', coalesce(p_policy::text, 'NULL')
            USING ERRCODE = '22023';
    END IF;
END $$;

CREATE OR REPLACE FUNCTION baton.check_input(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
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
END $$;

CREATE OR REPLACE FUNCTION baton.fence(
    p_resource text, p_token bigint, p_operation text, p_fingerprint bytea,
    p_result bytea DEFAULT '', p_seq bigint DEFAULT 0, p_policy smallint DEFAULT 1, p_must_exist boolean DEFAULT false,
    p_delete boolean DEFAULT false)
RETURNS TABLE (outcome text, token bigint, current_token bigint, current_seq bigint, detail text, result bytea)
LANGUAGE plpgsql AS $$
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
        PERFORM baton.check_name(p_resource);
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

CREATE OR REPLACE FUNCTION baton.publish(
    p_resource text, p_token bigint, p_operation text, p_fingerprint bytea, p_object_key text)
RETURNS TABLE (outcome text, token bigint, current_token bigint, current_seq bigint, detail text, result bytea)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    r record;
    f record;
BEGIN
    -- The fast path of baton.fence for the default policy, with the pointer
    -- moved in the same row update (the row is locked first, as there).
    IF p_token >= 1 AND octet_length(p_operation) BETWEEN 1 AND 128 AND length(p_fingerprint) BETWEEN 1 AND 64
       AND octet_length(p_object_key) BETWEEN 1 AND 4096 THEN
        PERFORM baton.check_name(p_resource);
        SELECT x.policy, x.deleted, x.cancelled_at, x.generation INTO r
        FROM baton.resources AS x WHERE x.resource = p_resource FOR UPDATE;
        IF FOUND AND r.policy = 1 AND NOT r.deleted
           AND (r.cancelled_at IS NULL OR r.cancelled_at < p_token) AND r.generation < p_token
           AND NOT EXISTS (SELECT 1 FROM baton.operations AS o WHERE o.resource = p_resource AND o.operation = p_operation) THEN
            UPDATE baton.resources AS x
            SET generation = p_token, seq = 0, last_operation = p_operation,
                published_key = p_object_key, published_token = p_token, published_operation = p_operation
            WHERE x.resource = p_resource;
            INSERT INTO baton.operations (resource, operation, token, fingerprint, result)
            VALUES (p_resource, p_operation, p_token, p_fingerprint, convert_to(p_object_key, 'UTF8'));
            outcome := 'applied'; token := p_token; current_token := p_token; current_seq := 0;
            RETURN NEXT;
            RETURN;
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

CREATE OR REPLACE FUNCTION baton.cancel(p_resource text, p_at bigint, p_policy smallint DEFAULT 1)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_floor bigint;
BEGIN
    PERFORM baton.check_name(p_resource);
    PERFORM baton.check_token('token', p_at);
    PERFORM baton.check_policy(p_policy);
    INSERT INTO baton.resources AS x (resource, policy, generation, cancelled_at)
    VALUES (p_resource, p_policy, p_at, p_at)
    ON CONFLICT ON CONSTRAINT resources_pkey DO UPDATE
        SET generation = greatest(x.generation, p_at),
            cancelled_at = greatest(coalesce(x.cancelled_at, p_at), p_at)
    RETURNING x.cancelled_at INTO v_floor;
    RETURN v_floor;
END $$;

CREATE OR REPLACE FUNCTION baton.recreate(p_resource text, p_token bigint)
RETURNS text LANGUAGE plpgsql AS $$
DECLARE
    r baton.resources%ROWTYPE;
BEGIN
    PERFORM baton.check_name(p_resource);
    PERFORM baton.check_token('token', p_token);
    SELECT * INTO r FROM baton.resources AS x WHERE x.resource = p_resource FOR UPDATE;
    IF NOT FOUND OR NOT r.deleted THEN
        RETURN 'not_deleted';
    END IF;
    IF p_token <= r.generation THEN
        RETURN 'stale';
    END IF;
    UPDATE baton.resources AS x
    SET generation = p_token, seq = 0, last_operation = NULL, cancelled_at = NULL, deleted = false,
        incarnation = r.incarnation + 1
    WHERE x.resource = p_resource;
    RETURN 'recreated';
END $$;

CREATE OR REPLACE FUNCTION baton.prune_operations(p_min_age interval)
RETURNS bigint LANGUAGE plpgsql AS $$
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
END $$;
