-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.outbox_record(p_id bigint, p_token bigint, p_state text, p_evidence text, p_retry_after_ms bigint DEFAULT 0)
 RETURNS SETOF baton.outbox_result
 LANGUAGE plpgsql
AS $function$
DECLARE
    o record;
    v_state text;
BEGIN
    IF p_state IS NULL OR p_state NOT IN ('delivered', 'accepted', 'retry', 'failed', 'needs_attention', 'cancelled') THEN
        RAISE EXCEPTION 'outcome %L is not one of delivered, accepted, retry, failed, needs_attention, cancelled', p_state
            USING ERRCODE = '22023';
    END IF;
    IF p_retry_after_ms IS NULL OR p_retry_after_ms < 0 OR p_retry_after_ms > 86400000 THEN
        RAISE EXCEPTION 'retry_after_ms % is out of range: 0 to 86400000 (a day)', p_retry_after_ms USING ERRCODE = '22023';
    END IF;
    SELECT * INTO o FROM baton.outbox AS b WHERE b.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'missing'::text, p_id, NULL::text, NULL::bigint, NULL::integer, NULL::text;
        RETURN;
    END IF;
    IF o.claim_token <> p_token THEN
        INSERT INTO baton.outbox_events (outbox_id, token, event, detail)
        VALUES (p_id, p_token, 'refused_stale_outcome',
                format('%s from token %s refused: the row is claimed by token %s', p_state, p_token, o.claim_token));
        RETURN QUERY SELECT 'stale'::text, o.id, o.state, o.claim_token, o.attempts, NULL::text;
        RETURN;
    END IF;
    IF baton.outbox_is_final(o.state) THEN
        INSERT INTO baton.outbox_events (outbox_id, token, actor, event, detail)
        VALUES (p_id, p_token, o.claimed_by, 'ignored_outcome', format('%s after the row became %s', p_state, o.state));
        RETURN QUERY SELECT 'final'::text, o.id, o.state, o.claim_token, o.attempts, NULL::text;
        RETURN;
    END IF;
    v_state := CASE WHEN p_state = 'retry' THEN 'pending' ELSE p_state END;
    UPDATE baton.outbox AS b
    SET state = v_state, evidence = p_evidence, updated_at = now(),
        next_attempt_at = now() + make_interval(secs => p_retry_after_ms / 1000.0)
    WHERE b.id = p_id;
    INSERT INTO baton.outbox_events (outbox_id, token, actor, event, detail)
    VALUES (p_id, p_token, o.claimed_by, p_state, p_evidence);
    RETURN QUERY SELECT 'recorded'::text, o.id, v_state, o.claim_token, o.attempts, NULL::text;
END $function$;
