"""Expected output as the docs print it, matched where values vary.

Numbers, hex ids and quoted holder or campaign values vary; `...` is any
text. A varying value of six characters or more is bound, on first sight,
to what the run printed in its place: later commands are rewritten with
the bound value and later sightings must print it again.
"""

from __future__ import annotations

import re

# hex ids (at least 8 characters, one a digit), quoted holders, numbers
VARYING = re.compile(
    r'(?P<quoted>(?<=holder=)"[^"]*"|(?<=value=)"[^"]*")'
    r"|(?P<hex>\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{8,}\b)"
    r"|(?P<num>(?<![A-Za-z0-9_])\d+(?![0-9]))"
    r"|(?P<any>\.\.\.)"
)
BIND_MIN = 6
EXIT = re.compile(r"\s{2,}#\s*exit(?: code)? (\d+)\b.*$")
COMMENT = re.compile(r"\s{2,}#\s.*$")


class Bindings:
    """What the docs printed, mapped to what this run printed instead."""

    def __init__(self) -> None:
        self.seen: dict[str, str] = {}

    def rewrite(self, command: str) -> str:
        for doc, actual in sorted(self.seen.items(), key=lambda kv: -len(kv[0])):
            command = command.replace(doc, actual)
        return command

    def line_pattern(self, expected: str) -> tuple[re.Pattern[str], list[str]]:
        parts, names, at = [], [], 0
        for m in VARYING.finditer(expected):
            parts.append(re.escape(expected[at : m.start()]))
            at = m.end()
            if m.group("any"):
                parts.append(".*?")
                continue
            value = m.group(0)
            names.append(value)
            if m.group("quoted"):
                parts.append(r'("[^"]*")')
            elif value in self.seen:
                parts.append("(" + re.escape(self.seen[value]) + ")")
            elif m.group("hex"):
                parts.append(r"([0-9a-f]+)")
            else:
                parts.append(r"(\d+)")
        parts.append(re.escape(expected[at:]))
        return re.compile("".join(parts) + r"\s*$"), names

    def match_line(self, expected: str, actual: str) -> bool:
        pattern, names = self.line_pattern(expected)
        m = pattern.match(actual)
        if not m:
            return False
        for doc, got in zip(names, m.groups()):
            if len(doc) >= BIND_MIN and not doc.startswith('"'):
                self.seen.setdefault(doc, got)
        return True


def split_expected(lines: list[str]) -> tuple[list[str], int]:
    """Expected output lines without their comments, and the exit status
    a `# exit code N` comment states (0 when none does)."""
    status = 0
    out = []
    for line in lines:
        m = EXIT.search(line)
        if m:
            status = int(m.group(1))
        line = COMMENT.sub("", line)
        if line.strip():
            out.append(line.rstrip())
    return out, status


def compare(bindings: Bindings, expected: list[str], actual: str) -> str | None:
    """None when every expected line matches the next printed line, in
    order, and nothing else was printed; otherwise what differs."""
    got = [line for line in actual.splitlines() if line.strip()]
    if len(got) != len(expected):
        return f"expected {len(expected)} lines, got {len(got)}:\n" + _side_by_side(expected, got)
    for want, line in zip(expected, got):
        if not bindings.match_line(want, line):
            return f"a line differs:\n  docs: {want}\n  got:  {line}"
    return None


def _side_by_side(expected: list[str], got: list[str]) -> str:
    return (
        "  docs:\n"
        + "".join(f"    {x}\n" for x in expected)
        + "  got:\n"
        + "".join(f"    {x}\n" for x in got)
    )
