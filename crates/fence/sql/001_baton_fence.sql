-- Baton fence kit for PostgreSQL, migration 1.
--
-- Installs the fencing rule as SQL functions in the `baton` schema, so a
-- service in any language can fence its writes with plain SQL inside its own
-- transaction. The Rust crate `baton-fence` calls the same functions.
--
--   baton.fence(resource, token, operation, fingerprint [, result, seq, policy, must_exist])
--       judges one write; when the outcome is 'applied' the resource's
--       generation advanced and the operation was recorded in this
--       transaction, and the caller's own mutation belongs in it too.
--   baton.publish(resource, token, operation, fingerprint, object_key)
--       fence + move the publication pointer (baton.resources.published_key), in one statement.
--   baton.cancel(resource, at_token [, policy])   durable cancellation
--   baton.delete(resource, token, operation, fingerprint)   fenced tombstone
--   baton.recreate(resource, token)   explicit new incarnation
--   baton.prune_operations(min_age)   removes old operation records (>= 1 hour)
--
-- Outcomes: applied, replayed, stale, conflict, cancelled, deleted, missing,
-- generation_used, out_of_order. Policies: 1 one operation per generation
-- (default), 2 ordered mutations (token + seq), 3 whole session.

CREATE SCHEMA IF NOT EXISTS baton;

