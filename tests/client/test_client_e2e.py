"""
The client library against a real twistd node, with a fault-injecting
TCP proxy between them.
"""

from __future__ import annotations

import inspect

import pytest
import pytest_twisted
from twisted.internet import reactor
from twisted.internet.defer import Deferred
from twisted.internet.task import deferLater
from twisted.internet.threads import deferToThread

from lockservice.client.api import LockTimeout, connect
from lockservice.testing.harness import freePort
from lockservice.testing.proxy import FaultProxy


async def until(predicate, timeout: float = 20.0, what: str = "condition"):  # type: ignore[no-untyped-def]
    """
    Poll C{predicate} (which may return a Deferred) without blocking the
    reactor, until it gives something truthy; return that.
    """
    deadline = reactor.seconds() + timeout
    while True:
        value = predicate()
        if isinstance(value, Deferred) or inspect.iscoroutine(value):
            value = await value
        if value:
            return value
        if reactor.seconds() > deadline:
            raise TimeoutError(f"{what} not reached within {timeout}s")
        await deferLater(reactor, 0.02, lambda: None)


def httpNode(spawn):  # type: ignore[no-untyped-def]
    port = freePort()
    node = spawn(args=["--http", f"tcp:{port}:interface=127.0.0.1"])
    node.statusURL = f"http://127.0.0.1:{port}/status"
    return node


async def waiters(node) -> int:  # type: ignore[no-untyped-def]
    """
    How many acquires the node has queued (its /status).
    """
    import treq

    response = await treq.get(node.statusURL)
    return int((await response.json())["waiters"])


async def queued(node, count: int) -> bool:  # type: ignore[no-untyped-def]
    return await waiters(node) == count


@pytest_twisted.ensureDeferred
async def test_acquire_release_and_timeout_against_real_node(spawn) -> None:  # type: ignore[no-untyped-def]
    node = spawn()
    client = connect(reactor, [node.address])
    try:
        await client.whenConnected()
        lock = await client.acquire("orders/42", 30, 5)
        with pytest.raises(LockTimeout):
            await client.acquire("orders/42", 30, 0.2)
        assert await client.release(lock) is True
        assert await client.release(lock) is False
        again = await client.acquire("orders/42", 30, 5)
        assert again.token > lock.token
        await client.release(again)
    finally:
        await client.close()


@pytest_twisted.ensureDeferred
async def test_connection_cut_mid_acquire_moves_to_next_connection(spawn) -> None:  # type: ignore[no-untyped-def]
    node = httpNode(spawn)
    proxy = FaultProxy(reactor, "127.0.0.1", node.port)
    await proxy.start()
    holder = connect(reactor, [node.address])
    waiter = connect(reactor, [proxy.address])
    try:
        await holder.whenConnected()
        await waiter.whenConnected()
        # Each connection first names itself (`I #<instance>`): forget
        # those bytes, so that only the acquire's link counts as busy.
        await until(lambda: len(proxy.links) == 2 and all(link.bytesUp for link in proxy.links),
                    what="both links named")
        for link in proxy.links:
            link.bytesUp = 0
        held = await holder.acquire("k", 30, 0)
        pending = waiter.acquire("k", 30, 0)
        await until(lambda: queued(node, 1), what="queued")
        assert not pending.called
        assert proxy.cutBusy() == 1
        # The cut request was withdrawn, and the client queued it again on
        # its other connection.
        await until(lambda: any(link.bytesUp for link in proxy.links), what="re-sent")
        await until(lambda: queued(node, 1), what="requeued")
        assert not pending.called
        assert await holder.release(held) is True
        lock = await pending
        assert lock.token > held.token
        # The request cut mid-wait left nothing behind on the server: the
        # key is ours alone and releases cleanly.
        assert await waiter.release(lock) is True
    finally:
        await holder.close()
        await waiter.close()
        await proxy.stop()


@pytest_twisted.ensureDeferred
async def test_cancelled_acquire_does_not_leak_lock(spawn) -> None:  # type: ignore[no-untyped-def]
    node = httpNode(spawn)
    client = connect(reactor, [node.address])
    other = connect(reactor, [node.address])
    try:
        await client.whenConnected()
        await other.whenConnected()
        held = await client.acquire("k", 30, 0)
        pending = other.acquire("k", 30, 0)
        await until(lambda: queued(node, 1), what="queued")
        pending.cancel()
        await client.release(held)
        # The late grant to the cancelled acquire is released at once, so a
        # third acquire gets the key promptly (not after a 30 s lease).
        third = await client.acquire("k", 30, 5)
        assert third.token > held.token
        await client.release(third)
    finally:
        await client.close()
        await other.close()


