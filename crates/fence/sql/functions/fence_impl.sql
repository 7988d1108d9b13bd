-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

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
