-- Baton fence kit for PostgreSQL, migration 4. Upgrades migration 3 in place.
--
-- baton.fence_or_abort: the fence for a pipelined transaction. A client may
-- send BEGIN, this fence and its own effect in one round trip, and COMMIT
-- in a second: when the fence does not apply, it raises SQLSTATE BF001, so
-- the transaction is aborted and the effect sent behind it cannot commit.
-- The outcome travels in the error: DETAIL is
-- "outcome,token,current_token,current_seq,result as hex" and HINT the
-- outcome's detail text. On `applied` it returns the row baton.fence would.

INSERT INTO baton.schema_migrations (version) VALUES (4) ON CONFLICT DO NOTHING;

CREATE FUNCTION baton.fence_or_abort_impl(
    p_resource text, p_token bigint, p_operation text, p_fingerprint bytea,
    p_result bytea, p_seq bigint, p_policy smallint, p_must_exist boolean)
RETURNS SETOF baton.fence_result LANGUAGE plpgsql AS $$
DECLARE
    f baton.fence_result;
BEGIN
    SELECT * INTO f FROM baton.fence_impl(p_resource, p_token, p_operation, p_fingerprint, p_result, p_seq,
                                          p_policy, p_must_exist, false);
    IF f.outcome IS DISTINCT FROM 'applied' THEN
        RAISE EXCEPTION 'fence did not apply: %; the transaction is aborted', f.outcome
            USING ERRCODE = 'BF001',
                  DETAIL = concat_ws(',', f.outcome, coalesce(f.token::text, ''),
                                     coalesce(f.current_token::text, ''), coalesce(f.current_seq::text, ''),
                                     encode(coalesce(f.result, ''::bytea), 'hex')),
                  HINT = coalesce(f.detail, '');
    END IF;
    RETURN NEXT f;
END $$;

CREATE FUNCTION baton.fence_or_abort(
    resource text, token bigint, operation text, fingerprint bytea,
    result bytea DEFAULT '', seq bigint DEFAULT 0, policy text DEFAULT 'one_per_generation',
    must_exist boolean DEFAULT false)
RETURNS SETOF baton.fence_result LANGUAGE sql AS $$
    SELECT * FROM baton.fence_or_abort_impl($1, $2, $3, $4, $5, $6, baton.policy_code($7), $8);
$$;
