# -*- test-case-name: tests.client.test_client_aio -*-
"""
The asyncio face of the client:

    from lockservice.client import aio

    client = await aio.connect("10.0.0.1:7700,10.0.0.2:7700", name="api")
    async with client.lock("orders/42", lease=30, wait=5) as lock:
        await write_order(fence=lock.token)   # lock.lost: an asyncio.Event

The Twisted client runs on the same private reactor thread as the blocking
face (L{lockservice.client.background}); answers are handed to the
awaiting loop with C{call_soon_threadsafe}.  Nothing is installed on the
caller's event loop, so it works in C{asyncio.run()} (several in turn, one
client across them), under uvloop (uvicorn, FastAPI) and in Jupyter.
Installing Twisted's asyncio reactor instead would tie the one global
reactor to one loop for good, and it does not run on uvloop.

Cancelling a waiting acquire (a task cancelled, a timeout) never leaks a
lock: a grant that arrives later is released at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
from typing import Any, Callable, Optional, Union

from lockservice.client import api, background
from lockservice.client.addresses import Addresses
from lockservice.client.arguments import checkShare, checkSlots
from lockservice.client.election import DEFAULT_LEADER_LEASE, Leader, campaignName
from lockservice.client.errors import (
    ForkedClient,
    LockError,
    LockLost,
    LockRejected,
    LockTimeout,
    NoConnection,
    ReleaseFailed,
)
from lockservice.client.lock import Share
from lockservice.client.observing import Observed
from lockservice.tls import ClientTLS

__all__ = [
    "connect", "Client", "Lock", "LockError", "LockTimeout", "LockRejected", "NoConnection",
    "ReleaseFailed", "LockLost", "ForkedClient", "ClientTLS", "Observed", "Leader",
    "Leadership",
]


async def _await(thread: background.ReactorThread, future: "concurrent.futures.Future[Any]",
                 onAbandon: Optional[Callable[[Any], None]] = None,
                 cancellable: bool = True) -> Any:
    """
    Await a reactor-thread future from this loop.  Unlike
    C{asyncio.wrap_future}, a result that reaches a cancelled awaiter is
    not dropped: it goes to C{onAbandon} (in the reactor thread).
    """
    loop = asyncio.get_running_loop()
    waiter: "asyncio.Future[Any]" = loop.create_future()

    def abandon(value: Any) -> None:
        if onAbandon is not None:
            thread.reactor.callFromThread(onAbandon, value)

    def settle(done: "concurrent.futures.Future[Any]") -> None:  # in the loop
        if done.cancelled():
            if not waiter.done():
                waiter.cancel()
            return
        error = done.exception()
        if waiter.done():  # the awaiter was cancelled first
            if error is None:
                abandon(done.result())
            return
        if error is not None:
            waiter.set_exception(error)
        else:
            waiter.set_result(done.result())

    def transfer(done: "concurrent.futures.Future[Any]") -> None:  # any thread
        try:
            loop.call_soon_threadsafe(settle, done)
        except RuntimeError:  # the loop is closed: nobody will take it
            if not done.cancelled() and done.exception() is None:
                abandon(done.result())

    future.add_done_callback(transfer)
    try:
        return await waiter
    except asyncio.CancelledError:
        if cancellable:
            future.cancel()
        if waiter.done() and not waiter.cancelled() and waiter.exception() is None:
            # The result was in, but this task was cancelled before it resumed.
            abandon(waiter.result())
        raise


class Lock:
    """
    A granted lock: C{key}, C{token}, C{share}, and C{lost}, an
    C{asyncio.Event} of the loop that acquired it, set the moment the client
    can no longer be sure it holds the lock (C{lostReason} says why).
    """

    def __init__(self, client: "Client", inner: api.Lock, loop: asyncio.AbstractEventLoop) -> None:
        # Built in the reactor thread, where inner.lost fires.
        self._client = client
        self._inner = inner
        self._loop = loop
        self.key = inner.key
        self.token = inner.token
        self.share = inner.share
        self.lease = inner.lease
        self.lost = asyncio.Event()
        self.lostReason: Optional[LockLost] = None
        self._lostSeen = threading.Event()
        inner.lost.addCallback(self._lost)

    def _lost(self, why: LockLost) -> None:
        self.lostReason = why
        self._lostSeen.set()
        try:
            self._loop.call_soon_threadsafe(self.lost.set)
        except RuntimeError:  # that loop is gone
            pass

    @property
    def isLost(self) -> bool:
        return self._lostSeen.is_set()

    @property
    def released(self) -> bool:
        return self._inner.released

    def __repr__(self) -> str:
        return f"aio.{self._inner!r}"

    async def release(self) -> bool:
        return await self._client.release(self)

    async def renew(self, lease: Optional[float] = None) -> bool:
        return bool(await self._client._run(self._inner.renew, lease, cancellable=False))

    async def keepAlive(self) -> None:
        await self._client._run(self._inner.keepAlive)

    async def stopKeepAlive(self) -> None:
        await self._client._run(self._inner.stopKeepAlive)


class _Held:
    def __init__(self, client: "Client", key: Union[str, bytes], lease: float, wait: float,
                 share: Share, keepAlive: bool) -> None:
        self.client = client
        self.args = (key, lease, wait)
        self.share = share
        self.keepAlive = keepAlive
        self.held: Optional[Lock] = None

    async def __aenter__(self) -> Lock:
        key, lease, wait = self.args
        self.held = await self.client.acquire(key, lease, wait, share=self.share,
                                              keepAlive=self.keepAlive)
        return self.held

    async def __aexit__(self, *exc: object) -> None:
        if self.held is None:
            return
        held, self.held = self.held, None
        try:
            # Shielded: a task cancelled inside the block still releases.
            await asyncio.shield(self.client.release(held))
        except ReleaseFailed:
            pass  # the lease frees the key; logged by the client


class Client:
    """
    An asyncio client: see L{connect}.  Not bound to a loop: one client
    may serve several loops (each call answers the loop that awaits it).
    """

    def __init__(self, thread: background.ReactorThread, inner: api.LockClient) -> None:
        self._thread = thread
        self._inner = inner
        self.instance = inner.instance
        self.closed = False
        thread.closers.add(inner.close)

    async def _run(self, f: Any, *args: Any, onAbandon: Optional[Callable[[Any], None]] = None,
                   cancellable: bool = True) -> Any:
        self._thread.check("this lockservice client")
        future = self._thread.submit(f, *args, onAbandon=onAbandon, cancellable=cancellable)
        return await _await(self._thread, future, onAbandon, cancellable)

    def _abandon(self, lock: Lock) -> None:
        self._inner.release(lock._inner).addErrback(lambda f: None)

    async def acquire(self, key: Union[str, bytes], lease: float, wait: float = 0,
                      share: Share = None, keepAlive: bool = False) -> Lock:
        """
        Acquire C{key} (the errors of L{lockservice.client.sync.Client.acquire}).
        Cancelling the awaiting task never leaks the lock.
        """
        checkShare(share)
        loop = asyncio.get_running_loop()

        def inReactor() -> Any:
            d = self._inner.acquire(key, lease, wait, keepAlive=keepAlive, share=share)
            return d.addCallback(lambda inner: Lock(self, inner, loop))

        return await self._run(inReactor, onAbandon=self._abandon)  # type: ignore[no-any-return]

    async def readLock(self, key: Union[str, bytes], lease: float, wait: float = 0,
                       keepAlive: bool = False) -> Lock:
        return await self.acquire(key, lease, wait, share="r", keepAlive=keepAlive)

    async def writeLock(self, key: Union[str, bytes], lease: float, wait: float = 0,
                        keepAlive: bool = False) -> Lock:
        return await self.acquire(key, lease, wait, keepAlive=keepAlive)

    async def semaphore(self, key: Union[str, bytes], slots: int, lease: float, wait: float = 0,
                        keepAlive: bool = False) -> Lock:
        checkSlots(slots)
        return await self.acquire(key, lease, wait, share=slots, keepAlive=keepAlive)

    def lock(self, key: Union[str, bytes], lease: float, wait: float = 0,
             share: Share = None, keepAlive: bool = True) -> _Held:
        """
        C{async with client.lock("k", lease=30, wait=5) as lock: ...}: kept
        alive inside (by default), released on the way out.
        """
        checkShare(share)
        return _Held(self, key, lease, wait, share, keepAlive)

    # -- observing, elections -------------------------------------------------

    def observe(self, key: Union[str, bytes]) -> "Observing":
        """
        C{async for state in client.observe("k"): ...}: the state of C{key}
        (L{Observed}) now, then at each change, across failovers; leaving
        the loop (or C{aclose()}) stops it.
        """
        return Observing(self, key)

    async def observeOnce(self, key: Union[str, bytes], token: Optional[int] = None,
                          wait: float = 0) -> Observed:
        """
        One observation: the state once it is not C{token} (None: at once),
        or unchanged when C{wait} seconds (0: no limit) run out.
        """
        return await self._run(self._inner.observe, key, token, wait)  # type: ignore[no-any-return]

    async def campaign(self, election: Union[str, bytes], value: str,
                       lease: float = DEFAULT_LEADER_LEASE) -> "Leadership":
        """
        Campaign in C{election} with C{value}; returns once this client
        leads (kept alive).  Cancelling the awaiting task withdraws it.

        @raise ValueError: C{value} cannot be a connection name's value.
        """
        campaignName(value, self.instance)  # refused here, before anything is sent
        loop = asyncio.get_running_loop()

        def inReactor() -> Any:
            d = self._inner.campaign(election, value, lease)
            return d.addCallback(lambda inner: Leadership(self, inner, loop))

        return await self._run(  # type: ignore[no-any-return]
            inReactor, onAbandon=lambda won: won._inner.resign().addErrback(lambda f: None))

    async def leader(self, election: Union[str, bytes]) -> Optional[Leader]:
        """
        Who leads C{election} now, or None.
        """
        return await self._run(self._inner.leader, election)  # type: ignore[no-any-return]

    async def release(self, lock: Lock) -> bool:
        """
        True (C{OK}) or False (C{STALE}); L{ReleaseFailed} after 5 s.  Runs
        to its end even if the awaiting task is cancelled.
        """
        return bool(await self._run(self._inner.release, lock._inner, cancellable=False))

    async def releaseToken(self, key: Union[str, bytes], token: int) -> bool:
        """
        Release the grant C{token} of C{key} (a token from elsewhere: another
        process, a saved job); as L{release}.
        """
        return bool(await self._run(self._inner.release, api.Lock(
            key if isinstance(key, str) else key.decode("utf-8"), token), cancellable=False))

    async def renewToken(self, key: Union[str, bytes], token: int, lease: float) -> bool:
        """
        Renew the grant C{token} of C{key} for C{lease} seconds from now:
        True (C{OK}) or False (C{STALE}).
        """
        return bool(await self._run(self._inner.renew, api.Lock(
            key if isinstance(key, str) else key.decode("utf-8"), token), lease,
            cancellable=False))

    async def whenConnected(self, timeout: float = 10.0, failFast: bool = False) -> None:
        await self._run(self._inner.whenConnected, timeout, failFast)

    async def ping(self, word: str = "ping") -> bool:
        return bool(await self._run(self._inner.ping, word))

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._thread.check("this lockservice client")
        self._thread.closers.discard(self._inner.close)
        await self._run(self._inner.close, cancellable=False)

    async def __aenter__(self) -> "Client":
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()


class Leadership:
    """
    This client leads an election: C{token} fences what it does as leader;
    C{lost} (an C{asyncio.Event}) is set the moment it can no longer be
    sure it leads.
    """

    def __init__(self, client: Client, inner: api.Leadership,
                 loop: asyncio.AbstractEventLoop) -> None:
        self._inner = inner
        self.election = inner.election
        self.value = inner.value
        self.lock = Lock(client, inner.lock, loop)
        self.token = inner.token
        self.lost = self.lock.lost

    def __repr__(self) -> str:
        return f"aio.{self._inner!r}"

    async def resign(self) -> bool:
        """
        Stop leading (release the election's key).
        """
        return await self.lock.release()

    async def __aenter__(self) -> "Leadership":
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await asyncio.shield(self.resign())
        except ReleaseFailed:
            pass  # the lease ends the leadership; logged by the client


class Observing:
    """
    The async iterator L{Client.observe} returns.
    """

    def __init__(self, client: Client, key: Union[str, bytes]) -> None:
        self._client = client
        self._key = key
        self._states: "Optional[asyncio.Queue[Observed]]" = None
        self._watch: Any = None
        self._loop: Optional[asyncio.AbstractEventLoop] = None

    def __aiter__(self) -> "Observing":
        return self

    async def _start(self) -> None:
        loop = self._loop = asyncio.get_running_loop()
        states = self._states = asyncio.Queue()

        def told(state: Observed) -> None:  # in the reactor thread
            try:
                loop.call_soon_threadsafe(states.put_nowait, state)
            except RuntimeError:  # that loop is gone
                pass

        self._watch = await self._client._run(self._client._inner.watch, self._key, told)

    async def __anext__(self) -> Observed:
        if self._states is None:
            await self._start()
        assert self._states is not None
        try:
            return await self._states.get()
        except asyncio.CancelledError:
            await self.aclose()
            raise

    async def aclose(self) -> None:
        watch, self._watch = self._watch, None
        if watch is not None and not self._client.closed:
            await self._client._run(watch.stop, cancellable=False)


async def connect(addresses: Addresses, name: Optional[str] = None,
                  tls: Optional[ClientTLS] = None) -> Client:
    """
    An asyncio client for the nodes at C{addresses}; bad addresses or names
    raise C{ValueError} at once.  The first call in a process starts the
    reactor thread (a few milliseconds).
    """
    thread = background.current()
    future = thread.submit(api.connect, thread.reactor, addresses, name=name, tls=tls)
    inner = await _await(thread, future, lambda c: c.close(), cancellable=False)
    return Client(thread, inner)
