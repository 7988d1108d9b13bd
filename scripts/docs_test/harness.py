"""The docs harness: reads the blocks, runs them file by file, prints what
ran, what is marked not runnable and why, and the wall time."""

from __future__ import annotations

import collections
import glob
import os
import re
import shutil
import socket
import sys
import time

import architecture
import scenarios
from blocks import Block, MarkerError, read_blocks
from expect import Bindings, compare, split_expected
from postgres import Cluster
from shell import REPO, Failure, Terminal, wait_ready

# The fixed addresses the blocks use; taken by anything else, the run
# stops before it starts, naming the port.
FIXED_PORTS = (5432, 7700, 7701, 7710, 7711, 7801, 7802, 7803, 7811, 7812, 7813, 9000, 2525, 9102)
# What the blocks call, besides what they install themselves.
TOOLS = (
    "bash",
    "cargo",
    "curl",
    "openssl",
    "psql",
    "createdb",
    "python3",
    "pkill",
    "timeout",
    "sha256sum",
)


def doc_files() -> list[str]:
    manuals = sorted(
        os.path.relpath(p, REPO) for p in glob.glob(os.path.join(REPO, "docs", "*.md"))
    )
    return ["README.md", "CONTRIBUTING.md", *manuals]


def all_blocks(files: list[str]) -> list[Block]:
    out = []
    for path in files:
        with open(os.path.join(REPO, path)) as f:
            out.extend(read_blocks(path, f.read()))
    return out


class Run:
    """One run of the harness: the PostgreSQL cluster, the terminal of the
    file being run and the quick start's server if a block needs it."""

    def __init__(self, blocks: list[Block]) -> None:
        self.blocks = blocks
        self.pg = Cluster()
        self.term: Terminal | None = None
        self.server: int | None = None
        self.bindings = Bindings()

    def quickstart(self) -> Block:
        for b in self.blocks:
            if b.path == "README.md" and b.has("background"):
                return b
        raise Failure("README.md has no quick start server block (marked background)")

    def terminal(self, name: str) -> Terminal:
        if self.term is not None:
            self.term.close()
            self.pg.drop_databases()
        self.term = Terminal(name)
        self.server = None
        return self.term

    def needs(self, block: Block) -> None:
        assert self.term is not None
        for need in block.values("needs"):
            if need == "server":
                if self.server is None:
                    self.server = self.background(self.quickstart())
            elif need == "no-server":
                if self.server is not None:
                    self.term.kill_group(self.server)
                    self.server = None
            elif need.startswith("fence-kit "):
                self.create_db(need.split()[1])
                self.fence_kit(need.split()[1])
            elif need.startswith("db "):
                self.create_db(need.split()[1])
            else:
                raise Failure(f"{block.where}: unknown need {need!r}")

    def create_db(self, db: str) -> None:
        if self.pg.query(f"SELECT count(*) FROM pg_database WHERE datname = '{db}'") == "0":
            self.pg.query(f'CREATE DATABASE "{db}"')

    def fence_kit(self, db: str) -> None:
        install = os.path.join(REPO, "crates", "fence", "sql", "install.sql")
        self.pg.psql(["-q", "-f", install], db)

    def background(self, block: Block) -> int:
        """Starts the block and waits until it is ready; its process group."""
        assert self.term is not None
        proc, log = self.term.start(block.text, strict=False, env={})
        ready = block.value("ready")
        if ready:
            wait_ready(proc, log, ready)
        return proc.pid

    def run_block(self, block: Block) -> None:
        assert self.term is not None
        self.needs(block)
        self.bindings = Bindings()  # a value in the docs names one thing within its block
        env = dict(kv.split("=", 1) for kv in block.values("env"))
        if block.has("file"):
            path = os.path.join(self.term.work, block.value("file") or "")
            with open(path, "w") as f:
                f.write(block.text)
            os.chmod(path, 0o755)
        kind = block.kind
        if kind == "scenario":
            output = scenarios.run(block.value("scenario") or "", self, block)
        elif kind == "file":
            return
        elif kind == "background":
            self.background(block)
            return
        elif kind == "transcript":
            self.transcript(block, env)
            return
        else:
            output = self.run_kind(kind, block, env)
        check_expect(block, output)

    def run_kind(self, kind: str, block: Block, env: dict[str, str]) -> str:
        assert self.term is not None
        if kind == "sql":
            psql = f"psql -X -qAt -v ON_ERROR_STOP=1 -d {block.value('sql')}"
            body = f"{psql} <<'DOCS_TEST_SQL'\n{block.text}DOCS_TEST_SQL"
        elif kind == "python":
            body = f".venv/bin/python - <<'DOCS_TEST_PY'\n{block.text}DOCS_TEST_PY"
        elif kind == "rust":
            body = f"cargo run -q -p baton-docs-blocks -- {block.where}"
        else:
            body = block.text
        timeout_s = float(block.value("timeout") or 900)
        status, output = self.term.run(body, strict=kind == "run", env=env, timeout_s=timeout_s)
        if status != 0:
            raise Failure(f"exited {status}:\n{output[-3000:]}")
        return output

    def transcript(self, block: Block, env: dict[str, str]) -> None:
        assert self.term is not None
        for command, expected_lines in transcript_steps(block.text):
            expected, status = split_expected([command, *expected_lines])
            expected = expected[1:]
            got_status, output = self.term.run(
                self.bindings.rewrite(command), strict=False, env=env
            )
            if got_status != status:
                raise Failure(
                    f"$ {command}\nexited {got_status}, the docs say {status}:\n{output[-2000:]}"
                )
            diff = compare(self.bindings, expected, output)
            if diff:
                raise Failure(f"$ {command}\n{diff}")


