"""The code blocks of the docs and their markers (see scripts/docs-test)."""

from __future__ import annotations

import dataclasses
import re

CODE_LANGUAGES = ("sh", "bash", "console", "sql", "rust", "python", "go")
MARKER = re.compile(r"^<!--\s*docs-test:\s*(.*?)\s*-->\s*$")
FILE_MARKER = re.compile(r"^<!--\s*docs-test-file:\s*(.*?)\s*-->\s*$")
FENCE = re.compile(r"^```(\S*)\s*$")
# Clauses that take the rest of the clause as their value.
VALUED = (
    "not runnable:",
    "record:",
    "doctest:",
    "expect ",
    "reject ",
    "env ",
    "file ",
    "sql ",
    "scenario ",
    "needs ",
    "ready ",
    "timeout ",
)
FLAGS = ("run", "transcript", "background", "python", "rust", "first")


class MarkerError(Exception):
    pass


@dataclasses.dataclass
class Block:
    path: str
    line: int
    language: str
    text: str
    clauses: dict[str, list[str]]

    @property
    def where(self) -> str:
        return f"{self.path}:{self.line}"

    def has(self, clause: str) -> bool:
        return clause in self.clauses

    def value(self, clause: str) -> str | None:
        values = self.clauses.get(clause)
        return values[0] if values else None

    def values(self, clause: str) -> list[str]:
        return self.clauses.get(clause, [])

    @property
    def kind(self) -> str:
        for kind in (
            "not runnable",
            "record",
            "doctest",
            "scenario",
            "file",
            "background",
            "transcript",
            "sql",
            "python",
            "rust",
            "run",
        ):
            if kind in self.clauses:
                return kind
        raise MarkerError(f"{self.where}: the marker says neither how to run the block nor why not")


def parse_clauses(marker: str, where: str) -> dict[str, list[str]]:
    clauses: dict[str, list[str]] = {}
    for last in ("not runnable:", "record:"):
        at = marker.find(last)
        if at >= 0:  # the reason is the rest of the marker, `;` and all
            clauses[last.rstrip(":")] = [marker[at + len(last) :].strip()]
            marker = marker[:at]
    for raw in marker.split(";"):
        clause = raw.strip()
        if not clause:
            continue
        if clause in FLAGS:
            clauses.setdefault(clause, []).append("")
            continue
        for head in VALUED:
            if clause.startswith(head):
                value = clause[len(head) :].strip()
                if not value:
                    raise MarkerError(f"{where}: `{head.strip()}` needs a value")
                clauses.setdefault(head.rstrip(": "), []).append(value)
                break
        else:
            raise MarkerError(f"{where}: unknown clause {clause!r} in the docs-test marker")
    return clauses


def read_blocks(path: str, text: str) -> list[Block]:
    """Every code block of one markdown file, with its marker's clauses."""
    lines = text.split("\n")
    file_default = None
    blocks = []
    i = 0
    while i < len(lines):
        m = FILE_MARKER.match(lines[i])
        if m:
            file_default = m.group(1)
        fence = FENCE.match(lines[i])
        if not fence:
            i += 1
            continue
        end = i + 1
        while end < len(lines) and not lines[end].startswith("```"):
            end += 1
        language = fence.group(1).split(",")[0]
        where = f"{path}:{i + 1}"
        if language in CODE_LANGUAGES:
            marker = MARKER.match(lines[i - 1]) if i > 0 else None
            spec = marker.group(1) if marker else file_default
            if spec is None:
                raise MarkerError(
                    f"{where}: a {language} block without a docs-test marker on the line before it "
                    "(say how to run it, or `not runnable: WHY`; see scripts/docs-test)"
                )
            body = "\n".join(lines[i + 1 : end]) + "\n"
            blocks.append(Block(path, i + 1, fence.group(1), body, parse_clauses(spec, where)))
        elif language not in ("", "text", "toml", "json", "yaml", "proto", "promql"):
            raise MarkerError(f"{where}: unknown block language {language!r}")
        i = end + 1
    return blocks