-- Which migrations have run; later migrations check and append here.
CREATE TABLE IF NOT EXISTS baton.schema_migrations (
    version    integer PRIMARY KEY,
    applied_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO baton.schema_migrations (version) VALUES (1) ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS baton.resources (
    resource       text PRIMARY KEY CHECK (octet_length(resource) BETWEEN 1 AND 512),
    policy         smallint NOT NULL CHECK (policy IN (1, 2, 3)),
    generation     bigint NOT NULL CHECK (generation >= 1),
    seq            bigint NOT NULL DEFAULT 0,
    last_operation text,
    cancelled_at   bigint,
    deleted        boolean NOT NULL DEFAULT false,
    incarnation    bigint NOT NULL DEFAULT 1,
    -- The publication pointer: which immutable object is authoritative.
    published_key       text,
    published_token     bigint,
    published_operation text
);

CREATE TABLE IF NOT EXISTS baton.operations (
    resource    text NOT NULL,
    operation   text NOT NULL,
    token       bigint NOT NULL,
    fingerprint bytea NOT NULL,
    result      bytea NOT NULL,
    recorded_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (resource, operation)
);

CREATE OR REPLACE FUNCTION baton.check_input(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea)
RETURNS void LANGUAGE plpgsql IMMUTABLE AS $$
BEGIN
    IF p_resource IS NULL OR octet_length(p_resource) NOT BETWEEN 1 AND 512 THEN
        RAISE EXCEPTION 'resource is % bytes; it must be 1 to 512 bytes', coalesce(octet_length(p_resource), 0)
            USING ERRCODE = '22023';
    END IF;
    IF p_token IS NULL OR p_token < 1 THEN
        RAISE EXCEPTION 'token % is out of range: tokens are 1 to 9223372036854775807', p_token USING ERRCODE = '22023';
    END IF;
    IF p_operation IS NULL OR octet_length(p_operation) NOT BETWEEN 1 AND 128 THEN
        RAISE EXCEPTION 'operation id is % bytes; it must be 1 to 128 bytes', coalesce(octet_length(p_operation), 0)
            USING ERRCODE = '22023';
    END IF;
    IF p_fingerprint IS NULL OR length(p_fingerprint) NOT BETWEEN 1 AND 64 THEN
        RAISE EXCEPTION 'fingerprint is % bytes; it must be 1 to 64 bytes', coalesce(length(p_fingerprint), 0)
            USING ERRCODE = '22023';
    END IF;
END $$;

-- The whole rule: creation, replay, conflict and every refusal. baton.fence
-- and baton.publish try a one-statement fast path first and come here when
-- it does not apply.
CREATE OR REPLACE FUNCTION baton.fence_full(
    p_resource text, p_token bigint, p_operation text, p_fingerprint bytea,
    p_result bytea, p_seq bigint, p_policy smallint, p_must_exist boolean, p_delete boolean)
RETURNS TABLE (outcome text, token bigint, current_token bigint, current_seq bigint, detail text, result bytea)
LANGUAGE plpgsql AS $$
DECLARE
    r  baton.resources%ROWTYPE;
    op baton.operations%ROWTYPE;
BEGIN
    PERFORM baton.check_input(p_resource, p_token, p_operation, p_fingerprint);
    IF p_seq IS NULL OR p_seq < 0 THEN
        RAISE EXCEPTION 'sequence % is out of range: sequences are 0 to 9223372036854775807', p_seq USING ERRCODE = '22023';
    END IF;
    IF p_policy NOT IN (1, 2, 3) THEN
        RAISE EXCEPTION 'policy % is unknown: 1 one per generation, 2 ordered, 3 session', p_policy USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_result) > 4096 THEN
        RAISE EXCEPTION 'result is % bytes; the limit is 4096 bytes', octet_length(p_result) USING ERRCODE = '22023';
    END IF;

    -- Lock the resource row for the rest of the transaction: the decision and
    -- the caller's effect cannot interleave with another writer's.
    SELECT * INTO r FROM baton.resources AS x WHERE x.resource = p_resource FOR UPDATE;
    IF NOT FOUND THEN
        IF p_must_exist THEN
            RETURN QUERY SELECT 'missing'::text, p_token, NULL::bigint, NULL::bigint, NULL::text, NULL::bytea;
            RETURN;
        END IF;
        -- First creation: the unique key decides between concurrent first writers.
        INSERT INTO baton.resources (resource, policy, generation, seq, last_operation, deleted)
        VALUES (p_resource, p_policy, p_token, p_seq, p_operation, p_delete)
        ON CONFLICT ON CONSTRAINT resources_pkey DO NOTHING;
        IF FOUND THEN
            INSERT INTO baton.operations (resource, operation, token, fingerprint, result)
            VALUES (p_resource, p_operation, p_token, p_fingerprint, p_result);
            RETURN QUERY SELECT 'applied'::text, p_token, p_token, p_seq, 'created'::text, NULL::bytea;
            RETURN;
        END IF;
        SELECT * INTO r FROM baton.resources AS x WHERE x.resource = p_resource FOR UPDATE;
    END IF;

    SELECT * INTO op FROM baton.operations AS o WHERE o.resource = p_resource AND o.operation = p_operation;
    IF FOUND THEN
        IF op.fingerprint = p_fingerprint THEN
            RETURN QUERY SELECT 'replayed'::text, op.token, r.generation, r.seq, NULL::text, op.result;
        ELSE
            RETURN QUERY SELECT 'conflict'::text, op.token, r.generation, r.seq, NULL::text, NULL::bytea;
        END IF;
        RETURN;
    END IF;
    IF r.policy <> p_policy THEN
        RAISE EXCEPTION 'resource % uses policy %; the request asked for %', p_resource, r.policy, p_policy
            USING ERRCODE = '22023';
    END IF;
    IF r.deleted THEN
        RETURN QUERY SELECT 'deleted'::text, p_token, r.generation, r.seq, NULL::text, NULL::bytea;
        RETURN;
    END IF;
    IF r.cancelled_at IS NOT NULL AND p_token <= r.cancelled_at THEN
        RETURN QUERY SELECT 'cancelled'::text, p_token, r.cancelled_at, r.seq, NULL::text, NULL::bytea;
        RETURN;
    END IF;
    IF p_token < r.generation THEN
        RETURN QUERY SELECT 'stale'::text, p_token, r.generation, r.seq, NULL::text, NULL::bytea;
        RETURN;
    END IF;
    IF p_token = r.generation THEN
        -- A generation opened by recreate has no operation yet: its owner's
        -- first write is that one.
        IF r.policy = 1 AND r.last_operation IS NOT NULL THEN
            RETURN QUERY SELECT 'generation_used'::text, p_token, r.generation, r.seq, r.last_operation, NULL::bytea;
            RETURN;
        ELSIF r.policy = 2 AND p_seq <= r.seq THEN
            RETURN QUERY SELECT 'out_of_order'::text, p_token, r.generation, r.seq, NULL::text, NULL::bytea;
            RETURN;
        END IF;
    END IF;
    UPDATE baton.resources AS x
    SET generation = p_token, seq = p_seq, last_operation = p_operation, deleted = p_delete
    WHERE x.resource = p_resource;
    INSERT INTO baton.operations (resource, operation, token, fingerprint, result)
    VALUES (p_resource, p_operation, p_token, p_fingerprint, p_result);
    RETURN QUERY SELECT 'applied'::text, p_token, p_token, p_seq, NULL::text, NULL::bytea;
