# -*- test-case-name: tests.cluster.test_peer -*-
"""
Peer connections: the handshake that proves knowledge of the shared
secret, then a line channel carrying cluster messages.

Peers use the client port.  The connecting node's first line is
C{HELLO} (every line is built in L{lockservice.cluster.peerwire}).  Every
proof is an HMAC-SHA256 under the shared secret over the same transcript:
who connects (C), whom it means to reach (A), and both sides' fresh
nonces; a label names the step, and so its direction:

    connector C                                    acceptor A
    HELLO <lo>-<hi> <C> <A> <nonceC>          ->
                                              <-   CHALLENGE <v> <nonceA> <mac("challenge")>
    AUTH <mac("auth")>                        ->
                                              <-   WELCOME <mac("welcome")>

The peer protocol has versions: C{HELLO} says the range the connector
speaks, and the acceptor picks the newest version both speak (C{<v>}, in
the transcript of every proof, so nobody can talk the link down to
another one).  A peer with no version in common is refused, once in the
log and on C{/status} (C{/ready} says so too), never silently: nodes of
adjacent releases speak a common version, so a cluster is upgraded one
node at a time.  Version 3 is that of lockservice 0.2; 0.1 spoke 2 only
(and wrote a bare C{2}), so an upgrade from 0.1 is a full restart.

Why each part is there:
  - both nonces: a recorded handshake fails against a new nonce (replay);
  - both identities: a stranger that binds the port of a peer that is
    down cannot relay one node's HELLO to another node, since the proofs
    name the node each side meant to talk to (reflection, relay);
  - the step labels: one side's proof is never a valid proof for the
    other side or another step;
  - an authenticated WELCOME: the connector only trusts a link whose
    acceptor has proven the secret on the whole transcript.
"""

from __future__ import annotations

import hmac
import os
from errno import EPIPE
from hashlib import sha256
from typing import Any, List, Optional, Set, Tuple
from typing import Protocol as TypingProtocol

from twisted.internet.error import ConnectionDone
from twisted.internet.interfaces import IDelayedCall, IReactorTime, ITransport
from twisted.internet.protocol import Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from lockservice.cluster import peerwire
from lockservice.internals import plainSocket, readWaiting, unsentProbe, watchSocketError
from lockservice.tcp import noDelay

# The peer protocol versions this node speaks, oldest and newest.
PROTOCOL_VERSIONS = (3, 3)
HANDSHAKE_TIMEOUT = 5.0
MAX_PEER_LINE = 1 << 20

# Read pacing on the links this node dialled (a standby's link to its
# active, which carries the replication stream).  A busy active writes to
# each standby once per reactor turn, thousands of times a second; woken
# for every write, a standby spends far more CPU on wake-ups than on the
# changes (about 50 us each on a 2-core box, as much as the active spends
# on the whole request), CPU that the active may need.  So when a small
# read follows the previous one within READ_PACE, the link stops reading
# for READ_PACE: what arrives meanwhile waits in the kernel's socket buffer
# (where the active's "replicate before answer" already put it) and is
# read in one go.  At most READ_PACE is added to seeing a change, a
# handoff or the active's death, against a --peer-timeout of a second; a
# big read (a snapshot, a backlog) never pauses, nor do heartbeats alone.
READ_PACE = 0.002
PACE_READS_BELOW = 16384

# Why a handshake failed, as told to the owner (see ChannelOwner.handshakeFailed).
MISMATCH = "secret mismatch"


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
    # Every secret a peer may prove: ours first, then one being rotated in
    # or out (--accept-secret).
    acceptedSecrets: Tuple[bytes, ...]

    def indexOf(self, entry: bytes) -> Optional[int]: ...

    def channelUp(self, channel: "PeerChannel") -> None: ...

    def channelLost(self, channel: "PeerChannel", clean: bool) -> None: ...

    def peerLines(self, channel: "PeerChannel", lines: List[bytes]) -> None: ...

    def handshakeFailed(self, remote: int, outbound: bool, why: str,
                        source: str = "") -> None: ...

    def handshakeRefused(self, source: str, why: str) -> None: ...

    def versionRefused(self, remote: int, theirs: Optional[Tuple[int, int]]) -> None: ...


def versionRange(field: bytes) -> Optional[Tuple[int, int]]:
    """
    C{lo-hi} (or a bare C{v}, as lockservice 0.1 wrote it) as a range.
    """
    lo, _, hi = field.partition(b"-")
    if not lo.isdigit() or not (hi.isdigit() or not hi) or len(field) > 20:
        return None
    low, high = int(lo), int(hi or lo)
    return (low, high) if low <= high else None


