"""Input rules, checked before anything is sent: the server's own rules
for names, holder descriptions and durations, with the same messages."""

from __future__ import annotations

import re
import unicodedata

RESOURCE_NAME_LEN_BYTES_MAX = 512
HOLDER_LEN_BYTES_MAX = 256
#: The longest duration any flag or argument accepts (one year).
DURATION_MAX_S = 365 * 24 * 3600.0


def _control(text: str) -> tuple[int, int] | None:
    """The first control character and its byte offset, if any."""
    at = 0
    for c in text:
        if unicodedata.category(c) == "Cc":
            return ord(c), at
        at += len(c.encode())
    return None


# Code points no new name or holder description may hold: Unicode general
# category Cf and the other Default_Ignorable_Code_Point code points (bidi
# overrides, zero-width characters, variation selectors, fillers, tags).
# They make one name look like another. The server's own table
# (baton_core::invisible), checked against this one by
# crates/fence/tests/it/sql_names.rs.
INVISIBLE_RANGES: tuple[tuple[int, int], ...] = (
    (0x00AD, 0x00AD),
    (0x034F, 0x034F),
    (0x0600, 0x0605),
    (0x061C, 0x061C),
    (0x06DD, 0x06DD),
    (0x070F, 0x070F),
    (0x0890, 0x0891),
    (0x08E2, 0x08E2),
    (0x115F, 0x1160),
    (0x17B4, 0x17B5),
    (0x180B, 0x180F),
    (0x200B, 0x200F),
    (0x202A, 0x202E),
    (0x2060, 0x206F),
    (0x3164, 0x3164),
    (0xFE00, 0xFE0F),
    (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0),
    (0xFFF0, 0xFFFB),
    (0x110BD, 0x110BD),
    (0x110CD, 0x110CD),
    (0x13430, 0x1343F),
    (0x1BCA0, 0x1BCA3),
    (0x1D173, 0x1D17A),
    (0xE0000, 0xE0FFF),
)
INVISIBLE_RULE = (
    "characters of Unicode category Cf and default-ignorable code points "
    "(bidi overrides, zero-width characters) are not allowed: "
    "they make one name look like another"
)


def _invisible(text: str) -> tuple[int, int] | None:
    """The first invisible or formatting character and its byte offset."""
    at = 0
    for c in text:
        cp = ord(c)
        if cp > 0x7F and any(lo <= cp <= hi for lo, hi in INVISIBLE_RANGES):
            return cp, at
        at += len(c.encode())
    return None


_ASCII_OK = re.compile(r"[\x21-\x7e](?:[\x20-\x7e]*[\x21-\x7e])?")


def check_resource(raw: str, existing: bool = False) -> str:
    """The canonical (NFC) form of a resource name, or :class:`ValueError`
    naming the rule it breaks. ``existing``: a name that may already be held
    (status, fence), where a name stored before invisible characters were
    refused still passes."""
    if not isinstance(raw, str):
        raise ValueError(f"resource name must be a str, not {type(raw).__name__}")
    # The common case, checked at once: printable ASCII (already NFC), no
    # surrounding space, no empty segment.
    if (
        len(raw) <= RESOURCE_NAME_LEN_BYTES_MAX
        and _ASCII_OK.fullmatch(raw)
        and not raw.startswith(":")
        and not raw.endswith(":")
        and "::" not in raw
    ):
        return raw
    if not raw:
        raise ValueError("resource name is empty")
    name = unicodedata.normalize("NFC", raw)
    n = len(name.encode())
    if n > RESOURCE_NAME_LEN_BYTES_MAX:
        raise ValueError(
            f"resource name is {n} bytes long; the limit is {RESOURCE_NAME_LEN_BYTES_MAX} "
            "bytes (after NFC normalization)"
        )
    control = _control(name)
    if control is not None:
        raise ValueError(
            f"resource name contains control character U+{control[0]:04X} at byte {control[1]}; "
            "control characters are not allowed"
        )
    invisible = None if existing else _invisible(name)
    if invisible is not None:
        raise ValueError(
            f"resource name contains invisible or formatting character U+{invisible[0]:04X} "
            f"at byte {invisible[1]}; {INVISIBLE_RULE}"
        )
    if name != name.strip():
        raise ValueError("resource name has leading or trailing whitespace; trim it")
    at = 0
    for segment in name.split(":"):
        if not segment:
            raise ValueError(
                f"resource name has an empty ':'-separated segment at byte {at}; "
                "segments must be non-empty"
            )
        at += len(segment.encode()) + 1
    return name


def _bounded_text(text: str, what: str, len_bytes_max: int, no_control: str) -> str:
    """``text`` if it is at most ``len_bytes_max`` bytes and holds no
    control character, else :class:`ValueError` naming the rule."""
    n = len(text.encode())
    if n > len_bytes_max:
        raise ValueError(f"{what} is {n} bytes long; the limit is {len_bytes_max} bytes")
    control = _control(text)
    if control is not None:
        raise ValueError(
            f"{what} contains control character U+{control[0]:04X} at byte {control[1]}; "
            f"{no_control}"
        )
    return text


