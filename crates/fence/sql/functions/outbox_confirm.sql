-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.outbox_confirm(p_operation text, p_delivered boolean, p_evidence text)
 RETURNS SETOF baton.outbox_result
 LANGUAGE plpgsql
AS $function$
DECLARE
    o record;
    v_state text := CASE WHEN p_delivered THEN 'delivered' ELSE 'failed' END;
BEGIN
    IF p_delivered IS NULL THEN
        RAISE EXCEPTION 'delivered must be true or false, not NULL' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO o FROM baton.outbox AS b WHERE b.operation = p_operation FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'missing'::text, NULL::bigint, NULL::text, NULL::bigint, NULL::integer, NULL::text;
        RETURN;
    END IF;
    IF baton.outbox_is_final(o.state) OR o.state = 'pending' AND o.attempts = 0 THEN
        INSERT INTO baton.outbox_events (outbox_id, event, detail)
        VALUES (o.id, 'ignored_callback', format('%s while %s: %s', v_state, o.state, p_evidence));
        RETURN QUERY SELECT 'ignored'::text, o.id, o.state, o.claim_token, o.attempts, NULL::text;
        RETURN;
    END IF;
    UPDATE baton.outbox AS b SET state = v_state, evidence = p_evidence, updated_at = now() WHERE b.id = o.id;
    INSERT INTO baton.outbox_events (outbox_id, event, detail) VALUES (o.id, 'confirmed', v_state || ': ' || p_evidence);
    RETURN QUERY SELECT 'confirmed'::text, o.id, v_state, o.claim_token, o.attempts, NULL::text;
END $function$;
