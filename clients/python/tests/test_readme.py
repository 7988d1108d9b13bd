"""The manual's Python example (docs/python.md) runs as written against a
real server."""

from __future__ import annotations

import pathlib
import subprocess
import sys

from .conftest import Server

MANUAL = pathlib.Path(__file__).resolve().parents[3] / "docs" / "python.md"


def test_the_readme_python_example_runs_as_written(server: Server) -> None:
    section = MANUAL.read_text()
    start = section.index("```python\n") + len("```python\n")
    code = section[start : section.index("```", start)]
    out = subprocess.run(
        [sys.executable, "-c", code.replace('"127.0.0.1:7700"', repr(server.address))],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("holding statement:account-42:2026-09-13 with token "), out.stdout