def check_holder(raw: str) -> str:
    """A holder description (also an election's campaign value), or
    :class:`ValueError` naming the rule."""
    if not raw:
        raise ValueError("holder description is empty; omit it instead")
    text = _bounded_text(
        raw, "holder description", HOLDER_LEN_BYTES_MAX, "control characters are not allowed"
    )
    invisible = _invisible(text)
    if invisible is not None:
        raise ValueError(
            f"holder description contains invisible or formatting character "
            f"U+{invisible[0]:04X} at byte {invisible[1]}; {INVISIBLE_RULE}"
        )
    return text


def _seconds(value: object, what: str) -> float:
    """``value`` as seconds, or :class:`ValueError` if it is not a number
    (a bool or a string is refused, not converted)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{what} {value!r}: it must be a number of seconds")
    return float(value)


def check_ttl(ttl_s: float) -> float:
    """A TTL in seconds: positive and at most a year (the server then
    applies its own bounds, and names them if it refuses)."""
    ttl_s = _seconds(ttl_s, "ttl")
    if not ttl_s > 0:
        raise ValueError(f"ttl {ttl_s} s: it must be positive")
    if ttl_s > DURATION_MAX_S:
        raise ValueError(f"ttl {ttl_s} s: the longest accepted is a year")
    return ttl_s


def millis(seconds: float, what: str, zero_ok: bool = False) -> int:
    """Whole milliseconds of ``seconds`` (rounded up, so a TTL is never
    shortened), or :class:`ValueError`."""
    seconds = _seconds(seconds, what)
    if seconds != seconds or seconds < 0 or (seconds == 0 and not zero_ok):
        raise ValueError(f"{what} {seconds} s: it must be {'0 or more' if zero_ok else 'positive'}")
    if seconds > DURATION_MAX_S:
        raise ValueError(f"{what} {seconds} s: the longest accepted is a year")
    ms = int(seconds * 1000)
    return ms + 1 if ms < seconds * 1000 else ms


_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h)\s*$")
_UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def parse_duration(raw: str, what: str) -> float:
    """``500ms``, ``30s``, ``5m``, ``1h`` as seconds (the command line's
    forms for the environment variables it shares)."""
    m = _DURATION.match(raw)
    if m is None:
        raise ValueError(f"{what} {raw!r}: write a duration like 500ms, 30s, 5m or 1h")
    seconds = float(m.group(1)) * _UNIT_S[m.group(2)]
    if not 0 < seconds <= DURATION_MAX_S:
        raise ValueError(f"{what} {raw!r}: it must be positive and at most a year")
    return seconds


#: The most permits a semaphore can have.
PERMITS_MAX = 4096


def check_shape(shared: object, permits: object) -> tuple[bool, int]:
    """How every resource of a request is held: ``(shared, permits)``,
    ``permits`` 0 for a lock, or :class:`ValueError` naming the rule."""
    if not isinstance(shared, bool):
        raise ValueError(f"shared must be True or False, not {shared!r}")
    if permits is None:
        return shared, 0
    if isinstance(permits, bool) or not isinstance(permits, int):
        raise ValueError(f"permits {permits!r}: it must be a whole number")
    if not 1 <= permits <= PERMITS_MAX:
        raise ValueError(f"permits {permits}: a semaphore has from 1 to {PERMITS_MAX} permits")
    if shared:
        raise ValueError(
            "shared and permits: a resource is held shared (a lock) or as a permit "
            "(a semaphore), not both"
        )
    return False, permits


def check_prefix(prefix: object) -> str:
    """A watch's or a list's prefix: text no longer than a name, with no
    control character (no name has one, so it could match nothing)."""
    if not isinstance(prefix, str):
        raise ValueError(f"prefix must be a str, not {type(prefix).__name__}")
    return _bounded_text(prefix, "prefix", RESOURCE_NAME_LEN_BYTES_MAX, "names never do")


def check_after_seq(after_seq: object) -> int | None:
    """A watch's ``after_seq``: None, or a number from 0 to 2**64-1."""
    if after_seq is None:
        return None
    if isinstance(after_seq, bool) or not isinstance(after_seq, int):
        raise ValueError(f"after_seq must be an int, not {type(after_seq).__name__}")
    if not 0 <= after_seq < 2**64:
        raise ValueError(f"after_seq must be from 0 to 2**64-1, not {after_seq}")
    return after_seq


def check_lease_args(resource: object, ttl_s: object, wait_s: object) -> str:
    """The checks of a ``lease(...)`` call, before a session is opened:
    the canonical name."""
    name = check_resource(resource)  # type: ignore[arg-type]
    if ttl_s is not None:
        check_ttl(ttl_s)  # type: ignore[arg-type]
    millis(wait_s, "wait", zero_ok=True)  # type: ignore[arg-type]
    return name


def check_session_ttl(ttl_s: object) -> None:
    """A session TTL: None (the server's default) or a positive duration."""
    if ttl_s is not None:
        millis(ttl_s, "session ttl")  # type: ignore[arg-type]
