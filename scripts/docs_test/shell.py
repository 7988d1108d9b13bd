"""A terminal in a scratch copy of the checkout: bash runs each block or
command there, and its variables and working directory carry over."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import time
import urllib.request

from expect import EXIT

REPO = os.path.abspath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BASE = os.path.join(REPO, "target", "docs-test")
# What a scratch directory links from the checkout (the blocks name them);
# clients/ is copied, for pip builds in the source tree.
COPIED = ("clients",)
LINKED = (
    "Cargo.toml",
    "Cargo.lock",
    "crates",
    "scripts",
    "docs",
    "README.md",
    "target",
    "rust-toolchain.toml",
    ".cargo",
)


class Failure(Exception):
    pass


def base_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BATON_", "PG", "CARGO_"))}
    env.update(
        PATH=os.path.join(BASE, "cargo", "bin") + os.pathsep + os.environ["PATH"],
        CARGO_TARGET_DIR=os.path.join(REPO, "target"),
        CARGO_INSTALL_ROOT=os.path.join(BASE, "cargo"),
        PGHOST="127.0.0.1",
        PGUSER="postgres",
        PYTHONDONTWRITEBYTECODE="1",
    )
    for keep in ("CARGO_HOME", "RUSTUP_HOME"):
        if keep in os.environ:
            env[keep] = os.environ[keep]
    return env


class Terminal:
    """One file's scratch directory, the processes its blocks left running,
    and the state that carries from block to block."""

    def __init__(self, name: str) -> None:
        self.work = os.path.join(BASE, "work", name)
        subprocess.run(["rm", "-rf", self.work], check=True)
        os.makedirs(self.work)
        for entry in LINKED:
            if os.path.exists(os.path.join(REPO, entry)):
                os.symlink(os.path.join(REPO, entry), os.path.join(self.work, entry))
        junk = shutil.ignore_patterns("build", "*.egg-info", "__pycache__", ".*cache", ".venv")
        for entry in COPIED:
            shutil.copytree(os.path.join(REPO, entry), os.path.join(self.work, entry), ignore=junk)
        self.state = os.path.join(BASE, "state", name)
        subprocess.run(["rm", "-rf", self.state], check=True)
        os.makedirs(self.state)
        self.groups: dict[int, subprocess.Popen[bytes]] = {}
        self.count = 0

    def script(self, body: str, strict: bool) -> str:
        st = shlex.quote(self.state)
        head = [
            "set -a",
            f"[ -f {st}/env ] && . {st}/env",
            f'cd "$(cat {st}/cwd 2>/dev/null || echo {shlex.quote(self.work)})"',
            f"trap 'export -p > {st}/env; pwd > {st}/cwd' EXIT",
        ]
        if strict:
            head.append("set -e -o pipefail")
            body = "\n".join(checked_exit(line) for line in body.split("\n"))
        return "\n".join(head) + "\n" + body + "\n"

    def start(
        self, body: str, strict: bool, env: dict[str, str]
    ) -> tuple[subprocess.Popen[bytes], str]:
        """bash runs `body` in its own process group; output to a log."""
        self.count += 1
        path = os.path.join(self.state, f"block-{self.count}.sh")
        log = os.path.join(self.state, f"block-{self.count}.log")
        with open(path, "w") as f:
            f.write(self.script(body, strict))
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                ["bash", path],
                cwd=self.work,
                env={**base_env(), **env},
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.groups[proc.pid] = proc
        return proc, log

    def run(
        self,
        body: str,
        strict: bool = True,
        env: dict[str, str] | None = None,
        timeout_s: float = 900,
    ) -> tuple[int, str]:
        proc, log = self.start(body, strict, env or {})
        try:
            status = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill_group(proc.pid)
            raise Failure(f"still running after {timeout_s:.0f} s:\n{tail(log)}") from None
        return status, read_text(log)

    def must(self, body: str, timeout_s: float = 60) -> str:
        """The output of a step a scenario takes, which must succeed."""
        status, output = self.run(body, timeout_s=timeout_s)
        if status != 0:
            raise Failure(f"{body}: exit {status}:\n{output[-2000:]}")
        return output

    def kill_group(self, pgid: int) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.killpg(pgid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline:
                if pgid in self.groups:
                    self.groups[pgid].poll()  # a zombie leader still counts as the group
                try:
                    os.killpg(pgid, 0)
                except ProcessLookupError:
                    return
                time.sleep(0.05)

    def close(self) -> None:
        for pgid in reversed(list(self.groups)):
            self.kill_group(pgid)
        self.groups.clear()


def checked_exit(line: str) -> str:
    """`COMMAND   # exit N ...` must exit N: the command as written, then
    a check of its status."""
    m = EXIT.search(line)
    if not m or line.lstrip().startswith("#"):
        return line
    command = line[: m.start()]
    want = m.group(1)
    return (
        f"if {command}; then __rc=0; else __rc=$?; fi; "
        f'[ "$__rc" = {want} ] || {{ echo "docs-test: expected exit {want}, got $__rc from: '
        f'{command.strip().replace(chr(34), chr(39))}" >&2; exit 98; }}'
    )


def wait_ready(proc: subprocess.Popen[bytes], log: str, url: str, timeout_s: float = 900) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise Failure(f"exited {proc.returncode} before {url} answered:\n{tail(log)}")
        if answers(url):
            return
        time.sleep(0.2)
    raise Failure(f"{url} did not answer within {timeout_s:.0f} s:\n{tail(log)}")


def answers(url: str) -> bool:
    """`tcp:PORT`: a connection to 127.0.0.1:PORT is accepted; a URL:
    it answers 200."""
    try:
        if url.startswith("tcp:"):
            socket.create_connection(("127.0.0.1", int(url[4:])), timeout=2).close()
            return True
        with urllib.request.urlopen(url, timeout=2) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def read_text(path: str) -> str:
    with open(path, errors="replace") as f:
        return f.read()


def tail(log: str, lines: int = 30) -> str:
    try:
        with open(log, errors="replace") as f:
            return "".join(f.readlines()[-lines:])
    except OSError:
        return ""


def wait_for_line(
    log: str,
    pattern: str,
    timeout_s: float,
    proc: subprocess.Popen[bytes] | None = None,
) -> str:
    """The first line of `log` that matches `pattern`, once it is written."""
    regex = re.compile(pattern)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        with open(log, errors="replace") as f:
            for line in f:
                if regex.search(line):
                    return line.rstrip("\n")
        if proc is not None and proc.poll() is not None:
            break
        time.sleep(0.1)
    raise Failure(f"no line matching {pattern!r} within {timeout_s:.0f} s:\n{tail(log)}")
