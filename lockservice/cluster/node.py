# -*- test-case-name: tests.test_cluster_unit -*-
"""
The cluster layer: this node's membership of a priority-ordered cluster
(SPEC section 4), and the election glue that ties its parts together:

  - L{lockservice.cluster.peer}: the handshake and the line channel;
  - L{lockservice.cluster.links}: links to every peer and their liveness;
  - L{lockservice.cluster.replication}: the replication stream;
  - L{lockservice.cluster.handoff}: handing the active role over;
  - L{lockservice.core.election}: the pure decision of who is active.

Every node dials every other node and sends its heartbeats on every link,
both directions:

    HB <term> <role> <leader|-> <last_token>    on every link, every --heartbeat

A follower asks its leader for state on its own outbound link (C{SYNC}),
and the leader streams back on that same connection, so the snapshot, the
live changes and a C{HANDOFF} arrive in order.

Terms, like tokens, follow the microsecond clock (a new term is
C{max(highest term seen + 1, now in microseconds)}), so a node refuses a
token or a term more than an hour ahead of its own clock, whoever sends
it: one forged or broken peer cannot push the cluster to the end of the
token space.
"""

from __future__ import annotations

from math import inf
from typing import Any, Callable, Dict, List, Optional, Tuple

from twisted.application.service import Service
from twisted.internet.defer import Deferred, gatherResults
from twisted.internet.task import LoopingCall, deferLater
from twisted.logger import Logger

from lockservice.cluster import clocktrust
from lockservice.cluster.clocktrust import PLAUSIBLE_AHEAD
from lockservice.cluster.handoff import Handoffs
from lockservice.cluster.links import Links
from lockservice.cluster.peer import HandshakeLimit, PeerChannel, acceptChannel
from lockservice.cluster.released import Releases
from lockservice.cluster.replication import ACK, Stream, writeNow
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
from lockservice.server.clock import wallMicros as systemWallMicros
from lockservice.server.service import LockService
from lockservice.tcp import clientEndpoint

