"""
An asyncio application that takes, renews and releases a lock.

Twisted runs on top of asyncio's event loop (the asyncio reactor), so
asyncio code awaits the client's Deferreds with C{Deferred.asFuture(loop)}.

    python examples/asyncio_app.py 127.0.0.1:7700
"""

import asyncio
import sys

from twisted.internet import asyncioreactor


async def main(reactor, address):
    from lockservice.client import connect

    loop = asyncio.get_running_loop()
    client = connect(reactor, address, name="asyncio-example")
    await client.whenConnected().asFuture(loop)

    # A 2-second lease, kept alive in the background while we work.
    lock = await client.acquire("examples/asyncio", lease=2, wait=10,
                                keepAlive=True).asFuture(loop)
    print(f"acquired examples/asyncio, token {lock.token}")
    first = lock.expires
    lost = lock.lost.asFuture(loop)

    work = asyncio.ensure_future(asyncio.sleep(5))  # longer than the lease
    done, _ = await asyncio.wait([work, lost], return_when=asyncio.FIRST_COMPLETED)
    if lost in done:
        print(f"lost the lock: {lost.result().reason}")
        raise SystemExit(1)
    print(f"still held after 5 s: renewed by the keep-alive "
          f"(expiry moved {lock.expires - first:.1f} s)")

    renewed = await lock.renew(10).asFuture(loop)  # and once by hand
    print(f"renewed by hand: {renewed}")

    released = await client.release(lock).asFuture(loop)
    print(f"released: {released}")
    await client.close().asFuture(loop)


def run(reactor, address="127.0.0.1:7700"):
    from twisted.internet.defer import Deferred

    # Startup callbacks run before the loop does: name the loop explicitly.
    loop = asyncio.get_event_loop()
    return Deferred.fromFuture(asyncio.ensure_future(main(reactor, address), loop=loop))


if __name__ == "__main__":
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    asyncioreactor.install(loop)
    from twisted.internet.task import react

    react(run, sys.argv[1:])
