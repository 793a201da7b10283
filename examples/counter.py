"""
Five workers increment a shared counter under one lock; the counter is a
fenced resource that refuses late writers.

    python examples/counter.py 127.0.0.1:7700
"""

import sys

from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import deferLater, react

from lockservice.client import FenceGuard, connect

counter = {"value": 0}
guard = FenceGuard()


async def worker(reactor, client, name, rounds):
    for _ in range(rounds):
        async with client.lock("examples/counter", lease=10, wait=30) as lock:
            guard.admit("counter", lock.token)  # the resource checks the fence
            current = counter["value"]
            await deferLater(reactor, 0.001, lambda: None)  # the "critical section"
            counter["value"] = current + 1


async def main(reactor, addresses="127.0.0.1:7700"):
    client = connect(reactor, addresses)
    await client.whenConnected()
    workers = [
        Deferred.fromCoroutine(worker(reactor, client, f"w{i}", 20)) for i in range(5)
    ]
    await gatherResults(workers)
    print(f"counter = {counter['value']} (expected 100), highest token {guard.highest('counter')}")
    await client.close()


if __name__ == "__main__":
    react(lambda reactor: Deferred.fromCoroutine(main(reactor, *sys.argv[1:])))
