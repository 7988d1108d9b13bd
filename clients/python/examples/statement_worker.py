"""The seed's statement worker in Python: take the statement's lease,
generate the statement as an immutable object named by the token, and
publish it through the fence kit, so that a worker that was paused past
its lease cannot overwrite a newer statement.

    python examples/statement_worker.py --server 127.0.0.1:7700 \\
        --db "host=127.0.0.1 user=postgres dbname=app" \\
        --statement account-42:2026-09-13

Prints ``publish: applied token=...`` (exit 0), or the outcome that
refused it (exit 1). ``--hold-before-publish`` waits for a line on stdin
after the last ownership check and before the write: the tests pause the
worker there with SIGSTOP, the moment the seed warns about.
"""

from __future__ import annotations

import argparse
import hashlib
import sys

import psycopg

import baton
from baton import fence


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", default=None, help="default: BATON_SERVER or 127.0.0.1:7700")
    parser.add_argument("--db", required=True, help="libpq connection string of the app database")
    parser.add_argument("--statement", required=True, help="like account-42:2026-09-13")
    parser.add_argument("--ttl", type=float, default=30.0, help="lease TTL in seconds")
    parser.add_argument("--wait", type=float, default=0.0, help="wait in line this long")
    parser.add_argument("--hold-before-publish", action="store_true")
    args = parser.parse_args()

    resource = f"statement:{args.statement}"
    client = baton.Client(args.server, holder=f"statement_worker.py {args.statement}")
    try:
        kept = client.lease(resource, ttl_s=args.ttl, wait_s=args.wait)
    except baton.NotAcquired as e:
        print(f"not acquired: {e}", file=sys.stderr)
        return 3
    with kept:
        token = kept.token
        # Generate: an immutable object per generation, named by the token.
        body = f"statement {args.statement}, generation {token}\n".encode()
        object_key = f"statements/{args.statement}/generation-{token}.pdf"
        kept.check()  # still ours now; a pause after this line is the danger
        if args.hold_before_publish:
            print(f"checked token={token}", flush=True)
            sys.stdin.readline()
        with psycopg.connect(args.db) as conn:
            decision = fence.publish(
                conn,
                resource,
                token,
                operation=f"publish-gen-{token}",
                fingerprint=hashlib.sha256(body).digest(),
                object_key=object_key,
            )
            conn.commit()
    print(f"publish: {decision.outcome.value} token={token}", flush=True)
    return 0 if decision.ok else 1


if __name__ == "__main__":
    sys.exit(main())
