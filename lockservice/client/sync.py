# -*- test-case-name: tests.client.test_client_sync -*-
"""
The blocking face of the client, for code that is not a Twisted program
(a Django view, a Celery task, a cron script):

    from lockservice.client import sync

    client = sync.connect("10.0.0.1:7700,10.0.0.2:7700", name="billing")
    with client.lock("orders/42", lease=30, wait=5) as lock:
        write_order(fence=lock.token)        # lock.lost: a threading.Event

It is the Twisted client (L{lockservice.client.api}: every behaviour of
docs/client.md) run on a private reactor in one background daemon thread
(L{lockservice.client.background}); each call waits for its answer in the
calling thread.  One client is meant to be shared by all the threads of a
process.  A client cannot cross a C{fork()}: make clients after it.
"""

from __future__ import annotations

import logging
from typing import Any, Optional, Union

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

log = logging.getLogger("lockservice.client")

# close() waits at most this long for the connections to close.
CLOSE_WAIT = 5.0


class Lock:
    """
    A granted lock.

    @ivar key: the key.
    @ivar token: its fencing token: give it to the resource you write.
    @ivar share: None (exclusive), C{"r"} (read) or the semaphore's slots.
    @ivar lost: a C{threading.Event}, set the moment the client can no
        longer be sure it holds the lock (see L{lockservice.client.api.Lock});
        never set after a release.
    @ivar lostReason: the L{LockLost} once C{lost} is set.
    """

    def __init__(self, client: "Client", inner: api.Lock) -> None:
        # Built in the reactor thread, where inner.lost fires.
        import threading

        self._client = client
        self._inner = inner
        self.key = inner.key
        self.token = inner.token
        self.share = inner.share
        self.lease = inner.lease
        self.lost = threading.Event()
        self.lostReason: Optional[LockLost] = None
        inner.lost.addCallback(self._lost)

    def _lost(self, why: LockLost) -> None:
        self.lostReason = why
        self.lost.set()

    def __repr__(self) -> str:
        return f"sync.{self._inner!r}"

    @property
    def released(self) -> bool:
        return self._inner.released

    def release(self) -> bool:
        """
        C{client.release(lock)}.
        """
        return self._client.release(self)

    def renew(self, lease: Optional[float] = None) -> bool:
        """
        Renew now (default: the acquire's lease).  True for C{OK}; False for
        C{STALE} (the lock is lost: C{lost} is set).
        """
        return bool(self._client._call(self._inner.renew, lease, cancellable=False))

    def keepAlive(self) -> None:
        """
        Renew every third of the lease in the background until released.
        """
        self._client._call(self._inner.keepAlive)

    def stopKeepAlive(self) -> None:
        self._client._call(self._inner.stopKeepAlive)


class _Held:
    """
    C{with client.lock(...) as lock:} -- released on the way out, whatever
    the block did.
    """

    def __init__(self, client: "Client", key: Union[str, bytes], lease: float, wait: float,
                 share: Share, keepAlive: bool) -> None:
        self.client = client
        self.args = (key, lease, wait)
        self.share = share
        self.keepAlive = keepAlive
        self.held: Optional[Lock] = None

    def __enter__(self) -> Lock:
        key, lease, wait = self.args
        self.held = self.client.acquire(key, lease, wait, share=self.share,
                                        keepAlive=self.keepAlive)
        return self.held

    def __exit__(self, *exc: object) -> None:
        if self.held is None:
            return
        held, self.held = self.held, None
        try:
            self.client.release(held)
        except ReleaseFailed as e:
            log.warning("%s; its lease will free the key", e)
        except ForkedClient:
            raise


