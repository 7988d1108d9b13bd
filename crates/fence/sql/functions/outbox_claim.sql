-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.outbox_claim(p_id bigint, p_token bigint, p_claimed_by text)
 RETURNS SETOF baton.outbox_result
 LANGUAGE plpgsql
AS $function$
DECLARE
    o record;
BEGIN
    PERFORM baton.check_token('token', p_token);
    IF p_claimed_by IS NULL OR octet_length(p_claimed_by) NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION 'claimed_by must be 1 to 256 bytes' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO o FROM baton.outbox AS b WHERE b.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'missing'::text, p_id, NULL::text, NULL::bigint, NULL::integer, NULL::text;
        RETURN;
    END IF;
    IF p_token <= o.claim_token THEN
        RETURN QUERY SELECT 'stale'::text, o.id, o.state, o.claim_token, o.attempts, NULL::text;
        RETURN;
    END IF;
    IF baton.outbox_is_final(o.state) THEN
        RETURN QUERY SELECT 'final'::text, o.id, o.state, o.claim_token, o.attempts, NULL::text;
        RETURN;
    END IF;
    IF o.next_attempt_at > now() THEN
        RETURN QUERY SELECT 'not_due'::text, o.id, o.state, o.claim_token, o.attempts, NULL::text;
        RETURN;
    END IF;
    UPDATE baton.outbox AS b
    SET claim_token = p_token, claimed_by = p_claimed_by, updated_at = now(),
        state = CASE WHEN b.state = 'pending' THEN 'claimed' ELSE b.state END
    WHERE b.id = p_id;
    INSERT INTO baton.outbox_events (outbox_id, token, actor, event, detail)
    VALUES (p_id, p_token, p_claimed_by, 'claimed', 'was ' || o.state);
    RETURN QUERY SELECT 'claimed'::text, o.id, CASE WHEN o.state = 'pending' THEN 'claimed' ELSE o.state END,
        p_token, o.attempts, o.state;
END $function$;
