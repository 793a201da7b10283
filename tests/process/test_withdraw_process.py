"""
Abandoned acquires leave the node's queue: 2,000 asyncio acquires of a held
key timed out by C{asyncio.wait_for}, from many clients, against a real
node.  (Before the withdraw C, each stayed queued: the queue filled
--max-waiters and another client's acquire was refused.)
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request

from lockservice.client import aio
from lockservice.testing.harness import LineClient, freePort, waitFor

CLIENTS = 20
EACH = 100


def queueLength(httpPort: int, key: str) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{httpPort}/locks/{key}", timeout=10) as r:
        return int(json.loads(r.read()).get("queue_length", 0) or 0)


def test_2000_timed_out_acquires_leave_the_queue_and_others_queue_normally(spawn) -> None:  # type: ignore[no-untyped-def]
    http = freePort()
    node = spawn(args=["--http", f"tcp:{http}:interface=127.0.0.1",
                       "--max-waiters", str(CLIENTS * EACH)])
    with LineClient(node.port) as holder:
        token = holder.ask(b"A hot 60 0").split()[2]

        async def abandon() -> float:
            clients = [await aio.connect(node.address) for _ in range(CLIENTS)]
            try:
                async def one(client: aio.Client) -> None:
                    try:
                        await asyncio.wait_for(client.acquire("hot", 30, 0), 0.05)
                    except asyncio.TimeoutError:
                        return
                    raise AssertionError("granted a held key")

                await asyncio.gather(*(one(c) for c in clients for _ in range(EACH)))
                ended = time.monotonic()
                # The clients stay connected: only a withdrawal can empty
                # the queue (a closed connection's waiters go anyway).
                await asyncio.to_thread(waitFor, lambda: queueLength(http, "hot") == 0, 10,
                                        0.02, "the abandoned acquires gone from the queue")
                took = time.monotonic() - ended
                await asyncio.to_thread(queuesNormally)
                return took
            finally:
                for c in clients:
                    await c.close()

        def queuesNormally() -> None:
            with LineClient(node.port) as other:
                # Queued like any waiter, and timed out by its own wait:
                # not refused for a queue full of ghosts.
                assert other.ask(b"A hot 10 0.3") == b"T hot"

        took = asyncio.run(abandon())
        assert took < 0.5, f"queue empty {took:.2f} s after the last timeout"
        assert holder.ask(b"R hot " + token) == b"R hot OK"
        with LineClient(node.port) as after:
            assert after.ask(b"A hot 10 1").startswith(b"A hot ")
