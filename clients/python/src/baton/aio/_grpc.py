"""What ``grpc.aio`` has and its type stubs lack."""

from __future__ import annotations

from typing import Any

import grpc.aio

#: What ``read()`` returns at the end of a stream.
EOF: Any = getattr(grpc.aio, "EOF")  # noqa: B009
