# -*- test-case-name: tests.test_client -*-
"""
A Deferred-returning client for Twisted applications (SPEC section 5).

    client = connect(reactor, ["10.0.0.1:7700", "10.0.0.2:7700"])
    lock = yield client.acquire("orders/42", lease=30, wait=5)
    ...
    yield client.release(lock)

It keeps one persistent connection per address (two when given a single
address), picks connections round-robin, pipelines requests, follows
C{M} redirects to the active node, retries releases, and never leaks a lock
whose acquire was cancelled.
"""

from __future__ import annotations

from collections import deque
from typing import (
    Any,
    Callable,
    Deque,
    Dict,
    List,
    Optional,
    Sequence,
    Tuple,
    TypeVar,
    Union,
)

from twisted.internet.defer import CancelledError, Deferred, maybeDeferred, succeed
from twisted.internet.endpoints import connectProtocol
from twisted.internet.interfaces import IDelayedCall, IReactorTime, IStreamClientEndpoint
from twisted.logger import Logger
from twisted.protocols.basic import LineOnlyReceiver
from twisted.python.failure import Failure

from lockservice.core import wire
from lockservice.tcp import clientEndpoint, noDelay

RECONNECT_INTERVAL = 3.0
RELEASE_RETRY_FOR = 5.0
RELEASE_RETRY_EVERY = 0.2
NO_ACTIVE_RETRY = 0.1
MAX_NO_ACTIVE_RETRIES = 100  # 10 s of "M ... *" before giving up
MAX_REDIRECTS = 20
ACQUIRE_GRACE = 0.5

T = TypeVar("T")


class LockError(Exception):
    """
    Base class of the client's errors.
    """


class LockTimeout(LockError):
    """
    The server answered C{T}: no grant within the wait; nothing is held.
    """


