# -*- test-case-name: tests.client.test_client -*-
"""
The connections of one cluster, kept up in the background.

One persistent connection per address -- two when the cluster is a single
address, so that a brief drop of one does not interrupt service -- used
round-robin.  A connection that drops is redialled at once; a failed
attempt (refused, timed out, TLS handshake refused) is retried every 3 s.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from twisted.internet.defer import Deferred, succeed
from twisted.internet.endpoints import connectProtocol
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger
from twisted.python.failure import Failure

from lockservice.client.endpoints import Address, EndpointFactory
from lockservice.client.errors import NoConnection
from lockservice.client.protocol import LockClientProtocol

RECONNECT_INTERVAL = 3.0
# A connection closed to follow a redirect is given this long to deliver the
# answers already on their way before it is cut.
RETIRE_TIMEOUT = 2.0
# A TLS connection must answer its first request within this.
READY_TIMEOUT = 5.0


def describe(error: Optional[BaseException]) -> str:
    """
    One readable line for a connection error; OpenSSL's lists of (library,
    function, reason) tuples become their reasons.
    """
    args = getattr(error, "args", ())
    if args and isinstance(args[0], list) and args[0] and isinstance(args[0][0], tuple):
        return "; ".join(str(item[-1]) for item in args[0])
    return str(error) or type(error).__name__


def _why(reason: Failure) -> str:
    text = describe(reason.value)
    if type(reason.value).__module__.startswith("OpenSSL"):
        return f"TLS handshake failed: {text}"
    return text


# Connections to one node that drop within this long of each other went
# down together (the node died or restarted, taking them all).
SAME_FAILURE = 0.5


class Tries:
    """
    The tries a request has spent on connections that dropped while they
    carried it: it gives up after as many as its pool has connections.
    Connections to one node that drop in the same moment are one try, so a
    failover costs a request one try however many of its connections had
    followed the active there.
    """

    def __init__(self, pool: "Pool") -> None:
        self.pool = pool
        self.spent = 0
        self._last: Optional[Tuple[Address, float]] = None

    def dropped(self, address: Address) -> None:
        """
        The connection to C{address} carrying the request dropped.

        @raise NoConnection: that was the last try.
        """
        now = self.pool.clock.seconds()
        last, self._last = self._last, (address, now)
        if last is not None and last[0] == address and now - last[1] < SAME_FAILURE:
            return
        self.spent += 1
        if self.spent >= len(self.pool.slots):
            raise NoConnection(f"connection dropped {self.spent} times; giving up")


class Slot:
    """
    One persistent connection of a pool.  States: down (a retry may be
    scheduled), connecting, up (C{protocol} set and ready).
    """

    def __init__(self, pool: "Pool", home: Address) -> None:
        self.pool = pool
        self.home = home
        self.address: Address = home
        self.protocol: Optional[LockClientProtocol] = None
        self.connecting = False
        self.retry: Optional[IDelayedCall] = None
        self.waitingForConnection: List["Deferred[None]"] = []
        self.lastError: Optional[str] = None
        # When the last attempt began: a node that accepts and closes at
        # once is redialled every RECONNECT_INTERVAL, not in a loop.
        self.attemptedAt = float("-inf")

    @property
    def up(self) -> bool:
        return self.protocol is not None

    def connect(self) -> None:
        if self.connecting or self.protocol is not None or self.pool.closed:
            return
        self.connecting = True
        self.retry = None
        self.attemptedAt = self.pool.clock.seconds()
        address = self.address
        protocol = LockClientProtocol(self.pool.name)
        try:
            d = connectProtocol(self.pool.endpointFor(address), protocol)
        except Exception:
            d = Deferred()
            d.errback()
        d.addCallback(lambda _: self._whenReady(protocol))
        d.addCallbacks(self._connected, lambda f: self._failed(f, address))
        # Closed before the handshake finished: a failed attempt.
        def lostEarly(_: None) -> None:
            if not protocol.isReady and not protocol.ready.called:
                assert protocol.lostReason is not None
                protocol.ready.errback(protocol.lostReason)

        protocol.lost.addCallback(lostEarly)

    def _whenReady(self, protocol: LockClientProtocol) -> "Deferred[LockClientProtocol]":
        """
        C{protocol.ready}, but a connection not ready within
        L{READY_TIMEOUT} (a TLS node that never answers) is cut: a failed
        attempt.
        """
        if protocol.isReady:
            return protocol.ready

        def tooSlow() -> None:
            if not protocol.isReady and protocol.transport is not None:
                protocol.transport.abortConnection()  # type: ignore[attr-defined]

        call = self.pool.clock.callLater(READY_TIMEOUT, tooSlow)

        def settled(result: object) -> object:
            if call.active():
                call.cancel()
            return result

        return protocol.ready.addBoth(settled)  # type: ignore[return-value]

    def _connected(self, protocol: LockClientProtocol) -> None:
        self.connecting = False
        if self.pool.closed:
            protocol.transport.loseConnection()  # type: ignore[union-attr]
            return
        self.protocol = protocol
        self.lastError = None
        protocol.lost.addCallback(lambda _: self._lost(protocol))
        waiting, self.waitingForConnection = self.waitingForConnection, []
        for d in waiting:
            d.callback(None)
        self.pool._slotUp()

    def _failed(self, reason: Failure, address: Address) -> None:
        self.connecting = False
        self.lastError = f"{address}: {_why(reason)}"
        self.pool.log.debug("connection to {address} failed: {reason}",
                            address=address, reason=self.lastError)
        # A redirect target that cannot be reached: go back home next time.
        self.address = self.home
        if not self.pool.closed:
            self._scheduleRetry(RECONNECT_INTERVAL)
            self.pool._attemptFailed()
        waiting, self.waitingForConnection = self.waitingForConnection, []
        for d in waiting:
            d.errback(NoConnection(f"cannot connect to {self.lastError}"))

    def _lost(self, protocol: LockClientProtocol) -> None:
        if self.protocol is not protocol:
            return
        self.protocol = None
        if self.pool.closed:
            return
        # A redirected connection that is lost goes back to its configured
        # address, which redirects it to whoever is active by then.  At
        # once after a connection that lasted, else a whole interval after
        # the attempt that made it.
        self.address = self.home
        self._scheduleRetry(max(0.0, self.attemptedAt + RECONNECT_INTERVAL
                                - self.pool.clock.seconds()))

    def switchTo(self, address: str) -> "Deferred[None]":
        """
        Follow a redirect: reconnect this slot to C{address}.  The old
        connection is retired (see L{LockClientProtocol.retire}), not cut.

        @return: fires when the slot is connected again.
        """
        if self.address == address and self.protocol is not None:
            return succeed(None)
        d: "Deferred[None]" = Deferred()
        self.waitingForConnection.append(d)
        self.address = address
        old, self.protocol = self.protocol, None
        if old is not None:
            self.pool.retire(old)
        if not self.connecting:
            self._scheduleRetry(0)
        return d

    def _scheduleRetry(self, delay: float) -> None:
        if self.retry is not None and self.retry.active():
            if delay > 0:
                return
            self.retry.cancel()
        self.retry = self.pool.clock.callLater(delay, self.connect)

    def close(self) -> Optional["Deferred[None]"]:
        if self.retry is not None and self.retry.active():
            self.retry.cancel()
        self.retry = None
        waiting, self.waitingForConnection = self.waitingForConnection, []
        for d in waiting:
            d.errback(NoConnection("client closed"))
        if self.protocol is not None:
            lost = self.protocol.lost
            self.protocol.transport.loseConnection()  # type: ignore[union-attr]
            return lost
        return None


class Pool:
    """
    The connections to the nodes of one cluster.
    """

    log = Logger()

    def __init__(self, clock: IReactorTime, homes: Sequence[Address],
                 endpointFor: EndpointFactory, name: Optional[bytes] = None,
                 spare: bool = True) -> None:
        """
        @param spare: keep two connections to a lone address (the client's
            own pools); a campaign's pool keeps one per address.
        """
        if not homes:
            raise ValueError("a cluster needs at least one address")
        self.clock = clock
        self.endpointFor = endpointFor
        self.name = name
        self.homes = list(homes)
        slots = self.homes * 2 if len(self.homes) == 1 and spare else self.homes
        self.slots = [Slot(self, home) for home in slots]
        self.closed = False
        self._next = 0
        self._readyWaiters: List["Deferred[None]"] = []
        self._failFast: List["Deferred[None]"] = []
        self._retiring: "dict[LockClientProtocol, IDelayedCall]" = {}

    def start(self) -> None:
        for slot in self.slots:
            slot.connect()

    def pick(self) -> Optional[Slot]:
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

    def pickFor(self, op: bytes, key: bytes) -> Tuple[Optional[Slot], "Optional[Deferred[None]]"]:
        """
        The next connected slot (round-robin) that carries no request of
        C{(op, key)} yet: a client keeps at most one outstanding C{A} and
        one C{O} per key per connection, so that a C{C} or an C{O}'s
        answer always belongs to the request it means.

        @return: C{(slot, None)}; or C{(None, busy)} when every connected
            slot carries one (C{busy} fires when one of them may be free);
            or C{(None, None)} when none is connected.
        """
        busy: "Optional[Deferred[None]]" = None
        for _ in range(len(self.slots)):
            slot = self.pick()
            if slot is None:
                return None, None
            assert slot.protocol is not None
            if not slot.protocol.outstanding(op, key):
                return slot, None
            if busy is None:
                busy = slot.protocol.whenIdle(op, key)
        return None, busy

    @property
    def up(self) -> bool:
        return any(slot.up for slot in self.slots)

    def lastError(self) -> str:
        errors = [s.lastError for s in self.slots if s.lastError]
        return errors[-1] if errors else "not connected yet"

    def whenConnected(self, timeout: float, failFast: bool = False) -> "Deferred[None]":
        """
        Fires once a connection is up; fails with L{NoConnection} (saying
        why the last attempt failed) after C{timeout} seconds -- or, with
        C{failFast}, once every connection has failed an attempt.
        """
        if self.up:
            return succeed(None)
        if self.closed:
            return Deferred.fromCoroutine(self._closedError())
        d: "Deferred[None]" = Deferred(lambda d: self._forget(d))
        self._readyWaiters.append(d)

        def expire() -> None:
            if d in self._readyWaiters:
                self._readyWaiters.remove(d)
                d.errback(NoConnection(
                    f"no connection to {', '.join(map(str, self.homes))} "
                    f"within {timeout:.1f} s (last error: {self.lastError()})"))

        if failFast:
            self._failFast.append(d)
            if self._allFailed():
                self._attemptFailed()

        call = self.clock.callLater(timeout, expire)

        def settled(result: object) -> object:
            if call.active():
                call.cancel()
            return result

        d.addBoth(settled)
        return d

    def _allFailed(self) -> bool:
        return all(s.lastError and not s.up and not s.connecting for s in self.slots)

    def _attemptFailed(self) -> None:
        if not self._failFast or not self._allFailed():
            return
        waiting, self._failFast = self._failFast, []
        for d in waiting:
            if d in self._readyWaiters:
                self._readyWaiters.remove(d)
                d.errback(NoConnection(f"cannot connect to {self.lastError()}"))

    async def _closedError(self) -> None:
        raise NoConnection("client closed")

    def _forget(self, d: "Deferred[None]") -> None:
        if d in self._readyWaiters:
            self._readyWaiters.remove(d)

    def _slotUp(self) -> None:
        self._failFast = []
        waiters, self._readyWaiters = self._readyWaiters, []
        for d in waiters:
            d.callback(None)

    def retire(self, protocol: LockClientProtocol) -> None:
        """
        Close C{protocol} once its pending answers are in, or after
        L{RETIRE_TIMEOUT} at the latest.
        """
        protocol.retire()

        def cut() -> None:
            self._retiring.pop(protocol, None)
            if protocol.transport is not None and not protocol.lost.called:
                protocol.transport.loseConnection()

        self._retiring[protocol] = self.clock.callLater(RETIRE_TIMEOUT, cut)

        def gone(_: object) -> None:
            call = self._retiring.pop(protocol, None)
            if call is not None and call.active():
                call.cancel()

        protocol.lost.addCallback(gone)

    def retireAll(self) -> None:
        """
        Stop redialling, and close every connection once its pending
        answers are in (a withdrawn acquire's crossed grant among them).
        """
        self.closed = True
        for slot in self.slots:
            if slot.retry is not None and slot.retry.active():
                slot.retry.cancel()
            slot.retry = None
            protocol, slot.protocol = slot.protocol, None
            if protocol is not None:
                self.retire(protocol)
        waiters, self._readyWaiters = self._readyWaiters, []
        for waiter in waiters:
            waiter.errback(NoConnection("closed"))

    def close(self) -> List["Deferred[None]"]:
        self.closed = True
        for call in self._retiring.values():
            if call.active():
                call.cancel()
        lost = [d for d in (slot.close() for slot in self.slots) if d is not None]
        for protocol in list(self._retiring):
            if protocol.transport is not None and not protocol.lost.called:
                protocol.transport.loseConnection()
                lost.append(protocol.lost)
        self._retiring.clear()
        waiters, self._readyWaiters = self._readyWaiters, []
        for waiter in waiters:
            waiter.errback(NoConnection("client closed"))
        return lost
