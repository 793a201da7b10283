# -*- test-case-name: tests.client.test_client -*-
"""
Observing a key: who holds it now, and each change (the C{O} request).

L{Observe} is one question, "tell me when the key's newest live grant is
no longer C{token}, or after C{wait} seconds": it follows redirects and
moves to the next connection on a drop, like an acquire, and carries at
most one outstanding C{O} per key per connection.  The protocol has no way
to withdraw an C{O}, so no C{O} asks for more than L{LONGEST_O}: a longer
question is asked again until its wait runs out, and one given up frees
its connection within that time.

L{Watch} asks again and again: the holder now, then each change, told to a
callback; it survives failovers (the new active answers at once when its
state differs from the last one seen).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Protocol

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime
from twisted.logger import Logger

from lockservice.client.acquiring import (
    ACQUIRE_GRACE,
    CONNECT_WAIT,
    MAX_REDIRECTS,
    NO_ACTIVE_FOR,
    NO_ACTIVE_RETRY,
    secondsField,
)
from lockservice.client.errors import ConnectionDropped, LockError, LockRejected, NoConnection
from lockservice.client.pool import Pool, Slot, Tries
from lockservice.client.protocol import LockClientProtocol
from lockservice.client.timers import Timers

# The longest wait one O asks for (see the module's docstring).
LONGEST_O = 10.0
# A watch that lost its connection asks again after this long.
WATCH_RETRY = 0.5


def valueOf(name: Optional[str]) -> Optional[str]:
    """
    A connection name's value: the part before its last C{#} (official
    clients name connections C{<name>#<instance id>}), or the whole name.
    """
    if name is None:
        return None
    value, sep, _ = name.rpartition("#")
    return value if sep else name


class Observed(NamedTuple):
    """
    A key's state: its newest live grant's C{token} (0 when nothing holds
    it) and that grant's C{holder} name (None when free or unnamed).
    """

    token: int
    holder: Optional[str]

    @property
    def value(self) -> Optional[str]:
        """
        The holder name's value (see L{valueOf}): an election's leader.
        """
        return valueOf(self.holder)


class ObserveOwner(Protocol):
    clock: IReactorTime
    closed: bool

    timers: Timers


class Observe:
    """
    One observation: fires with the key's L{Observed} state once its newest
    live grant is not C{token} (None: at once), or with the unchanged state
    when C{wait} (0: no limit) runs out.

    @ivar result: the Deferred; fails with L{LockRejected}, L{NoConnection}
        or (cancelled) C{CancelledError}.
    """

    def __init__(self, owner: ObserveOwner, pool: Pool, key: bytes, token: Optional[int],
                 wait: float) -> None:
        self.owner = owner
        self.pool = pool
        self.key = key
        self.token = token
        self.wait = wait
        self.deadline = owner.clock.seconds() + wait if wait > 0 else None
        self.result: "Deferred[Observed]" = Deferred(lambda d: self._giveUp(CancelledError()))
        self.carrier: Optional[LockClientProtocol] = None
        self.noActiveSince: Optional[float] = None
        self.guard: Optional[IDelayedCall] = None

    def start(self) -> "Deferred[Observed]":
        if self.deadline is not None:
            self.guard = self.owner.timers.later(self.wait + ACQUIRE_GRACE, self._noAnswer)
        self.result.addBoth(self._settled)
        Deferred.fromCoroutine(self._run())
        return self.result

    def _settled(self, value: object) -> object:
        self.owner.timers.cancel(self.guard)
        return value

    def _giveUp(self, error: Exception) -> None:
        if not self.result.called:
            self.result.errback(error)

    def _noAnswer(self) -> None:
        self.guard = None
        self._giveUp(NoConnection(f"no answer to observe {self.key.decode()!r} within "
                                  f"{self.wait:g} s (+{ACQUIRE_GRACE:g} s)"))

    def _line(self) -> bytes:
        now = self.owner.clock.seconds()
        left = LONGEST_O if self.deadline is None else min(LONGEST_O, self.deadline - now)
        token = b"?" if self.token is None else str(self.token).encode()
        return (b"O " + self.key + b" " + token + b" "
                + secondsField(max(left, 0.000001), "wait") + b"\n")

    async def _run(self) -> None:
        try:
            await self._attempt()
        except Exception as e:
            self._giveUp(e)

    async def _attempt(self) -> None:
        owner, pool = self.owner, self.pool
        tries = Tries(pool)
        redirects = 0
        again: Optional[Slot] = None
        while True:
            if self.result.called:
                return
            if owner.closed:
                raise NoConnection("client closed")
            now = owner.clock.seconds()
            if self.noActiveSince is not None and (
                    (self.deadline is not None and now >= self.deadline)
                    or (self.deadline is None and now - self.noActiveSince >= NO_ACTIVE_FOR)):
                raise NoConnection("no active node (the cluster answers M *)")
            slot: Optional[Slot]
            if (again is not None and again.protocol is not None
                    and not again.protocol.outstanding(b"O", self.key)):
                slot, busy = again, None
            else:
                slot, busy = pool.pickFor(b"O", self.key)
            again = None
            if slot is None:
                if busy is not None:
                    await busy
                else:
                    await pool.whenConnected(CONNECT_WAIT)
                continue
            protocol, address = slot.protocol, slot.address
            assert protocol is not None
            self.carrier = protocol
            try:
                fields = await protocol.request(b"O", self.key, self._line())
            except ConnectionDropped:
                tries.dropped(address)
                continue
            finally:
                self.carrier = None
            if self.result.called:
                return
            kind = fields[0]
            if kind == b"M":
                target = fields[3] if len(fields) > 3 else b"*"
                if target == b"*":
                    if self.noActiveSince is None:
                        self.noActiveSince = now
                    await owner.timers.sleep(NO_ACTIVE_RETRY)
                    again = slot
                    continue
                self.noActiveSince = None
                redirects += 1
                if redirects > MAX_REDIRECTS:
                    raise NoConnection("too many redirects; no active node found")
                try:
                    await slot.switchTo(target.decode())
                    again = slot
                except NoConnection:
                    pass
                continue
            self.noActiveSince = None
            if kind == b"E":
                raise LockRejected(b" ".join(fields[3:]).decode("utf-8", "replace"))
            if kind != b"O" or len(fields) != 4 or not fields[2].isdigit():
                raise LockError(f"unexpected answer {b' '.join(fields)!r}")
            state = Observed(int(fields[2]), None if fields[3] == b"-"
                             else fields[3].decode("utf-8", "replace"))
            unchanged = state.token == self.token
            if unchanged and (self.deadline is None
                              or owner.clock.seconds() < self.deadline - 1e-6):
                again = slot  # an O shorter than our wait ran out: ask again
                continue
            self.result.callback(state)
            return


class Watch:
    """
    Tells C{callback} the state of a key now, then each change, until
    L{stop}; it asks again after a drop, a failover or a redirect.

    @ivar last: the last state told (None before the first).
    """

    log = Logger()

    def __init__(self, observe: Callable[[Optional[int], float], "Deferred[Observed]"],
                 callback: Callable[[Observed], object], clock: IReactorTime,
                 onError: Optional[Callable[[Exception], object]] = None) -> None:
        self._observe = observe
        self.callback = callback
        self.clock = clock
        self.onError = onError
        self.last: Optional[Observed] = None
        self.stopped = False
        self._current: "Optional[Deferred[Observed]]" = None
        self._retry: Optional[IDelayedCall] = None

    def start(self) -> "Watch":
        self._next()
        return self

    def _next(self) -> None:
        self._retry = None
        if self.stopped:
            return
        token = None if self.last is None else self.last.token
        d = self._current = self._observe(token, 0)
        d.addCallbacks(self._told, self._failed)

    def _told(self, state: Observed) -> None:
        self._current = None
        if self.stopped:
            return
        if self.last is None or state != self.last:
            self.last = state
            try:
                self.callback(state)
            except Exception:
                self.log.failure("a watch callback raised")
        self._next()

    def _failed(self, failure: object) -> None:
        self._current = None
        if self.stopped or getattr(failure, "check", lambda *a: None)(CancelledError):
            return
        error = getattr(failure, "value", None)
        if self.onError is not None and isinstance(error, Exception):
            self.onError(error)
        if isinstance(error, LockRejected) or (isinstance(error, NoConnection)
                                               and str(error) == "client closed"):
            self.stopped = True
            return
        self._retry = self.clock.callLater(WATCH_RETRY, self._next)

    def stop(self) -> None:
        self.stopped = True
        if self._retry is not None and self._retry.active():
            self._retry.cancel()
        self._retry = None
        current, self._current = self._current, None
        if current is not None:
            current.cancel()
