"""Generates baton._proto from crates/proto/proto/baton/v1/baton.proto.

Run from anywhere: ``python clients/python/scripts/generate_proto.py``.
With ``--check`` nothing is written: it exits 1 if the committed files
differ from what the .proto generates now (CI runs this).
"""

from __future__ import annotations

import argparse
import pathlib
import re
import sys
import tempfile

from grpc_tools import protoc

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PROTO_DIR = ROOT / "crates" / "proto" / "proto"
PROTO = PROTO_DIR / "baton" / "v1" / "baton.proto"
OUT = HERE.parent / "src" / "baton" / "_proto"
FILES = ["baton_pb2.py", "baton_pb2.pyi", "baton_pb2_grpc.py", "baton_pb2_grpc.pyi"]


def generate() -> dict[str, str]:
    with tempfile.TemporaryDirectory() as tmp:
        # mypy-protobuf's plugins sit beside this interpreter (a venv's bin).
        bindir = pathlib.Path(sys.executable).parent
        args = [
            "grpc_tools.protoc",
            f"--plugin=protoc-gen-mypy={bindir / 'protoc-gen-mypy'}",
            f"--plugin=protoc-gen-mypy_grpc={bindir / 'protoc-gen-mypy_grpc'}",
            f"-I{PROTO_DIR}",
            f"--python_out={tmp}",
            f"--mypy_out={tmp}",
            f"--grpc_python_out={tmp}",
            f"--mypy_grpc_out={tmp}",
            str(PROTO),
        ]
        if protoc.main(args) != 0:
            sys.exit("protoc failed")
        out = {}
        for name in FILES:
            text = (pathlib.Path(tmp) / "baton" / "v1" / name).read_text()
            # The generated modules live in baton._proto, not baton.v1.
            text = re.sub(r"\bfrom baton\.v1 import", "from baton._proto import", text)
            text = re.sub(r"\bimport baton\.v1\.baton_pb2\b", "import baton._proto.baton_pb2", text)
            text = text.replace("baton.v1.baton_pb2", "baton._proto.baton_pb2")
            out[name] = text
        return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--check", action="store_true")
    check = parser.parse_args().check
    generated = generate()
    stale = [
        n for n, t in generated.items() if not (OUT / n).exists() or (OUT / n).read_text() != t
    ]
    if check:
        if stale:
            sys.exit(
                f"baton._proto is stale ({', '.join(stale)}): run {HERE / 'generate_proto.py'}"
            )
        print("baton._proto matches baton.proto")
        return
    for name, text in generated.items():
        (OUT / name).write_text(text)
    print(f"wrote {', '.join(FILES)} to {OUT}")


if __name__ == "__main__":
    main()
