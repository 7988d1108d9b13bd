-- Baton fence kit for PostgreSQL, migration 8: the outbox.
--
-- An external effect that no token can guard (an email, a third party's
-- API) is recorded as a delivery intent in the same transaction as the
-- fenced write that causes it, and sent later by a dispatcher. Each send
-- is claimed with a fencing token (a Baton lease on the row, in the Rust
-- kit), so the outcome of a stale dispatcher cannot overwrite a newer one.
--
--   baton.outbox_enqueue(resource, token, operation, receiver_kind, recipient, payload)
--       the intent; only while `token` is the resource's generation (call
--       it after baton.fence or baton.publish applied, in that transaction)
--   baton.outbox_claim(id, token, claimed_by)        take a row for one send
--   baton.outbox_begin_send(id, token)               just before sending
--   baton.outbox_record(id, token, state, evidence, retry_after_ms)
--       delivered, accepted, retry, failed, needs_attention, cancelled
--   baton.outbox_confirm(operation, delivered, evidence)   a receiver's callback
--   baton.outbox_cancel(resource, actor)             cancels what was not sent
--   baton.outbox_resolve(id, resolution, actor, reason)
--       an operator's decision: delivered, resend or abandon
--
-- Receiver kinds: 'idempotent' (honours an idempotency key and answers a
-- status query: a send whose outcome is unknown may be repeated with the
-- same key) and 'unrepeatable' (neither: an unknown outcome goes to
-- needs_attention, never to a second send without an operator).
-- States: pending, claimed, sending, accepted (sent, awaiting the
-- receiver's confirmation), delivered, failed, needs_attention, cancelled,
-- abandoned. The last five are final, except that an operator may resolve
-- needs_attention and failed.

INSERT INTO baton.schema_migrations (version) VALUES (8) ON CONFLICT DO NOTHING;

CREATE TABLE IF NOT EXISTS baton.outbox (
    id              bigserial PRIMARY KEY,
    operation       text NOT NULL UNIQUE CHECK (octet_length(operation) BETWEEN 1 AND 256),
    resource        text NOT NULL,
    token           bigint NOT NULL CHECK (token >= 1),
    receiver_kind   text NOT NULL CHECK (receiver_kind IN ('idempotent', 'unrepeatable')),
    recipient       text NOT NULL CHECK (octet_length(recipient) BETWEEN 1 AND 2048),
    payload         bytea NOT NULL CHECK (length(payload) <= 1048576),
    payload_digest  bytea NOT NULL,
    state           text NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'claimed', 'sending', 'accepted',
                        'delivered', 'failed', 'needs_attention', 'cancelled', 'abandoned')),
    attempts        integer NOT NULL DEFAULT 0,
    claim_token     bigint NOT NULL DEFAULT 0,
    claimed_by      text,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    send_started_at timestamptz,
    evidence        text,
    created_at      timestamptz NOT NULL DEFAULT now(),
    updated_at      timestamptz NOT NULL DEFAULT now(),
    resolved_by     text,
    resolved_at     timestamptz,
    resolution      text,
    resolution_reason text
);
CREATE INDEX IF NOT EXISTS outbox_due ON baton.outbox (next_attempt_at, id)
    WHERE state IN ('pending', 'claimed', 'sending', 'accepted');
CREATE INDEX IF NOT EXISTS outbox_resource ON baton.outbox (resource);

-- Every step of every row, with who and which token: the evidence an
-- operator reads before resolving.
CREATE TABLE IF NOT EXISTS baton.outbox_events (
    id        bigserial PRIMARY KEY,
    outbox_id bigint NOT NULL REFERENCES baton.outbox (id),
    at        timestamptz NOT NULL DEFAULT now(),
    token     bigint,
    actor     text,
    event     text NOT NULL,
    detail    text
);
CREATE INDEX IF NOT EXISTS outbox_events_row ON baton.outbox_events (outbox_id, id);

-- What each outbox function returns: the outcome, and the row as it stands.
DO $$ BEGIN
    CREATE TYPE baton.outbox_result AS (outcome text, id bigint, state text, claim_token bigint,
                                        attempts integer, detail text);
EXCEPTION WHEN duplicate_object THEN NULL;
END $$;

