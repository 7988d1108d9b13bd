-- The definition in force (generated from the migrations by
-- crates/store-pg/tests/store.rs; do not edit by hand: change a migration,
-- then write these again with BATON_STORE_WRITE_FUNCTIONS=1 cargo test -p
-- baton-store-pg --test store functions). A start that installs or
-- upgrades the schema applies every file here after the migrations.

CREATE OR REPLACE FUNCTION baton_server.commit_batch(p_term bigint, p_commit bigint, p_epoch bigint, p_counter bigint, p_put_resources text[], p_put_digests bytea[], p_put_tokens bigint[], p_put_ttls bigint[], p_put_sessions bytea[], p_put_holders text[], p_put_permits integer[], p_deletes text[], p_session_digests bytea[], p_session_ttls bigint[], p_session_openers text[], p_session_deletes bytea[], p_ended bytea[], p_change_seqs bigint[], p_changes bytea[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
DECLARE
    current_term bigint;
    last_seq bigint;
    ended_before timestamptz := now() - interval '120 seconds';
    meta_at tid;
    was_epoch bigint;
    was_counter bigint;
    was_seq bigint;
    was_ended_kept_from timestamptz;
    was_commit_term bigint;
    was_commits bigint;
BEGIN
    SELECT term INTO current_term FROM baton_server.leader WHERE id = 1 FOR KEY SHARE;
    IF current_term IS DISTINCT FROM p_term THEN
        RAISE EXCEPTION 'leadership term % is over: the current term is %', p_term, current_term
            USING ERRCODE = 'BA001';
    END IF;
    IF cardinality(p_change_seqs) > 0 THEN
        last_seq := p_change_seqs[cardinality(p_change_seqs)];
    END IF;
    -- The token position, the last change's number and where the ended
    -- leases' trim stopped: one row, read once and updated once per commit
    -- (by its tuple id: every lookup by key walks the row's versions, one
    -- per commit since the oldest snapshot still open).
    IF p_commit IS NOT NULL OR p_epoch IS NOT NULL OR last_seq IS NOT NULL
       OR cardinality(p_ended) > 0 THEN
        SELECT ctid, epoch, counter, seq, ended_kept_from, commit_term, commits
          INTO meta_at, was_epoch, was_counter, was_seq, was_ended_kept_from,
               was_commit_term, was_commits
          FROM baton_server.meta WHERE id = 1;
        -- A leader sends a commit while the one before it runs: it is
        -- taken only if that one committed (the first of a term follows
        -- whatever the last term left), so what is durable is always a
        -- prefix of the commits the leader sent.
        IF p_commit > 1 AND (was_commit_term, was_commits) IS DISTINCT FROM (p_term, p_commit - 1) THEN
            RAISE EXCEPTION 'commit % of term % does not follow the last one committed (% of term %): an earlier commit failed',
                p_commit, p_term, was_commits, was_commit_term
                USING ERRCODE = 'BA003';
        END IF;
        IF p_epoch IS NOT NULL AND (was_epoch, was_counter) > (p_epoch, p_counter) THEN
            RAISE EXCEPTION 'the token position would move backwards to (%, %)', p_epoch, p_counter
                USING ERRCODE = 'BA002';
        END IF;
        IF last_seq IS NOT NULL AND was_seq >= p_change_seqs[1] THEN
            RAISE EXCEPTION 'change number % is not above the last one', p_change_seqs[1]
                USING ERRCODE = 'BA002';
        END IF;
        UPDATE baton_server.meta
           SET epoch = coalesce(p_epoch, epoch), counter = coalesce(p_counter, counter),
               seq = coalesce(last_seq, seq),
               ended_kept_from = CASE WHEN cardinality(p_ended) > 0 THEN ended_before
                                      ELSE ended_kept_from END,
               commit_term = CASE WHEN p_commit IS NULL THEN commit_term ELSE p_term END,
               commits = coalesce(p_commit, commits)
         WHERE ctid = meta_at;
        IF NOT FOUND THEN
            RAISE EXCEPTION 'baton_server.meta changed during a leader''s commit'
                USING ERRCODE = 'BA002';
        END IF;
    END IF;
    IF last_seq IS NOT NULL THEN
        -- The kept changes are the newest million by number: those above
        -- the last number before this commit, less a million, that fall
        -- out now.
        DELETE FROM baton_server.changes
         WHERE seq > was_seq - 1000000 AND seq <= last_seq - 1000000;
    END IF;
    IF cardinality(p_ended) > 0 THEN
        -- From where the last trim stopped (a database clock that steps
        -- back makes the range empty until it passes that point again).
        DELETE FROM baton_server.ended
         WHERE ended_at >= was_ended_kept_from AND ended_at < ended_before;
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
    END IF;
    IF last_seq IS NOT NULL THEN
        INSERT INTO baton_server.changes (seq, body) SELECT * FROM unnest(p_change_seqs, p_changes);
    END IF;
END
$function$;

CREATE OR REPLACE FUNCTION baton_server.commit_batch(p_term bigint, p_epoch bigint, p_counter bigint, p_put_resources text[], p_put_digests bytea[], p_put_tokens bigint[], p_put_ttls bigint[], p_deletes text[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION baton_server.commit_batch(p_term bigint, p_epoch bigint, p_counter bigint, p_put_resources text[], p_put_digests bytea[], p_put_tokens bigint[], p_put_ttls bigint[], p_put_sessions bytea[], p_deletes text[], p_session_digests bytea[], p_session_ttls bigint[], p_session_deletes bytea[])
 RETURNS void
 LANGUAGE sql
AS $function$
    SELECT baton_server.commit_batch(
        p_term, p_epoch, p_counter,
        p_put_resources, p_put_digests, p_put_tokens, p_put_ttls, p_put_sessions,
        array_fill(NULL::text, ARRAY[cardinality(p_put_resources)]),
        p_deletes,
        p_session_digests, p_session_ttls,
        array_fill(NULL::text, ARRAY[cardinality(p_session_digests)]),
        p_session_deletes);
$function$;

CREATE OR REPLACE FUNCTION baton_server.commit_batch(p_term bigint, p_epoch bigint, p_counter bigint, p_put_resources text[], p_put_digests bytea[], p_put_tokens bigint[], p_put_ttls bigint[], p_put_sessions bytea[], p_put_holders text[], p_deletes text[], p_session_digests bytea[], p_session_ttls bigint[], p_session_openers text[], p_session_deletes bytea[])
 RETURNS void
 LANGUAGE sql
AS $function$
    SELECT baton_server.commit_batch(
        p_term, p_epoch, p_counter,
        p_put_resources, p_put_digests, p_put_tokens, p_put_ttls, p_put_sessions,
        p_put_holders, p_deletes,
        p_session_digests, p_session_ttls, p_session_openers, p_session_deletes,
        ARRAY[]::bytea[]);
$function$;

CREATE OR REPLACE FUNCTION baton_server.commit_batch(p_term bigint, p_epoch bigint, p_counter bigint, p_put_resources text[], p_put_digests bytea[], p_put_tokens bigint[], p_put_ttls bigint[], p_put_sessions bytea[], p_put_holders text[], p_deletes text[], p_session_digests bytea[], p_session_ttls bigint[], p_session_openers text[], p_session_deletes bytea[], p_ended bytea[])
 RETURNS void
 LANGUAGE sql
AS $function$
    SELECT baton_server.commit_batch(
        p_term, p_epoch, p_counter,
        p_put_resources, p_put_digests, p_put_tokens, p_put_ttls, p_put_sessions,
        p_put_holders, array_fill(NULL::integer, ARRAY[cardinality(p_put_resources)]),
        p_deletes,
        p_session_digests, p_session_ttls, p_session_openers, p_session_deletes,
        p_ended);
$function$;

CREATE OR REPLACE FUNCTION baton_server.commit_batch(p_term bigint, p_epoch bigint, p_counter bigint, p_put_resources text[], p_put_digests bytea[], p_put_tokens bigint[], p_put_ttls bigint[], p_put_sessions bytea[], p_put_holders text[], p_put_permits integer[], p_deletes text[], p_session_digests bytea[], p_session_ttls bigint[], p_session_openers text[], p_session_deletes bytea[], p_ended bytea[])
 RETURNS void
 LANGUAGE plpgsql
AS $function$
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
$function$;

CREATE OR REPLACE FUNCTION baton_server.commit_batch(p_term bigint, p_epoch bigint, p_counter bigint, p_put_resources text[], p_put_digests bytea[], p_put_tokens bigint[], p_put_ttls bigint[], p_put_sessions bytea[], p_put_holders text[], p_put_permits integer[], p_deletes text[], p_session_digests bytea[], p_session_ttls bigint[], p_session_openers text[], p_session_deletes bytea[], p_ended bytea[], p_change_seqs bigint[], p_changes bytea[])
 RETURNS void
 LANGUAGE sql
AS $function$
    SELECT baton_server.commit_batch(
        p_term, NULL::bigint, p_epoch, p_counter,
        p_put_resources, p_put_digests, p_put_tokens, p_put_ttls, p_put_sessions,
        p_put_holders, p_put_permits, p_deletes,
        p_session_digests, p_session_ttls, p_session_openers, p_session_deletes,
        p_ended, p_change_seqs, p_changes);
$function$;
