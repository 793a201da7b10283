# -*- test-case-name: tests.client.test_client -*-
"""
A granted lock, as the Deferred-returning client hands it out.
"""

from __future__ import annotations

from typing import Optional, Protocol, Union

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IDelayedCall

from lockservice.client.errors import LockError, LockLost

Share = Union[None, int, str]


class LockOwner(Protocol):
    """
    The client a L{Lock} was granted by (L{lockservice.client.api.LockClient}).
    """

    def renew(self, lock: "Lock", lease: Optional[float] = None) -> "Deferred[bool]": ...

    def release(self, lock: "Lock") -> "Deferred[bool]": ...

    def keepAlive(self, lock: "Lock") -> None: ...


class Lock:
    """
    A granted lock: its C{key} and fencing C{token}.

    Locks returned by L{LockClient.acquire} also know their C{lease}, the
    local time until which the client is sure the server still holds the
    grant (C{expires}, on the client's clock, counted from when the acquire
    or the last confirmed renewal was I{sent}), and have:

      - C{lost}: a Deferred that fires once, with a L{LockLost}, the moment
        the client can no longer be sure it holds the lock: a renewal was
        refused (C{STALE}), or C{expires} passed while renewals failed (or
        with no renewal at all).  It never fires after a release.
      - L{renew}, L{keepAlive}, L{stopKeepAlive}, L{release}.

    C{Lock(key, token)} built by hand (a token from elsewhere) can be
    released with L{LockClient.release}.
    """

    def __init__(self, key: str, token: int, lease: Optional[float] = None,
                 client: Optional[LockOwner] = None, share: Share = None) -> None:
        self.key = key
        self.token = token
        self.lease = lease
        # None (exclusive), "r" (a read lock) or the semaphore's slot count.
        self.share = share
        self.expires: Optional[float] = None
        self.lost: "Deferred[LockLost]" = Deferred()
        self.released = False
        self._client = client
        self._keepAlive = False
        self._renewCall: Optional[IDelayedCall] = None
        self._expiryCall: Optional[IDelayedCall] = None
        self._lastRenewError: Optional[str] = None

    def __repr__(self) -> str:
        if self.share is None:
            return f"Lock(key={self.key!r}, token={self.token})"
        return f"Lock(key={self.key!r}, token={self.token}, share={self.share!r})"

    @property
    def isLost(self) -> bool:
        return self.lost.called

    def _bound(self) -> LockOwner:
        if self._client is None:
            raise LockError("this Lock was built by hand; use client.release(lock)")
        return self._client

    def renew(self, lease: Optional[float] = None) -> "Deferred[bool]":
        """
        Renew now: the server's grant then runs C{lease} seconds (default:
        the acquire's lease) from when the renewal is received.

        @return: a Deferred firing True (C{OK}) or False (C{STALE}: the lock
            is lost, and C{lost} has fired); failing with L{LockRejected}
            (C{E}) or L{NoConnection} (no answer before C{expires}).
        """
        return self._bound().renew(self, lease)

    def keepAlive(self) -> None:
        """
        Renew automatically every third of the lease (each renewal retried
        every 200 ms across connections and redirects) until released or
        lost.
        """
        self._bound().keepAlive(self)

    def stopKeepAlive(self) -> None:
        self._keepAlive = False
        if self._renewCall is not None and self._renewCall.active():
            self._renewCall.cancel()
        self._renewCall = None

    def release(self) -> "Deferred[bool]":
        """
        Same as C{client.release(lock)}.
        """
        return self._bound().release(self)
