-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.name_is_plain(p_resource text)
 RETURNS boolean
 LANGUAGE sql
 IMMUTABLE PARALLEL SAFE
AS $function$
    SELECT octet_length($1) <= 512
       AND $1 ~ '^[!-~]([ -~]*[!-~])?$'
       AND left($1, 1) <> ':' AND right($1, 1) <> ':' AND strpos($1, '::') = 0
$function$;
