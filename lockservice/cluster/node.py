# -*- test-case-name: tests.cluster.test_cluster_unit -*-
"""
The cluster layer: this node's membership of a priority-ordered cluster
(docs/cluster.md).  L{Cluster} alone changes this node's role, term and
leader; its collaborators tell it what happened through the small
interfaces of L{lockservice.cluster.interfaces}:

  - L{lockservice.cluster.receiving}: each peer line to its collaborator;
  - L{lockservice.cluster.heartbeats}: heartbeats, peer views, the freeze check;
  - L{lockservice.cluster.following}: a standby's copy of its leader's stream;
  - L{lockservice.cluster.healing}: the offer and the merge of a heal;
  - L{lockservice.cluster.handoff}: handing the active role over;
  - L{lockservice.cluster.replication}: the stream to standbys, the answer gate;
  - L{lockservice.cluster.links}: links to every peer and their liveness;
  - L{lockservice.cluster.peer}: the handshake and the line channel;
  - L{lockservice.cluster.peerwire}: every peer line, built and parsed;
  - pure rules, told the time: L{lockservice.core.election} (who is
    active), L{lockservice.cluster.terms} (terms, eras, plausible values),
    L{lockservice.cluster.serving} (when an active serves),
    L{lockservice.cluster.clocktrust}, L{lockservice.cluster.merge},
    L{lockservice.cluster.released}.

A follower asks its leader for state on its own outbound link (C{SYNC}),
and the leader streams back on that same connection, so the snapshot, the
live changes and a C{HANDOFF} arrive in order.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

from twisted.application.service import Service
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import LoopingCall
from twisted.logger import Logger
from zope.interface import implementer

from lockservice.cluster import serving as states
from lockservice.cluster import terms
from lockservice.cluster.deciding import Decisions
from lockservice.cluster.following import Following
from lockservice.cluster.handoff import Handoffs
from lockservice.cluster.healing import Healing
from lockservice.cluster.heartbeats import Heartbeats
from lockservice.cluster.interfaces import (
    IFollowerOwner,
    IHandoffOwner,
    IHealOwner,
    IHeartbeatOwner,
    IReceiverOwner,
    IStreamOwner,
)
from lockservice.cluster.links import Links
from lockservice.cluster.peer import PeerChannel
from lockservice.cluster.receiving import Receiver
from lockservice.cluster.released import Releases
from lockservice.cluster.replication import ACK, Stream
from lockservice.cluster.serving import Gate, NodeState, stateOf
from lockservice.core.election import (
    ACTIVE,
    HANDING_OFF,
    LEAVING,
    STANDBY,
    SYNCING,
    PeerView,
)
from lockservice.server import modes
from lockservice.server.clock import wallMicros as systemWallMicros
from lockservice.server.service import LockService
from lockservice.tcp import clientEndpoint


def tcpEndpoint(reactor: Any, entry: bytes, peerTimeout: float) -> Any:
    """
    A plain TCP endpoint for a peer's --peers entry.
    """
    host, _, port = entry.decode().rpartition(":")
    return clientEndpoint(reactor, host, int(port), timeout=max(peerTimeout, 0.5))


@implementer(IStreamOwner, IHandoffOwner, IFollowerOwner, IHealOwner, IHeartbeatOwner,
             IReceiverOwner)
class Cluster(Decisions, Service):
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
        wallMicros: Callable[[], int] = systemWallMicros,
        endpointFor: Optional[Callable[[int], Any]] = None,
        replication: str = ACK,
        acceptSecrets: Sequence[bytes] = (),
    ) -> None:
        """
        @param acceptSecrets: secrets a peer may prove besides C{secret}
            (a rotation: see docs/operations.md).
        @param replication: what client answers wait for: C{"ack"} (every
            synchronised standby acknowledged receiving the changes) or
            C{"sent"} (they left this host's socket buffers).
        """
        self.reactor = reactor
        self.clock = locks.clock
        self.locks = locks
        self.peers = [p.encode() for p in peers]
        self.me = peers.index(me)
        self.myEntry = self.peers[self.me]
        self.heartbeat = heartbeat
        self.peerTimeout = peerTimeout
        self.wallMicros = wallMicros
        # The operator's event feed (promotion, handoff, peer-up/down):
        # called as eventSink(type, who, detail); makeService connects it.
        self.eventSink: Callable[[str, Optional[str], Optional[str]], object] = (
            lambda type, who, detail: None)
        self.views: Dict[int, PeerView] = {
            j: PeerView() for j in range(len(peers)) if j != self.me
        }
        # Its state (serving.py): the role it shows, and what its lock
        # service does.
        self.nodeState = NodeState(self._unexpectedMove)
        self.term = 0
        self.leader: Optional[int] = None
        self.promotions = 0
        self.startedAt = self.clock.seconds()
        self.stopping = False
        # Why this node distrusts its own clock (shown on /status), or None.
        self.clockSuspect: Optional[str] = None
        # Whether we are a standby only because our clock is the suspect
        # (we hold no state of the cluster's).
        self._deferred = False
        self.terms = terms.Terms()
        self.eras = terms.Eras()
        self.servingGate = Gate(heartbeat, peerTimeout, self.startedAt)
        self.receiver = Receiver(self, locks, self.peers, self.me, secret, acceptSecrets)
        self.links = Links(self.clock, self.receiver, self.receiver, sorted(self.views),
                           peerTimeout, endpointFor or self._tcpEndpoint, self.peers)
        self.lastHeard = self.links.lastHeard
        # Releases a lost follower may not know of (see released.py).
        self.releases = Releases(recentFor=2 * peerTimeout + 1.0)
        self.stream = Stream(self, locks, self.links, self.releases, peerTimeout, replication,
                             firstPosition=wallMicros())
        self.handoffs = Handoffs(self, self.clock, self.links, self.views, self.me)
        self.heartbeats = Heartbeats(self, locks, self.links, self.views, self.servingGate,
                                     wallMicros)
        self.healing = Healing(self, locks, self.stream, self.releases, self.eras, wallMicros)
        self.following = Following(self, locks, self.links, self.healing, wallMicros)
        self.receiver.wire(self.links, self.releases, self.heartbeats, self.stream,
                           self.following, self.healing, self.handoffs)
        self._beat: Optional[LoopingCall] = None
        locks.observers.append(self.stream)
        locks.notify.mirrors.append(self.stream)
        locks.groups.registry.observers.append(self.stream)
        locks.answers.gate = self.stream
        locks.beforeTurnHooks.append(self.heartbeats.notJustResumed)
        self._enter(states.SYNCING)

    def _tcpEndpoint(self, j: int) -> Any:
        return tcpEndpoint(self.reactor, self.peers[j], self.peerTimeout)

    # -- lookups -------------------------------------------------------------

    def name(self, j: int) -> str:
        return self.peers[j].decode()

    @property
    def role(self) -> str:
        """
        This node's role (lockservice.core.election's), as its state shows it.
        """
        return self.nodeState.role

    @property
    def state(self) -> str:
        """
        This node's state (see serving.py), shown on /status.
        """
        return self.nodeState.current

    @property
    def serving(self) -> bool:
        return self.servingGate.serving  # (see gate)

    @property
    def maxTerm(self) -> int:
        return self.terms.highest

    @property
    def merged(self) -> int:
        return self.locks.stats.merged  # offered grants merged on heals

    def activeAddress(self) -> Optional[bytes]:
        """
        The client address of the active node, as written in --peers.
        """
        if self.role == ACTIVE:
            return self.myEntry if self.serving else None
        if self.leader is not None:
            view = self.views[self.leader]
            if view.alive and view.role == ACTIVE:
                return self.peers[self.leader]
        return None

    @property
    def incompatiblePeers(self) -> List[str]:
        """
        The peers refused for speaking no peer protocol version of ours.
        """
        return [self.name(j) for j in self.links.incompatible]

    def position(self) -> int:
        if self.role in (ACTIVE, HANDING_OFF):
            return self.stream.position
        return self.following.position

    def fromLeader(self, j: int, channel: Any) -> bool:
        return channel.outbound and j == self.leader and self.role in (STANDBY, SYNCING)

    # -- terms (see terms.py) --------------------------------------------------

    def plausible(self, j: int, value: int, what: str) -> bool:
        if terms.plausible(value, self.wallMicros()):
            return True
        if self.terms.logRefusal(j, self.clock.seconds()):
            self.log.error(
                "refused a {what} of {value} from peer {peer}: more than an hour ahead "
                "of this node's clock", what=what, value=value, peer=self.name(j),
                event="implausible_value_refused")
        return False

    def newTerm(self) -> int:
        return self.terms.new(self.wallMicros())

    def learnTerm(self, term: int) -> None:
        self.terms.learn(term)

    def restoredLocks(self, term: int) -> None:
        """
        This node starts with held locks saved at a graceful stop (see
        L{terms.Eras.restored}); if this node becomes active, it serves them.
        """
        self.eras.restored(self.me, term)

    # -- service ---------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self.startedAt = self.clock.seconds()
        self.links.start()
        self._beat = LoopingCall(self.tick)
        self._beat.clock = self.clock
        self._beat.start(self.heartbeat, now=True)

    async def gracefulStop(self) -> None:
        """On SIGINT/SIGTERM: hand over first (see L{Handoffs.beforeStopping})."""
        self.stopping = True
        await self.handoffs.beforeStopping()
        self.setRole(LEAVING)
        self.broadcastHeartbeat()

    def stopService(self) -> "Deferred[None]":
        super().stopService()
        if self._beat is not None and self._beat.running:
            self._beat.stop()
        self.handoffs.stop()
        self.stream.flush()
        stopping = self.links.stop()
        return gatherResults(stopping, consumeErrors=True).addCallback(lambda _: None)

    # -- heartbeats (IHeartbeatOwner, see heartbeats.py) --------------------------

    def tick(self) -> None:
        self.heartbeats.tick()

    def broadcastHeartbeat(self) -> None:
        self.heartbeats.broadcast()

    def ticked(self) -> None:
        self.evaluate()
        if self.role == ACTIVE:
            self.healing.forgetNotes(self.me, self.views, self.links.inbound)

    def justResumed(self) -> bool:
        return self.heartbeats.justResumed()

    def resumedLate(self, idle: float) -> None:
        if self.servingGate.stopUntilRead(idle):
            self.log.info("did not run for {ms:.0f} ms: not serving until the peers are read",
                          ms=idle * 1000, event="resumed_late")
            self.gate()

    def peerTerm(self, j: int, term: int, token: int) -> None:
        self.locks.observeToken(token)
        self.learnTerm(term)
        if j == self.leader and self.role == STANDBY and self.views[j].role == ACTIVE:
            self.term = term  # a standby shows the term of the active it follows

    def acceptPeer(self, transport: object, hello: bytes) -> PeerChannel:
        """The server's C{peerAcceptor} (see L{Receiver.acceptPeer})."""
        return self.receiver.acceptPeer(transport, hello)

    # -- the following side (IFollowerOwner) -------------------------------------

    def snapshotBegins(self, j: int, term: int) -> None:
        self.learnTerm(term)
        self.term = term

    def synchronised(self, j: int) -> bool:
        if self.role != SYNCING:
            return False
        self.setRole(STANDBY)
        self.broadcastHeartbeat()
        return True

    def follow(self, j: int, merge: bool) -> None:
        if merge:
            # Our keys mirror our leader's stream (or are our own, when we
            # step down): the offer says whose (see terms.Eras).
            self.eras.leaving(self.me, self.leader, self.term, self.following.position)
        previous, self.leader = self.leader, j
        self.following.followed(previous, j)
        self.broadcastHeartbeat()

    def sync(self, channel: Any) -> None:
        self.following.sync(channel)

    def setRole(self, role: str) -> None:
        """
        Take C{role}: the state it means (an active node's is its serving
        gate's call).
        """
        gate = self.servingGate
        if role == ACTIVE and self.role != ACTIVE:
            gate.becameActive(self.clock.seconds())
            if self.role != HANDING_OFF:
                self._snapshotAgain()
        if role not in (ACTIVE, HANDING_OFF) and self.role in (ACTIVE, HANDING_OFF):
            self.stream.leadNoMore()
        # Frozen until every live peer receives our stream (see gate).
        gate.serving = role == ACTIVE and not self.unsubscribed()
        self._enter(stateOf(role, gate))

    def _snapshotAgain(self) -> None:
        """
        We lead from now on: a peer that subscribed to us before (it asked
        for our state while we were a standby, on a heartbeat that ran
        ahead of our promotion) is sent our state again, as it is now.  Its
        earlier snapshot would otherwise count as in sync for a handoff,
        and the peer could take over with the copy it had before.
        """
        for channel in list(self.links.inbound.values()):
            if channel.synced or channel.snapshot is not None:
                self.stream.startSnapshot(channel)

    def _enter(self, state: str) -> None:
        """
        Move to C{state}, and have the lock service do what it means:
        serve, freeze, or redirect to the active.
        """
        self.nodeState.move(state)
        if state == states.SERVING:
            mode = modes.SERVING
        elif state in states.FROZEN:
            mode = modes.FROZEN
        else:
            mode = modes.REDIRECTING
        self.locks.setMode(mode, self.activeAddress(), self.role)

    def _unexpectedMove(self, before: str, to: str) -> None:
        self.log.error("internal error: this node moved from state {before} to {to}, "
                       "which serving.MOVES does not list", before=before, to=to,
                       event="unexpected_state_move")

    def _promote(self) -> None:
        # Our copy of our leader's stream goes at least as far as any live
        # standby's (else we would not promote: see core/election.py), so
        # an offer of that stream up to there brings nothing we lack.
        followed = self.leader
        self.eras.promoted(None if followed is None
                           else (followed, self.term, self.following.position),
                           self.locks.lastToken())
        self.term = self.newTerm()
        self.leader = None
        self.promotions += 1
        # The old active may come back with its copy of the grants we took
        # over: note our releases of them for that heal (see merge.py).
        self.releases.startNoting(self.locks.lastToken(), self.clock.seconds())
        self.setRole(ACTIVE)
        self.log.warn("promoted to active (term {term}) with {keys} held keys",
                      term=self.term, keys=self.locks.heldCount(), event="promoted")
        self.eventSink("promotion", self.name(self.me),
                       f"term {self.term}, {self.locks.heldCount()} held keys")
        self.broadcastHeartbeat()

    # -- handoff (IHandoffOwner, see handoff.py) ------------------------------------

    def handingOff(self) -> None:
        self.setRole(HANDING_OFF)
        self.stream.flush()

    def handoffFailed(self) -> None:
        self.setRole(ACTIVE)
        self.broadcastHeartbeat()

    def tookOver(self, j: int, term: int) -> None:
        # Everything of our leader's term reached us before its HANDOFF:
        # a standby's offer of keys from that same stream brings nothing
        # new, only keys dropped since (see healing.py).
        self.eras.tookOver((j, self.term, self.following.position), self.locks.lastToken())
        self.term = term
        self.learnTerm(term)
        self.leader = None
        self.promotions += 1
        # As after a promotion: a peer may still hold a copy of the grants
        # we took over (one that missed the handoff); note our releases of
        # them, so that a heal with it undoes none (see released.py).
        self.releases.startNoting(self.locks.lastToken(), self.clock.seconds())
        self.setRole(ACTIVE)
        self.log.warn("took over from {peer} by handoff (term {term}) with {keys} held keys",
                      peer=self.name(j), term=term, keys=self.locks.heldCount(),
                      event="took_over")
        self.eventSink("promotion", self.name(self.me),
                       f"by handoff from {self.name(j)}, term {term}")

    def handedOff(self, j: int, term: int, stopping: bool) -> None:
        self.term = term
        self.leader = j
        self.views[j].role = ACTIVE
        self.views[j].term = term
        self.setRole(LEAVING if stopping else STANDBY)
        self.eventSink("handoff", self.name(j), f"handed off to it, term {term}")
        if not stopping:
            self.follow(j, merge=False)
        else:
            self.broadcastHeartbeat()
