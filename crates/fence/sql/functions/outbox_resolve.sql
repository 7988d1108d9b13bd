-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.outbox_resolve(p_id bigint, p_resolution text, p_actor text, p_reason text)
 RETURNS SETOF baton.outbox_result
 LANGUAGE plpgsql
AS $function$
DECLARE
    o record;
    v_state text;
BEGIN
    IF p_resolution IS NULL OR p_resolution NOT IN ('delivered', 'resend', 'abandon') THEN
        RAISE EXCEPTION 'resolution %L is not one of delivered, resend, abandon', p_resolution USING ERRCODE = '22023';
    END IF;
    IF p_actor IS NULL OR octet_length(btrim(p_actor)) = 0 OR p_reason IS NULL OR octet_length(btrim(p_reason)) = 0 THEN
        RAISE EXCEPTION 'a resolution names who made it and why (actor and reason must not be empty)' USING ERRCODE = '22023';
    END IF;
    SELECT * INTO o FROM baton.outbox AS b WHERE b.id = p_id FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'missing'::text, p_id, NULL::text, NULL::bigint, NULL::integer, NULL::text;
        RETURN;
    END IF;
    IF o.state NOT IN ('needs_attention', 'failed') THEN
        RETURN QUERY SELECT 'not_resolvable'::text, o.id, o.state, o.claim_token, o.attempts,
            format('only needs_attention and failed deliveries are resolved; this one is %s', o.state);
        RETURN;
    END IF;
    v_state := CASE p_resolution WHEN 'delivered' THEN 'delivered' WHEN 'resend' THEN 'pending' ELSE 'abandoned' END;
    UPDATE baton.outbox AS b
    SET state = v_state, resolved_by = p_actor, resolved_at = now(), resolution = p_resolution,
        resolution_reason = p_reason, next_attempt_at = now(), updated_at = now()
    WHERE b.id = p_id;
    INSERT INTO baton.outbox_events (outbox_id, actor, event, detail)
    VALUES (p_id, p_actor, 'resolved_' || p_resolution, p_reason);
    RETURN QUERY SELECT 'resolved'::text, o.id, v_state, o.claim_token, o.attempts, NULL::text;
END $function$;
