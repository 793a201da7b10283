"""
The asyncio face (lockservice.client.aio) against real twistd nodes, from
plain asyncio code: no reactor in these tests.  Each runs its loop with
asyncio.run() (or uvloop) inside the test.
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import List, Tuple

import pytest

from lockservice.client import aio
from lockservice.testing.harness import LineClient, activeNodes, waitFor


def test_asyncio_run_several_times_in_turn_with_one_client(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    shared: List[aio.Client] = []

    async def main(round: int) -> int:
        if not shared:
            shared.append(await aio.connect(node.address, name="aio"))
        client = shared[0]
        async with client.lock("aio/k", lease=10, wait=5) as lock:
            assert not lock.lost.is_set()
            with pytest.raises(aio.LockTimeout):
                await client.acquire("aio/k", 10, 0.2)
            token = lock.token
        assert lock.released
        return token

    tokens = [asyncio.run(main(i)) for i in range(3)]
    assert tokens == sorted(tokens) and len(set(tokens)) == 3

    async def close() -> None:
        await shared[0].close()

    asyncio.run(close())


def test_uvloop(spawn) -> None:  # type: ignore[no-untyped-def]
    import uvloop

    node = spawn()

    async def main() -> Tuple[int, bool]:
        async with await aio.connect(node.address) as client:
            async with client.lock("aio/uv", lease=10, wait=5) as lock:
                pass
            return lock.token, await client.ping()

    token, pinged = uvloop.run(main())
    assert token > 0 and pinged


def test_cancelling_a_waiting_acquire_never_leaks_the_lock(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()

    async def main() -> None:
        client = await aio.connect(node.address)
        try:
            held = await client.acquire("aio/c", 30, 5)
            for _ in range(20):
                waiting = asyncio.ensure_future(client.acquire("aio/c", 30, 0))
                await asyncio.sleep(0.01)
                waiting.cancel()
                with pytest.raises(asyncio.CancelledError):
                    await waiting
            # asyncio.wait_for's timeout cancels the same way.
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(client.acquire("aio/c", 30, 0), 0.1)
            assert await client.release(held) is True
            # Every cancelled waiter was withdrawn or its grant released:
            # the key comes to us, not to a ghost.
            again = await client.acquire("aio/c", 30, 5)
            assert again.token > held.token
            assert await client.release(again) is True
        finally:
            await client.close()

    asyncio.run(main())


def test_a_cancelled_task_inside_async_with_still_releases(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()

    async def main() -> None:
        client = await aio.connect(node.address)
        entered = asyncio.Event()

        async def holder() -> None:
            async with client.lock("aio/r", lease=30, wait=5):
                entered.set()
                await asyncio.sleep(60)

        task = asyncio.ensure_future(holder())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        lock = await client.acquire("aio/r", 30, 2)   # released, not left to its lease
        await client.release(lock)
        await client.close()

    asyncio.run(main())


def test_lost_is_an_asyncio_event_set_from_the_reactor_thread(spawn) -> None:  # type: ignore[no-untyped-def]
    import signal

    node = spawn()

    async def main() -> str:
        client = await aio.connect(node.address)
        try:
            async with client.lock("aio/lost", lease=1, wait=5) as lock:
                node.signal(signal.SIGSTOP)
                try:
                    await asyncio.wait_for(lock.lost.wait(), 5)
                finally:
                    node.signal(signal.SIGCONT)
                assert lock.lostReason is not None
                return lock.lostReason.reason
        finally:
            await client.close()

    assert "lease ran out" in asyncio.run(main())


def test_bad_input_fails_at_once() -> None:
    async def main() -> None:
        with pytest.raises(ValueError, match="not a host:port address"):
            await aio.connect("127.0.0.1")
        client = await aio.connect("127.0.0.1:1")
        try:
            with pytest.raises(ValueError, match="invalid share"):
                await client.acquire("k", 30, 1, share=70000)
        finally:
            await client.close()

    asyncio.run(main())


def test_loop_in_a_thread_like_jupyter(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    Jupyter runs a loop already; top-level await there is this: a loop
    running in a thread that is not the main one.
    """
    node = spawn()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()

    async def cell() -> int:
        client = await aio.connect(node.address)
        async with client.lock("aio/jupyter", lease=5, wait=5) as lock:
            token = lock.token
        await client.close()
        return token

    try:
        assert asyncio.run_coroutine_threadsafe(cell(), loop).result(30) > 0
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)


@pytest.mark.slow
def test_failover_under_the_asyncio_face_never_holds_a_lock_twice(cluster) -> None:  # type: ignore[no-untyped-def]
    from tests.support.doubleholds import assertNoDoubleHolds

    c = cluster(2)
    first = c.nodes[0]
    waitFor(lambda: [n.port for n in activeNodes(c.nodes)] == [first.port], 15, what="node0 active")
    spans: List[Tuple[float, float, int]] = []
    killed: List[float] = []

    async def worker(client: aio.Client, stop: asyncio.Event) -> None:
        while not stop.is_set():
            try:
                async with client.lock("aio-failover/k", lease=3, wait=20) as lock:
                    start = time.monotonic()
                    await asyncio.sleep(0.02)
                    spans.append((start, time.monotonic(), lock.token))
            except aio.LockError:
                await asyncio.sleep(0.05)

    async def main() -> None:
        client = await aio.connect(c.addresses(), name="aio-failover")
        stop = asyncio.Event()
        workers = [asyncio.ensure_future(worker(client, stop)) for _ in range(4)]
        deadline = time.monotonic() + 30
        while len(spans) < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        killed.append(time.monotonic())
        await asyncio.get_running_loop().run_in_executor(None, first.kill)
        deadline = time.monotonic() + 60
        while sum(1 for s in spans if s[0] > killed[0]) < 20 and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        stop.set()
        await asyncio.gather(*workers)
        await client.close()

    asyncio.run(main())
    assertNoDoubleHolds(spans, killed[0])
    with LineClient(c.nodes[1].port) as line:
        assert line.ask(b"P done") == b"P done"
