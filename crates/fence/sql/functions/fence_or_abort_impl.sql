-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.fence_or_abort_impl(p_resource text, p_token bigint, p_operation text, p_fingerprint bytea, p_result bytea, p_seq bigint, p_policy smallint, p_must_exist boolean)
 RETURNS SETOF baton.fence_result
 LANGUAGE plpgsql
AS $function$
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
END $function$;
