# -*- test-case-name: tests.cluster.test_cluster_unit -*-
"""
Handing the active role to another node: on a graceful stop, and to a
higher-priority node that came back and caught up.

    old active                               successor
    (flush the live stream)
    HANDOFF <term>                     ->    takes over at <term>
                                       <-    TAKEN <term>    (or REFUSED <term>)

The successor is a synchronised standby: it already mirrors every held
key through the live stream, so no snapshot is sent at handoff time, and
its leases keep running on its own clock from the remaining times it was
sent.  The old active freezes (answers C{M ... *}) until TAKEN.

One successor per handoff: when TAKEN does not come in time, the old
active only turns to another candidate once it knows the first did not
take over (it refused, or it is dead); while the first is alive but
silent about it, the old active keeps waiting, up to a bound.  Each
attempt claims a term of its own, so two attempts can never make two
actives of one term.
"""

from __future__ import annotations

from math import inf
from typing import Any, Dict, Optional

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.internet.task import deferLater
from twisted.logger import Logger

from lockservice.cluster import peerwire
from lockservice.cluster.interfaces import IHandoffOwner
from lockservice.cluster.links import Links
from lockservice.cluster.peer import PeerChannel
from lockservice.core.election import ACTIVE, STANDBY, PeerView

HANDOFF_CHECK = 0.5
HANDOFF_GIVE_UP = 6.0
FLUSH_BEFORE_EXIT = 0.1


class Attempt:
    def __init__(self, successor: int, term: int, stopping: bool, startedAt: float) -> None:
        self.successor = successor
        self.term = term
        self.stopping = stopping
        self.startedAt = startedAt
        self.done: "Deferred[bool]" = Deferred()
        self.timer: Optional[IDelayedCall] = None


class Handoffs:
    """
    The handoff in progress, if any, on either side.  It tells its owner
    what happened (L{IHandoffOwner}); the owner changes role and term.
    """

    log = Logger()

    def __init__(self, owner: IHandoffOwner, clock: Any, links: Links,
                 views: Dict[int, PeerView], me: int) -> None:
        self.owner = owner
        self.clock = clock
        self.links = links
        self.views = views
        self.me = me
        self.current: Optional[Attempt] = None

    async def beforeStopping(self) -> None:
        """
        On SIGINT/SIGTERM, an active node hands over to the highest-priority
        live standby (its stream is already up to date) before it lets its
        clients go.  One successor at a time: the next candidate is only
        tried once the previous one surely did not take over.
        """
        if self.owner.role != ACTIVE:
            return
        inbound = self.links.inbound
        # Those heard from lately first, by priority: a standby silent for
        # a quarter of --peer-timeout (heartbeats come every tenth) may be
        # frozen, and the first successor tried is waited for until it is
        # surely gone (up to --peer-timeout).
        now, quiet = self.clock.seconds(), self.links.peerTimeout / 4
        lastHeard = self.links.lastHeard
        candidates = sorted(
            (j for j, v in self.views.items()
             if v.alive and v.role == STANDBY and v.leader == self.me
             and not v.clockSuspect and j in inbound and inbound[j].synced),
            key=lambda j: (now - lastHeard.get(j, -inf) > quiet, j))
        if not candidates:
            self.log.warn("stopping with no live standby: held locks end with this node",
                          event="stopping_without_standby")
        for j in candidates:
            if await self.start(j, stopping=True):
                await deferLater(self.clock, FLUSH_BEFORE_EXIT, lambda: None)
                break
            if self.owner.role != ACTIVE:
                break

    def start(self, j: int, stopping: bool) -> "Deferred[bool]":
        """
        Hand the active role to peer C{j} (it follows us on its link).

        @return: fires with True once C{j} took over, False when it did not.
        """
        owner = self.owner
        channel = self.links.inbound.get(j)
        if channel is None or not channel.synced or owner.role != ACTIVE:
            return succeed(False)
        attempt = Attempt(j, owner.newTerm(), stopping, self.clock.seconds())
        self.current = attempt
        self.log.info("handing off to {peer} (term {term})", peer=owner.name(j),
                      term=attempt.term, event="handoff_started")
        owner.handingOff()
        channel.send(peerwire.handoff(attempt.term))
        owner.broadcastHeartbeat()
        attempt.timer = self.clock.callLater(HANDOFF_CHECK, self._check)
        return attempt.done

    def _check(self) -> None:
        attempt = self.current
        if attempt is None:
            return
        attempt.timer = None
        j = attempt.successor
        view = self.views[j]
        if view.alive and view.role == ACTIVE and view.term >= attempt.term:
            # Its TAKEN was lost, but it did take over.
            return self.taken(j, view.term)
        waited = self.clock.seconds() - attempt.startedAt
        if not self.links.alive(j):
            return self.failed(f"{self.owner.name(j)} is gone")
        if waited >= HANDOFF_GIVE_UP:
            return self.failed("no answer to the handoff")
        attempt.timer = self.clock.callLater(HANDOFF_CHECK, self._check)

    def takeOver(self, j: int, channel: PeerChannel, term: int) -> None:
        """
        Our leader hands us the active role.  Refused when this process has
        just run again after a freeze: the offer may be one its sender gave
        up on long ago (it found us silent and handed off to another), and
        taking it would make a second active from a stale copy.
        """
        owner = self.owner
        if (not owner.fromLeader(j, channel) or owner.role != STANDBY or owner.stopping
                or owner.justResumed() or not owner.plausible(j, term, "term")):
            channel.send(peerwire.refused(term))
            return
        owner.tookOver(j, term)
        channel.send(peerwire.taken(term))
        owner.broadcastHeartbeat()

    def taken(self, j: int, term: int) -> None:
        attempt = self.current
        if attempt is None or attempt.successor != j or attempt.term != term:
            return
        self._end(attempt)
        self.log.warn("handed off to {peer} (term {term})", peer=self.owner.name(j), term=term,
                      event="handed_off")
        self.owner.handedOff(j, term, attempt.stopping)
        attempt.done.callback(True)

    def refused(self, j: int, term: int) -> None:
        attempt = self.current
        if attempt is not None and attempt.successor == j and attempt.term == term:
            self.failed(f"{self.owner.name(j)} refused the handoff")

    def lost(self, j: int) -> None:
        """
        The successor's link to us closed: wait and see (it may have taken
        over and redial); the check decides.
        """

    def failed(self, why: str) -> None:
        attempt = self.current
        if attempt is None:
            return
        self._end(attempt)
        self.log.warn("handoff to {peer} failed: {why}",
                      peer=self.owner.name(attempt.successor), why=why,
                      event="handoff_failed")
        self.owner.handoffFailed()
        attempt.done.callback(False)

    def _end(self, attempt: Attempt) -> None:
        self.current = None
        if attempt.timer is not None and attempt.timer.active():
            attempt.timer.cancel()
        attempt.timer = None

    def stop(self) -> None:
        if self.current is not None:
            self._end(self.current)
