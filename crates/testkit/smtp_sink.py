"""An SMTP server for tests (aiosmtpd): every message it takes is written
to DIR as NNNNNN.eml, so a test counts what arrived.

Faults: if DIR/drop-next exists when a message's DATA ends, the message is
kept (it arrived) and the connection is reset before the reply, so the
client cannot know; the file is removed. --drop-pct P does the same to P
percent of messages, chosen by --seed.

Prints "listening on 127.0.0.1:PORT" once it accepts connections.
"""

import argparse
import asyncio
import os
import random

from aiosmtpd.smtp import SMTP


class Sink:
    def __init__(self, directory, drop_pct, seed):
        self.directory = directory
        self.drop_pct = drop_pct
        self.rng = random.Random(seed)
        self.count = 0

    async def handle_DATA(self, server, session, envelope):
        self.count += 1
        path = os.path.join(self.directory, "%06d.eml" % self.count)
        with open(path + ".tmp", "wb") as f:
            f.write(envelope.original_content or envelope.content)
        os.rename(path + ".tmp", path)
        flag = os.path.join(self.directory, "drop-next")
        drop = False
        if os.path.exists(flag):
            os.remove(flag)
            drop = True
        elif self.drop_pct and self.rng.random() * 100 < self.drop_pct:
            drop = True
        if drop:
            with open(os.path.join(self.directory, "dropped.log"), "a") as f:
                f.write(path + "\n")
            server.transport.abort()
        return "250 OK queued as %d" % self.count


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--drop-pct", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=1)
    a = p.parse_args()
    os.makedirs(a.dir, exist_ok=True)
    handler = Sink(a.dir, a.drop_pct, a.seed)
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    server = loop.run_until_complete(
        loop.create_server(lambda: SMTP(handler, hostname="sink.test"), "127.0.0.1", a.port)
    )
    port = server.sockets[0].getsockname()[1]
    print("listening on 127.0.0.1:%d" % port, flush=True)
    loop.run_forever()


if __name__ == "__main__":
    main()
