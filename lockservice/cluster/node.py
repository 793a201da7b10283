# -*- test-case-name: tests.test_cluster -*-
"""
The cluster layer: peer links, heartbeats, replication, promotion,
graceful handoff and split-brain demotion (SPEC section 4).

Messages on an authenticated peer channel (one line each):

    HB <term> <role> <leader|-> <last_token>    on every link, every --heartbeat
    SYNC                                        follower -> leader: send state, then stream
    SNAP <term> <last_token>                    leader -> follower: a full snapshot begins
    H <key> <token> <remaining_us>              one held key of the snapshot
    SNAPEND                                     the snapshot is complete
    G <key> <token> <remaining_us>              a grant (live stream)
    D <key> <token>                             a release or expiry (live stream)
    HANDOFF <term>                              leader -> successor: take over at <term>
    TAKEN <term>                                successor -> old leader: done
    REFUSED <term>                              successor cannot take over

Every node dials every other node (a ClientService per peer, retrying
quickly) and sends its heartbeats on every link, both directions.  A follower asks
its leader for state on its own outbound link, and the leader streams back
on that same connection, so the snapshot, the live changes and a HANDOFF
arrive in order.
"""

from __future__ import annotations

from typing import Dict, List, Optional

from twisted.application.internet import ClientService
from twisted.application.service import Service
from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.protocol import Factory
from twisted.internet.task import LoopingCall, deferLater
from twisted.logger import Logger

from lockservice.cluster.peer import PeerChannel, PeerClientProtocol, acceptChannel
from lockservice.core import election
from lockservice.core.election import (
    ACTIVE,
    HANDING_OFF,
    LEAVING,
    STANDBY,
    SYNCING,
    Action,
    PeerView,
    SelfView,
)
from lockservice.internals import QuietClientService
from lockservice.server.service import LockService
from lockservice.tcp import clientEndpoint

PEER_RETRY = 0.25
HANDOFF_TIMEOUT = 2.0
FLUSH_BEFORE_EXIT = 0.1


class _Handoff:
    def __init__(self, successor: int, term: int, stopping: bool) -> None:
        self.successor = successor
        self.term = term
        self.stopping = stopping
        self.done: "Deferred[bool]" = Deferred()
        self.timer: Optional[IDelayedCall] = None


class _PeerLinkFactory(Factory):
    noisy = False

    def __init__(self, cluster: "Cluster", remote: int) -> None:
        self.cluster = cluster
        self.remote = remote

    def buildProtocol(self, addr: object) -> PeerClientProtocol:
        return PeerClientProtocol(self.cluster, self.remote)


