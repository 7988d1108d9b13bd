-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.outbox_enqueue(p_resource text, p_token bigint, p_operation text, p_receiver_kind text, p_recipient text, p_payload bytea)
 RETURNS SETOF baton.outbox_result
 LANGUAGE plpgsql
AS $function$
DECLARE
    r record;
    o record;
BEGIN
    PERFORM baton.check_name(p_resource);
    PERFORM baton.check_token('token', p_token);
    IF p_operation IS NULL OR octet_length(p_operation) NOT BETWEEN 1 AND 256 THEN
        RAISE EXCEPTION 'outbox operation id is % bytes; it must be 1 to 256 bytes', coalesce(octet_length(p_operation), 0)
            USING ERRCODE = '22023';
    END IF;
    IF p_receiver_kind IS NULL OR p_receiver_kind NOT IN ('idempotent', 'unrepeatable') THEN
        RAISE EXCEPTION 'receiver kind %L is not one of idempotent, unrepeatable', p_receiver_kind USING ERRCODE = '22023';
    END IF;
    IF p_recipient IS NULL OR octet_length(p_recipient) NOT BETWEEN 1 AND 2048 THEN
        RAISE EXCEPTION 'recipient is % bytes; it must be 1 to 2048 bytes', coalesce(octet_length(p_recipient), 0)
            USING ERRCODE = '22023';
    END IF;
    IF p_payload IS NULL OR length(p_payload) > 1048576 THEN
        RAISE EXCEPTION 'payload is % bytes; the limit is 1048576 bytes', coalesce(length(p_payload), 0)
            USING ERRCODE = '22023';
    END IF;
    -- Fenced: the resource's generation must be this token, locked by the
    -- fence or publish that applied in this transaction.
    SELECT x.generation, x.cancelled_at, x.deleted INTO r
    FROM baton.resources AS x WHERE x.resource = p_resource FOR UPDATE;
    IF NOT FOUND THEN
        RETURN QUERY SELECT 'missing'::text, NULL::bigint, NULL::text, NULL::bigint, NULL::integer,
            format('resource %s has no fenced write; enqueue after baton.fence or baton.publish applied', p_resource);
        RETURN;
    END IF;
    IF r.cancelled_at IS NOT NULL AND r.cancelled_at >= p_token THEN
        RETURN QUERY SELECT 'cancelled'::text, NULL::bigint, NULL::text, NULL::bigint, NULL::integer,
            format('resource cancelled at token %s', r.cancelled_at);
        RETURN;
    END IF;
    IF r.deleted OR r.generation <> p_token THEN
        RETURN QUERY SELECT 'stale'::text, NULL::bigint, NULL::text, NULL::bigint, NULL::integer,
            format('token %s is not the resource''s generation %s', p_token, r.generation);
        RETURN;
    END IF;
    SELECT * INTO o FROM baton.outbox AS b WHERE b.operation = p_operation;
    IF FOUND THEN
        IF o.payload_digest = sha256(p_payload) AND o.recipient = p_recipient AND o.receiver_kind = p_receiver_kind
           AND o.resource = p_resource THEN
            RETURN QUERY SELECT 'exists'::text, o.id, o.state, o.claim_token, o.attempts, NULL::text;
        ELSE
            RETURN QUERY SELECT 'conflict'::text, o.id, o.state, o.claim_token, o.attempts,
                'the operation id was enqueued with a different resource, receiver, recipient or payload'::text;
        END IF;
        RETURN;
    END IF;
    INSERT INTO baton.outbox AS b (operation, resource, token, receiver_kind, recipient, payload, payload_digest)
    VALUES (p_operation, p_resource, p_token, p_receiver_kind, p_recipient, p_payload, sha256(p_payload))
    RETURNING * INTO o;
    INSERT INTO baton.outbox_events (outbox_id, token, event, detail)
    VALUES (o.id, p_token, 'enqueued', p_receiver_kind || ' ' || p_recipient);
    RETURN QUERY SELECT 'enqueued'::text, o.id, o.state, o.claim_token, o.attempts, NULL::text;
END $function$;
