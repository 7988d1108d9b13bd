-- Baton server state, schema version 2: sessions. Upgrades version 1 in
-- place; never edited after release.

-- Open sessions: the session id's digest, never the id, and its TTL.
CREATE TABLE baton_server.sessions (
    digest bytea  PRIMARY KEY CHECK (length(digest) = 16),
    ttl_ms bigint NOT NULL CHECK (ttl_ms > 0)
);

-- The session a lease is tied to, if any (its ttl_ms is then the session's).
ALTER TABLE baton_server.leases
    ADD COLUMN session bytea CHECK (session IS NULL OR length(session) = 16);

-- One leader commit, as in version 1, with sessions. The version 1
-- function stays, so a leader still running the previous release keeps
-- committing until it is replaced.
CREATE FUNCTION baton_server.commit_batch(
    p_term bigint,
    p_epoch bigint,
    p_counter bigint,
    p_put_resources text[],
    p_put_digests bytea[],
    p_put_tokens bigint[],
    p_put_ttls bigint[],
    p_put_sessions bytea[],
    p_deletes text[],
    p_session_digests bytea[],
    p_session_ttls bigint[],
    p_session_deletes bytea[]
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
        INSERT INTO baton_server.sessions (digest, ttl_ms)
        SELECT * FROM unnest(p_session_digests, p_session_ttls)
        ON CONFLICT (digest) DO UPDATE SET ttl_ms = excluded.ttl_ms;
    END IF;
    IF cardinality(p_deletes) > 0 THEN
        DELETE FROM baton_server.leases WHERE resource = ANY (p_deletes);
    END IF;
    IF cardinality(p_put_resources) > 0 THEN
        INSERT INTO baton_server.leases (resource, digest, token, ttl_ms, session)
        SELECT * FROM unnest(p_put_resources, p_put_digests, p_put_tokens, p_put_ttls, p_put_sessions)
        ON CONFLICT (resource) DO UPDATE
            SET digest = excluded.digest, token = excluded.token, ttl_ms = excluded.ttl_ms,
                session = excluded.session;
    END IF;
END
$$;
