-- Baton server state, schema version 6: the latest holder changes.
-- Upgrades version 5 in place; never edited after release.

-- The last holder change's number (every change a leader commits is
-- numbered, one order for the cluster), and the latest changes themselves
-- (the newest 1,000,000, baton_core::HISTORY_LEN_MAX), each encoded as the
-- embedded store's log encodes it: a leader that takes over serves a
-- watcher that resumes from a number it had. Only the server's own
-- commit writes and prunes them.
ALTER TABLE baton_server.meta ADD COLUMN seq bigint NOT NULL DEFAULT 0;
CREATE TABLE baton_server.changes (
    seq  bigint PRIMARY KEY,
    body bytea  NOT NULL
);

-- One leader commit, as in version 5, with its numbered changes.
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
    p_ended bytea[],
    p_change_seqs bigint[],
    p_changes bytea[]
) RETURNS void LANGUAGE plpgsql AS $$
DECLARE
    current_term bigint;
    last_seq bigint;
BEGIN
    SELECT term INTO current_term FROM baton_server.leader WHERE id = 1 FOR KEY SHARE;
    IF current_term IS DISTINCT FROM p_term THEN
        RAISE EXCEPTION 'leadership term % is over: the current term is %', p_term, current_term
            USING ERRCODE = 'BA001';
    END IF;
    -- The token position and the last change's number: one row, one
    -- update per commit (with a second update of the row a one-member
    -- cluster ran 0.93x the build before this schema at 16 session
    -- clients, with one 0.975x, medians of three alternating runs).
    IF cardinality(p_change_seqs) > 0 THEN
        last_seq := p_change_seqs[cardinality(p_change_seqs)];
    END IF;
    IF p_epoch IS NOT NULL OR last_seq IS NOT NULL THEN
        UPDATE baton_server.meta
           SET epoch = coalesce(p_epoch, epoch), counter = coalesce(p_counter, counter),
               seq = coalesce(last_seq, seq)
         WHERE id = 1
           AND (p_epoch IS NULL OR (epoch, counter) <= (p_epoch, p_counter))
           AND (last_seq IS NULL OR seq < p_change_seqs[1]);
        IF NOT FOUND THEN
            IF p_epoch IS NOT NULL AND NOT EXISTS (SELECT 1 FROM baton_server.meta
                    WHERE id = 1 AND (epoch, counter) <= (p_epoch, p_counter)) THEN
                RAISE EXCEPTION 'the token position would move backwards to (%, %)', p_epoch, p_counter
                    USING ERRCODE = 'BA002';
            END IF;
            RAISE EXCEPTION 'change number % is not above the last one', p_change_seqs[1]
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
    IF last_seq IS NOT NULL THEN
        INSERT INTO baton_server.changes (seq, body) SELECT * FROM unnest(p_change_seqs, p_changes);
        DELETE FROM baton_server.changes WHERE seq <= last_seq - 1000000;
    END IF;
END
$$;

-- Version 5's commit, for a leader still running the previous release
-- during an upgrade: it numbers no change, so a commit of its that
-- changes a holder breaks the history: the kept changes go and the number
-- moves up by one, so that a watcher resuming from before it is told its
-- number is too old (never handed a history with a hole in it).
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
    p_put_permits integer[],
    p_deletes text[],
    p_session_digests bytea[],
    p_session_ttls bigint[],
    p_session_openers text[],
    p_session_deletes bytea[],
    p_ended bytea[]
) RETURNS void LANGUAGE plpgsql AS $$
BEGIN
    PERFORM baton_server.commit_batch(
        p_term, p_epoch, p_counter,
        p_put_resources, p_put_digests, p_put_tokens, p_put_ttls, p_put_sessions,
        p_put_holders, p_put_permits, p_deletes,
        p_session_digests, p_session_ttls, p_session_openers, p_session_deletes,
        p_ended, ARRAY[]::bigint[], ARRAY[]::bytea[]);
    IF cardinality(p_put_resources) + cardinality(p_deletes) > 0 THEN
        DELETE FROM baton_server.changes;
        UPDATE baton_server.meta SET seq = seq + 1 WHERE id = 1;
    END IF;
END
$$;
