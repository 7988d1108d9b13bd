-- Baton fence kit for PostgreSQL, migration 10: writes made under a shared lease.
--
-- A reader holding a shared lease (`baton acquire NAME --shared`) writes
-- what it derived from the data with baton.fence_shared. Many readers hold
-- the resource at once, each with its own token, so a shared write never
-- raises the floor the other readers are judged against: it is refused
-- only when an exclusive write with a higher token has been recorded (a
-- writer changed the data after the reader's grant), when the resource is
-- deleted, or when it is cancelled at or above the token. The exclusive
-- side keeps its rule and gains one consequence: a shared write raises
-- `generation` to its token, so an exclusive write below a recorded
-- reader's token is stale (that reader was granted after the writer's
-- lease ended), while one equal to it is judged as a new generation (no
-- exclusive write was made with that token).
--
-- resources.exclusive_token is the floor shared writes are judged
-- against: NULL while `generation` is itself the last exclusive write's
-- token (every row written before this version), the last exclusive
-- write's token once a shared write has raised `generation` above it, 0
-- when a shared write created the row and no exclusive write has been
-- recorded since. Every exclusive write (fence, publish, delete) and a
-- recreate set it back to NULL.

INSERT INTO baton.schema_migrations (version) VALUES (10) ON CONFLICT DO NOTHING;

-- No default and no check: adding the column rewrites and scans nothing.
ALTER TABLE baton.resources ADD COLUMN IF NOT EXISTS exclusive_token bigint;

CREATE OR REPLACE FUNCTION baton.fence_impl(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea, p_result bytea DEFAULT '\x'::bytea, p_seq bigint DEFAULT 0, p_policy smallint DEFAULT 1, p_must_exist boolean DEFAULT false, p_delete boolean DEFAULT false)
 RETURNS TABLE(outcome text, token bigint, current_token bigint, current_seq bigint, detail text, result bytea)
 LANGUAGE plpgsql
AS $function$
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
        SELECT x.policy, x.deleted, x.cancelled_at, x.generation, x.seq, x.exclusive_token INTO r
        FROM baton.resources AS x WHERE x.resource = p_resource FOR UPDATE;
        IF FOUND AND r.policy = p_policy AND NOT r.deleted
           AND (r.cancelled_at IS NULL OR r.cancelled_at < p_token)
           AND (r.generation < p_token
                OR (r.generation = p_token
                    AND (r.policy = 3 OR (r.policy = 2 AND r.seq < p_seq) OR r.exclusive_token IS NOT NULL)))
           AND NOT EXISTS (SELECT 1 FROM baton.operations AS o WHERE o.resource = p_resource AND o.operation = p_operation) THEN
            UPDATE baton.resources AS x
            SET generation = p_token, seq = p_seq, last_operation = p_operation, exclusive_token = NULL
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
END $function$;

-- The shared side is a mode of the one decision (p_shared), as in Rust's
-- `rule::decide`; callers that pass nine arguments get the exclusive side.
DROP FUNCTION IF EXISTS baton.fence_full(text, bigint, text, bytea, bytea, bigint, smallint, boolean, boolean);
CREATE OR REPLACE FUNCTION baton.fence_full(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea, p_result bytea, p_seq bigint, p_policy smallint, p_must_exist boolean, p_delete boolean, p_shared boolean DEFAULT false)
 RETURNS TABLE(outcome text, token bigint, current_token bigint, current_seq bigint, detail text, result bytea)
 LANGUAGE plpgsql
