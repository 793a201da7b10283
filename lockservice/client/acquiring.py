# -*- test-case-name: tests.client.test_client -*-
"""
One acquire, from its first send to its end: granted, timed out, refused,
or withdrawn when its caller gives up.

An acquire is sent on a connection that carries no other acquire of its
key (at most one outstanding C{A} per key per connection, so a C{C} always
means the request it should).  It moves to the next connection when its
connection drops (an error only after as many tries as there are
connections), follows C{M} redirects to the active node, and retries
C{M ... *} (no active node known) until its wait runs out (10 s when it
waits for ever).

Giving up -- C{Deferred.cancel()}, an asyncio task's cancellation, a
timeout the caller sets, Ctrl+C in blocking code, or no answer from a
stalled node by the wait plus L{ACQUIRE_GRACE} -- ends the acquire at once
and withdraws it from the node's queue with C{C <key>}; a grant that
crossed the withdrawal is released at once.  An acquire given up before it
was sent is never sent.
"""

from __future__ import annotations

from typing import Optional, Protocol, Set

from twisted.internet.defer import CancelledError, Deferred
from twisted.internet.interfaces import IDelayedCall, IReactorTime

from lockservice.client.errors import ConnectionDropped, LockRejected, LockTimeout, NoConnection
from lockservice.client.holding import Holdings
from lockservice.client.lock import Lock, Share
from lockservice.client.pool import Pool, Slot, Tries
from lockservice.client.protocol import Fields, LockClientProtocol
from lockservice.client.timers import Timers
from lockservice.core import wire

# A stalled node (no answer at all) ends an acquire this long after its
# wait ran out.
ACQUIRE_GRACE = 0.5
# An acquire that finds no connection up waits this long for one.
CONNECT_WAIT = 5.0
# M ... * (no active node known right now): asked again this often, for
# the acquire's wait, or this long when it waits for ever.
NO_ACTIVE_RETRY = 0.1
NO_ACTIVE_FOR = 10.0
MAX_REDIRECTS = 20


class AcquireOwner(Protocol):
    """
    What an acquire needs of its client (L{lockservice.client.api.LockClient}).
    """

    clock: IReactorTime
    closed: bool
    _acquiring: Set["Deferred[Lock]"]

    timers: Timers
    holdings: Holdings

    def release(self, lock: Lock) -> "Deferred[bool]": ...



def secondsField(value: float, name: str) -> bytes:
    return wire.formatSeconds(wire.checkSeconds(value, name, positive=False))


