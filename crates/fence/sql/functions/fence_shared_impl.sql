-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.fence_shared_impl(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea, p_result bytea DEFAULT '\x'::bytea, p_policy smallint DEFAULT 1, p_must_exist boolean DEFAULT false)
 RETURNS SETOF baton.fence_result
 LANGUAGE plpgsql
AS $function$
DECLARE
    r  baton.resources%ROWTYPE;
    op baton.operations%ROWTYPE;
    v_floor bigint;
BEGIN
    PERFORM baton.check_input(p_resource, p_token, p_operation, p_fingerprint);
    PERFORM baton.check_policy(p_policy);
    IF p_result IS NULL THEN
        RAISE EXCEPTION 'result is NULL; pass an empty bytea for no result' USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_result) > 4096 THEN
        RAISE EXCEPTION 'result is % bytes; the limit is 4096 bytes', octet_length(p_result) USING ERRCODE = '22023';
    END IF;
    IF p_must_exist IS NULL THEN
        RAISE EXCEPTION 'must_exist must be true or false, not NULL' USING ERRCODE = '22023';
    END IF;

    -- The row stays locked until commit, as for an exclusive write: the
    -- decision and the caller's effect cannot interleave with a writer's.
    SELECT * INTO r FROM baton.resources AS x WHERE x.resource = p_resource FOR UPDATE;
    IF NOT FOUND THEN
        IF p_must_exist THEN
            RETURN NEXT ('missing', p_token, NULL, NULL, NULL, NULL)::baton.fence_result;
            RETURN;
        END IF;
        -- Created by a reader: no exclusive write recorded yet (floor 0).
        INSERT INTO baton.resources (resource, policy, generation, seq, last_operation, deleted, exclusive_token)
        VALUES (p_resource, p_policy, p_token, 0, NULL, false, 0)
        ON CONFLICT ON CONSTRAINT resources_pkey DO NOTHING;
        IF FOUND THEN
            INSERT INTO baton.operations (resource, operation, token, fingerprint, result)
            VALUES (p_resource, p_operation, p_token, p_fingerprint, p_result);
            RETURN NEXT ('applied', p_token, p_token, 0, 'created', NULL)::baton.fence_result;
            RETURN;
        END IF;
        SELECT * INTO r FROM baton.resources AS x WHERE x.resource = p_resource FOR UPDATE;
    END IF;

    SELECT * INTO op FROM baton.operations AS o WHERE o.resource = p_resource AND o.operation = p_operation;
    IF FOUND THEN
        IF op.fingerprint = p_fingerprint THEN
            RETURN NEXT ('replayed', op.token, r.generation, r.seq, NULL, op.result)::baton.fence_result;
        ELSE
            RETURN NEXT ('conflict', op.token, r.generation, r.seq, NULL, NULL)::baton.fence_result;
        END IF;
        RETURN;
    END IF;
    IF r.policy <> p_policy THEN
        RAISE EXCEPTION 'resource % uses policy %; the request asked for %', p_resource, r.policy, p_policy
            USING ERRCODE = '22023';
    END IF;
    IF r.deleted THEN
        RETURN NEXT ('deleted', p_token, r.generation, r.seq, NULL, NULL)::baton.fence_result;
        RETURN;
    END IF;
    IF r.cancelled_at IS NOT NULL AND p_token <= r.cancelled_at THEN
        RETURN NEXT ('cancelled', p_token, r.cancelled_at, r.seq, NULL, NULL)::baton.fence_result;
        RETURN;
    END IF;
    -- Stale only below the last exclusive write: other readers' tokens,
    -- higher or lower, never refuse this one.
    v_floor := coalesce(r.exclusive_token, r.generation);
    IF p_token < v_floor THEN
        RETURN NEXT ('stale', p_token, v_floor, r.seq, NULL, NULL)::baton.fence_result;
        RETURN;
    END IF;
    IF p_token > r.generation THEN
        UPDATE baton.resources AS x
        SET generation = p_token, exclusive_token = v_floor
        WHERE x.resource = p_resource;
    END IF;
    INSERT INTO baton.operations (resource, operation, token, fingerprint, result)
    VALUES (p_resource, p_operation, p_token, p_fingerprint, p_result);
    RETURN NEXT ('applied', p_token, greatest(r.generation, p_token), r.seq, NULL, NULL)::baton.fence_result;
END $function$;