FLUSH_BEFORE_EXIT = 0.1
# How long a new active waits for a live peer that does not subscribe to
# its stream before it serves anyway (in units of --peer-timeout): a peer
# that neither dies nor follows us is not our standby.
SUBSCRIBE_BOUND = 2.0
# Replication lines that change held keys (grant, snapshot holder, drop):
# runs of them are applied in bulk (Stream.applyChanges).
_CHANGES = (b"H ", b"G ", b"D ")
# The lines of a heal's offer (see merge.py), likewise kept in one run.
_OFFERED = (b"MERGE ", b"RELEAS")


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
        wallMicros: Callable[[], int] = systemWallMicros,
        endpointFor: Optional[Callable[[int], Any]] = None,
        replication: str = ACK,
    ) -> None:
        """
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
        self.secret = secret
        self.heartbeat = heartbeat
        self.peerTimeout = peerTimeout
        # A heartbeat timer this late means the process did not run (see
        # tick): half the time a peer has to notice, and well over the
        # heartbeat period itself.
        self.frozenAfter = max(peerTimeout / 2, 2.5 * heartbeat)
        self.wallMicros = wallMicros
        # The operator's event feed (promotion, handoff, peer-up/down):
        # called as eventSink(type, who, detail); makeService connects it.
        self.eventSink: Callable[[str, Optional[str], Optional[str]], object] = (
            lambda type, who, detail: None)
        self.views: Dict[int, PeerView] = {
            j: PeerView() for j in range(len(peers)) if j != self.me
        }
        self.links = Links(self.clock, self, self, sorted(self.views), peerTimeout,
                           endpointFor or self._endpointFor, self.peers)
        self.lastHeard = self.links.lastHeard
        self.stream = Stream(self, replication)
        # Releases a lost follower may not know of (see released.py).
        self.releases = Releases(recentFor=2 * peerTimeout + 1.0)
        self.handshakes = HandshakeLimit(self.clock)
        self.handoffs = Handoffs(self)
        self.role = SYNCING
        self.term = 0
        self.maxTerm = 0
        self.leader: Optional[int] = None
        self.promotions = 0
        self.merged = 0
        self.startedAt = self.clock.seconds()
        self.syncStartedAt = self.startedAt
        self.stopping = False
        # Whether this node, when active, serves yet (see gate).
        self.serving = False
        self.activeSince = self.startedAt
        self._unsubscribedLogged = False
        self._unsubscribedSince: Dict[int, float] = {}
        # The era (leader, term) whose stream our mirror copies, to offer
        # with our keys at the next sync (see follow); None: no offer.
        self._offerFrom: Optional[Tuple[int, int]] = None
        # The era we took over whole by handoff (see Stream.offered).
        self.inheritedFrom: Optional[Tuple[int, int]] = None
        # The leader whose link we read up before leaving it (see
        # _caughtUpWithLeader).
        self._leavingLeader: Optional[int] = None
        self._beat: Optional[LoopingCall] = None
        self._lastTick: Optional[float] = None
        self._frozenAt = -inf  # when this active last stopped serving
        self._catchingUp = False
        # Set when this active finds it did not run for a while: it serves
        # nothing until it has read what its peers sent meanwhile.
        self._resuming = False
        self._implausibleLogged: Dict[int, float] = {}
        # By peer: what its last heartbeat had far ahead of our clock, and
        # by how much (see clocktrust).
        self._aheadOf: Dict[int, Tuple[str, int]] = {}
        # Why this node distrusts its own clock (shown on /status), or None.
        self.clockSuspect: Optional[str] = None
        # Whether we are a standby only because our clock is the suspect
        # (we hold no state of the cluster's).
        self._deferred = False
        # Grants a heal's loser released that we could not release yet
        # (see releaseMerged).
        self._releaseWhenServing: List[Tuple[bytes, int]] = []
        locks.observers.append(self.stream)
        locks.answers.gate = self.stream
        locks.beforeTurnHooks.append(self._notJustResumed)
        locks.setRole(SYNCING, None)

    def _endpointFor(self, j: int) -> Any:
        host, _, port = self.peers[j].decode().rpartition(":")
        return clientEndpoint(self.reactor, host, int(port), timeout=max(self.peerTimeout, 0.5))

    # -- lookups -------------------------------------------------------------

    def name(self, j: int) -> str:
        return self.peers[j].decode()

    def indexOf(self, entry: bytes) -> Optional[int]:
        try:
            return self.peers.index(entry)
        except ValueError:
            return None

    @property
    def inbound(self) -> Dict[int, PeerChannel]:
        return self.links.inbound

    @property
    def outbound(self) -> Dict[int, PeerChannel]:
        return self.links.outbound

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

    def plausible(self, j: int, value: int, what: str) -> bool:
        """
        False (and logged, at most every 10 s per peer) for a token or term
        more than an hour ahead of our clock.
        """
        if value <= self.wallMicros() + PLAUSIBLE_AHEAD:
            return True
        now = self.clock.seconds()
        if now - self._implausibleLogged.get(j, -1e18) >= 10:
            self._implausibleLogged[j] = now
            self.log.error(
                "refused a {what} of {value} from peer {peer}: more than an hour ahead "
                "of this node's clock", what=what, value=value, peer=self.name(j))
        return False

    def newTerm(self) -> int:
        """
        A term above every term seen, following the microsecond clock.
        """
        term = max(self.maxTerm + 1, self.wallMicros())
        self.learnTerm(term)
        return term

    def learnTerm(self, term: int) -> None:
        if term > self.maxTerm:
            self.maxTerm = term

    def restoredLocks(self, term: int) -> None:
        """
        This node starts with held locks saved at a graceful stop
        (--state-dir, in its term C{term}): if another node becomes active,
        they are offered to it at the first sync and merged by the heal
        rules; if this node does, it serves them.
        """
        self._offerFrom = (self.me, term)

    # -- service ---------------------------------------------------------------

    def startService(self) -> None:
        super().startService()
        self.startedAt = self.clock.seconds()
        self.links.start()
        self._beat = LoopingCall(self.tick)
        self._beat.clock = self.clock
        self._beat.start(self.heartbeat, now=True)

    async def gracefulStop(self) -> None:
        """
        On SIGINT/SIGTERM: an active node hands over to the highest-priority
        live standby (its stream is already up to date), and only then lets
        its clients go.  One successor at a time: the next candidate is
        only tried once the previous one surely did not take over.
        """
        self.stopping = True
        if self.role == ACTIVE:
            candidates = sorted(
                j for j, v in self.views.items()
                if v.alive and v.role == STANDBY and v.leader == self.me
                and not v.clockSuspect and j in self.links.inbound and self.links.inbound[j].synced
            )
            if not candidates:
                self.log.warn("stopping with no live standby: held locks end with this node")
            for j in candidates:
                if await self.handoffs.start(j, stopping=True):
                    await deferLater(self.clock, FLUSH_BEFORE_EXIT, lambda: None)
                    break
                if self.role != ACTIVE:
                    break
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

    # -- heartbeats and liveness -----------------------------------------------

    def tick(self) -> None:
        now = self.clock.seconds()
        idle = 0.0 if self._lastTick is None else now - self._lastTick
        self._lastTick = now
        late = idle > self.frozenAfter
        if late and not self._catchingUp:
            # This process did not run for a while (stopped, starved): what
            # the peers sent meanwhile still waits unread in our sockets,
            # and timers run before reads.  Read first (one reactor
            # iteration), then judge who is silent.
            self._catchingUp = True
            self._stopServingUntilRead(idle)
            self.clock.callLater(0, self.tick)
            return
        self._catchingUp = False
        self._resuming = False
        self.links.closeSilent()
        self.refreshViews()
        self.broadcastHeartbeat()
        self.evaluate()
        if self.releases.watermark is not None and self.role == ACTIVE and all(
                v.alive and j in self.links.inbound and self.links.inbound[j].applied
                and v.leader == self.me for j, v in self.views.items()):
            # Every peer follows us again, and has replaced its old copy of
            # the grants with our snapshot.
            self.releases.forget()

    def _notJustResumed(self) -> None:
        """
        Before an active serves a turn of requests or timers: when this
        process did not run for L{frozenAfter} (stopped, frozen), a standby
        may have promoted meanwhile, and its news waits unread in our
        sockets, behind the requests that piled up.  Answering those first
        would decide things the heal then undoes (a release answered OK
        brought back by the other side's copy), so the node serves nothing
        (C{M ... *}, as during a handoff) until the late tick has read its
        peers and judged again (see L{tick}).
        """
        if self._lastTick is not None:
            self._stopServingUntilRead(self.clock.seconds() - self._lastTick)

    def _stopServingUntilRead(self, idle: float) -> None:
        if self.serving and not self._resuming and idle > self.frozenAfter:
            self._resuming = True
            self.log.info("did not run for {ms:.0f} ms: not serving until the peers are read",
                          ms=idle * 1000)
            self.gate()

    def refreshViews(self) -> None:
        for j, view in self.views.items():
            alive = self.links.alive(j)
            view.secretMismatch = self.links.secretMismatch(j)
            if alive != view.alive:
                view.alive = alive
                if not alive:
                    self._aheadOf.pop(j, None)
                self._peerChanged(j, alive)

    def _peerChanged(self, j: int, alive: bool) -> None:
        if alive:
            self.log.info("peer {peer} is up ({role}, term {term})", peer=self.name(j),
                          role=self.views[j].role, term=self.views[j].term)
            self.eventSink("peer-up", self.name(j),
                           f"{self.views[j].role}, term {self.views[j].term}")
        else:
            self.log.warn("lost peer {peer}", peer=self.name(j))
            self.eventSink("peer-down", self.name(j), None)

    def heartbeatLine(self) -> bytes:
        leader = str(self.leader).encode() if self.leader is not None else b"-"
        line = b"HB %d %s %s %d" % (self.term, self.role.encode(), leader,
                                    self.locks.lastToken())
        return line + b" " + clocktrust.SUSPECT if self.clockSuspect else line

    def broadcastHeartbeat(self) -> None:
        self.links.broadcast(self.heartbeatLine())

    # -- channels (ChannelOwner, LinkEvents) ------------------------------------

    def acceptPeer(self, transport: object, hello: bytes) -> PeerChannel:
        """
        A client connection opened with HELLO: it becomes a peer channel
        (the server's C{peerAcceptor}).
        """
        return acceptChannel(self, transport, hello, self.handshakes)

    def handshakeFailed(self, remote: int, outbound: bool, why: str,
                        source: str = "") -> None:
        self.links.handshakeFailed(remote, outbound, why, source)
        self.views[remote].secretMismatch = self.links.secretMismatch(remote)

    def channelUp(self, channel: PeerChannel) -> None:
        self.links.channelUp(channel)

    def linkUp(self, channel: PeerChannel) -> None:
        # Acknowledged replication: a paced read would delay the ACK.
        channel.paced = not self.stream.acknowledged
        channel.send(self.heartbeatLine())
        j = channel.remote
        if channel.outbound and self.leader == j and self.role in (STANDBY, SYNCING):
            self._sync(channel)

    def channelLost(self, channel: PeerChannel, clean: bool) -> None:
        j = channel.remote
        assert j is not None
        if channel.replicating and self.role in (ACTIVE, HANDING_OFF):
            # A follower that may have missed our last changes, and keeps
            # its copy of the grants (also when we closed the link for its
            # silence): note what we release from now on (see released).
            self.releases.startNoting(
                self.locks.lastToken(), self.links.lastHeard.get(j, 0.0) - self.peerTimeout)
        if not self.links.channelLost(channel, clean):
            return
        if channel.replicating and not channel.lagging:
            # (A follower we cut off for not reading is not waited for.)
            self.gate()
        current = self.handoffs.current
        if not channel.outbound and current is not None and current.successor == j:
            self.handoffs.lost(j)

    def peerGone(self, j: int) -> None:
        """
        The links are sure peer C{j}'s process is gone (FIN, then refused).
        """
        self.refreshViews()
        self.evaluate()

    # -- messages --------------------------------------------------------------

    def peerLines(self, channel: PeerChannel, lines: List[bytes]) -> None:
        """
        Lines from an authenticated peer.  Runs of changes (a
        snapshot, a busy stream) and of offered keys are applied in bulk.
        """
        j = channel.remote
        assert j is not None
        self.links.heard(j)
        transport: Any = channel.transport
        if self.stream.acknowledged and channel.outbound:
            self._acknowledge(channel, lines)
        i, count = 0, len(lines)
        while i < count:
            if channel.closing or transport.disconnecting:
                return
            if lines[i][:2] in _CHANGES:
                end = i + 1
                while end < count and lines[end][:2] in _CHANGES:
                    end += 1
                self.stream.applyChanges(j, channel, lines[i:end])
                i = end
                continue
            if lines[i][:6] in _OFFERED:
                end = i + 1
                while end < count and lines[end][:6] in _OFFERED:
                    end += 1
                self.stream.merge(j, channel, lines[i:end])
                i = end
                continue
            self.peerMessage(channel, lines[i].rstrip(b"\r").split(b" "))
            i += 1

    def _acknowledge(self, channel: PeerChannel, lines: List[bytes]) -> None:
        """
        On receipt, before applying them: acknowledge the last stream
        position in this read (one C{ACK} per read, however many
        positions it holds).  Positions end each flush, so it is mostly
        the last line.
        """
        for index in range(len(lines) - 1, -1, -1):
            line = lines[index]
            if line[:2] == b"S ":
                if self.fromLeader(channel.remote or 0, channel):
                    writeNow(channel, b"ACK " + line[2:].rstrip(b"\r") + b"\n")
                return

    def peerMessage(self, channel: PeerChannel, fields: List[bytes]) -> None:
        j = channel.remote
        assert j is not None
        kind = fields[0]
        try:
            if kind == b"HB":
                self._heartbeat(j, fields)
            elif kind == b"HANDOFF":
                self.handoffs.takeOver(j, channel, int(fields[1]))
            elif kind == b"TAKEN":
                self.handoffs.taken(j, int(fields[1]))
            elif kind == b"REFUSED":
                self.handoffs.refused(j, int(fields[1]))
            else:
                self.stream.apply(j, channel, fields)
        except (IndexError, ValueError):
            self.log.warn("malformed peer message {fields!r}", fields=fields[:6])

    def fromLeader(self, j: int, channel: PeerChannel) -> bool:
        return channel.outbound and j == self.leader and self.role in (STANDBY, SYNCING)

    def _heartbeat(self, j: int, fields: List[bytes]) -> None:
        term, token = int(fields[1]), int(fields[4])
        view = self.views[j]
        role = fields[2].decode()
        view.role = role if role in election.ROLES else SYNCING
        view.leader = None if fields[3] == b"-" else int(fields[3])
        view.clockSuspect = len(fields) > 5 and fields[5] == clocktrust.SUSPECT
        now = self.wallMicros()
        ahead = clocktrust.aheadBy(term, now)
        what = "term"
        if ahead is None:
            ahead, what = clocktrust.aheadBy(token, now), "token"
        if ahead is not None:
            # Not adopted; but its role counts: our clock may be the wrong
            # one (see clocktrust), and then we must not serve beside it.
            self.plausible(j, term if what == "term" else token, what)  # logs it
            self._aheadOf[j] = (what, ahead)
        else:
            self._aheadOf.pop(j, None)
            view.term = term
            self.locks.observeToken(token)
            self.learnTerm(term)
            if j == self.leader and self.role == STANDBY and view.role == ACTIVE:
                self.term = term  # a standby shows the term of the active it follows
        if not view.alive:
            view.alive = True
            self._peerChanged(j, True)
        self.evaluate()

    def synchronised(self, j: int) -> None:
        if self.role == SYNCING:
            self.setRole(STANDBY)
            self.log.info(
                "synchronised from {peer} ({keys} held keys) in {seconds:.3f} s "
                "(longest silence from it meanwhile: {silence:.0f} ms)",
                peer=self.name(j), keys=self.locks.heldCount(),
                seconds=self.clock.seconds() - self.syncStartedAt,
                silence=self.links.longestSilence.get(j, 0.0) * 1000)
            self.broadcastHeartbeat()

    # -- decisions -------------------------------------------------------------

    def evaluate(self) -> None:
        if self.stopping and self.role != ACTIVE:
            return
        # A node without state waits to hear from its peers (and for its own
        # links to them to come up) before it may take over an empty cluster.
        graceOver = self.clock.seconds() - self.startedAt >= 2 * self.peerTimeout
        authenticated = [j for j, v in self.views.items() if v.alive]
        mismatched = [j for j, v in self.views.items() if v.secretMismatch]
        may = election.mayPromote(self.me, authenticated, mismatched)
        self._trustOwnClock(clocktrust.distrustedBy(self._aheadOf, authenticated))
        if self.clockSuspect is not None:
            may = False
        action = election.decide(
            self.me, SelfView(self.role, self.term, self.leader, graceOver, may), self.views
        )
        if action is not None and not self.stopping:
            self._act(action)
        self.gate()
        self.locks.setActiveAddress(self.activeAddress())

    def _trustOwnClock(self, distrusted: Optional[int]) -> None:
        """
        Act on what clocktrust says: while peer C{distrusted} (not None)
        is alive, our clock is the suspect and we stand by; once it is not
        (it died, or our clocks agree again) we sync afresh.
        """
        if distrusted is None:
            if self.clockSuspect is not None:
                self.clockSuspect = None
                self.log.info("this node's clock agrees with its live peers again")
                if self._deferred:
                    self._deferred = False
                    self.leader = None
                    self.setRole(SYNCING)
                self.broadcastHeartbeat()
            return
        what, ahead = self._aheadOf[distrusted]
        if self.clockSuspect is not None:
            return
        self.clockSuspect = clocktrust.reason(self.name(distrusted), what, ahead)
        self.log.error("{why}", why=self.clockSuspect)
        if self.role == ACTIVE:
            self.log.warn("stepping down and offering {peer} our {keys} held keys",
                          peer=self.name(distrusted), keys=self.locks.heldCount())
            self._offerFrom = (self.me, self.term)
            self.setRole(STANDBY)
            self._deferred = True
        elif self.role == SYNCING:
            self.setRole(STANDBY)
            self._deferred = True
        self.broadcastHeartbeat()

    def unsubscribed(self) -> List[int]:
        """
        The live peers that do not receive our replication stream: it did
        not ask for it on its current link, or its heartbeat does not say
        it follows us (a link left over from an earlier term).
        """
        inbound = self.links.inbound
        return [j for j, v in self.views.items()
                if v.alive and v.role != LEAVING and not v.clockSuspect
                and not (j in inbound and inbound[j].replicating and v.leader == self.me)]

    def gate(self) -> None:
        """
        An active node serves client changes only while every live peer it
        knows of receives its stream: right after a promotion or a
        takeover, the other nodes (the old active among them) subscribe
        within a heartbeat or two, and an answer given before that could be
        lost on a kill -9 (SPEC section 4).  Meanwhile the node is frozen
        (C{M ... *}, queued waiters stay queued), as during a handoff.  A
        live peer that does not subscribe within L{SUBSCRIBE_BOUND} peer
        timeouts is not our standby: we serve without it.
        """
        if self.role != ACTIVE:
            self.serving = False
            return
        missing = self.unsubscribed()
        now = self.clock.seconds()
        for j in list(self._unsubscribedSince):
            if j not in missing:
                del self._unsubscribedSince[j]
        for j in missing:
            self._unsubscribedSince.setdefault(j, now)
        serving = not missing
        if self._resuming:
            serving = False
        elif missing:
            # Each peer gets the bound from when it became a live
            # non-subscriber (a restarted node syncs within it).
            waited = now - max(self._unsubscribedSince[j] for j in missing)
            if waited >= SUBSCRIBE_BOUND * self.peerTimeout:
                serving = True
                if not self._unsubscribedLogged:
                    self._unsubscribedLogged = True
                    self.log.warn(
                        "serving although live peer(s) {peers} do not follow this node "
                        "after {seconds:.1f} s: changes answered now may be lost if this "
                        "node fails", peers=", ".join(self.name(j) for j in missing),
                        seconds=waited)
        else:
            self._unsubscribedLogged = False
        if serving != self.serving:
            self.serving = serving
            self.locks.setRole(ACTIVE if serving else HANDING_OFF, self.activeAddress())
            if serving:
                pending, self._releaseWhenServing = self._releaseWhenServing, []
                for key, token in pending:
                    self.releaseMerged(key, token)
                since = max(self.activeSince, self._frozenAt)
                self.log.info("serving: {peers} live peer(s) receive the stream "
                              "({ms:.0f} ms after this node {what})",
                              peers=sum(1 for j, v in self.views.items()
                                        if v.alive and j not in missing),
                              ms=(now - since) * 1000,
                              what="became active" if since == self.activeSince
                              else "stopped serving")
            else:
                self._frozenAt = now
                if missing:
                    self.log.info("not serving until {peers} receive(s) the stream",
                                  peers=", ".join(self.name(j) for j in missing))

    def _act(self, action: Action) -> None:
        if action.kind == "promote":
            self._promote()
        elif action.kind == "step-down":
            assert action.peer is not None
            self.log.warn(
                "split brain: {peer} is active too (term {theirs} >= {ours}); stepping down "
                "and handing it our {keys} held keys",
                peer=self.name(action.peer), theirs=self.views[action.peer].term,
                ours=self.term, keys=self.locks.heldCount(),
            )
            self.setRole(STANDBY)
            self.follow(action.peer, merge=True)
        elif action.kind == "follow":
            assert action.peer is not None
            if self._caughtUpWithLeader():
                # Its last lines may have changed what to do.
                self.evaluate()
                return
            # A standby that changes leader offers its mirror to the new
            # one: a key held on one side only must survive a heal.
            self.follow(action.peer, merge=self.role == STANDBY and self.leader is not None)
        elif action.kind == "bump-term":
            self.log.warn("split brain: a lower-priority node is active; claiming a higher term")
            self.term = self.newTerm()
            self.broadcastHeartbeat()
        elif action.kind == "hand-off":
            assert action.peer is not None
            self.handoffs.start(action.peer, stopping=False)

    def setRole(self, role: str) -> None:
        if role == ACTIVE and self.role != ACTIVE:
            self.activeSince = self.clock.seconds()
            self._unsubscribedLogged = False
            self._unsubscribedSince.clear()
        self.role = role
        if role == ACTIVE:
            # Frozen until every live peer receives our stream (see gate).
            self.serving = False
            if not self.unsubscribed():
                self.serving = True
                self.locks.setRole(ACTIVE, self.activeAddress())
            else:
                self.locks.setRole(HANDING_OFF, None)
        else:
            self.serving = False
            self.locks.setRole(role, self.activeAddress())

    def _promote(self) -> None:
        self.term = self.newTerm()
        self.leader = None
        self.inheritedFrom = None
        self.promotions += 1
        # The old active may come back with its copy of the grants we took
        # over: note our releases of them for that heal (see merge.py).
        self.releases.startNoting(self.locks.lastToken(), self.clock.seconds())
        self.setRole(ACTIVE)
        self.log.warn("promoted to active (term {term}) with {keys} held keys",
                      term=self.term, keys=self.locks.heldCount())
        self.eventSink("promotion", self.name(self.me),
                       f"term {self.term}, {self.locks.heldCount()} held keys")
        self.broadcastHeartbeat()

    def releaseMerged(self, key: bytes, token: int) -> None:
        """
        A heal's loser released grant C{token} of C{key}, which we still
        hold: release it here too (its next waiter gets the key, our
        standbys hear of it).  While we do not serve yet, it is only
        dropped, and a key with waiters is released when we serve.
        """
        if self.locks.role == ACTIVE:
            self.locks.release(key, token, lambda answer: None)
            return
        self.locks.dropHolder(key, token)
        if self.locks.table.tokenOf(key) == token:
            self._releaseWhenServing.append((key, token))
        else:
            self.stream.dropped(key, token, 0.0, expired=False)

    def _caughtUpWithLeader(self) -> bool:
        """
        Before leaving our leader for another, apply what its link already
        holds: the new leader's heartbeat may have overtaken the old one's
        last changes (a paced read, or another socket read first), and a
        copy that misses a release would offer the new leader that lock
        back (see follow).

        @return: whether we read it now (once per leader change).
        """
        channel = self.links.outbound.get(self.leader) if self.leader is not None else None
        if channel is None or self._leavingLeader == self.leader:
            return False
        self._leavingLeader = self.leader
        channel.catchUp()
        return True

    def follow(self, j: int, merge: bool) -> None:
        if merge and self._offerFrom is None:
            # Our keys mirror our leader's stream (or are our own, when we
            # step down): the offer says whose, so that a leader which
            # took that stream over whole can tell stale keys (see
            # Stream.offered).
            self._offerFrom = (self.me if self.leader is None else self.leader, self.term)
        if self.leader != j:
            self.log.info("following {peer}", peer=self.name(j))
        self.leader = j
        self._leavingLeader = None
        channel = self.links.outbound.get(j)
        if channel is not None:
            self._sync(channel)
        self.broadcastHeartbeat()

    def _sync(self, channel: PeerChannel) -> None:
        """
        Ask our leader for its state; first offer it our held keys when we
        come from a heal (they arrive before the SYNC, so its snapshot
        already holds them).
        """
        if self._offerFrom is not None:
            grants, notes = self.stream.sendMerge(channel, self._offerFrom)
            self._offerFrom = None
            # Handed over: the winner keeps them from now on.
            self.releases.forget()
            if grants or notes:
                self.log.info("offered {keys} held keys and {notes} release notes to {peer}",
                              keys=grants, notes=notes, peer=self.name(channel.remote or 0))
        if self.clockSuspect is None:
            # (A node that distrusts its clock would refuse the snapshot.)
            channel.send(b"SYNC")