def test_documented_example_runs_against_a_local_node(spawn) -> None:  # type: ignore[no-untyped-def]
    import subprocess
    import sys
    from pathlib import Path

    node = spawn()
    example = Path(__file__).resolve().parents[2] / "examples" / "counter.py"
    from lockservice.testing.harness import twistdEnvironment

    out = subprocess.run(
        [sys.executable, str(example), node.address],
        capture_output=True, timeout=120, env=twistdEnvironment(),
    )
    assert out.returncode == 0, out.stderr.decode()
    assert b"counter = 100 (expected 100)" in out.stdout


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_client_follows_redirects_and_survives_failover(cluster) -> None:  # type: ignore[no-untyped-def]
    from lockservice.testing.harness import activeNodes

    c = cluster(3)
    first, second, third = c.nodes
    await until(lambda: deferToThread(activeNodes, c.nodes).addCallback(
        lambda active: [n.port for n in active] == [first.port]), 10, what="node0 active")
    # Only standbys listed first: the client must follow M to the active.
    client = connect(reactor, [third.address, second.address, first.address])
    try:
        await client.whenConnected()
        locks = [await client.acquire(f"k{i}", 30, 5) for i in range(6)]
        first.kill()
        after = await client.acquire("after-failover", 30, 10)
        assert after.token > max(lock.token for lock in locks)
        # Locks granted before the failover are still held on the successor.
        with pytest.raises(LockTimeout):
            await client.acquire("k0", 30, 0.3)
        assert await client.release(locks[0]) is True
    finally:
        await client.close()


def test_asyncio_application_takes_renews_and_releases_a_lock(spawn) -> None:  # type: ignore[no-untyped-def]
    """
    examples/asyncio_app.py: asyncio code on Twisted's asyncio reactor,
    awaiting the client through Deferred.asFuture.  Run as a subprocess:
    this pytest process already has its reactor installed.
    """
    import subprocess
    import sys
    from pathlib import Path

    from lockservice.testing.harness import LineClient, twistdEnvironment

    node = spawn()
    example = Path(__file__).resolve().parents[2] / "examples" / "asyncio_app.py"
    out = subprocess.run([sys.executable, str(example), node.address],
                         capture_output=True, timeout=120, env=twistdEnvironment())
    assert out.returncode == 0, out.stdout.decode() + out.stderr.decode()
    lines = out.stdout.decode().splitlines()
    assert lines[0].startswith("acquired examples/asyncio, token ")
    assert lines[1].startswith("still held after 5 s: renewed by the keep-alive")
    assert lines[2:] == ["renewed by hand: True", "released: True"]
    token = lines[0].rsplit(" ", 1)[1].encode()
    with LineClient(node.port) as c:
        assert c.ask(b"R examples/asyncio " + token) == b"R examples/asyncio STALE"


@pytest.mark.slow
@pytest_twisted.ensureDeferred
async def test_failover_under_the_twisted_face_never_holds_a_lock_twice(cluster) -> None:  # type: ignore[no-untyped-def]
    import time

    from lockservice.client.api import LockError
    from lockservice.testing.harness import activeNodes
    from tests.support.doubleholds import assertNoDoubleHolds

    c = cluster(2)
    first = c.nodes[0]
    await until(lambda: deferToThread(activeNodes, c.nodes).addCallback(
        lambda active: [n.port for n in active] == [first.port]), 15, what="node0 active")
    client = connect(reactor, c.addresses(), name="twisted-failover")
    spans: list = []  # type: ignore[type-arg]
    stopped = []

    async def worker() -> None:
        while not stopped:
            try:
                async with client.lock("tw-failover/k", 3, 20, keepAlive=True) as lock:
                    start = time.monotonic()
                    await deferLater(reactor, 0.02, lambda: None)
                    spans.append((start, time.monotonic(), lock.token))
            except LockError:
                await deferLater(reactor, 0.05, lambda: None)

    try:
        workers = [Deferred.fromCoroutine(worker()) for _ in range(4)]
        await until(lambda: len(spans) >= 20, 30, what="grants before the kill")
        killedAt = time.monotonic()
        await deferToThread(first.kill)
        await until(lambda: sum(1 for s in spans if s[0] > killedAt) >= 20, 60,
                    what="grants after the failover")
        stopped.append(True)
        for w in workers:
            await w
    finally:
        stopped.append(True)
        await client.close()
    assertNoDoubleHolds(spans, killedAt)
