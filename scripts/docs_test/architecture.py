"""ARCHITECTURE.md checked against the code: every path it names exists,
every test it names is defined in the file it names, its list of crate
arrows is exactly what `cargo metadata` says, and the shipped binaries
link no test tooling."""

from __future__ import annotations

import json
import os
import re
import subprocess

from shell import REPO, read_text

PATH = re.compile(r"^(crates|clients|scripts|docs|\.ci)/[\w./-]+$")
# A test's name: snake_case with at least three words.
TEST = re.compile(r"^[a-z][a-z0-9]*(_[a-z0-9]+){2,}$")
ARROW = re.compile(r"^([a-z][a-z-]*)\s+->\s*(.*)$")
# What the packaged binaries must not link (cargo tree -e normal).
SHIPPED = ("baton", "statements")
TEST_TOOLING = ("baton-testkit", "baton-chaos", "baton-faults", "baton-systest")


def check() -> tuple[str, list[str]]:
    """What was checked, and what is wrong."""
    with open(os.path.join(REPO, "ARCHITECTURE.md")) as f:
        text = f.read()
    problems: list[str] = []
    paths, tests = cited(text, problems)
    arrows = check_arrows(text, problems)
    shipped = check_shipped(problems)
    return (
        f"ARCHITECTURE.md: {paths} paths, {tests} tests, {arrows} crate arrows; "
        f"{shipped} shipped binaries free of test tooling",
        problems,
    )


def check_shipped(problems: list[str]) -> int:
    for package in SHIPPED:
        out = subprocess.run(
            ["cargo", "tree", "-p", package, "-e", "normal", "--prefix", "none", "--offline"],
            cwd=REPO,
            check=True,
            capture_output=True,
            text=True,
        )
        linked = {line.split()[0] for line in out.stdout.splitlines() if line.strip()}
        for tool in TEST_TOOLING:
            if tool in linked:
                problems.append(f"the shipped {package} links {tool} (cargo tree -e normal)")
    return len(SHIPPED)


def cited(text: str, problems: list[str]) -> tuple[int, int]:
    """Paths in backticks exist; a test named after a file's path is
    defined in that file."""
    current = None
    n_paths = n_tests = 0
    for token in re.findall(r"`([^`\n]+)`", text):
        if PATH.match(token):
            n_paths += 1
            current = token
            if not os.path.exists(os.path.join(REPO, token)):
                problems.append(f"ARCHITECTURE.md names {token}, which does not exist")
            continue
        if current and current.endswith((".rs", ".py")) and TEST.match(token):
            n_tests += 1
            path = os.path.join(REPO, current)
            source = read_text(path) if os.path.exists(path) else ""
            if not re.search(rf"\b(fn|def) {token}\b", source):
                problems.append(f"ARCHITECTURE.md names test {token} in {current}: not found there")
    return n_paths, n_tests


def check_arrows(text: str, problems: list[str]) -> int:
    documented = {}
    for line in text.splitlines():
        m = ARROW.match(line)
        if m:
            deps = {d.strip() for d in m.group(2).split(",") if d.strip()}
            documented[m.group(1)] = deps
    actual = workspace_arrows()
    for name in sorted(set(documented) | set(actual)):
        want, got = documented.get(name), actual.get(name)
        if want != got:
            problems.append(
                f"ARCHITECTURE.md's arrows for {name}: {sorted(want or [])}, "
                f"cargo metadata: {sorted(got or [])}"
            )
    return sum(len(d) for d in actual.values())


def workspace_arrows() -> dict[str, set[str]]:
    """Each workspace crate (by its folder under crates/) and the
    workspace crates it depends on for its normal build, features off."""
    out = subprocess.run(
        ["cargo", "metadata", "--format-version", "1", "--no-deps", "--offline"],
        cwd=REPO,
        check=True,
        capture_output=True,
        text=True,
    )
    packages = json.loads(out.stdout)["packages"]
    folder = {p["name"]: os.path.basename(os.path.dirname(p["manifest_path"])) for p in packages}
    return {
        folder[p["name"]]: {
            folder[d["name"]]
            for d in p["dependencies"]
            if d["name"] in folder and d["kind"] is None and not d["optional"]
        }
        for p in packages
    }
