-- Baton server state, schema version 4: the leases that ended lately.
-- Upgrades version 3 in place; never edited after release.

-- The acquisition digest of each lease that ended, kept for two minutes
-- (twice the leader's memory of repeated acquires): a leader that takes
-- over answers a late attempt of the request that got it "ended", never
-- with a second grant. Only the server's own commit writes and prunes it.
CREATE TABLE baton_server.ended (
    ended_at timestamptz NOT NULL DEFAULT now(),
    digest   bytea       NOT NULL CHECK (length(digest) = 16)
);
CREATE INDEX ended_by_time ON baton_server.ended (ended_at);

-- One leader commit, as in version 3, with the leases that ended.
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
        INSERT INTO baton_server.leases (resource, digest, token, ttl_ms, session, holder)
        SELECT * FROM unnest(p_put_resources, p_put_digests, p_put_tokens, p_put_ttls,
                             p_put_sessions, p_put_holders)
        ON CONFLICT (resource) DO UPDATE
            SET digest = excluded.digest, token = excluded.token, ttl_ms = excluded.ttl_ms,
                session = excluded.session, holder = excluded.holder;
    END IF;
    IF cardinality(p_ended) > 0 THEN
        INSERT INTO baton_server.ended (digest) SELECT unnest(p_ended);
        DELETE FROM baton_server.ended WHERE ended_at < now() - interval '120 seconds';
    END IF;
END
$$;

-- Version 3's commit, for a leader still running the previous release
-- during an upgrade: it records no ended leases (a leader taking over
-- from it judges a late attempt by its own memory alone).
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
    p_session_deletes bytea[]
) RETURNS void LANGUAGE sql AS $$
    SELECT baton_server.commit_batch(
        p_term, p_epoch, p_counter,
        p_put_resources, p_put_digests, p_put_tokens, p_put_ttls, p_put_sessions,
        p_put_holders, p_deletes,
        p_session_digests, p_session_ttls, p_session_openers, p_session_deletes,
        ARRAY[]::bytea[]);
$$;