def commonVersion(theirs: Tuple[int, int], ours: Tuple[int, int]) -> Optional[int]:
    """
    The newest version both ranges hold, or None.
    """
    newest = min(theirs[1], ours[1])
    return newest if newest >= max(theirs[0], ours[0]) else None


def proof(secret: bytes, step: bytes, connector: bytes, acceptor: bytes,
          nonceC: bytes, nonceA: bytes) -> bytes:
    """
    The MAC one side sends at C{step} (challenge, auth or welcome) of a
    handshake between C{connector} and C{acceptor} (their --peers entries).
    """
    transcript = b"\n".join([b"lockservice-peer-2", step, connector, acceptor, nonceC, nonceA])
    return hmac.new(secret, transcript, sha256).hexdigest().encode()


def _nonce() -> bytes:
    return os.urandom(16).hex().encode()


def _isNonce(field: bytes) -> bool:
    return len(field) == 32 and all(c in b"0123456789abcdef" for c in field)


class PeerChannel:
    """
    One peer connection, in either direction, once past the first line.

    @ivar remote: the peer's index in --peers (known after HELLO).
    @ivar outbound: True when this node opened the connection.
    @ivar replicating: (inbound only) the peer follows us and receives our
        replication stream on this channel.
    @ivar lastReceived: when a line last arrived (silence detection).
    @ivar closing: set when this node closed the link itself, so its loss
        says nothing about the peer.
    """

    def __init__(self, cluster: ChannelOwner, transport: ITransport, outbound: bool,
                 remote: Optional[int] = None) -> None:
        self.cluster = cluster
        self.transport = transport
        self.outbound = outbound
        self.remote = remote
        self.authenticated = False
        # The peer protocol version this link speaks (chosen in the handshake).
        self.version = PROTOCOL_VERSIONS[1]
        self.replicating = False
        self.synced = False
        # (inbound) the follower says it applied our snapshot (SYNCED).
        self.applied = False
        self.snapshot: Optional[Any] = None
        # (inbound) the MERGE lines that follow repeat a stream we already
        # have whole (see Healing.offered).
        self.staleOffer = False
        # The grants an offer from further in the stream we took over
        # holds, gathered until its SYNC (see Healing.offerEnded), or None.
        self.furtherOffer: Optional[Set[Tuple[bytes, int]]] = None
        self.closing = False
        # (replication) since when a follower has left our writes unread,
        # and whether we cut it off for that.
        self.behindSince: Optional[float] = None
        # The stream position this follower acknowledged (--replication ack).
        self.acked = 0
        # Whether reads are paced (see READ_PACE); off when every read must
        # be acknowledged at once.
        self.paced = True
        self.lagging = False
        self.socketError = 0
        self.tcpReason: Optional[Failure] = None
        watchSocketError(transport, self._socketError)
        # Where replication may write straight to the kernel (plain TCP),
        # and whether what we wrote has left this host (see Stream.caughtUp).
        self.socket = plainSocket(transport)
        self.leftUnsent = unsentProbe(transport)
        self.lastReceived = cluster.clock.seconds()
        self._buffer = b""
        self._step = "challenge" if outbound else "hello"
        self._nonce = _nonce()
        self._theirNonce = b""
        self._timeout: Optional[IDelayedCall] = cluster.clock.callLater(
            HANDSHAKE_TIMEOUT, self._refuse, b"handshake timed out"
        )
        self._resumeReading: Optional[IDelayedCall] = None
        self._catchingUp = False

    # -- handshake ---------------------------------------------------------

    def _names(self) -> "tuple[bytes, bytes]":
        """
        (connector, acceptor) entries of this link.
        """
        assert self.remote is not None
        theirs = self.cluster.peers[self.remote]
        mine = self.cluster.myEntry
        return (mine, theirs) if self.outbound else (theirs, mine)

    def _nonces(self) -> "tuple[bytes, bytes]":
        return (self._nonce, self._theirNonce) if self.outbound else (self._theirNonce, self._nonce)

    def _proof(self, step: bytes, secret: Optional[bytes] = None) -> bytes:
        # The version in use is part of every proof's transcript.
        return proof(self.cluster.secret if secret is None else secret,
                     step + b" %d" % self.version, *self._names(), *self._nonces())

    def _proven(self, value: bytes, step: bytes) -> bool:
        """
        Whether the peer's C{value} proves a secret we accept: ours, or
        one being rotated (a peer proves with its own first secret).
        """
        return any(hmac.compare_digest(value, self._proof(step, secret))
                   for secret in self.cluster.acceptedSecrets)

    def sendHello(self) -> None:
        assert self.remote is not None
        self.send(peerwire.hello(b"%d-%d" % PROTOCOL_VERSIONS, self.cluster.myEntry,
                                 self.cluster.peers[self.remote], self._nonce))

    def _handshake(self, fields: List[bytes]) -> None:
        if self._step == "hello":
            if len(fields) != 5 or fields[0] != peerwire.HELLO:
                return self._refuse(b"bad peer hello")
            theirs = versionRange(fields[1])
            if theirs is None:
                return self._refuse(b"bad peer hello")
            remote = self.cluster.indexOf(fields[2])
            if remote is None or remote == self.cluster.me:
                return self._refuse(b"not a peer of this cluster")
            if fields[3] != self.cluster.myEntry:
                return self._refuse(b"this node is not " + fields[3][:250])
            if not _isNonce(fields[4]) or fields[4] == self._nonce:
                return self._refuse(b"bad peer hello")
            version = commonVersion(theirs, PROTOCOL_VERSIONS)
            if version is None:
                self.cluster.versionRefused(remote, theirs)
                return self._refuse(b"peer protocol versions %d-%d not spoken here (this "
                                    b"node speaks %d-%d)" % (theirs + PROTOCOL_VERSIONS),
                                    quiet=True)
            self.version = version
            self.remote = remote
            self._theirNonce = fields[4]
            self.send(peerwire.challenge(b"%d" % version, self._nonce,
                                         self._proof(b"challenge")))
            self._step = "auth"
        elif self._step == "auth":
            # A wrong AUTH, or the refusal of a node that found our proof
            # wrong (its "E" line): either way the claimed peer does not
            # share our secret.
            answered = fields[0] in (peerwire.AUTH, peerwire.REFUSAL)
            proven = len(fields) == 2 and fields[0] == peerwire.AUTH
            if not proven or not self._proven(fields[1], b"auth"):
                return self._refuse(b"peer authentication failed", mismatch=answered)
            self.send(peerwire.welcome(self._proof(b"welcome")))
            self._authenticated()
        elif self._step == "challenge":
            if fields[:1] == [peerwire.REFUSAL] and b"protocol versions" in b" ".join(fields):
                # It speaks no version of ours (a release too old or too new).
                assert self.remote is not None
                self.cluster.versionRefused(self.remote, None)
                return self._refuse(b"no common peer protocol version", quiet=True)
            if len(fields) != 4 or fields[0] != peerwire.CHALLENGE:
                return self._refuse(b"bad challenge")
            chosen = versionRange(fields[1])
            if chosen is None or chosen[0] != chosen[1] or not (
                    PROTOCOL_VERSIONS[0] <= chosen[0] <= PROTOCOL_VERSIONS[1]):
                return self._refuse(b"bad challenge")
            if not _isNonce(fields[2]) or fields[2] == self._nonce:
                return self._refuse(b"bad challenge")
            self.version = chosen[0]
            self._theirNonce = fields[2]
            if not self._proven(fields[3], b"challenge"):
                return self._refuse(b"peer authentication failed", mismatch=True)
            self.send(peerwire.auth(self._proof(b"auth")))
            self._step = "welcome"
        elif self._step == "welcome":
            welcomed = len(fields) == 2 and fields[0] == peerwire.WELCOME
            if not welcomed or not self._proven(fields[1], b"welcome"):
                return self._refuse(b"not welcomed", mismatch=welcomed)
            self._authenticated()

    def _authenticated(self) -> None:
        self.authenticated = True
        self._cancelTimeout()
        self.cluster.channelUp(self)

    def _refuse(self, why: bytes, mismatch: bool = False, quiet: bool = False) -> None:
        self._cancelTimeout()
        if quiet:
            pass  # the owner was told already (a version refusal)
        elif self.remote is not None and mismatch:
            # The owner logs a mismatch once per peer, not once per retry.
            # Inbound, the identity is only claimed: say where it came from.
            peer = self.transport.getPeer()  # type: ignore[attr-defined]
            source = f"{getattr(peer, 'host', '?')}:{getattr(peer, 'port', '?')}"
            self.cluster.handshakeFailed(self.remote, self.outbound, MISMATCH, source)
        else:
            # Counted, and logged once per source and reason by the owner:
            # a misconfigured node retries dozens of times a second.
            peer = self.transport.getPeer()  # type: ignore[attr-defined]
            self.cluster.handshakeRefused(f"{getattr(peer, 'host', peer)}",
                                          why.decode("ascii", "replace"))
        self.closing = True
        self.transport.write(peerwire.refusal(why) + b"\n")
        self.transport.loseConnection()  # type: ignore[attr-defined]

    def _cancelTimeout(self) -> None:
        if self._timeout is not None and self._timeout.active():
            self._timeout.cancel()
        self._timeout = None

    # -- lines -------------------------------------------------------------

    def send(self, line: bytes) -> None:
        self.transport.write(line + b"\n")

    def close(self, abort: bool = False) -> None:
        """
        Close this link on purpose (silence, a newer link, shutdown).
        """
        self.closing = True
        if abort:
            self.transport.abortConnection()  # type: ignore[attr-defined]
        else:
            self.transport.loseConnection()  # type: ignore[attr-defined]

    def dataReceived(self, data: bytes) -> None:
        now = self.cluster.clock.seconds()
        previous, self.lastReceived = self.lastReceived, now
        self._lines(data)
        if (self.outbound and self.paced and self.authenticated and not self.closing
                and not self._catchingUp
                and now - previous < READ_PACE and len(data) < PACE_READS_BELOW
                and self._resumeReading is None):
            self.transport.pauseProducing()  # type: ignore[attr-defined]
            self._resumeReading = self.cluster.clock.callLater(READ_PACE, self._readAgain)

    def catchUp(self) -> None:
        """
        Read now what this link left waiting in the kernel (a paced read,
        or one the reactor had not come to yet), before this node acts on
        another peer's news: it is leaving this leader for another, and the
        old leader's last changes must be applied first.
        """
        if self._resumeReading is not None:
            self._resumeReading.cancel()
            self._resumeReading = None
            if not getattr(self.transport, "disconnected", False):
                self.transport.resumeProducing()  # type: ignore[attr-defined]
        self._catchingUp = True
        try:
            readWaiting(self.transport)
        finally:
            self._catchingUp = False

    def _readAgain(self) -> None:
        self._resumeReading = None
        if not getattr(self.transport, "disconnected", False):
            self.transport.resumeProducing()  # type: ignore[attr-defined]

    def _lines(self, data: bytes) -> None:
        lines = (self._buffer + data).split(b"\n") if self._buffer else data.split(b"\n")
        self._buffer = lines.pop()
        if len(self._buffer) > MAX_PEER_LINE:
            return self._refuse(b"peer line too long")
        while lines and not self.authenticated:
            if self.closing or self.transport.disconnecting:  # type: ignore[attr-defined]
                return
            self._handshake(lines.pop(0).rstrip(b"\r").split(b" "))
        if lines and not self.closing:
            # The rest in one call: a snapshot's lines are applied in bulk.
            self.cluster.peerLines(self, lines)

    def _socketError(self, errno: int, reason: Failure) -> None:
        self.socketError = errno
        self.tcpReason = reason

    def connectionLost(self, reason: Failure) -> None:
        self._cancelTimeout()
        if self._resumeReading is not None:
            self._resumeReading.cancel()
            self._resumeReading = None
        if self.authenticated:
            # A FIN is how the kernel closes the sockets of an exited
            # process; a reset (which Twisted may also report as
            # ConnectionDone, hence the socket's own error) or any other
            # error is network trouble.
            # Under TLS, judge the TCP connection below (a FIN without TLS's
            # close_notify is what an exited process leaves).
            # EPIPE is what a reset leaves on a socket that had already
            # received a FIN (Linux, CLOSE_WAIT): we wrote (a heartbeat)
            # after the peer's FIN, before reading it, and its kernel,
            # whose socket is gone, answered with a reset.  The FIN came
            # first: that is a close, not network trouble.
            tcp = self.tcpReason or reason
            clean = tcp.check(ConnectionDone) is not None and self.socketError in (0, EPIPE)
            self.cluster.channelLost(self, clean=clean)


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

    def connectionLost(self, reason: Failure = Failure(ConnectionDone())) -> None:
        if self.channel is not None:
            self.channel.connectionLost(reason)


class HandshakeLimit:
    """
    A token bucket for inbound handshakes: a node's peers redial a few
    times a second at most, so a flood of HELLOs is refused before any
    HMAC is computed (and before it can harvest proofs quickly).
    """

    def __init__(self, clock: IReactorTime, rate: float = 20.0, burst: float = 20.0) -> None:
        self.clock = clock
        self.rate = rate
        self.burst = burst
        self.tokens = burst
        self.at = clock.seconds()

    def take(self) -> bool:
        now = self.clock.seconds()
        self.tokens = min(self.burst, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


def acceptChannel(cluster: ChannelOwner, transport: Any, hello: bytes,
                  limit: Optional[HandshakeLimit] = None) -> PeerChannel:
    """
    Turn a client connection whose first line was C{HELLO} into a peer channel.
    """
    channel = PeerChannel(cluster, transport, outbound=False)
    if limit is not None and not limit.take():
        channel._refuse(b"too many peer handshakes")
        return channel
    channel._handshake(hello.rstrip(b"\r").split(b" "))
    return channel