CREATE OR REPLACE FUNCTION baton.outbox_is_final(p_state text)
RETURNS boolean LANGUAGE sql IMMUTABLE PARALLEL SAFE AS $$
    SELECT $1 IN ('delivered', 'failed', 'needs_attention', 'cancelled', 'abandoned')
$$;

CREATE OR REPLACE FUNCTION baton.outbox_enqueue(p_resource text, p_token bigint, p_operation text,
                                                p_receiver_kind text, p_recipient text, p_payload bytea)
RETURNS SETOF baton.outbox_result LANGUAGE plpgsql AS $$
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
END $$;

-- Takes a row for one send with a token above every earlier claim's. The
-- outcome 'claimed' says, in detail, the state the row was in: 'pending'
-- or 'claimed' (nothing was sent), or 'sending' or 'accepted' (an earlier
-- send's outcome is not known: query the receiver, or, if it cannot be
-- queried, record needs_attention).
CREATE OR REPLACE FUNCTION baton.outbox_claim(p_id bigint, p_token bigint, p_claimed_by text)
RETURNS SETOF baton.outbox_result LANGUAGE plpgsql AS $$
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
END $$;

-- Marks the send as begun: from here on its outcome may be unknown. Refused
-- ('cancelled') if a cancellation committed first, or ('stale') if a newer
-- claim took the row.
CREATE OR REPLACE FUNCTION baton.outbox_begin_send(p_id bigint, p_token bigint)
RETURNS SETOF baton.outbox_result LANGUAGE plpgsql AS $$
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
END $$;

-- Records what became of a send, with the claim's token. 'retry' puts the
-- row back to pending, due after p_retry_after_ms (on this database's
-- clock); 'accepted' waits for the receiver's confirmation until then.
CREATE OR REPLACE FUNCTION baton.outbox_record(p_id bigint, p_token bigint, p_state text, p_evidence text,
                                               p_retry_after_ms bigint DEFAULT 0)
RETURNS SETOF baton.outbox_result LANGUAGE plpgsql AS $$
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
END $$;

-- A receiver's asynchronous confirmation, by operation id (the idempotency
-- key). It settles a row that is not final; for a final row it changes
-- nothing ('ignored').
CREATE OR REPLACE FUNCTION baton.outbox_confirm(p_operation text, p_delivered boolean, p_evidence text)
RETURNS SETOF baton.outbox_result LANGUAGE plpgsql AS $$
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
END $$;

-- Cancels every delivery of the resource that was not sent (pending,
-- claimed): call it in the transaction that cancels the work. A send that
-- began is left to finish, and the cancel is noted on it.
CREATE OR REPLACE FUNCTION baton.outbox_cancel(p_resource text, p_actor text)
RETURNS bigint LANGUAGE plpgsql AS $$
DECLARE
    v_n bigint;
BEGIN
    PERFORM baton.check_name(p_resource);
    WITH cancelled AS (
        UPDATE baton.outbox AS b SET state = 'cancelled', updated_at = now(), evidence = 'cancelled by ' || coalesce(p_actor, 'unknown')
        WHERE b.resource = p_resource AND b.state IN ('pending', 'claimed')
        RETURNING b.id
    ), logged AS (
        INSERT INTO baton.outbox_events (outbox_id, actor, event, detail)
        SELECT id, p_actor, 'cancelled', 'before the send' FROM cancelled
    )
    SELECT count(*) INTO v_n FROM cancelled;
    INSERT INTO baton.outbox_events (outbox_id, actor, event, detail)
    SELECT b.id, p_actor, 'cancel_too_late', 'the send had begun' FROM baton.outbox AS b
    WHERE b.resource = p_resource AND b.state IN ('sending', 'accepted');
    RETURN v_n;
END $$;

-- An operator's decision on a row that needs attention or failed:
-- 'delivered' (it arrived), 'resend' (send it again, as a new attempt) or
-- 'abandon' (do not send). Who, when and why are kept on the row.
CREATE OR REPLACE FUNCTION baton.outbox_resolve(p_id bigint, p_resolution text, p_actor text, p_reason text)
RETURNS SETOF baton.outbox_result LANGUAGE plpgsql AS $$
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
END $$;
