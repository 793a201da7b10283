# -*- test-case-name: tests.test_cluster -*-
"""
Peer connections: the handshake that proves knowledge of the shared
secret, then a line channel carrying cluster messages.

Peers use the client port.  The connecting node's first line is
C{HELLO}; both sides then prove they know the secret (HMAC-SHA256 over
both sides' nonces), so neither a stranger nor an impostor node gets in.

    connector                          acceptor
    HELLO 1 <entry> <nonceC>      ->
                                  <-   CHALLENGE <nonceS> <mac("acceptor", nonceC, nonceS)>
    AUTH <mac("connector", ...)>  ->
                                  <-   WELCOME
"""

from __future__ import annotations

import hmac
import os
from hashlib import sha256
from typing import Any, List, Optional
from typing import Protocol as TypingProtocol

from twisted.internet.interfaces import IDelayedCall, IReactorTime, ITransport
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from lockservice.tcp import noDelay


class ChannelOwner(TypingProtocol):
    """
    What a peer channel needs from the node that owns it: the cluster's
    configuration for the handshake, and a listener for channel events.
    """

    clock: IReactorTime
    log: Logger
    peers: List[bytes]
    me: int
    myEntry: bytes
    secret: bytes

    def indexOf(self, entry: bytes) -> Optional[int]: ...

    def channelUp(self, channel: "PeerChannel") -> None: ...

    def channelLost(self, channel: "PeerChannel") -> None: ...

    def peerMessage(self, channel: "PeerChannel", fields: List[bytes]) -> None: ...

PROTOCOL_VERSION = b"1"
HANDSHAKE_TIMEOUT = 5.0
MAX_PEER_LINE = 1 << 20


def _mac(secret: bytes, *parts: bytes) -> bytes:
    return hmac.new(secret, b"|".join(parts), sha256).hexdigest().encode()


def _nonce() -> bytes:
    return os.urandom(16).hex().encode()


class PeerChannel:
    """
    One peer connection, in either direction, once past the first line.

    @ivar remote: the peer's index in --peers (known after HELLO).
    @ivar outbound: True when this node opened the connection.
    @ivar replicating: (inbound only) the peer follows us and receives our
        replication stream on this channel.
    """

    def __init__(self, cluster: ChannelOwner, transport: ITransport, outbound: bool,
                 remote: Optional[int] = None) -> None:
        self.cluster = cluster
        self.transport = transport
        self.outbound = outbound
        self.remote = remote
        self.authenticated = False
        self.replicating = False
        self._buffer = b""
        self._step = "challenge" if outbound else "hello"
        self._nonce = _nonce()
        self._theirNonce = b""
        self._timeout: Optional[IDelayedCall] = cluster.clock.callLater(
            HANDSHAKE_TIMEOUT, self._refuse, b"handshake timed out"
        )

    # -- handshake ---------------------------------------------------------

    def sendHello(self) -> None:
        self.send(b"HELLO " + PROTOCOL_VERSION + b" " + self.cluster.myEntry + b" " + self._nonce)

    def _handshake(self, fields: List[bytes]) -> None:
        secret = self.cluster.secret
        if self._step == "hello":
            if len(fields) != 4 or fields[0] != b"HELLO" or fields[1] != PROTOCOL_VERSION:
                return self._refuse(b"bad peer hello")
            remote = self.cluster.indexOf(fields[2])
            if remote is None or remote == self.cluster.me:
                return self._refuse(b"not a peer of this cluster")
            self.remote = remote
            self._theirNonce = fields[3]
            self.send(b"CHALLENGE " + self._nonce + b" "
                      + _mac(secret, b"acceptor", self._theirNonce, self._nonce))
            self._step = "auth"
        elif self._step == "auth":
            expected = _mac(secret, b"connector", self._nonce, self._theirNonce,
                            self.cluster.peers[self.remote or 0])
            proven = len(fields) == 2 and fields[0] == b"AUTH"
            if not proven or not hmac.compare_digest(fields[1], expected):
                return self._refuse(b"peer authentication failed")
            self.send(b"WELCOME")
            self._authenticated()
        elif self._step == "challenge":
            if len(fields) != 3 or fields[0] != b"CHALLENGE":
                return self._refuse(b"bad challenge")
            expected = _mac(secret, b"acceptor", self._nonce, fields[1])
            if not hmac.compare_digest(fields[2], expected):
                return self._refuse(b"peer authentication failed")
            self.send(b"AUTH " + _mac(secret, b"connector", fields[1], self._nonce,
                                      self.cluster.myEntry))
            self._step = "welcome"
        elif self._step == "welcome":
            if fields != [b"WELCOME"]:
                return self._refuse(b"not welcomed")
            self._authenticated()

    def _authenticated(self) -> None:
        self.authenticated = True
        self._cancelTimeout()
        self.cluster.channelUp(self)

    def _refuse(self, why: bytes) -> None:
        self._cancelTimeout()
        self.cluster.log.warn(
            "refused peer connection {peer}: {why}",
            peer=self.transport.getPeer(), why=why.decode(),  # type: ignore[attr-defined]
        )
        self.transport.write(b"E * * " + why + b"\n")
        self.transport.loseConnection()  # type: ignore[attr-defined]

    def _cancelTimeout(self) -> None:
        if self._timeout is not None and self._timeout.active():
            self._timeout.cancel()
        self._timeout = None

    # -- lines -------------------------------------------------------------

    def send(self, line: bytes) -> None:
        self.transport.write(line + b"\n")

    def sendMany(self, lines: List[bytes]) -> None:
        if lines:
            self.transport.write(b"\n".join(lines) + b"\n")

    def dataReceived(self, data: bytes) -> None:
        lines = (self._buffer + data).split(b"\n")
        self._buffer = lines.pop()
        if len(self._buffer) > MAX_PEER_LINE:
            return self._refuse(b"peer line too long")
        for line in lines:
            if self.transport.disconnecting:  # type: ignore[attr-defined]
                return
            fields = line.rstrip(b"\r").split(b" ")
            if not self.authenticated:
                self._handshake(fields)
            else:
                self.cluster.peerMessage(self, fields)

    def connectionLost(self, reason: Failure) -> None:
        self._cancelTimeout()
        if self.authenticated:
            self.cluster.channelLost(self)


class PeerClientProtocol(Protocol):
    """
    The connecting side of a peer link (driven by a ClientService).
    """

    def __init__(self, cluster: ChannelOwner, remote: int) -> None:
        self.cluster = cluster
        self.remote = remote
        self.channel: Optional[PeerChannel] = None

    def connectionMade(self) -> None:
        assert self.transport is not None
        noDelay(self.transport)
        self.channel = PeerChannel(self.cluster, self.transport, outbound=True, remote=self.remote)
        self.channel.sendHello()

    def dataReceived(self, data: bytes) -> None:
        if self.channel is not None:
            self.channel.dataReceived(data)

    def connectionLost(self, reason: Failure = Failure(ConnectionError())) -> None:
        if self.channel is not None:
            self.channel.connectionLost(reason)


def acceptChannel(cluster: ChannelOwner, transport: Any, hello: bytes) -> PeerChannel:
    """
    Turn a client connection whose first line was C{HELLO} into a peer channel.
    """
    channel = PeerChannel(cluster, transport, outbound=False)
    channel._handshake(hello.rstrip(b"\r").split(b" "))
    return channel
