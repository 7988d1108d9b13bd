-- Baton server state, schema version 1. Created by `baton serve --store`
-- under an advisory lock; never edited after release: later versions add
-- numbered files.
CREATE SCHEMA IF NOT EXISTS baton_server;

-- One row: the format, the cluster that owns this schema, the store id, and
-- the position of the last issued token (epoch << 40 | counter).
CREATE TABLE baton_server.meta (
    id             int PRIMARY KEY CHECK (id = 1),
    schema_version int    NOT NULL,
    cluster        text   NOT NULL,
    store_id       text   NOT NULL,
    epoch          bigint NOT NULL CHECK (epoch >= 1),
    counter        bigint NOT NULL CHECK (counter >= 0)
);

-- One row: the leadership lease. `term` only goes up; `holder` is the node
-- id of the leader (NULL once it stepped down); every renewal bumps `beats`,
-- which is what followers watch on their own monotonic clocks.
CREATE TABLE baton_server.leader (
    id        int PRIMARY KEY CHECK (id = 1),
    term      bigint NOT NULL CHECK (term >= 0),
    holder    text,
    advertise text,
    beats     bigint NOT NULL DEFAULT 0
);

-- Held leases: the acquisition id's digest, never the id.
CREATE TABLE baton_server.leases (
    resource text   PRIMARY KEY,
    digest   bytea  NOT NULL CHECK (length(digest) = 16),
    token    bigint NOT NULL CHECK (token > 0),
    ttl_ms   bigint NOT NULL CHECK (ttl_ms > 0)
);

-- Servers of the cluster, for `baton cluster status`; times are the
-- database's clock, read and compared only by the database.
CREATE TABLE baton_server.members (
    node      text PRIMARY KEY,
    advertise text NOT NULL,
    seen_at   timestamptz NOT NULL
);

-- One leader commit: applied only while `p_term` is the current term. The
-- leader row is share-locked for the whole transaction, so a takeover (which
-- locks it FOR UPDATE) waits for a commit in flight, and a commit that starts
-- after a takeover finds the new term and is refused (SQLSTATE BA001).
CREATE FUNCTION baton_server.commit_batch(
    p_term bigint,
    p_epoch bigint,
    p_counter bigint,
    p_put_resources text[],
    p_put_digests bytea[],
    p_put_tokens bigint[],
    p_put_ttls bigint[],
    p_deletes text[]
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
    IF cardinality(p_deletes) > 0 THEN
        DELETE FROM baton_server.leases WHERE resource = ANY (p_deletes);
    END IF;
    IF cardinality(p_put_resources) > 0 THEN
        INSERT INTO baton_server.leases (resource, digest, token, ttl_ms)
        SELECT * FROM unnest(p_put_resources, p_put_digests, p_put_tokens, p_put_ttls)
        ON CONFLICT (resource) DO UPDATE
            SET digest = excluded.digest, token = excluded.token, ttl_ms = excluded.ttl_ms;
    END IF;
END
$$;
