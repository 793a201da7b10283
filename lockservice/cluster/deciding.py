# -*- test-case-name: tests.cluster.test_cluster_unit -*-
"""
A cluster node's decisions: what its peers' views and its own clock say it
must do (promote, step down, follow, claim a term, hand off, serve or
freeze), and doing it.  The rules themselves are pure and told the time
(L{lockservice.core.election}, L{lockservice.cluster.clocktrust},
L{lockservice.cluster.serving}); this is where a L{Cluster
<lockservice.cluster.node.Cluster>} applies them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Dict, List, Optional

from twisted.logger import Logger

from lockservice.cluster import clocktrust
from lockservice.cluster.serving import Gate, NodeState, activeState, unsubscribed
from lockservice.core import election
from lockservice.core.election import ACTIVE, STANDBY, SYNCING, Action, PeerView, SelfView

if TYPE_CHECKING:
    from lockservice.cluster.following import Following
    from lockservice.cluster.handoff import Handoffs
    from lockservice.cluster.healing import Healing
    from lockservice.cluster.heartbeats import Heartbeats
    from lockservice.cluster.links import Links
    from lockservice.cluster.terms import Eras
    from lockservice.server.service import LockService


class Decisions:
    """
    The decisions of L{Cluster<lockservice.cluster.node.Cluster>}, which
    provides what is declared here.
    """

    log: Logger
    clock: Any
    me: int
    term: int
    leader: Optional[int]
    stopping: bool
    startedAt: float
    peerTimeout: float
    clockSuspect: Optional[str]
    _deferred: bool
    views: Dict[int, PeerView]
    heartbeats: "Heartbeats"
    following: "Following"
    handoffs: "Handoffs"
    healing: "Healing"
    links: "Links"
    eras: "Eras"
    locks: "LockService"
    servingGate: Gate
    nodeState: NodeState

    @property
    def role(self) -> str:
        raise NotImplementedError

    @property
    def serving(self) -> bool:
        raise NotImplementedError

    def name(self, j: int) -> str:
        raise NotImplementedError

    def activeAddress(self) -> Optional[bytes]:
        raise NotImplementedError

    def setRole(self, role: str) -> None:
        raise NotImplementedError

    def follow(self, j: int, merge: bool) -> None:
        raise NotImplementedError

    def newTerm(self) -> int:
        raise NotImplementedError

    def broadcastHeartbeat(self) -> None:
        raise NotImplementedError

    def _enter(self, state: str) -> None:
        raise NotImplementedError

    def _promote(self) -> None:
        raise NotImplementedError

    def evaluate(self) -> None:
        if self.stopping and self.role != ACTIVE:
            return
        # A node without state waits to hear from its peers (and for its own
        # links to them to come up) before it may take over an empty cluster.
        graceOver = self.clock.seconds() - self.startedAt >= 2 * self.peerTimeout
        authenticated = [j for j, v in self.views.items() if v.alive]
        mismatched = [j for j, v in self.views.items() if v.secretMismatch]
        may = election.mayPromote(self.me, authenticated, mismatched)
        self._trustOwnClock(clocktrust.distrustedBy(self.heartbeats.aheadOf, authenticated))
        if self.clockSuspect is not None:
            may = False
        action = election.decide(
            self.me, SelfView(self.role, self.term, self.leader, graceOver, may,
                              self.following.position), self.views
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
                self.log.info("this node's clock agrees with its live peers again",
                              event="clock_trusted")
                if self._deferred:
                    self._deferred = False
                    self.leader = None
                    self.setRole(SYNCING)
                self.broadcastHeartbeat()
            return
        what, ahead = self.heartbeats.aheadOf[distrusted]
        if self.clockSuspect is not None:
            return
        self.clockSuspect = clocktrust.reason(self.name(distrusted), what, ahead)
        self.log.error("{why}", why=self.clockSuspect, event="clock_suspect")
        if self.role == ACTIVE:
            self.log.warn("stepping down and offering {peer} our {keys} held keys",
                          peer=self.name(distrusted), keys=self.locks.heldCount(),
                          event="stepped_down")
            self.eras.steppingDown(self.me, self.term)
            self.setRole(STANDBY)
            self._deferred = True
        elif self.role == SYNCING:
            self.setRole(STANDBY)
            self._deferred = True
        self.broadcastHeartbeat()

    def unsubscribed(self) -> List[int]:
        return unsubscribed(self.me, self.views, self.links.inbound)

    def subscribed(self) -> None:
        self.gate()

    def gate(self) -> None:
        """
        Serve, or stop serving, as the serving gate says (see serving.py).
        """
        active = self.role == ACTIVE
        now = self.clock.seconds()
        verdict = self.servingGate.judge(active, self.unsubscribed() if active else [], now)
        missing = verdict.missing
        names = ", ".join(self.name(j) for j in missing)
        if verdict.servingWithout is not None:
            self.log.warn(
                "serving although live peer(s) {peers} do not follow this node "
                "after {seconds:.1f} s: changes answered now may be lost if this "
                "node fails", peers=names, seconds=verdict.servingWithout,
                event="serving_without_peers")
        if not verdict.changed:
            if active:
                # Frozen still, maybe for another reason (its peers read).
                self.nodeState.move(activeState(self.servingGate))
            return
        self._enter(activeState(self.servingGate))
        if self.serving:
            self.healing.serving()
            self.log.info("serving: {peers} live peer(s) receive the stream "
                          "({ms:.0f} ms after this node {what})",
                          peers=sum(1 for j, v in self.views.items()
                                    if v.alive and j not in missing),
                          ms=verdict.frozenFor * 1000,
                          what="became active" if verdict.sinceActive else "stopped serving",
                          event="serving")
        elif missing:
            self.log.info("not serving until {peers} receive(s) the stream", peers=names,
                          event="not_serving")

    def _act(self, action: Action) -> None:
        if action.kind == "promote":
            self._promote()
        elif action.kind == "step-down":
            assert action.peer is not None
            self.log.warn(
                "split brain: {peer} is active too (term {theirs} >= {ours}); stepping down "
                "and handing it our {keys} held keys",
                peer=self.name(action.peer), theirs=self.views[action.peer].term,
                ours=self.term, keys=self.locks.heldCount(), event="stepped_down",
            )
            self.setRole(STANDBY)
            self.follow(action.peer, merge=True)
        elif action.kind == "follow":
            assert action.peer is not None
            if self.following.catchUp(self.leader):
                # Its last lines may have changed what to do.
                self.evaluate()
                return
            # A standby that changes leader offers its mirror to the new
            # one: a key held on one side only must survive a heal.
            self.follow(action.peer, merge=self.role == STANDBY and self.leader is not None)
        elif action.kind == "bump-term":
            self.log.warn("split brain: a lower-priority node is active; claiming a higher term",
                          event="term_claimed")
            self.term = self.newTerm()
            self.broadcastHeartbeat()
        elif action.kind == "hand-off":
            assert action.peer is not None
            self.handoffs.start(action.peer, stopping=False)
