# -*- test-case-name: tests.client.test_client_keepalive -*-
"""
The locks a client holds: until when it is sure the node still holds each
(counted from when the acquire or the last confirmed renewal was sent, on
the client's clock), their keep-alive renewals, and the moment it must tell
a holder the lock is lost.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple

from twisted.internet.defer import Deferred

from lockservice.client.errors import LockLost
from lockservice.client.lock import Lock
from lockservice.client.timers import Timers


class Holdings:
    """
    @ivar renew: sends one renewal of a lock (the client's C{renew}).
    """

    def __init__(self, timers: Timers, renew: Callable[[Lock], "Deferred[bool]"],
                 log: Any) -> None:
        self.timers = timers
        self.renew = renew
        self.log = log
        self._held: Dict[Tuple[str, int], Lock] = {}

    def hold(self, lock: Lock, sentAt: float, keepAlive: bool) -> None:
        """
        C{lock} was granted to an acquire sent at C{sentAt}.
        """
        assert lock.lease is not None
        self._held[(lock.key, lock.token)] = lock
        if sentAt + lock.lease > self.timers.clock.seconds():
            self.confirmed(lock, sentAt)
        # else: the grant came after its lease, counted from the send, had
        # run out (a long wait in the queue): we cannot be sure we hold it.
        # A keep-alive renews at once; without one the lock is lost now.
        if keepAlive:
            self.startKeepAlive(lock)
        elif lock.expires is None:
            self.lose(lock, "the grant arrived after its lease (counted from the acquire's "
                            "send) had run out; renew at once or use keepAlive")

    def confirmed(self, lock: Lock, sentAt: float, lease: Optional[float] = None) -> None:
        """
        The node holds the grant until at least C{sentAt + lease}.
        """
        lease = lock.lease if lease is None else lease
        assert lease is not None
        expires = sentAt + lease
        if lock.expires is not None and expires <= lock.expires:
            return
        lock.expires = expires
        if self._held.get((lock.key, lock.token)) is not lock:
            return  # a lock this client does not hold (a token from elsewhere)
        self.timers.cancel(lock._expiryCall)
        lock._expiryCall = self.timers.later(expires - self.timers.clock.seconds(),
                                             lambda: self._expired(lock))

    def _expired(self, lock: Lock) -> None:
        lock._expiryCall = None
        if lock.released:
            return
        if lock._keepAlive or lock._lastRenewError:
            why = lock._lastRenewError or "no answer"
            self.lose(lock, f"the lease ran out on the client's clock while renewals "
                            f"failed ({why})")
        else:
            self.lose(lock, "the lease ran out (no renewal)")

    def lose(self, lock: Lock, reason: str) -> None:
        """
        The client can no longer be sure it holds C{lock}: tell its holder
        (C{lock.lost}), once, unless it was released.
        """
        self._stopWatching(lock)
        self._held.pop((lock.key, lock.token), None)
        if not lock.lost.called and not lock.released:
            self.log.warn("{lost}", lost=str(LockLost(lock.key, lock.token, reason)))
            lock.lost.callback(LockLost(lock.key, lock.token, reason))

    def released(self, lock: Lock) -> None:
        """
        C{lock} is being released: no renewal is sent after this, and it is
        never reported lost.
        """
        for tracked in (lock, self._held.pop((lock.key, lock.token), None)):
            if tracked is not None:
                tracked.released = True
                self._stopWatching(tracked)

    def _stopWatching(self, lock: Lock) -> None:
        lock.stopKeepAlive()
        self.timers.cancel(lock._expiryCall)
        lock._expiryCall = None

    def startKeepAlive(self, lock: Lock) -> None:
        if lock.released or lock.isLost or lock._keepAlive:
            return
        lock._keepAlive = True
        self.scheduleRenewal(lock)

    def scheduleRenewal(self, lock: Lock) -> None:
        """
        The next keep-alive renewal: a third of the lease after the last
        confirmed send (at once when nothing is confirmed).
        """
        if not lock._keepAlive or lock.released or lock.isLost:
            return
        assert lock.lease is not None
        if lock._renewCall is not None and lock._renewCall.active():
            self.timers.cancel(lock._renewCall)
        if lock.expires is None:
            delay = 0.0
        else:
            delay = lock.expires - lock.lease * 2 / 3 - self.timers.clock.seconds()

        def due() -> None:
            lock._renewCall = None
            self.renew(lock).addErrback(lambda f: None)  # told through lock.lost

        lock._renewCall = self.timers.later(delay, due)

    def close(self) -> None:
        """
        The client closes: every keep-alive and expiry watch stops.
        """
        for lock in list(self._held.values()):
            self._stopWatching(lock)
        self._held.clear()
