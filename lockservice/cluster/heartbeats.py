# -*- test-case-name: tests.cluster.test_cluster_unit -*-
"""
Heartbeats and what they tell: every node sends its heartbeat on every
link, both directions, every --heartbeat,

    HB <term> <role> <leader|-> <last_token> [suspect]

and keeps a view of each peer (L{lockservice.core.election.PeerView})
from the heartbeats it hears and the links' liveness.  The heartbeat
timer also finds out when this process did not run for a while (stopped,
starved): what the peers sent meanwhile still waits unread, so it reads
first and judges after (see L{Heartbeats.tick}).
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

from twisted.logger import Logger

from lockservice.cluster import clocktrust, peerwire
from lockservice.cluster.interfaces import IHeartbeatOwner
from lockservice.cluster.links import Links
from lockservice.cluster.serving import Gate
from lockservice.core.election import PeerView
from lockservice.server.service import LockService


class Heartbeats:
    """
    Our heartbeats, and the peer views they and the links keep.

    @ivar aheadOf: by peer, what its last heartbeat had far ahead of our
        clock, and by how much (see clocktrust).
    """

    log = Logger()

    def __init__(self, owner: IHeartbeatOwner, locks: LockService, links: Links,
                 views: Dict[int, PeerView], gate: Gate,
                 wallMicros: Callable[[], int]) -> None:
        self.owner = owner
        self.locks = locks
        self.clock = locks.clock
        self.links = links
        self.views = views
        self.gate = gate
        self.wallMicros = wallMicros
        self.aheadOf: Dict[int, Tuple[str, int]] = {}
        self._lastTick: Optional[float] = None
        self._catchingUp = False

    # -- sending -------------------------------------------------------------

    def line(self) -> bytes:
        owner = self.owner
        return peerwire.heartbeat(owner.term, owner.role, owner.leader, self.locks.lastToken(),
                                  owner.clockSuspect is not None, owner.position())

    def broadcast(self) -> None:
        self.links.broadcast(self.line())

    # -- the timer -------------------------------------------------------------

    def tick(self) -> None:
        now = self.clock.seconds()
        idle = 0.0 if self._lastTick is None else now - self._lastTick
        self._lastTick = now
        if self.gate.late(idle) and not self._catchingUp:
            # This process did not run for a while (stopped, starved): what
            # the peers sent meanwhile still waits unread in our sockets,
            # and timers run before reads.  Read first (one reactor
            # iteration), then judge who is silent.
            self._catchingUp = True
            self.owner.resumedLate(idle)
            self.clock.callLater(0, self.tick)
            return
        self._catchingUp = False
        self.gate.readUp()
        self.links.closeSilent()
        self.refreshViews()
        self.broadcast()
        self.owner.ticked()

    def justResumed(self) -> bool:
        """
        Whether this process did not run for L{Gate.frozenAfter} and has
        not judged its peers since: its last tick is that late (a frozen
        process reads its sockets as soon as it runs again, before the
        late tick), or that tick is catching up (see L{tick}).
        """
        if self._catchingUp:
            return True
        return (self._lastTick is not None
                and self.gate.late(self.clock.seconds() - self._lastTick))

    def notJustResumed(self) -> None:
        """
        Before an active serves a turn of requests or timers: when this
        process did not run for L{Gate.frozenAfter} (stopped, frozen), a
        standby may have promoted meanwhile, and its news waits unread in
        our sockets, behind the requests that piled up.  Answering those
        first would decide things the heal then undoes (a release answered
        OK brought back by the other side's copy), so the node serves
        nothing (C{M ... *}, as during a handoff) until the late tick has
        read its peers and judged again (see L{tick}).
        """
        if self._lastTick is not None:
            self.owner.resumedLate(self.clock.seconds() - self._lastTick)

    # -- the peers' views -------------------------------------------------------

    def refreshViews(self) -> None:
        for j, view in self.views.items():
            alive = self.links.alive(j)
            view.secretMismatch = self.links.secretMismatch(j)
            if alive != view.alive:
                view.alive = alive
                if not alive:
                    self.aheadOf.pop(j, None)
                self._peerChanged(j, alive)

    def _peerChanged(self, j: int, alive: bool) -> None:
        name = self.owner.name(j)
        if alive:
            view = self.views[j]
            self.log.info("peer {peer} is up ({role}, term {term})", peer=name,
                          role=view.role, term=view.term, event="peer_up")
            self.owner.eventSink("peer-up", name, f"{view.role}, term {view.term}")
        else:
            self.log.warn("lost peer {peer}", peer=name, event="peer_lost")
            self.owner.eventSink("peer-down", name, None)

    def heard(self, j: int, fields: Sequence[bytes]) -> None:
        """
        Peer C{j}'s heartbeat.
        """
        beat = peerwire.parseHeartbeat(fields)
        view = self.views[j]
        view.role = beat.role
        view.leader = beat.leader
        view.clockSuspect = beat.suspect
        view.position = beat.position
        now = self.wallMicros()
        ahead = clocktrust.aheadBy(beat.term, now)
        what = "term"
        if ahead is None:
            ahead, what = clocktrust.aheadBy(beat.token, now), "token"
        if ahead is not None:
            # Not adopted; but its role counts: our clock may be the wrong
            # one (see clocktrust), and then we must not serve beside it.
            self.owner.plausible(j, beat.term if what == "term" else beat.token, what)  # logs
            self.aheadOf[j] = (what, ahead)
        else:
            self.aheadOf.pop(j, None)
            view.term = beat.term
            self.owner.peerTerm(j, beat.term, beat.token)
        if not view.alive:
            view.alive = True
            self._peerChanged(j, True)
        self.owner.evaluate()
