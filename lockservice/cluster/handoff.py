# -*- test-case-name: tests.test_cluster_unit -*-
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

from typing import TYPE_CHECKING, Optional

from twisted.internet.defer import Deferred, succeed
from twisted.internet.interfaces import IDelayedCall
from twisted.logger import Logger

from lockservice.cluster.peer import PeerChannel
from lockservice.core.election import ACTIVE, HANDING_OFF, LEAVING, STANDBY

if TYPE_CHECKING:
    from lockservice.cluster.node import Cluster

HANDOFF_CHECK = 0.5
HANDOFF_GIVE_UP = 6.0


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
    The handoff in progress, if any, on either side.
    """

    log = Logger()

    def __init__(self, cluster: "Cluster") -> None:
        self.cluster = cluster
        self.current: Optional[Attempt] = None

    def start(self, j: int, stopping: bool) -> "Deferred[bool]":
        """
        Hand the active role to peer C{j} (it follows us on its link).

        @return: fires with True once C{j} took over, False when it did not.
        """
        cluster = self.cluster
        channel = cluster.links.inbound.get(j)
        if channel is None or not channel.synced or cluster.role != ACTIVE:
            return succeed(False)
        attempt = Attempt(j, cluster.newTerm(), stopping, cluster.clock.seconds())
        self.current = attempt
        self.log.info("handing off to {peer} (term {term})", peer=cluster.name(j),
                      term=attempt.term)
        cluster.setRole(HANDING_OFF)
        cluster.stream.flush()
        channel.send(b"HANDOFF %d" % attempt.term)
        cluster.broadcastHeartbeat()
        attempt.timer = cluster.clock.callLater(HANDOFF_CHECK, self._check)
        return attempt.done

    def _check(self) -> None:
        attempt = self.current
        if attempt is None:
            return
        attempt.timer = None
        cluster = self.cluster
        j = attempt.successor
        view = cluster.views[j]
        if view.alive and view.role == ACTIVE and view.term >= attempt.term:
            # Its TAKEN was lost, but it did take over.
            return self.taken(j, view.term)
        waited = cluster.clock.seconds() - attempt.startedAt
        if not cluster.links.alive(j):
            return self.failed(f"{cluster.name(j)} is gone")
        if waited >= HANDOFF_GIVE_UP:
            return self.failed("no answer to the handoff")
        attempt.timer = cluster.clock.callLater(HANDOFF_CHECK, self._check)

    def takeOver(self, j: int, channel: PeerChannel, term: int) -> None:
        """
        Our leader hands us the active role.
        """
        cluster = self.cluster
        if (not cluster.fromLeader(j, channel) or cluster.role != STANDBY or cluster.stopping
                or not cluster.plausible(j, term, "term")):
            channel.send(b"REFUSED %d" % term)
            return
        # Everything of our leader's term reached us before its HANDOFF:
        # a standby's offer of keys from that same stream brings nothing
        # new, only keys dropped since (see Stream.offered).
        cluster.inheritedFrom = (j, cluster.term)
        cluster.term = term
        cluster.learnTerm(term)
        cluster.leader = None
        cluster.promotions += 1
        cluster.setRole(ACTIVE)
        self.log.warn("took over from {peer} by handoff (term {term}) with {keys} held keys",
                      peer=cluster.name(j), term=term, keys=cluster.locks.heldCount())
        cluster.eventSink("promotion", cluster.name(cluster.me),
                          f"by handoff from {cluster.name(j)}, term {term}")
        channel.send(b"TAKEN %d" % term)
        cluster.broadcastHeartbeat()

    def taken(self, j: int, term: int) -> None:
        attempt = self.current
        if attempt is None or attempt.successor != j or attempt.term != term:
            return
        self._end(attempt)
        cluster = self.cluster
        cluster.term = term
        cluster.leader = j
        cluster.views[j].role = ACTIVE
        cluster.views[j].term = term
        cluster.setRole(LEAVING if attempt.stopping else STANDBY)
        self.log.warn("handed off to {peer} (term {term})", peer=cluster.name(j), term=term)
        cluster.eventSink("handoff", cluster.name(j), f"handed off to it, term {term}")
        if not attempt.stopping:
            cluster.follow(j, merge=False)
        else:
            cluster.broadcastHeartbeat()
        attempt.done.callback(True)

    def refused(self, j: int, term: int) -> None:
        attempt = self.current
        if attempt is not None and attempt.successor == j and attempt.term == term:
            self.failed(f"{self.cluster.name(j)} refused the handoff")

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
        cluster = self.cluster
        self.log.warn("handoff to {peer} failed: {why}", peer=cluster.name(attempt.successor),
                      why=why)
        cluster.setRole(ACTIVE)
        cluster.broadcastHeartbeat()
        attempt.done.callback(False)

    def _end(self, attempt: Attempt) -> None:
        self.current = None
        if attempt.timer is not None and attempt.timer.active():
            attempt.timer.cancel()
        attempt.timer = None

    def stop(self) -> None:
        if self.current is not None:
            self._end(self.current)