class Cluster(Service):
    """
    This node's membership of the cluster.
    """

    log = Logger()

    def __init__(
        self,
        reactor: object,
        locks: LockService,
        peers: List[str],
        me: str,
        secret: bytes,
        heartbeat: float = 0.1,
        peerTimeout: float = 1.0,
    ) -> None:
        self.reactor = reactor
        self.clock = locks.clock
        self.locks = locks
        self.peers = [p.encode() for p in peers]
        self.me = peers.index(me)
        self.myEntry = self.peers[self.me]
        self.secret = secret
        self.heartbeat = heartbeat
        self.peerTimeout = peerTimeout
        self.views: Dict[int, PeerView] = {
            j: PeerView() for j in range(len(peers)) if j != self.me
        }
        self.lastHeard: Dict[int, float] = {}
        self.inbound: Dict[int, PeerChannel] = {}
        self.outbound: Dict[int, PeerChannel] = {}
        self.role = SYNCING
        self.term = 0
        self.maxTerm = 0
        self.leader: Optional[int] = None
        self.promotions = 0
        self.handoff: Optional[_Handoff] = None
        self.startedAt = self.clock.seconds()
        self._links: List[ClientService] = []
        self._beat: Optional[LoopingCall] = None
        self._stopping = False
        locks.observers.append(self)
        locks.setRole(SYNCING, None)

    # -- lookups -------------------------------------------------------------

    def indexOf(self, entry: bytes) -> Optional[int]:
        try:
            return self.peers.index(entry)
        except ValueError:
            return None

    def activeAddress(self) -> Optional[bytes]:
        """
        The client address of the active node, as written in --peers.
        """
        if self.role == ACTIVE:
            return self.myEntry
        if self.leader is not None:
            view = self.views[self.leader]
            if view.alive and view.role == ACTIVE:
                return self.peers[self.leader]
        return None

    # -- service ---------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self.startedAt = self.clock.seconds()
        for j in self.views:
            host, _, port = self.peers[j].decode().rpartition(":")
            endpoint = clientEndpoint(self.reactor, host, int(port), timeout=2)
            factory = _PeerLinkFactory(self, j)
            link = QuietClientService(endpoint, factory, retryPolicy=lambda _: PEER_RETRY,
                                 clock=self.clock)
            link.startService()
            self._links.append(link)
        self._beat = LoopingCall(self.tick)
        self._beat.clock = self.clock
        self._beat.start(self.heartbeat, now=True)

    async def gracefulStop(self) -> None:
        """
        On SIGINT/SIGTERM: an active node hands over to the highest-priority
        live standby (after a final sync), and only then lets its clients go.
        """
        self._stopping = True
        if self.role == ACTIVE:
            candidates = sorted(
                j for j, v in self.views.items()
                if v.alive and v.role == STANDBY and j in self.inbound
            )
            if not candidates:
                self.log.warn("stopping with no live standby: held locks end with this node")
            for j in candidates:
                if await self.handOff(j, stopping=True):
                    await deferLater(self.clock, FLUSH_BEFORE_EXIT, lambda: None)
                    break
        self._setRole(LEAVING)
        self.broadcastHeartbeat()

    def stopService(self) -> "Deferred[None]":
        super().stopService()
        if self._beat is not None and self._beat.running:
            self._beat.stop()
        if self.handoff is not None and self.handoff.timer is not None:
            if self.handoff.timer.active():
                self.handoff.timer.cancel()
        stopping = [link.stopService() for link in self._links]
        self._links = []
        for channel in list(self.inbound.values()):
            channel.transport.loseConnection()  # type: ignore[attr-defined]

        async def allStopped() -> None:
            for d in stopping:
                await d

        return Deferred.fromCoroutine(allStopped())

    # -- heartbeats and liveness -----------------------------------------------

    def tick(self) -> None:
        now = self.clock.seconds()
        for j, view in self.views.items():
            alive = self._linked(j) and now - self.lastHeard.get(j, -1e18) <= self.peerTimeout
            if alive != view.alive:
                view.alive = alive
                self._peerChanged(j, alive)
        self.broadcastHeartbeat()
        self.evaluate()

    def _peerChanged(self, j: int, alive: bool) -> None:
        if alive:
            self.log.info("peer {peer} is up ({role}, term {term})", peer=self.peers[j].decode(),
                          role=self.views[j].role, term=self.views[j].term)
        else:
            self.log.warn("lost peer {peer}", peer=self.peers[j].decode())

    def heartbeatLine(self) -> bytes:
        leader = str(self.leader).encode() if self.leader is not None else b"-"
        return b"HB %d %s %s %d" % (self.term, self.role.encode(), leader,
                                    self.locks.lastToken())

    def broadcastHeartbeat(self) -> None:
        # On both directions' links: a peer hears us as soon as either link
        # is up (ours may still be waiting for its next connection attempt).
        line = self.heartbeatLine()
        for channel in self.outbound.values():
            channel.send(line)
        for channel in self.inbound.values():
            channel.send(line)

    def _linked(self, j: int) -> bool:
        return j in self.inbound or j in self.outbound

    # -- channels --------------------------------------------------------------

    def acceptPeer(self, transport: object, hello: bytes) -> PeerChannel:
        """
        A client connection opened with HELLO: it becomes a peer channel
        (the server's C{peerAcceptor}).
        """
        return acceptChannel(self, transport, hello)

    def channelUp(self, channel: PeerChannel) -> None:
        j = channel.remote
        assert j is not None
        links = self.outbound if channel.outbound else self.inbound
        old = links.get(j)
        links[j] = channel
        if old is not None and old is not channel:
            old.transport.loseConnection()  # type: ignore[attr-defined]
        channel.send(self.heartbeatLine())
        if channel.outbound and self.leader == j and self.role in (STANDBY, SYNCING):
            channel.send(b"SYNC")

    def channelLost(self, channel: PeerChannel) -> None:
        j = channel.remote
        assert j is not None
        links = self.outbound if channel.outbound else self.inbound
        if links.get(j) is not channel:
            return
        del links[j]
        if not channel.outbound and self.handoff is not None and self.handoff.successor == j:
            self._handoffFailed(f"lost {self.peers[j].decode()} during handoff")
        if not self._linked(j):
            # A dead process closes every link at once: no need to wait
            # for the peer timeout.
            if self.views[j].alive:
                self.views[j].alive = False
                self._peerChanged(j, False)
            self.evaluate()

    # -- messages --------------------------------------------------------------

    def peerMessage(self, channel: PeerChannel, fields: List[bytes]) -> None:
        j = channel.remote
        assert j is not None
        kind = fields[0]
        try:
            if kind == b"HB":
                self._heartbeat(j, fields)
            elif kind in (b"G", b"H"):
                if self._fromLeader(j, channel):
                    self.locks.installHolder(fields[1], int(fields[2]), int(fields[3]) / 1e6)
            elif kind == b"D":
                if self._fromLeader(j, channel):
                    self.locks.dropHolder(fields[1], int(fields[2]))
            elif kind == b"SYNC":
                self._sendSnapshot(channel)
                channel.replicating = True
            elif kind == b"SNAP":
                if self._fromLeader(j, channel):
                    self.locks.clearHolders()
                    self.locks.observeToken(int(fields[2]))
                    self._learnTerm(int(fields[1]))
            elif kind == b"SNAPEND":
                if self._fromLeader(j, channel) and self.role == SYNCING:
                    self._setRole(STANDBY)
                    self.log.info("synchronised from {peer}", peer=self.peers[j].decode())
                    self.broadcastHeartbeat()
            elif kind == b"HANDOFF":
                self._takeOver(j, channel, int(fields[1]))
            elif kind == b"TAKEN":
                self._handoffDone(j, int(fields[1]))
            elif kind == b"REFUSED":
                if self.handoff is not None and self.handoff.successor == j:
                    self._handoffFailed(f"{self.peers[j].decode()} refused the handoff")
            else:
                self.log.warn("unknown peer message {kind!r}", kind=kind)
        except (IndexError, ValueError):
            self.log.warn("malformed peer message {fields!r}", fields=fields)

    def _fromLeader(self, j: int, channel: PeerChannel) -> bool:
        return channel.outbound and j == self.leader and self.role in (STANDBY, SYNCING)

    def _learnTerm(self, term: int) -> None:
        if term > self.maxTerm:
            self.maxTerm = term

    def _heartbeat(self, j: int, fields: List[bytes]) -> None:
        view = self.views[j]
        role = fields[2].decode()
        view.term = int(fields[1])
        view.role = role if role in election.ROLES else SYNCING
        view.leader = None if fields[3] == b"-" else int(fields[3])
        self.locks.observeToken(int(fields[4]))
        self._learnTerm(view.term)
        self.lastHeard[j] = self.clock.seconds()
        if not view.alive and self._linked(j):
            view.alive = True
            self._peerChanged(j, True)
        self.evaluate()

    # -- decisions -------------------------------------------------------------

    def evaluate(self) -> None:
        if self._stopping and self.role != ACTIVE:
            return
        # A node without state waits to hear from its peers (and for its own
        # links to them to come up) before it may take over an empty cluster.
        graceOver = self.clock.seconds() - self.startedAt >= 2 * self.peerTimeout
        action = election.decide(
            self.me, SelfView(self.role, self.term, self.leader, graceOver), self.views
        )
        if action is not None and not self._stopping:
            self._act(action)
        self.locks.setActiveAddress(self.activeAddress())

    def _act(self, action: Action) -> None:
        if action.kind == "promote":
            self._promote()
        elif action.kind == "step-down":
            assert action.peer is not None
            self.log.warn(
                "split brain: {peer} is active too (term {theirs} >= {ours}); stepping down",
                peer=self.peers[action.peer].decode(), theirs=self.views[action.peer].term,
                ours=self.term,
            )
            self.leader = action.peer
            self._setRole(STANDBY)
            self._follow(action.peer)
        elif action.kind == "follow":
            assert action.peer is not None
            self._follow(action.peer)
        elif action.kind == "bump-term":
            assert action.term is not None
            self.log.warn("split brain: a lower-priority node is active; claiming term {term}",
                          term=action.term)
            self.term = action.term
            self._learnTerm(self.term)
            self.broadcastHeartbeat()
        elif action.kind == "hand-off":
            assert action.peer is not None
            self.handOff(action.peer, stopping=False)

    def _setRole(self, role: str) -> None:
        self.role = role
        self.locks.setRole(role, self.activeAddress())

    def _promote(self) -> None:
        self.term = self.maxTerm + 1
        self._learnTerm(self.term)
        self.leader = None
        self.promotions += 1
        self._setRole(ACTIVE)
        self.log.warn("promoted to active (term {term}) with {keys} held keys",
                      term=self.term, keys=self.locks.heldCount())
        self.broadcastHeartbeat()

    def _follow(self, j: int) -> None:
        if self.leader != j:
            self.log.info("following {peer}", peer=self.peers[j].decode())
        self.leader = j
        channel = self.outbound.get(j)
        if channel is not None:
            channel.send(b"SYNC")
        self.broadcastHeartbeat()

    # -- replication (LockService observer) ------------------------------------

    def granted(self, key: bytes, token: int, grantedAt: float, expiresAt: float,
                waited: float) -> None:
        line = b"G %s %d %d\n" % (key, token, int((expiresAt - grantedAt) * 1e6))
        for channel in self.inbound.values():
            if channel.replicating:
                channel.transport.write(line)

    def renewed(self, key: bytes, token: int, grantedAt: float, expiresAt: float) -> None:
        # Replicated exactly like a grant: the standby's install() of the
        # token that already holds the key only moves its expiry.
        remaining = expiresAt - self.clock.seconds()
        line = b"G %s %d %d\n" % (key, token, int(remaining * 1e6))
        for channel in self.inbound.values():
            if channel.replicating:
                channel.transport.write(line)

    def dropped(self, key: bytes, token: int, heldFor: float, expired: bool) -> None:
        line = b"D %s %d\n" % (key, token)
        for channel in self.inbound.values():
            if channel.replicating:
                channel.transport.write(line)

    def _sendSnapshot(self, channel: PeerChannel) -> None:
        now = self.clock.seconds()
        lines = [b"SNAP %d %d" % (self.term, self.locks.lastToken())]
        lines.extend(
            b"H %s %d %d" % (key, holder.token, int((holder.expiresAt - now) * 1e6))
            for key, holder in self.locks.heldKeys()
        )
        lines.append(b"SNAPEND")
        channel.sendMany(lines)

    # -- handoff ---------------------------------------------------------------

    def handOff(self, j: int, stopping: bool) -> "Deferred[bool]":
        """
        Hand the active role to peer C{j}: freeze, send a final snapshot and
        HANDOFF on the channel it follows us on, wait for TAKEN.
        """
        channel = self.inbound.get(j)
        if channel is None or self.role != ACTIVE:
            return succeed(False)
        handoff = _Handoff(j, self.term + 1, stopping)
        self.handoff = handoff
        self.log.info("handing off to {peer} (term {term})", peer=self.peers[j].decode(),
                      term=handoff.term)
        self._setRole(HANDING_OFF)
        self._sendSnapshot(channel)
        channel.replicating = True
        channel.send(b"HANDOFF %d" % handoff.term)
        self.broadcastHeartbeat()
        handoff.timer = self.clock.callLater(
            HANDOFF_TIMEOUT, self._handoffFailed, "no answer to the handoff"
        )
        return handoff.done

    def _takeOver(self, j: int, channel: PeerChannel, term: int) -> None:
        if not self._fromLeader(j, channel) or self._stopping:
            channel.send(b"REFUSED %d" % term)
            return
        self.term = term
        self._learnTerm(term)
        self.leader = None
        self.promotions += 1
        self._setRole(ACTIVE)
        self.log.warn("took over from {peer} by handoff (term {term}) with {keys} held keys",
                      peer=self.peers[j].decode(), term=term, keys=self.locks.heldCount())
        channel.send(b"TAKEN %d" % term)
        self.broadcastHeartbeat()

    def _handoffDone(self, j: int, term: int) -> None:
        handoff = self.handoff
        if handoff is None or handoff.successor != j or handoff.term != term:
            return
        self.handoff = None
        if handoff.timer is not None and handoff.timer.active():
            handoff.timer.cancel()
        self.term = term
        self.leader = j
        self.views[j].role = ACTIVE
        self.views[j].term = term
        self._setRole(LEAVING if handoff.stopping else STANDBY)
        self.log.warn("handed off to {peer} (term {term})", peer=self.peers[j].decode(), term=term)
        if not handoff.stopping:
            self._follow(j)
        else:
            self.broadcastHeartbeat()
        handoff.done.callback(True)

    def _handoffFailed(self, why: str) -> None:
        handoff = self.handoff
        if handoff is None:
            return
        self.handoff = None
        if handoff.timer is not None and handoff.timer.active():
            handoff.timer.cancel()
        self.log.warn("handoff to {peer} failed: {why}",
                      peer=self.peers[handoff.successor].decode(), why=why)
        self._setRole(ACTIVE)
        self.broadcastHeartbeat()
        handoff.done.callback(False)
