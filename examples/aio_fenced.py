"""
An asyncio program (the asyncio face): ten tasks increment one fenced
counter under one lock, inside asyncio.run(); no reactor in sight.

    python examples/aio_fenced.py 127.0.0.1:7700
"""

import asyncio
import sys

from lockservice.client import FenceGuard, aio


async def main(address: str) -> int:
    guard = FenceGuard()          # stands in for a resource that checks tokens
    counter = 0

    async with await aio.connect(address, name="aio-example") as client:

        async def worker() -> None:
            nonlocal counter
            for _ in range(5):
                async with client.lock("examples/aio-counter", lease=5, wait=30) as lock:
                    guard.admit("counter", lock.token)     # raises StaleToken if late
                    value = counter
                    await asyncio.sleep(0.001)
                    counter = value + 1

        await asyncio.gather(*(worker() for _ in range(10)))
    print(f"counter = {counter} (expected 50)")
    return 0 if counter == 50 else 1


if __name__ == "__main__":
    sys.exit(asyncio.run(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7700")))
