# -*- test-case-name: tests.cli.test_cli -*-
"""
C{lockservice shell}: an interactive line session with one node, so that no
C{nc} is needed (and TLS works as it does for the client library).

Every line read from standard input is sent as it is; every line the node
sends is printed as it arrives (answers to pipelined requests may come in
any order, as the protocol allows).  At the end of input the session ends
as C{printf ... | nc -N} would: our sending side is shut down, so the node
withdraws this connection's queued acquires, writes the answers it has
decided, and closes.  Over TLS, which has no half-close, the session ends
once every request has been answered.
"""

from __future__ import annotations

import sys
from typing import Any, Optional

from twisted.internet.defer import Deferred
from twisted.internet.endpoints import connectProtocol
from twisted.internet.interfaces import INegotiated
from twisted.protocols.basic import LineOnlyReceiver
from twisted.python.failure import Failure

from lockservice.client.pool import describe

BANNER = """\
connected to {address}{tls} as {name}
type requests, one per line; answers are printed as they arrive:
  A <key> <lease> <wait>     acquire            R <key> <token>           release
  N <key> <token> <lease>    renew              P <word>                  ping
  I <name>                   name this connection
end with Ctrl+D (queued acquires are then withdrawn)"""


class _NodeSide(LineOnlyReceiver):
    """
    The connection to the node: prints what it says.
    """

    delimiter = b"\n"
    MAX_LENGTH = 65536

    def __init__(self, session: "_Session") -> None:
        self.session = session

    def connectionMade(self) -> None:
        self.session.nodeUp(self)

    def lineReceived(self, line: bytes) -> None:
        self.session.answer(line.rstrip(b"\r"))

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        self.session.nodeGone(reason)


class _InputSide(LineOnlyReceiver):
    """
    Standard input: each line is a request.
    """

    delimiter = b"\n"
    MAX_LENGTH = 65536

    def __init__(self, session: "_Session") -> None:
        self.session = session

    def lineReceived(self, line: bytes) -> None:
        self.session.request(line.rstrip(b"\r"))

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        self.session.inputEnded()


class _Session:
    def __init__(self, name: bytes, out: Any) -> None:
        self.name = name
        self.out = out
        self.node: Optional[_NodeSide] = None
        self.outstanding = 0
        self.swallowName = True
        self.inputDone = False
        self.answered = False
        self.done: "Deferred[int]" = Deferred()

    def nodeUp(self, node: _NodeSide) -> None:
        self.node = node
        # Name the connection first; its answer is not shown.
        node.sendLine(b"I " + self.name)

    def request(self, line: bytes) -> None:
        if self.node is None or self.node.transport is None:
            return
        if line.strip():
            self.outstanding += 1
        self.node.sendLine(line)

    def answer(self, line: bytes) -> None:
        self.answered = True
        if self.swallowName:
            self.swallowName = False
            if line == b"I " + self.name or line.startswith(b"E "):
                return
        self.outstanding = max(self.outstanding - 1, 0)
        self.out.write(line + b"\n")
        self.out.flush()
        self._maybeClose()

    def inputEnded(self) -> None:
        self.inputDone = True
        node = self.node
        if node is None or node.transport is None:
            return
        if INegotiated.providedBy(node.transport):
            self._maybeClose()
        else:
            node.transport.loseWriteConnection()  # type: ignore[attr-defined]

    def _maybeClose(self) -> None:
        if (self.inputDone and self.outstanding == 0 and self.node is not None
                and self.node.transport is not None
                and INegotiated.providedBy(self.node.transport)):
            self.node.transport.loseConnection()

    def nodeGone(self, reason: Failure) -> None:
        node = self.node
        if not self.answered and not self.done.called:
            # Closed before its first answer: under TLS 1.3 that is how a
            # node refuses a client certificate (after the handshake).
            tls = node is not None and INegotiated.providedBy(node.transport)
            self.done.errback(ConnectionError(
                f"{'TLS handshake failed' if tls else 'the node closed the connection'}: "
                f"{describe(reason.value)}"))
            return
        if not self.inputDone:
            print("lockservice: the node closed the connection", file=sys.stderr)
        if not self.done.called:
            self.done.callback(0)


async def runShell(reactor: Any, address: str, tls: Any, name: str,
                   interactive: bool) -> int:
    """
    Run one session against C{address}.

    @raise ConnectionError: the node cannot be reached.
    """
    from twisted.internet import stdio

    from lockservice.client.endpoints import endpointFactory

    session = _Session(name.encode("utf-8"), sys.stdout.buffer)
    endpoint = endpointFactory(reactor, tls)(address)
    try:
        await connectProtocol(endpoint, _NodeSide(session))
    except Exception as e:
        raise ConnectionError(f"cannot reach {address}: {e}") from None
    if interactive:
        print(BANNER.format(address=address, tls=" (TLS)" if tls else "", name=name),
              file=sys.stderr)
    stdio.StandardIO(_InputSide(session), reactor=reactor)
    return await session.done