class LockRejected(LockError):
    """
    The server answered C{E}: the request was malformed or refused.
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class NoConnection(LockError):
    """
    No connection could carry the request (after one try per connection).
    """


class ReleaseFailed(LockError):
    """
    A release could not be delivered within its retry window; the lease
    will reclaim the key.
    """


class Lock:
    """
    A granted lock: its key and fencing token.
    """

    __slots__ = ("key", "token")

    def __init__(self, key: str, token: int) -> None:
        self.key = key
        self.token = token

    def __repr__(self) -> str:
        return f"Lock(key={self.key!r}, token={self.token})"


class _ConnectionDropped(Exception):
    """
    The connection carrying a request closed before its answer arrived.
    """


class _Redirected(Exception):
    def __init__(self, address: Optional[str]) -> None:
        super().__init__(address)
        self.address = address


def _encodeKey(key: Union[str, bytes]) -> bytes:
    raw = key.encode("utf-8") if isinstance(key, str) else key
    if not wire.isValidKey(raw):
        raise ValueError(f"invalid key {key!r}: 1-250 bytes of UTF-8, no spaces or controls")
    return raw


def _seconds(value: float, name: str) -> bytes:
    return wire.formatSeconds(wire.checkSeconds(value, name, positive=False))


class LockClientProtocol(LineOnlyReceiver):
    """
    One connection: sends request lines and pairs answers with requests by
    the echoed (op, key), in send order for equal pairs.
    """

    delimiter = b"\n"
    MAX_LENGTH = 65536

    def __init__(self) -> None:
        self._pending: Dict[Tuple[bytes, bytes], Deque["Deferred[List[bytes]]"]] = {}
        self.lost: "Deferred[None]" = Deferred()

    def connectionMade(self) -> None:
        noDelay(self.transport)

    def request(self, op: bytes, key: bytes, line: bytes) -> "Deferred[List[bytes]]":
        """
        Send C{line}; the Deferred fires with the answer's fields.
        """
        d: "Deferred[List[bytes]]" = Deferred()
        self._pending.setdefault((op, key), deque()).append(d)
        self.transport.write(line)  # type: ignore[union-attr]
        return d

    def lineReceived(self, line: bytes) -> None:
        line = line.rstrip(b"\r")
        fields = line.split(b" ")
        kind = fields[0]
        if kind in (b"A", b"T", b"R") and len(fields) >= 2:
            pair = (b"R" if kind == b"R" else b"A", fields[1])
        elif kind == b"P" and len(fields) == 2:
            pair = (b"P", fields[1])
        elif kind in (b"M", b"E") and len(fields) >= 3:
            pair = (fields[1], fields[2])
        else:
            return
        queue = self._pending.get(pair)
        if not queue and kind == b"E":
            # An error we cannot pair exactly: fail the oldest request of its op.
            for (op, _), candidates in self._pending.items():
                if candidates and (op == fields[1] or fields[1] == b"*"):
                    queue = candidates
                    break
        if not queue:
            return
        d = queue.popleft()
        if not queue:
            self._pending.pop(pair, None)
        d.callback(fields)

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        pending, self._pending = self._pending, {}
        for queue in pending.values():
            for d in queue:
                d.errback(_ConnectionDropped(str(reason.value)))
        self.lost.callback(None)


class _Slot:
    """
    One persistent connection of the client, kept up in the background.
    """

    def __init__(self, client: "LockClient", home: Union[str, IStreamClientEndpoint]) -> None:
        self.client = client
        self.home = home
        self.address: Union[str, IStreamClientEndpoint] = home
        self.protocol: Optional[LockClientProtocol] = None
        self.connecting = False
        self.retry: Optional[IDelayedCall] = None
        self.waitingForConnection: List["Deferred[None]"] = []
        # True while the slot closes its link on purpose to follow a redirect.
        self.switching = False

    @property
    def up(self) -> bool:
        return self.protocol is not None

    def connect(self) -> None:
        if self.connecting or self.protocol is not None or self.client.closed:
            return
        self.connecting = True
        self.retry = None
        protocol = LockClientProtocol()
        d = connectProtocol(self.client.endpointFor(self.address), protocol)
        d.addCallbacks(self._connected, self._failed)

    def _connected(self, protocol: LockClientProtocol) -> None:
        self.connecting = False
        if self.client.closed:
            protocol.transport.loseConnection()  # type: ignore[union-attr]
            return
        self.protocol = protocol
        protocol.lost.addCallback(lambda _: self._lost(protocol))
        waiting, self.waitingForConnection = self.waitingForConnection, []
        for d in waiting:
            d.callback(None)
        self.client._slotUp()

    def _failed(self, reason: Failure) -> None:
        self.connecting = False
        self.client.log.debug("connection to {address} failed: {reason}",
                              address=self.address, reason=reason.value)
        failedAddress = self.address
        # A redirect target that cannot be reached: go back home next time.
        self.address = self.home
        self._scheduleRetry(RECONNECT_INTERVAL)
        waiting, self.waitingForConnection = self.waitingForConnection, []
        for d in waiting:
            d.errback(NoConnection(f"cannot connect to {failedAddress}"))

    def _lost(self, protocol: LockClientProtocol) -> None:
        if self.protocol is not protocol:
            return
        self.protocol = None
        if self.client.closed:
            return
        if self.address != self.home and not self.switching:
            self.address = self.home
        self.switching = False
        # Reconnect at once after a drop; failures then retry every 3 s.
        self._scheduleRetry(0)

    def switchTo(self, address: str) -> "Deferred[None]":
        """
        Follow a redirect: reconnect this slot to C{address}.

        @return: fires when the slot is connected again.
        """
        if self.address == address and self.protocol is not None:
            return succeed(None)
        d: "Deferred[None]" = Deferred()
        self.waitingForConnection.append(d)
        self.address = address
        if self.protocol is not None:
            self.switching = True
            self.protocol.transport.loseConnection()  # type: ignore[union-attr]
        else:
            self._scheduleRetry(0)
        return d

    def _scheduleRetry(self, delay: float) -> None:
        if self.retry is not None and self.retry.active():
            if delay > 0:
                return
            self.retry.cancel()
        self.retry = self.client.clock.callLater(delay, self.connect)

    def close(self) -> Optional["Deferred[None]"]:
        if self.retry is not None and self.retry.active():
            self.retry.cancel()
        self.retry = None
        if self.protocol is not None:
            lost = self.protocol.lost
            self.protocol.transport.loseConnection()  # type: ignore[union-attr]
            return lost
        return None


class LockClient:
    """
    The client object returned by L{connect}.
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        addresses: Sequence[Union[str, IStreamClientEndpoint]],
        endpointFor: Callable[[Union[str, IStreamClientEndpoint]], IStreamClientEndpoint],
    ) -> None:
        if not addresses:
            raise ValueError("at least one address is needed")
        self.clock = clock
        self.endpointFor = endpointFor
        homes = list(addresses) * 2 if len(addresses) == 1 else list(addresses)
        self.slots = [_Slot(self, home) for home in homes]
        self.closed = False
        self._next = 0
        self._readyWaiters: List["Deferred[None]"] = []
        self._timers: "set[IDelayedCall]" = set()

    def start(self) -> None:
        for slot in self.slots:
            slot.connect()

    # -- connection choice ---------------------------------------------------

    def _pick(self) -> Optional[_Slot]:
        """
        The next connected slot, round-robin; None when all are down.
        """
        count = len(self.slots)
        for i in range(count):
            slot = self.slots[(self._next + i) % count]
            if slot.up:
                self._next = (self._next + i + 1) % count
                return slot
        return None

    def whenConnected(self, timeout: float = 10.0) -> "Deferred[None]":
        """
        Fires once at least one connection is up (fails after C{timeout}).
        """
        if any(slot.up for slot in self.slots):
            return succeed(None)
        d: "Deferred[None]" = Deferred()
        self._readyWaiters.append(d)

        def expire() -> None:
            if d in self._readyWaiters:
                self._readyWaiters.remove(d)
                d.errback(NoConnection("no connection to any lockservice node"))

        self._later(timeout, expire)
        return d

    def _slotUp(self) -> None:
        waiters, self._readyWaiters = self._readyWaiters, []
        for d in waiters:
            d.callback(None)

    def _later(self, delay: float, f: Callable[[], object]) -> IDelayedCall:
        def run() -> None:
            self._timers.discard(call)
            f()

        call = self.clock.callLater(delay, run)
        self._timers.add(call)
        return call

    def _sleep(self, delay: float) -> "Deferred[None]":
        d: "Deferred[None]" = Deferred()
        self._later(delay, lambda: d.callback(None))
        return d

    # -- acquire -------------------------------------------------------------

    def acquire(self, key: Union[str, bytes], lease: float, wait: float = 0) -> "Deferred[Lock]":
        """
        Acquire C{key} for C{lease} seconds, waiting at most C{wait} seconds
        (0: no limit).

        @return: a Deferred firing with a L{Lock}, or failing with
            L{LockTimeout}, L{LockRejected} or L{NoConnection}.  Cancelling it
            never leaks a lock: a grant that arrives later is released.
        """
        rawKey = _encodeKey(key)
        if lease <= 0:
            raise ValueError("lease must be > 0 seconds")
        leaseField = _seconds(lease, "lease")
        _seconds(wait, "wait")
        deadline = self.clock.seconds() + wait if wait > 0 else None

        def line() -> bytes:
            # A request re-sent after a drop or a redirect asks only for
            # the wait that is left, so the whole acquire stays bounded.
            if deadline is None:
                remaining = b"0"
            else:
                remaining = _seconds(max(deadline - self.clock.seconds(), 0.001), "wait")
            return b"A " + rawKey + b" " + leaseField + b" " + remaining + b"\n"

        state = {"cancelled": False}
        keyText = key if isinstance(key, str) else key.decode("utf-8")

        def giveUp(d: "Deferred[Lock]", error: Exception) -> None:
            if not d.called:
                state["cancelled"] = True
                d.errback(error)

        result: "Deferred[Lock]" = Deferred(lambda d: giveUp(d, CancelledError()))
        guard: Optional[IDelayedCall] = None
        if deadline is not None:
            # The server answers T at the deadline; if its answer is held up
            # (a stalled link, a paused node) we stop waiting a little later.
            guard = self._later(wait + ACQUIRE_GRACE, lambda: giveUp(
                result, LockTimeout(f"no answer for {keyText!r} within {wait}s")))

        async def attempt() -> None:
            try:
                fields = await self._send(b"A", rawKey, line, dropsAllowed=len(self.slots),
                                          deadline=deadline)
            except Exception as e:
                fields = None
                if not state["cancelled"]:
                    result.errback(e)
            if guard is not None and guard.active():
                guard.cancel()
                self._timers.discard(guard)
            if fields is None:
                return
            if fields[0] == b"A":
                lock = Lock(keyText, int(fields[2]))
                if state["cancelled"]:
                    # Too late: the caller gave up, so give the key back.
                    self.release(lock).addErrback(lambda f: None)
                else:
                    result.callback(lock)
            elif not state["cancelled"]:
                result.errback(LockTimeout(f"no grant for {keyText!r} within {wait}s"))

        Deferred.fromCoroutine(attempt())
        return result

    async def _send(
        self, op: bytes, key: bytes, line: Callable[[], bytes], dropsAllowed: int,
        waitForConnection: bool = True, deadline: Optional[float] = None,
    ) -> List[bytes]:
        """
        Send a request (C{line()} builds it for each try), following
        redirects and moving to the next connection when one drops; answers
        C{A}/C{T}/C{R} fields.  Past C{deadline}, an acquire ends as C{T}.
        """
        drops = 0
        redirects = 0
        unknownActive = 0
        slot: Optional[_Slot] = None
        while True:
            if self.closed:
                raise NoConnection("client closed")
            if deadline is not None and self.clock.seconds() >= deadline:
                return [b"T", key]
            if slot is None or not slot.up:
                slot = self._pick()
            if slot is None:
                drops += 1
                if drops > dropsAllowed or not waitForConnection:
                    raise NoConnection("no usable connection to any lockservice node")
                try:
                    await self.whenConnected(RECONNECT_INTERVAL + 1)
                except NoConnection:
                    pass
                continue
            assert slot.protocol is not None
            try:
                fields = await slot.protocol.request(op, key, line())
            except _ConnectionDropped:
                drops += 1
                if drops >= dropsAllowed:
                    raise NoConnection(
                        f"connection dropped {drops} times; giving up") from None
                slot = None
                continue
            if fields[0] == b"M":
                target = fields[3] if len(fields) > 3 else b"*"
                if target == b"*":
                    # No active right now (a handoff, a cluster starting).
                    unknownActive += 1
                    if unknownActive > MAX_NO_ACTIVE_RETRIES:
                        raise NoConnection("no active node (the cluster answers M *)")
                    await self._sleep(NO_ACTIVE_RETRY)
                    continue
                redirects += 1
                if redirects > MAX_REDIRECTS:
                    raise NoConnection("too many redirects; no active node found")
                try:
                    await slot.switchTo(target.decode())
                except NoConnection:
                    slot = None
                continue
            if fields[0] == b"E":
                raise LockRejected(b" ".join(fields[3:]).decode("utf-8", "replace"))
            return fields

    # -- release -------------------------------------------------------------

    def release(self, lock: Lock) -> "Deferred[bool]":
        """
        Release C{lock}.  Retried every 200 ms for 5 s across dropped
        connections and redirects.

        @return: a Deferred firing True (C{OK}) or False (C{STALE}: the lock
            had already expired or been released), or failing with
            L{ReleaseFailed}.
        """
        rawKey = _encodeKey(lock.key)
        line = b"R " + rawKey + b" " + str(lock.token).encode() + b"\n"
        deadline = self.clock.seconds() + RELEASE_RETRY_FOR

        async def attempt() -> bool:
            while True:
                try:
                    fields = await self._send(
                        b"R", rawKey, lambda: line, dropsAllowed=1, waitForConnection=False
                    )
                    return fields[2] == b"OK"
                except (NoConnection, _ConnectionDropped) as e:
                    if self.closed or self.clock.seconds() + RELEASE_RETRY_EVERY > deadline:
                        raise ReleaseFailed(f"release of {lock!r} not delivered: {e}") from None
                    await self._sleep(RELEASE_RETRY_EVERY)

        return Deferred.fromCoroutine(attempt())

    # -- helpers -------------------------------------------------------------

    def locked(
        self, key: Union[str, bytes], lease: float, wait: float,
        f: Callable[..., Any], *args: Any, **kwargs: Any,
    ) -> "Deferred[Any]":
        """
        Run C{f(lock, *args, **kwargs)} while holding C{key}; the lock is
        released whatever C{f} (or its Deferred) does.
        """
        async def run() -> Any:
            async with self.lock(key, lease, wait) as lock:
                return await maybeDeferred(f, lock, *args, **kwargs)

        return Deferred.fromCoroutine(run())

    def lock(self, key: Union[str, bytes], lease: float, wait: float = 0) -> "_Held":
        """
        C{async with client.lock(key, lease, wait) as lock: ...}
        """
        return _Held(self, key, lease, wait)

    def ping(self, word: str = "ping") -> "Deferred[bool]":
        """
        Send C{P word} on the next connection; True when it is echoed.
        """
        raw = _encodeKey(word)

        async def attempt() -> bool:
            slot = self._pick()
            if slot is None or slot.protocol is None:
                raise NoConnection("no connection")
            fields = await slot.protocol.request(b"P", raw, b"P " + raw + b"\n")
            return fields == [b"P", raw]

        return Deferred.fromCoroutine(attempt())

    def close(self) -> "Deferred[None]":
        """
        Stop reconnecting and close every connection.
        """
        self.closed = True
        for call in list(self._timers):
            if call.active():
                call.cancel()
        self._timers.clear()
        lost = [d for d in (slot.close() for slot in self.slots) if d is not None]
        for waiter in self._readyWaiters:
            waiter.errback(NoConnection("client closed"))
        self._readyWaiters = []

        async def all_lost() -> None:
            for d in lost:
                await d

        return Deferred.fromCoroutine(all_lost())


