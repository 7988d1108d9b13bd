-- Baton server state, schema version 5: shared holders and permits.
-- Upgrades version 4 in place; never edited after release.

-- A shared holder or a permit of a semaphore is a row of its own, under
-- its holder's name: the resource's name, the character U+001F (never in a
-- resource's name), its slot in decimal. `permits` is the semaphore's N
-- for a permit, NULL for a shared holder and for an exclusive lease (a
-- row under a resource's own name). Rows written before version 5 are
-- exclusive leases.
ALTER TABLE baton_server.leases
    ADD COLUMN permits integer CHECK (permits IS NULL OR permits BETWEEN 1 AND 4096),
    ADD CONSTRAINT permits_only_on_holders
        CHECK (permits IS NULL OR strpos(resource, chr(31)) > 0);

-- One leader commit, as in version 4, with each lease's permits.
CREATE FUNCTION baton_server.commit_batch(
    p_term bigint,
    p_epoch bigint,
    p_counter bigint,
    p_put_resources text[],
    p_put_digests bytea[],
    p_put_tokens bigint[],
    p_put_ttls bigint[],
    p_put_sessions bytea[],
    p_put_holders text[],
    p_put_permits integer[],
    p_deletes text[],
    p_session_digests bytea[],
    p_session_ttls bigint[],
    p_session_openers text[],
    p_session_deletes bytea[],
    p_ended bytea[]
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    current_term bigint;
BEGIN
    SELECT term INTO current_term FROM baton_server.leader WHERE id = 1 FOR KEY SHARE;
    IF current_term IS DISTINCT FROM p_term THEN
        RAISE EXCEPTION 'leadership term % is over: the current term is %', p_term, current_term
            USING ERRCODE = 'BA001';
    END IF;
    IF p_epoch IS NOT NULL THEN
        UPDATE baton_server.meta SET epoch = p_epoch, counter = p_counter
         WHERE id = 1 AND (epoch, counter) <= (p_epoch, p_counter);
        IF NOT FOUND THEN
            RAISE EXCEPTION 'the token position would move backwards to (%, %)', p_epoch, p_counter
                USING ERRCODE = 'BA002';
        END IF;
    END IF;
    IF cardinality(p_session_deletes) > 0 THEN
        DELETE FROM baton_server.sessions WHERE digest = ANY (p_session_deletes);
    END IF;
    IF cardinality(p_session_digests) > 0 THEN
        INSERT INTO baton_server.sessions (digest, ttl_ms, opener)
        SELECT * FROM unnest(p_session_digests, p_session_ttls, p_session_openers)
        ON CONFLICT (digest) DO UPDATE SET ttl_ms = excluded.ttl_ms, opener = excluded.opener;
    END IF;
    IF cardinality(p_deletes) > 0 THEN
        DELETE FROM baton_server.leases WHERE resource = ANY (p_deletes);
    END IF;
    IF cardinality(p_put_resources) > 0 THEN
        INSERT INTO baton_server.leases (resource, digest, token, ttl_ms, session, holder, permits)
        SELECT * FROM unnest(p_put_resources, p_put_digests, p_put_tokens, p_put_ttls,
                             p_put_sessions, p_put_holders, p_put_permits)
        ON CONFLICT (resource) DO UPDATE
            SET digest = excluded.digest, token = excluded.token, ttl_ms = excluded.ttl_ms,
                session = excluded.session, holder = excluded.holder,
                permits = excluded.permits;
    END IF;
    IF cardinality(p_ended) > 0 THEN
        INSERT INTO baton_server.ended (digest) SELECT unnest(p_ended);
        DELETE FROM baton_server.ended WHERE ended_at < now() - interval '120 seconds';
    END IF;
END
$$;

-- Version 4's commit, for a leader still running the previous release
-- during an upgrade: it writes exclusive leases only.
CREATE OR REPLACE FUNCTION baton_server.commit_batch(
    p_term bigint,
    p_epoch bigint,
    p_counter bigint,
    p_put_resources text[],
    p_put_digests bytea[],
    p_put_tokens bigint[],
    p_put_ttls bigint[],
    p_put_sessions bytea[],
    p_put_holders text[],
    p_deletes text[],
    p_session_digests bytea[],
    p_session_ttls bigint[],
    p_session_openers text[],
    p_session_deletes bytea[],
    p_ended bytea[]
) RETURNS void LANGUAGE sql AS $$
    SELECT baton_server.commit_batch(
        p_term, p_epoch, p_counter,
        p_put_resources, p_put_digests, p_put_tokens, p_put_ttls, p_put_sessions,
        p_put_holders, array_fill(NULL::integer, ARRAY[cardinality(p_put_resources)]),
        p_deletes,
        p_session_digests, p_session_ttls, p_session_openers, p_session_deletes,
        p_ended);
$$;
