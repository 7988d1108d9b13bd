-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

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
