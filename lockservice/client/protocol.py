# -*- test-case-name: tests.client.test_client -*-
"""
One client connection: the line protocol of the client port, pipelined.

Requests are written at once; answers are paired with requests by the
echoed (op, key) -- in send order for equal pairs -- because a server may
answer different pairs in any order.  Like Twisted's memcache client,
every request still pending when the connection closes fails.
"""

from __future__ import annotations

from collections import deque
from typing import Deque, Dict, List, Optional, Tuple

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import INegotiated
from twisted.protocols.basic import LineOnlyReceiver
from twisted.python.failure import Failure

from lockservice.client.errors import ConnectionDropped
from lockservice.core.groupwire import OPS as GROUP_OPS
from lockservice.tcp import noDelay

Fields = List[bytes]


def pairOf(fields: Fields) -> Optional[Tuple[bytes, bytes]]:
    """
    The (op, key) of the request an answer line answers, or None for a line
    that answers nothing we could have sent.
    """
    kind = fields[0]
    if kind in (b"A", b"T") and len(fields) >= 2:
        return (b"A", fields[1])
    if kind in (b"R", b"N", b"C", b"O") and len(fields) >= 2:
        return (kind, fields[1])
    if kind in (b"P", b"I") and len(fields) == 2:
        return (kind, fields[1])
    if kind in GROUP_OPS and len(fields) >= 2:
        return (kind, fields[1])  # the group extension (see core/groupwire.py)
    if kind in (b"M", b"E") and len(fields) >= 3:
        return (fields[1], fields[2])
    return None


class LockClientProtocol(LineOnlyReceiver):
    """
    One connection.  C{ready} fires when requests may be sent: at once on
    plain TCP; on TLS once the node has answered a first request (C{I name},
    or a C{P} when unnamed).  Over TLS 1.3 a client learns that the node
    refused its certificate only after its side of the handshake is done,
    so "handshake completed" would count a refused connection as up.  A
    connection closed before C{ready} is a failed connection attempt for
    the pool, not a drop.  C{lost} fires when the connection is closed.

    @ivar name: sent as C{I <name>} first on the connection, when given.
    """

    delimiter = b"\n"
    MAX_LENGTH = 65536
    PROBE = b"lockservice-client"

    def __init__(self, name: Optional[bytes] = None) -> None:
        self._pending: Dict[Tuple[bytes, bytes], Deque["Deferred[Fields]"]] = {}
        # Who waits for a pair to have nothing outstanding (see whenIdle).
        self._idle: Dict[Tuple[bytes, bytes], List["Deferred[None]"]] = {}
        self.name = name
        self.ready: "Deferred[LockClientProtocol]" = Deferred()
        self.lost: "Deferred[None]" = Deferred()
        self.lostReason: Optional[Failure] = None
        self.isReady = False
        self.closing = False

    def connectionMade(self) -> None:
        noDelay(self.transport)
        tls = INegotiated.providedBy(self.transport)
        first: "Optional[Deferred[Fields]]" = None
        if self.name is not None and not tls:
            # The answer only confirms; nothing waits for it on plain TCP
            # (so it never holds a retiring connection open either).
            self.transport.write(b"I " + self.name + b"\n")  # type: ignore[union-attr]
        elif self.name is not None:
            first = self.request(b"I", self.name, b"I " + self.name + b"\n")
        elif tls:
            first = self.request(b"P", self.PROBE, b"P " + self.PROBE + b"\n")
        if tls and first is not None:
            first.addCallback(lambda _: self._becomeReady())
        if first is not None:
            first.addErrback(lambda f: None)
        if not tls:
            self._becomeReady()

    def _becomeReady(self) -> None:
        if not self.isReady:
            self.isReady = True
            self.ready.callback(self)

    @property
    def pendingCount(self) -> int:
        return sum(len(q) for q in self._pending.values())

    def outstanding(self, op: bytes, key: bytes) -> bool:
        """
        Whether a request of C{(op, key)} waits for its answer here.
        """
        return (op, key) in self._pending

    def whenIdle(self, op: bytes, key: bytes) -> "Deferred[None]":
        """
        Fires once no request of C{(op, key)} waits for its answer here
        (answered, or the connection closed).
        """
        d: "Deferred[None]" = Deferred()
        if (op, key) not in self._pending:
            d.callback(None)
        else:
            self._idle.setdefault((op, key), []).append(d)
        return d

    def _wakeIdle(self, pair: Tuple[bytes, bytes]) -> None:
        for d in self._idle.pop(pair, ()):
            d.callback(None)

    def request(self, op: bytes, key: bytes, line: bytes) -> "Deferred[Fields]":
        """
        Send C{line}; the Deferred fires with the answer's fields, or fails
        with L{ConnectionDropped}.
        """
        d: "Deferred[Fields]" = Deferred()
        if self.lostReason is not None:
            d.errback(ConnectionDropped(str(self.lostReason.value)))
            return d
        self._pending.setdefault((op, key), deque()).append(d)
        self.transport.write(line)  # type: ignore[union-attr]
        return d

    def retire(self) -> None:
        """
        Close this connection without losing an answer already decided:
        shut down our sending side only (the server then withdraws our queued
        acquires, writes every answer it has decided -- a grant included --
        and closes).  Closing at once would discard a grant in flight and
        leave it held by nobody until its lease ran out.
        """
        if self.closing:
            return
        self.closing = True
        transport = self.transport
        if transport is None:
            return
        if not self._pending:
            transport.loseConnection()
            return
        # Not on TLS: its wrapper would forward this to the TCP socket under
        # it and cut the TLS stream without a close_notify.
        loseWrite = getattr(transport, "loseWriteConnection", None)
        if loseWrite is None or INegotiated.providedBy(transport):
            transport.loseConnection()
        else:
            loseWrite()

    def lineReceived(self, line: bytes) -> None:
        fields = line.rstrip(b"\r").split(b" ")
        pair = pairOf(fields)
        if pair is None:
            return
        queue = self._pending.get(pair)
        if not queue and fields[0] == b"E":
            # An error we cannot pair exactly: fail the oldest request of its op.
            for candidatePair, candidates in self._pending.items():
                if candidates and fields[1] in (candidatePair[0], b"*"):
                    pair, queue = candidatePair, candidates
                    break
        if not queue:
            return
        d = queue.popleft()
        if not queue:
            del self._pending[pair]
        d.callback(fields)
        if pair not in self._pending and pair in self._idle:
            self._wakeIdle(pair)
        if self.closing and not self._pending and self.transport is not None:
            self.transport.loseConnection()

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        # Tell the pool first, so that a request failed below and re-sent
        # at once (synchronously) does not pick this connection again.
        self.lostReason = reason
        self.lost.callback(None)
        pending, self._pending = self._pending, {}
        for queue in pending.values():
            for d in queue:
                d.errback(ConnectionDropped(str(reason.value)))
        for pair in list(self._idle):
            self._wakeIdle(pair)