class _Held:
    def __init__(self, client: LockClient, key: Union[str, bytes], lease: float,
                 wait: float) -> None:
        self.client = client
        self.key = key
        self.lease = lease
        self.wait = wait
        self.held: Optional[Lock] = None

    async def __aenter__(self) -> Lock:
        self.held = await self.client.acquire(self.key, self.lease, self.wait)
        return self.held

    async def __aexit__(self, *exc: object) -> None:
        if self.held is not None:
            try:
                await self.client.release(self.held)
            except ReleaseFailed:
                self.client.log.warn("could not release {lock}; its lease will", lock=self.held)


Address = Union[str, IStreamClientEndpoint]
EndpointFactory = Callable[[Address], IStreamClientEndpoint]


def _defaultEndpoint(reactor: Any) -> EndpointFactory:
    def endpointFor(address: Address) -> IStreamClientEndpoint:
        if not isinstance(address, str):
            return address
        host, _, port = address.rpartition(":")
        return clientEndpoint(reactor, host, int(port), timeout=5)  # type: ignore[no-any-return]

    return endpointFor


def connect(
    reactor: Any,
    addresses: Union[str, Sequence[Address]],
    endpointFor: Optional[EndpointFactory] = None,
) -> LockClient:
    """
    Start a client for the nodes at C{addresses} (C{host:port} strings,
    a comma-separated string, or client endpoints).  Connections come up in
    the background; C{client.whenConnected()} fires when the first is up.
    """
    if isinstance(addresses, str):
        addresses = [a.strip() for a in addresses.split(",") if a.strip()]
    client = LockClient(reactor, addresses, endpointFor or _defaultEndpoint(reactor))
    client.start()
    return client


__all__ = [
    "connect", "LockClient", "Lock", "LockError", "LockTimeout", "LockRejected",
    "NoConnection", "ReleaseFailed",
]