class Client:
    """
    A blocking client: see L{connect}.  Thread-safe.

    @ivar instance: the random id sent with the name (C{I name#instance}).
    """

    def __init__(self, addresses: Addresses, name: Optional[str] = None,
                 tls: Optional[ClientTLS] = None) -> None:
        self._thread = background.current()
        self._inner: api.LockClient = self._thread.call(
            api.connect, self._thread.reactor, addresses, name=name, tls=tls)
        self.instance = self._inner.instance
        self.closed = False
        self._thread.closers.add(self._inner.close)

    def _call(self, f: Any, *args: Any, **kwargs: Any) -> Any:
        self._thread.check("this lockservice client")
        return self._thread.call(f, *args, **kwargs)

    def _abandon(self, lock: Lock) -> None:
        # A grant that came after the caller stopped waiting (interrupted).
        self._inner.release(lock._inner).addErrback(lambda f: None)

    def acquire(self, key: Union[str, bytes], lease: float, wait: float = 0,
                share: Share = None, keepAlive: bool = False) -> Lock:
        """
        Acquire C{key} for C{lease} seconds, waiting at most C{wait}
        seconds (0: no limit), and return the L{Lock}.

        @param share: None (exclusive), C{"r"} (read) or slots C{n} (a
            semaphore); checked at once (C{ValueError}).
        @raise LockTimeout: not granted within C{wait}.
        @raise NoConnection: no connection carried it (after as many tries
            as there are connections), or the client is closed.
        @raise LockRejected: the node answered C{E}.
        @raise ForkedClient: this client was made before a fork.
        """
        def inReactor() -> Any:
            d = self._inner.acquire(key, lease, wait, keepAlive=keepAlive, share=share)
            return d.addCallback(lambda inner: Lock(self, inner))

        return self._call(inReactor, onAbandon=self._abandon)  # type: ignore[no-any-return]

    def readLock(self, key: Union[str, bytes], lease: float, wait: float = 0,
                 keepAlive: bool = False) -> Lock:
        return self.acquire(key, lease, wait, share="r", keepAlive=keepAlive)

    def writeLock(self, key: Union[str, bytes], lease: float, wait: float = 0,
                  keepAlive: bool = False) -> Lock:
        return self.acquire(key, lease, wait, keepAlive=keepAlive)

    def semaphore(self, key: Union[str, bytes], slots: int, lease: float, wait: float = 0,
                  keepAlive: bool = False) -> Lock:
        checkSlots(slots)
        return self.acquire(key, lease, wait, share=slots, keepAlive=keepAlive)

    def lock(self, key: Union[str, bytes], lease: float, wait: float = 0,
             share: Share = None, keepAlive: bool = True) -> _Held:
        """
        C{with client.lock("k", lease=30, wait=5) as lock: ...}: acquired on
        entry (the errors of L{acquire}), kept alive while inside (by
        default), released on the way out.
        """
        checkShare(share)
        return _Held(self, key, lease, wait, share, keepAlive)

    # -- observing, elections -------------------------------------------------

    def observe(self, key: Union[str, bytes], timeout: Optional[float] = None) -> "Observing":
        """
        The state of C{key} now, then each change, as an iterator of
        L{Observed}: C{for state in client.observe("k", timeout=30)}.  The
        iteration ends when C{timeout} seconds pass with no change (None:
        never); C{close()} it (or leave a C{with} block) to stop.
        """
        return Observing(self, key, timeout)

    def observeOnce(self, key: Union[str, bytes], token: Optional[int] = None,
                    wait: float = 0) -> Observed:
        """
        One observation (see L{lockservice.client.api.LockClient.observe}).
        """
        return self._call(self._inner.observe, key, token, wait)  # type: ignore[no-any-return]

    def campaign(self, election: Union[str, bytes], value: str,
                 lease: float = DEFAULT_LEADER_LEASE, wait: float = 0) -> "Leadership":
        """
        Campaign in C{election} with C{value}; returns once this client
        leads (kept alive).  Ctrl+C (or a timeout around it) withdraws it.

        @raise ValueError: C{value} cannot be a connection name's value.
        """
        campaignName(value, self.instance)  # refused here, before anything is sent

        def inReactor() -> Any:
            d = self._inner.campaign(election, value, lease, wait)
            return d.addCallback(lambda inner: Leadership(self, inner))

        return self._call(inReactor, onAbandon=lambda won: won._inner.resign())  # type: ignore[no-any-return]

    def groups(self, method: str, *args: Any) -> Any:
        """
        One request of the group extension (see
        L{lockservice.client.groups.Groups}): C{client.groups("join", g, m,
        30, b"caps")}.
        """
        return self._call(getattr(self._inner.groups, method), *args)

    def leader(self, election: Union[str, bytes]) -> Optional[Leader]:
        """
        Who leads C{election} now, or None.
        """
        return self._call(self._inner.leader, election)  # type: ignore[no-any-return]

    def release(self, lock: Lock) -> bool:
        """
        Release C{lock} (retried for 5 s across connections).  True for
        C{OK}, False for C{STALE} (it had expired or was released).

        @raise ReleaseFailed: not confirmed within 5 s.
        """
        return bool(self._call(self._inner.release, lock._inner, cancellable=False))

    def releaseAll(self, locks: "list[Lock]", timeout: float = 5.0) -> int:
        """
        Release C{locks} all at once (each retried as by L{release}), and
        wait for them at most C{timeout} seconds.

        @return: how many were released C{OK} within that time.
        """
        from twisted.internet.defer import gatherResults

        def inReactor() -> Any:
            done = [self._inner.release(lock._inner).addErrback(lambda f: False)
                    for lock in locks]
            return gatherResults(done)

        try:
            answers = self._call(inReactor, timeout=timeout, cancellable=False)
        except Exception:
            return 0
        return sum(1 for ok in answers if ok)

    def whenConnected(self, timeout: float = 10.0, failFast: bool = False) -> None:
        """
        Wait until every cluster has a connection up.

        @raise NoConnection: none within C{timeout} (or, with C{failFast},
            once every connection failed an attempt).
        """
        self._call(self._inner.whenConnected, timeout, failFast)

    def ping(self, word: str = "ping") -> bool:
        return bool(self._call(self._inner.ping, word))

    def close(self) -> None:
        """
        Close this client's connections (a pending acquire fails with
        L{NoConnection}).  The reactor thread stays for the next client.
        """
        if self.closed:
            return
        self.closed = True
        self._thread.check("this lockservice client")
        self._thread.closers.discard(self._inner.close)
        self._thread.call(self._inner.close, timeout=CLOSE_WAIT, cancellable=False)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Leadership:
    """
    This client leads an election: C{token} fences what it does as leader;
    C{lost} (a C{threading.Event}) is set the moment it can no longer be
    sure it leads.
    """

    def __init__(self, client: Client, inner: api.Leadership) -> None:
        self._inner = inner
        self.election = inner.election
        self.value = inner.value
        self.lock = Lock(client, inner.lock)
        self.token = inner.token
        self.lost = self.lock.lost

    def __repr__(self) -> str:
        return f"sync.{self._inner!r}"

    def resign(self) -> bool:
        """
        Stop leading (release the election's key).
        """
        return self.lock.release()

    def __enter__(self) -> "Leadership":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.resign()
        except ReleaseFailed as e:
            log.warning("%s; its lease will end the leadership", e)


class Observing:
    """
    The iterator L{Client.observe} returns.
    """

    def __init__(self, client: Client, key: Union[str, bytes], timeout: Optional[float]) -> None:
        import queue

        self._client = client
        self._timeout = timeout
        self._states: "queue.Queue[Any]" = queue.Queue()
        self._watch = client._call(client._inner.watch, key, self._states.put)

    def __iter__(self) -> "Observing":
        return self

    def __next__(self) -> Observed:
        import queue

        try:
            state = background.waitForQueue(self._states, self._timeout)
        except queue.Empty:
            self.close()
            raise StopIteration from None
        return state  # type: ignore[no-any-return]

    def close(self) -> None:
        if not self._client.closed:
            self._client._call(self._watch.stop)

    def __enter__(self) -> "Observing":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def connect(addresses: Addresses, name: Optional[str] = None,
            tls: Optional[ClientTLS] = None) -> Client:
    """
    A blocking client for the nodes at C{addresses} (C{"a:7700,b:7700"},
    a list, or several clusters: see L{lockservice.client.api.parseClusters}).
    Connections come up in the background; an acquire waits for one (5 s at
    most).  Bad addresses or names raise C{ValueError} at once.
    """
    return Client(addresses, name=name, tls=tls)