AS $function$
DECLARE
    r  baton.resources%ROWTYPE;
    op baton.operations%ROWTYPE;
    v_floor bigint;
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
        -- First creation: the unique key decides between concurrent first
        -- writers. A reader's write records no exclusive operation (its
        -- exclusive floor is 0: none yet) and no sequence.
        INSERT INTO baton.resources (resource, policy, generation, seq, last_operation, deleted, exclusive_token)
        VALUES (p_resource, p_policy, p_token, CASE WHEN p_shared THEN 0 ELSE p_seq END,
                CASE WHEN p_shared THEN NULL ELSE p_operation END, p_delete,
                CASE WHEN p_shared THEN 0 END)
        ON CONFLICT ON CONSTRAINT resources_pkey DO NOTHING;
        IF FOUND THEN
            INSERT INTO baton.operations (resource, operation, token, fingerprint, result)
            VALUES (p_resource, p_operation, p_token, p_fingerprint, p_result);
            RETURN QUERY SELECT 'applied'::text, p_token, p_token, CASE WHEN p_shared THEN 0 ELSE p_seq END,
                                'created'::text, NULL::bytea;
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
    IF p_shared THEN
        -- Stale only below the last exclusive write: other readers' tokens,
        -- higher or lower, never refuse this one. The generation rises to
        -- the reader's token, the exclusive floor stays.
        v_floor := coalesce(r.exclusive_token, r.generation);
        IF p_token < v_floor THEN
            RETURN QUERY SELECT 'stale'::text, p_token, v_floor, r.seq, NULL::text, NULL::bytea;
            RETURN;
        END IF;
        IF p_token > r.generation THEN
            UPDATE baton.resources AS x SET generation = p_token, exclusive_token = v_floor
            WHERE x.resource = p_resource;
        END IF;
        INSERT INTO baton.operations (resource, operation, token, fingerprint, result)
        VALUES (p_resource, p_operation, p_token, p_fingerprint, p_result);
        RETURN QUERY SELECT 'applied'::text, p_token, greatest(r.generation, p_token), r.seq, NULL::text, NULL::bytea;
        RETURN;
    END IF;
    IF p_token < r.generation THEN
        RETURN QUERY SELECT 'stale'::text, p_token, r.generation, r.seq, NULL::text, NULL::bytea;
        RETURN;
    END IF;
    IF p_token = r.generation AND r.exclusive_token IS NULL THEN
        -- A generation opened by recreate has no operation yet: its owner's
        -- first write is that one. A generation a reader's write raised
        -- (exclusive_token set) has no exclusive operation at all.
        IF r.policy = 1 AND r.last_operation IS NOT NULL THEN
            RETURN QUERY SELECT 'generation_used'::text, p_token, r.generation, r.seq, r.last_operation, NULL::bytea;
            RETURN;
        ELSIF r.policy = 2 AND p_seq <= r.seq THEN
            RETURN QUERY SELECT 'out_of_order'::text, p_token, r.generation, r.seq, NULL::text, NULL::bytea;
            RETURN;
        END IF;
    END IF;
    UPDATE baton.resources AS x
    SET generation = p_token, seq = p_seq, last_operation = p_operation, deleted = p_delete, exclusive_token = NULL
    WHERE x.resource = p_resource;
    INSERT INTO baton.operations (resource, operation, token, fingerprint, result)
    VALUES (p_resource, p_operation, p_token, p_fingerprint, p_result);
    RETURN QUERY SELECT 'applied'::text, p_token, p_token, p_seq, NULL::text, NULL::bytea;
END $function$;

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

CREATE OR REPLACE FUNCTION baton.recreate_impl(p_resource text, p_token bigint)
 RETURNS text
 LANGUAGE plpgsql
AS $function$
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
    SET generation = p_token, seq = 0, last_operation = NULL, cancelled_at = NULL, deleted = false, exclusive_token = NULL,
        incarnation = r.incarnation + 1
    WHERE x.resource = p_resource;
    RETURN 'recreated';
END $function$;

CREATE OR REPLACE FUNCTION baton.fence_shared_impl(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea, p_result bytea DEFAULT '\x'::bytea, p_policy smallint DEFAULT 1, p_must_exist boolean DEFAULT false)
 RETURNS SETOF baton.fence_result
 LANGUAGE plpgsql
AS $function$
BEGIN
    -- What fence_impl checks before the full path, then the full path on
    -- the shared side.
    PERFORM baton.check_policy(p_policy);
    IF p_result IS NULL THEN
        RAISE EXCEPTION 'result is NULL; pass an empty bytea for no result' USING ERRCODE = '22023';
    END IF;
    IF p_must_exist IS NULL THEN
        RAISE EXCEPTION 'must_exist must be true or false, not NULL' USING ERRCODE = '22023';
    END IF;
    RETURN QUERY SELECT * FROM baton.fence_full(p_resource, p_token, p_operation, p_fingerprint, p_result, 0,
                                                p_policy, p_must_exist, false, true);
END $function$;

CREATE OR REPLACE FUNCTION baton.fence_shared(resource text, token bigint, operation text, fingerprint bytea, result bytea DEFAULT '\x'::bytea, policy text DEFAULT 'one_per_generation'::text, must_exist boolean DEFAULT false)
 RETURNS SETOF baton.fence_result
 LANGUAGE plpgsql
AS $function$
BEGIN
    RETURN QUERY SELECT * FROM baton.fence_shared_impl($1, $2, $3, $4, $5, baton.policy_code($6), $7);
END $function$;
