"""
The client's exceptions (re-exported by L{lockservice.client}).
"""

from __future__ import annotations


class LockError(Exception):
    """
    Base class of the client's errors.
    """


class LockTimeout(LockError):
    """
    No grant within the wait: the server answered C{T}, or (a stalled link)
    no answer arrived by C{wait} + 0.5 s.  Nothing is held.
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
    No connection could carry the request: none came up (refused, timed
    out, TLS handshake failed) or each one tried dropped.
    """


class ReleaseFailed(LockError):
    """
    A release could not be confirmed within its 5 s retry window; the lease
    will reclaim the key.
    """


class LockLost(LockError):
    """
    The value L{Lock.lost} fires with: the holder can no longer be sure it
    holds the lock.  C{reason} says why (a refused renewal, or the lease ran
    out on the client's clock while renewals failed).
    """

    def __init__(self, key: str, token: int, reason: str) -> None:
        super().__init__(f"lost the lock on {key!r} (token {token}): {reason}")
        self.key = key
        self.token = token
        self.reason = reason


class ForkedClient(LockError):
    """
    A client (of the blocking or asyncio face) made before a C{fork()} was
    used in the child: its connections belong to the parent.  Make a new
    client in the child.
    """


class ConnectionDropped(Exception):
    """
    The connection carrying a request closed before its answer arrived
    (internal: the client moves to another connection).
    """
