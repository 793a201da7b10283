# -*- test-case-name: tests.cluster.test_peer -*-
"""
Links and liveness: one outbound link to every peer (a ClientService that
redials), the inbound links peers open to us, and what they tell about
each peer's liveness.

The rules (a reset link is not a dead node; a partition is seen when it
heals):

  - A peer is alive while it was heard from within --peer-timeout.
  - A link closed cleanly (a FIN: the kernel closes the sockets of an
    exited process) makes us dial the peer's port at once; when that is
    refused too, the peer is dead now, without waiting for the timeout
    (a kill -9 fails over in milliseconds).
  - A reset or broken link (RST, timeout), and refusals while we have not
    heard from the peer since a reset, are network trouble: we redial and
    let --peer-timeout decide.
  - A link silent for --peer-timeout is closed and redialed, so after a
    partition, however long, the nodes meet again within --peer-timeout
    plus the retry interval instead of waiting for TCP's backoff.
"""

from __future__ import annotations

from math import inf
from typing import Any, Callable, Dict, List, Optional, Set, Tuple
from typing import Protocol as TypingProtocol

from twisted.application.internet import ClientService
from twisted.internet.error import ConnectionRefusedError
from twisted.internet.interfaces import IReactorTime
from twisted.internet.protocol import Factory, Protocol
from twisted.logger import Logger
from twisted.python.failure import Failure

from lockservice.cluster.peer import (
    PROTOCOL_VERSIONS,
    ChannelOwner,
    PeerChannel,
    PeerClientProtocol,
)
from lockservice.internals import QuietClientService

PEER_RETRY = 0.25


class LinkEvents(TypingProtocol):
    """
    What the links tell the node that owns them.
    """

    def linkUp(self, channel: PeerChannel) -> None: ...

    def peerGone(self, j: int) -> None: ...


class _PeerLinkFactory(Factory):
    noisy = False

    def __init__(self, owner: ChannelOwner, remote: int) -> None:
        self.owner = owner
        self.remote = remote

    def buildProtocol(self, addr: object) -> PeerClientProtocol:
        return PeerClientProtocol(self.owner, self.remote)


class _Probe(Protocol):
    def connectionMade(self) -> None:
        self.transport.loseConnection()  # type: ignore[union-attr]


