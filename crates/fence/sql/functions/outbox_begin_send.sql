-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.outbox_begin_send(p_id bigint, p_token bigint)
 RETURNS SETOF baton.outbox_result
 LANGUAGE plpgsql
AS $function$
DECLARE
    o record;
BEGIN
    SELECT * INTO o FROM baton.outbox AS b WHERE b.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'missing'::text, p_id, NULL::text, NULL::bigint, NULL::integer, NULL::text;
        RETURN;
    END IF;
    IF o.claim_token <> p_token THEN
        RETURN QUERY SELECT 'stale'::text, o.id, o.state, o.claim_token, o.attempts, NULL::text;
        RETURN;
    END IF;
    IF o.state = 'cancelled' THEN
        INSERT INTO baton.outbox_events (outbox_id, token, actor, event, detail)
        VALUES (p_id, p_token, o.claimed_by, 'not_sent', 'cancelled before the send began');
        RETURN QUERY SELECT 'cancelled'::text, o.id, o.state, o.claim_token, o.attempts, NULL::text;
        RETURN;
    END IF;
    IF baton.outbox_is_final(o.state) THEN
        RETURN QUERY SELECT 'final'::text, o.id, o.state, o.claim_token, o.attempts, NULL::text;
        RETURN;
    END IF;
    UPDATE baton.outbox AS b
    SET state = 'sending', attempts = b.attempts + 1, send_started_at = now(), updated_at = now()
    WHERE b.id = p_id;
    INSERT INTO baton.outbox_events (outbox_id, token, actor, event, detail)
    VALUES (p_id, p_token, o.claimed_by, 'sending', 'attempt ' || (o.attempts + 1));
    RETURN QUERY SELECT 'sending'::text, o.id, 'sending'::text, o.claim_token, o.attempts + 1, NULL::text;
END $function$;