END $$;

CREATE OR REPLACE FUNCTION baton.fence(
    p_resource text, p_token bigint, p_operation text, p_fingerprint bytea,
    p_result bytea DEFAULT '', p_seq bigint DEFAULT 0, p_policy smallint DEFAULT 1, p_must_exist boolean DEFAULT false,
    p_delete boolean DEFAULT false)
RETURNS TABLE (outcome text, token bigint, current_token bigint, current_seq bigint, detail text, result bytea)
LANGUAGE plpgsql AS $$
#variable_conflict use_column
BEGIN
    -- Fast path: a live resource of this policy, a new operation, and a token
    -- the policy accepts. The UPDATE takes the row lock and re-checks its
    -- conditions against the latest row version, so concurrent writers
    -- serialize here. Inputs it cannot judge go to baton.fence_full.
    IF NOT p_delete AND p_token >= 1 AND p_seq >= 0 AND octet_length(p_operation) BETWEEN 1 AND 128
       AND length(p_fingerprint) BETWEEN 1 AND 64 AND octet_length(p_result) <= 4096 THEN
        UPDATE baton.resources AS x
        SET generation = p_token, seq = p_seq, last_operation = p_operation
        WHERE x.resource = p_resource AND x.policy = p_policy AND NOT x.deleted
          AND (x.cancelled_at IS NULL OR x.cancelled_at < p_token)
          AND (x.generation < p_token
               OR (x.generation = p_token AND (x.policy = 3 OR (x.policy = 2 AND x.seq < p_seq))))
          AND NOT EXISTS (SELECT 1 FROM baton.operations AS o WHERE o.resource = p_resource AND o.operation = p_operation);
        IF FOUND THEN
            INSERT INTO baton.operations (resource, operation, token, fingerprint, result)
            VALUES (p_resource, p_operation, p_token, p_fingerprint, p_result);
            outcome := 'applied'; token := p_token; current_token := p_token; current_seq := p_seq;
            RETURN NEXT;
            RETURN;
        END IF;
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
    f record;
BEGIN
    -- The fast path of baton.fence for the default policy, with the pointer
    -- moved in the same row update.
    IF p_token >= 1 AND octet_length(p_operation) BETWEEN 1 AND 128 AND length(p_fingerprint) BETWEEN 1 AND 64
       AND octet_length(p_object_key) BETWEEN 1 AND 4096 THEN
        UPDATE baton.resources AS x
        SET generation = p_token, seq = 0, last_operation = p_operation,
            published_key = p_object_key, published_token = p_token, published_operation = p_operation
        WHERE x.resource = p_resource AND x.policy = 1 AND NOT x.deleted
          AND (x.cancelled_at IS NULL OR x.cancelled_at < p_token) AND x.generation < p_token
          AND NOT EXISTS (SELECT 1 FROM baton.operations AS o WHERE o.resource = p_resource AND o.operation = p_operation);
        IF FOUND THEN
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

CREATE OR REPLACE FUNCTION baton.delete(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea)
RETURNS TABLE (outcome text, token bigint, current_token bigint, current_seq bigint, detail text, result bytea)
LANGUAGE sql AS $$
    SELECT * FROM baton.fence_full(p_resource, p_token, p_operation, p_fingerprint, ''::bytea, 0, 1::smallint, false, true);
$$;

CREATE OR REPLACE FUNCTION baton.cancel(p_resource text, p_at bigint, p_policy smallint DEFAULT 1)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_floor bigint;
BEGIN
    IF p_at IS NULL OR p_at < 1 THEN
        RAISE EXCEPTION 'token % is out of range: tokens are 1 to 9223372036854775807', p_at USING ERRCODE = '22023';
    END IF;
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
    IF p_min_age < interval '1 hour' THEN
        RAISE EXCEPTION 'operation records younger than 3600s are never pruned; asked for %', p_min_age
            USING ERRCODE = '22023';
    END IF;
    DELETE FROM baton.operations WHERE recorded_at < now() - p_min_age;
    GET DIAGNOSTICS n = ROW_COUNT;
    RETURN n;
END $$;