class Links:
    """
    Every link to every peer, and the liveness they show.

    @ivar lastHeard: when each peer was last heard from (any line).
    @ivar mismatch: when each peer last failed our handshake with a wrong
        secret, as seen on our own outbound link (we dialed its address).
    """

    log = Logger()

    def __init__(
        self,
        clock: IReactorTime,
        owner: ChannelOwner,
        events: LinkEvents,
        peerIndexes: List[int],
        peerTimeout: float,
        endpointFor: Callable[[int], Any],
        names: List[bytes],
    ) -> None:
        self.clock = clock
        self.owner = owner
        self.events = events
        self.peerIndexes = peerIndexes
        self.peerTimeout = peerTimeout
        self.endpointFor = endpointFor
        self.names = names
        self.inbound: Dict[int, PeerChannel] = {}
        self.outbound: Dict[int, PeerChannel] = {}
        self.lastHeard: Dict[int, float] = {}
        # The longest gap between two lines heard from each peer, since the
        # owner last reset it (a snapshot must not starve heartbeats).
        self.longestSilence: Dict[int, float] = {}
        self.resetAt: Dict[int, float] = {}
        self.dead: Set[int] = set()
        self.mismatch: Dict[int, float] = {}
        self.mismatchSeen: Set[int] = set()
        self.claimsSeen: Set[Tuple[int, str]] = set()
        # Refused handshakes (a stranger, or a peer of another cluster):
        # how many, and the (source, reason) pairs logged already.
        self.refusedHandshakes = 0
        self.refusalsSeen: Set[Tuple[str, str]] = set()
        # Peers that speak no peer protocol version of ours: j -> the
        # range they said (None: they refused ours).
        self.incompatible: Dict[int, Optional[Tuple[int, int]]] = {}
        self.claimedMismatch: Dict[int, float] = {}
        self._services: List[ClientService] = []

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> None:
        for j in self.peerIndexes:
            service = QuietClientService(
                self.endpointFor(j), _PeerLinkFactory(self.owner, j),
                retryPolicy=lambda _: PEER_RETRY, clock=self.clock,
            )
            service.startService()
            self._services.append(service)

    def stop(self) -> List[Any]:
        stopping = [service.stopService() for service in self._services]
        self._services = []
        for channel in list(self.inbound.values()):
            channel.close()
        return stopping

    # -- liveness ----------------------------------------------------------

    def heard(self, j: int) -> None:
        now = self.clock.seconds()
        last = self.lastHeard.get(j)
        if last is not None and now - last > self.longestSilence.get(j, 0.0):
            self.longestSilence[j] = now - last
        self.lastHeard[j] = now
        self.dead.discard(j)

    def alive(self, j: int) -> bool:
        if j in self.dead:
            return False
        return self.clock.seconds() - self.lastHeard.get(j, -inf) <= self.peerTimeout

    def linked(self, j: int) -> bool:
        return j in self.inbound or j in self.outbound

    def closeSilent(self) -> None:
        """
        Close (and so redial) every link that has been silent for the peer
        timeout: after a partition heals, a fresh connection gets through
        at once where the old one would wait out TCP's retransmission
        backoff.
        """
        now = self.clock.seconds()
        for links in (self.inbound, self.outbound):
            for channel in list(links.values()):
                if now - channel.lastReceived > self.peerTimeout:
                    assert channel.remote is not None
                    self.resetAt[channel.remote] = now
                    del links[channel.remote]
                    channel.close(abort=True)

    def secretMismatch(self, j: int) -> bool:
        """
        True while peer C{j} keeps failing our handshakes with a wrong secret:
        what answers on its address fails our proof, and something claiming
        to be it dials us and fails too.  A node with another secret does
        both (it dials every peer); a stranger that only squats a dead
        peer's port and answers junk proves nothing and blocks nobody.
        """
        now = self.clock.seconds()
        window = 3 * self.peerTimeout + 1
        return (now - self.mismatch.get(j, -inf) <= window
                and now - self.claimedMismatch.get(j, -inf) <= window)

    # -- channel events (from the node) ------------------------------------

    def handshakeFailed(self, j: int, outbound: bool, why: str, source: str = "") -> None:
        if not outbound:
            # Anyone can claim any identity in a HELLO: log the claim and
            # its source (once per claimed peer and source host).  It only
            # counts together with a mismatch on our own link to the peer's
            # address (see secretMismatch).
            self.claimedMismatch[j] = self.clock.seconds()
            host = source.rpartition(":")[0]
            if (j, host) not in self.claimsSeen:
                if len(self.claimsSeen) >= 1000:
                    self.claimsSeen.clear()
                self.claimsSeen.add((j, host))
                self.log.error(
                    "a connection from {source} claiming to be peer {peer} failed the "
                    "handshake ({why})", source=source, peer=self.names[j].decode(), why=why,
                    event="handshake_failed")
            return
        self.mismatch[j] = self.clock.seconds()
        if j not in self.mismatchSeen:
            self.mismatchSeen.add(j)
            self.log.error(
                "peer {peer} does not share our --secret ({why}): it cannot join this "
                "node's cluster until the secrets match",
                peer=self.names[j].decode(), why=why, event="peer_secret_mismatch",
            )

    def handshakeRefused(self, source: str, why: str) -> None:
        """
        We refused a peer handshake from C{source} (a host) for C{why}:
        counted (C{/status} shows it), logged once per source and reason.
        """
        self.refusedHandshakes += 1
        if (source, why) not in self.refusalsSeen:
            if len(self.refusalsSeen) >= 1000:
                self.refusalsSeen.clear()
            self.refusalsSeen.add((source, why))
            self.log.warn("refused a peer handshake from {source}: {why} (logged once per "
                          "source and reason; /status counts them)", source=source, why=why,
                          event="handshake_refused")

    def versionRefused(self, j: int, theirs: Optional[Tuple[int, int]]) -> None:
        """
        Peer C{j} speaks no peer protocol version of ours (C{theirs}: the
        range it said, or None when it refused ours): it is a release too
        old or too new to join this node's cluster.  Logged once, shown on
        C{/status} and C{/ready} until it links up.
        """
        known = j in self.incompatible
        self.incompatible[j] = theirs
        if not known:
            self.log.error(
                "peer {peer} speaks no peer protocol version of this node ({theirs}; this "
                "node speaks {ours}): it cannot join until one of them is upgraded "
                "(adjacent releases interoperate; from lockservice 0.1, a full restart)",
                peer=self.names[j].decode(), event="peer-version-refused",
                theirs=(f"versions {theirs[0]}-{theirs[1]}" if theirs is not None
                        else "it refused ours"),
                ours=f"{PROTOCOL_VERSIONS[0]}-{PROTOCOL_VERSIONS[1]}")

    def channelUp(self, channel: PeerChannel) -> None:
        j = channel.remote
        self.incompatible.pop(j, None)  # type: ignore[arg-type]
        assert j is not None
        if j in self.mismatchSeen:
            self.mismatchSeen.discard(j)
            self.mismatch.pop(j, None)
            self.log.info("peer {peer} now shares our --secret", peer=self.names[j].decode(),
                          event="peer_secret_matches")
        links = self.outbound if channel.outbound else self.inbound
        old = links.get(j)
        links[j] = channel
        if old is not None and old is not channel:
            old.close()
        self.heard(j)
        self.events.linkUp(channel)

    def channelLost(self, channel: PeerChannel, clean: bool) -> bool:
        """
        @return: True when C{channel} was a current link (not one we had
            already replaced or closed).
        """
        j = channel.remote
        assert j is not None
        links = self.outbound if channel.outbound else self.inbound
        if links.get(j) is channel:
            del links[j]
        elif channel.closing:
            return False
        if channel.closing:
            return True
        if not clean:
            self.resetAt[j] = self.clock.seconds()
        elif j not in self.dead:
            self._probe(j)
        return True

    def _probe(self, j: int) -> None:
        """
        After a clean close: is anything still listening on C{j}'s port?
        A refusal, with no reset seen lately, means the process is gone.
        """
        closedAt = self.clock.seconds()
        d = self.endpointFor(j).connect(Factory.forProtocol(_Probe))

        def failed(reason: Failure) -> None:
            if not reason.check(ConnectionRefusedError):
                return
            if self.resetAt.get(j, -inf) >= self.lastHeard.get(j, -inf):
                return  # no word from it since a reset: network trouble, not an exit
            if self.lastHeard.get(j, -inf) > closedAt or self.linked(j):
                return  # heard from it since
            self.dead.add(j)
            self.events.peerGone(j)

        d.addCallbacks(lambda _: None, failed)

    # -- sending -----------------------------------------------------------

    def broadcast(self, line: bytes) -> None:
        # On both directions' links: a peer hears us as soon as either link
        # is up (ours may still be waiting for its next connection attempt).
        for channel in list(self.outbound.values()):
            channel.send(line)
        for channel in list(self.inbound.values()):
            channel.send(line)
