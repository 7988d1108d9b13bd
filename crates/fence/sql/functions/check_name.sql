-- The definition in force (generated from the migrations by
-- crates/fence/tests/it/sql_functions.rs; do not edit by hand: change a
-- migration, then write these again). Migrate re-applies every file here
-- after the migrations, on every install and upgrade.

CREATE OR REPLACE FUNCTION baton.check_name(p_resource text)
 RETURNS void
 LANGUAGE plpgsql
 IMMUTABLE
AS $function$
DECLARE
    v_canonical text;
    v_at integer;
BEGIN
    IF p_resource IS NULL OR p_resource = '' THEN
        RAISE EXCEPTION 'resource name is empty' USING ERRCODE = '22023';
    END IF;
    IF octet_length(p_resource) > 2048 THEN
        RAISE EXCEPTION 'resource name is % bytes long; the limit is 512 bytes (after NFC normalization)',
            octet_length(p_resource) USING ERRCODE = '22023';
    END IF;
    -- Printable ASCII is already canonical: skip the normalizer on the common path.
    IF p_resource ~ '^[ -~]+$' THEN
        v_canonical := p_resource;
    ELSE
        v_canonical := normalize(p_resource, NFC);
    END IF;
    IF octet_length(v_canonical) > 512 THEN
        RAISE EXCEPTION 'resource name is % bytes long; the limit is 512 bytes (after NFC normalization)',
            octet_length(v_canonical) USING ERRCODE = '22023';
    END IF;
    v_at := position(substring(v_canonical from '[\u0001-\u001F\u007F-\u009F]') in v_canonical);
    IF v_at > 0 THEN
        RAISE EXCEPTION 'resource name contains control character U+% at character %; control characters are not allowed',
            lpad(upper(to_hex(ascii(substr(v_canonical, v_at, 1)))), 4, '0'), v_at - 1 USING ERRCODE = '22023';
    END IF;
    v_at := position(substring(v_canonical from '[\u00AD\u034F\u0600-\u0605\u061C\u06DD\u070F\u0890-\u0891\u08E2\u115F-\u1160\u17B4-\u17B5\u180B-\u180F\u200B-\u200F\u202A-\u202E\u2060-\u206F\u3164\uFE00-\uFE0F\uFEFF\uFFA0\uFFF0-\uFFFB\U000110BD\U000110CD\U00013430-\U0001343F\U0001BCA0-\U0001BCA3\U0001D173-\U0001D17A\U000E0000-\U000E0FFF]') in v_canonical);
    IF v_at > 0 THEN
        RAISE EXCEPTION 'resource name contains invisible or formatting character U+% at character %; characters of Unicode category Cf and default-ignorable code points (bidi overrides, zero-width characters) are not allowed: they make one name look like another',
            lpad(upper(to_hex(ascii(substr(v_canonical, v_at, 1)))),
                 greatest(4, length(to_hex(ascii(substr(v_canonical, v_at, 1))))), '0'),
            v_at - 1 USING ERRCODE = '22023';
    END IF;
    IF v_canonical ~ '^[ \u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]'
       OR v_canonical ~ '[ \u00A0\u1680\u2000-\u200A\u2028\u2029\u202F\u205F\u3000]$' THEN
        RAISE EXCEPTION 'resource name has leading or trailing whitespace; trim it' USING ERRCODE = '22023';
    END IF;
    IF v_canonical LIKE ':%' OR v_canonical LIKE '%:' OR position('::' in v_canonical) > 0 THEN
        RAISE EXCEPTION 'resource name % has an empty '':''-separated segment; segments must be non-empty',
            quote_literal(v_canonical) USING ERRCODE = '22023';
    END IF;
    IF v_canonical <> p_resource THEN
        RAISE EXCEPTION 'resource name % is not in canonical form (Unicode NFC); write it as %, the name the lease service returns',
            quote_literal(p_resource), quote_literal(v_canonical) USING ERRCODE = '22023';
    END IF;
END $function$;