def transcript_steps(text: str) -> list[tuple[str, list[str]]]:
    steps: list[tuple[str, list[str]]] = []
    for line in text.split("\n"):
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        elif line.strip():
            raise Failure(f"a transcript starts with a command (`$ ...`), not {line!r}")
    return steps


def check_expect(block: Block, output: str) -> None:
    for pattern in block.values("expect"):
        if not re.search(pattern, output, re.MULTILINE):
            raise Failure(f"the output does not match {pattern!r}:\n{output[-3000:]}")
    for pattern in block.values("reject"):
        if re.search(pattern, output, re.MULTILINE):
            raise Failure(f"the output matches {pattern!r}, which it must not:\n{output[-3000:]}")


def check_doctest(block: Block) -> None:
    path = block.value("doctest") or ""
    with open(os.path.join(REPO, path)) as f:
        source = f.read()
    name = os.path.basename(block.path)
    if not re.search(r"include_str!\([^)]*" + re.escape(name) + r"\"\)", source):
        raise Failure(f"{path} does not include {block.path}: its Rust blocks are not doc tests")


def ports_taken() -> list[int]:
    taken = []
    for port in FIXED_PORTS:
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                taken.append(port)
    return taken


def main(argv: list[str]) -> int:
    started = time.monotonic()
    listing = "--list" in argv
    files = [a for a in argv if a != "--list"] or doc_files()
    try:
        blocks = all_blocks(doc_files())
    except MarkerError as e:
        print(f"docs-test: {e}", file=sys.stderr)
        return 1
    chosen = [b for b in blocks if b.path in files or b.has("first")]
    if listing:
        for b in chosen:
            print(f"{b.where:28} {b.kind:12} {describe(b)}")
        return 0
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        print(
            f"docs-test: the blocks call {missing}, which are missing "
            "(scripts/test installs them as root)",
            file=sys.stderr,
        )
        return 1
    taken = ports_taken()
    if taken:
        print(
            f"docs-test: the docs' fixed ports {taken} are in use on 127.0.0.1: the blocks run as "
            "written, one at a time, on those ports; stop what holds them",
            file=sys.stderr,
        )
        return 1
    run = Run(blocks)
    checked, failures = architecture.check()
    print(checked + ("" if not failures else f": {len(failures)} wrong"), flush=True)
    for problem in failures:
        print(f"FAIL {problem}", flush=True)
    tally: collections.Counter[str] = collections.Counter()
    try:
        run.pg.start()
        order = [b for b in chosen if b.has("first")] + [b for b in chosen if not b.has("first")]
        current = None
        for block in order:
            name = (
                "first" if block.has("first") else os.path.splitext(os.path.basename(block.path))[0]
            )
            if name != current:
                current = name
                run.terminal(name)
            failures.extend(run_one(run, block, tally))
    except Failure as e:
        failures.append(f"setup: {e}")
    finally:
        if run.term is not None:
            run.term.close()
        run.pg.stop()
    report(chosen, tally, failures, time.monotonic() - started)
    return 1 if failures else 0


def run_one(run: Run, block: Block, tally: collections.Counter[str]) -> list[str]:
    kind = block.kind
    if kind in ("not runnable", "record"):
        tally[kind] += 1
        return []
    t0 = time.monotonic()
    try:
        if kind == "doctest":
            check_doctest(block)
        else:
            run.run_block(block)
    except Failure as e:
        print(
            f"FAIL {block.where} ({kind}, {time.monotonic() - t0:.1f} s)\n{e}\n",
            flush=True,
        )
        return [f"{block.where}: {str(e).splitlines()[0] if str(e) else kind}"]
    tally["doctest" if kind == "doctest" else "ran"] += 1
    print(f"ok   {block.where} ({kind}, {time.monotonic() - t0:.1f} s)", flush=True)
    return []


def describe(block: Block) -> str:
    return block.value("not runnable") or block.value("record") or block.value("doctest") or ""


def report(
    chosen: list[Block],
    tally: collections.Counter[str],
    failures: list[str],
    wall_s: float,
) -> None:
    print("\nnot runnable:")
    for b in chosen:
        if b.kind == "not runnable":
            print(f"  {b.where}: {b.value('not runnable')}")
    records = [b for b in chosen if b.kind == "record"]
    if records:
        print(f"records: {len(records)} blocks ({records[0].value('record')})")
    print(
        f"\ndocs blocks: {len(chosen)}; ran {tally['ran']}, doc tests {tally['doctest']} "
        f"(run by cargo test --doc), not runnable {tally['not runnable']}, "
        f"records {tally['record']}, "
        f"failed {len(failures)}; wall time {wall_s:.0f} s"
    )
    for f in failures:
        print(f"  FAILED {f}")