class Acquire:
    """
    One acquire request and its answer.

    @ivar result: fires with the L{Lock}, or fails with L{LockTimeout},
        L{LockRejected}, L{NoConnection} or (cancelled) C{CancelledError}.
    @ivar carrier: the connection our C{A} is outstanding on now, or None.
    """

    def __init__(self, owner: AcquireOwner, pool: Pool, key: bytes, lease: float,
                 wait: float, share: Share, shareField: bytes, keepAlive: bool) -> None:
        self.owner = owner
        self.pool = pool
        self.key = key
        self.keyText = key.decode("utf-8")
        self.lease = lease
        self.wait = wait
        self.share = share
        self.shareField = shareField
        self.keepAlive = keepAlive
        self.leaseField = secondsField(lease, "lease")
        self.waitField = secondsField(wait, "wait")
        self.deadline = owner.clock.seconds() + wait if wait > 0 else None
        self.result: "Deferred[Lock]" = Deferred(lambda d: self.giveUp(CancelledError()))
        self.carrier: Optional[LockClientProtocol] = None
        self.sends = 0
        # Since when the cluster answers M ... * (no active known), or None.
        self.noActiveSince: Optional[float] = None
        self.guard: Optional[IDelayedCall] = None
        # The withdrawal (C) sent when the caller gave up, until answered.
        self.withdrawal: "Optional[Deferred[Fields]]" = None

    def start(self) -> "Deferred[Lock]":
        owner = self.owner
        owner._acquiring.add(self.result)

        def settled(value: object) -> object:
            owner._acquiring.discard(self.result)
            owner.timers.cancel(self.guard)
            return value

        self.result.addBoth(settled)
        if self.deadline is not None:
            self.guard = owner.timers.later(self.wait + ACQUIRE_GRACE, self._noAnswer)
        Deferred.fromCoroutine(self._run())
        return self.result

    # -- giving up ---------------------------------------------------------

    def giveUp(self, error: Exception) -> None:
        """
        The caller stops waiting: end with C{error}, and withdraw the
        request from the node's queue (C{C}) if it is out.
        """
        if self.result.called:
            return
        carrier = self.carrier
        if carrier is not None and carrier.lostReason is None:
            self.withdrawal = carrier.request(b"C", self.key, b"C " + self.key + b"\n")
            self.withdrawal.addErrback(lambda f: None)
        # After the withdrawal is out: whoever waits on the result may
        # want to know whether one was sent (L{whenSettled}).
        self.result.errback(error)

    def whenSettled(self, within: float) -> "Deferred[None]":
        """
        Fires once the node has answered the withdrawal, if one was sent
        (so a grant that crossed it has been read, and is being released),
        or after C{within} seconds at the latest.
        """
        settled: "Deferred[None]" = Deferred()
        if self.withdrawal is None or self.withdrawal.called:
            settled.callback(None)
            return settled
        def done(_: object = None) -> None:
            self.owner.timers.cancel(call)
            if not settled.called:
                settled.callback(None)

        call = self.owner.timers.later(within, done)
        self.withdrawal.addBoth(done)
        return settled

    def _noAnswer(self) -> None:
        self.guard = None
        if self.noActiveSince is not None:
            self.giveUp(NoConnection(f"no active node within {self.wait:g} s "
                                     "(the cluster answers M *)"))
        elif self.carrier is not None:
            self.giveUp(LockTimeout(f"no answer for {self.keyText!r} within {self.wait:g} s "
                                    f"(+{ACQUIRE_GRACE:g} s)"))
        else:
            self.giveUp(NoConnection(f"no connection within {self.wait:g} s: "
                                     f"{self.pool.lastError()}"))

    # -- sending -----------------------------------------------------------

    def _line(self) -> bytes:
        # A request re-sent after a drop or a redirect asks only for the
        # wait that is left, so the whole acquire stays bounded.  The first
        # asks for the wait given, exactly: a try (wait 0.000001) would
        # otherwise be spent before it is even sent.
        self.sends += 1
        if self.deadline is None:
            wait = b"0"
        elif self.sends == 1:
            wait = self.waitField
        else:
            wait = secondsField(max(self.deadline - self.owner.clock.seconds(), 0.001), "wait")
        return b"A " + self.key + b" " + self.leaseField + b" " + wait + self.shareField + b"\n"

    async def _run(self) -> None:
        try:
            await self._attempt()
        except Exception as e:
            if not self.result.called:
                self.result.errback(e)

    async def _attempt(self) -> None:
        owner, pool = self.owner, self.pool
        tries = Tries(pool)
        redirects = 0
        # The deadline ends re-sends only: the first try goes out, once a
        # connection carries it (the guard bounds the wait for one).
        tried = False
        # The connection to try again (after a redirect, or M *).
        again: Optional[Slot] = None
        while True:
            if self.result.called:
                return  # given up before (re)sending: never sent
            if owner.closed:
                raise NoConnection("client closed")
            now = owner.clock.seconds()
            self._checkBounds(now, tried)
            slot: Optional[Slot]
            if (again is not None and again.protocol is not None
                    and not again.protocol.outstanding(b"A", self.key)):
                slot, busy = again, None
            else:
                slot, busy = pool.pickFor(b"A", self.key)
            again = None
            if slot is None:
                if busy is not None:
                    await busy  # our other acquire of this key comes first
                else:
                    await pool.whenConnected(CONNECT_WAIT)
                continue
            protocol, address = slot.protocol, slot.address
            assert protocol is not None
            tried = True
            self.carrier = protocol
            try:
                fields = await protocol.request(b"A", self.key, self._line())
            except ConnectionDropped:
                tries.dropped(address)
                continue
            finally:
                self.carrier = None
            if self.result.called:
                self._crossed(fields)
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
            if kind != b"A" or len(fields) < 3:
                raise LockTimeout(f"no grant for {self.keyText!r} within {self.wait:g} s")
            lock = Lock(self.keyText, int(fields[2]), self.lease, owner, self.share)  # type: ignore[arg-type]
            owner.holdings.hold(lock, now, self.keepAlive)
            self.result.callback(lock)
            return

    def _checkBounds(self, now: float, tried: bool) -> None:
        if self.noActiveSince is not None:
            if (self.deadline is not None and now >= self.deadline) or (
                    self.deadline is None and now - self.noActiveSince >= NO_ACTIVE_FOR):
                raise NoConnection("no active node (the cluster answers M *)")
        elif tried and self.deadline is not None and now >= self.deadline:
            raise LockTimeout(f"no grant for {self.keyText!r} within {self.wait:g} s")

    def _crossed(self, fields: Fields) -> None:
        """
        The answer to a request given up meanwhile: a grant that crossed
        the withdrawal is released at once.
        """
        if fields[0] == b"A" and len(fields) >= 3:
            lock = Lock(self.keyText, int(fields[2]), self.lease, self.owner,  # type: ignore[arg-type]
                        self.share)
            self.owner.release(lock).addErrback(lambda f: None)
