-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.outbox_cancel(p_resource text, p_actor text)
 RETURNS bigint
 LANGUAGE plpgsql
AS $function$
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
END $function$;
