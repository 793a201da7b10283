# -*- test-case-name: tests.cluster.test_serving -*-
"""
The states a node is in, and when an active node may serve its clients:
the serving gate.

An active node serves client changes only while every live peer it
knows of receives its stream: right after a promotion or a takeover, the
other nodes (the old active among them) subscribe within a heartbeat or
two, and an answer given before that could be lost on a kill -9.
Meanwhile the node is frozen (C{M ... *}, queued waiters stay queued:
the state awaiting-standbys), as during a handoff.  A live peer that does not subscribe within
L{SUBSCRIBE_BOUND} peer timeouts is not our standby: the node serves
without it.

And a node that did not run for L{Gate.frozenAfter} (stopped, starved)
serves nothing until it has read what its peers sent meanwhile: a
standby may have promoted, and its news waits unread in our sockets,
behind the requests that piled up (the state reading-peers).

Pure: the caller says what it sees and passes the time; it logs and acts
on the L{Verdict}, and moves its L{NodeState}.

A node's states, the role each shows (heartbeats, C{/status} C{role})
and what its lock service does then (L{lockservice.server.modes}):

    state               role         lock service
    syncing             syncing      redirects   copying its leader's state
    standby             standby      redirects   a copy in step with its leader
    awaiting-standbys   active       frozen      until every live peer takes
                                                 its stream (or SUBSCRIBE_BOUND)
    reading-peers       active       frozen      it did not run for a while:
                                                 reads what its peers sent first
    serving             active       serves
    handing-off         handing-off  frozen      its locks go to a successor
    leaving             leaving      redirects   stopping, for good

The lock service of a frozen node shows the role C{handing-off}, whatever
the reason; C{/status} C{state} says which.  The moves (L{MOVES}):

    syncing            -> standby (synchronised; or its clock is suspect),
                          awaiting-standbys | serving (promoted)
    standby            -> syncing (its clock is trusted again),
                          awaiting-standbys | serving (promoted, took over)
    awaiting-standbys  -> serving (every live peer takes the stream)
    serving            -> awaiting-standbys (a live peer does not take it),
                          reading-peers (did not run for a while)
    reading-peers      -> serving | awaiting-standbys (read its peers)
    any active state   -> handing-off (a higher-priority standby is in step),
                          standby (stepped down: split brain, clock suspect)
    handing-off        -> standby | leaving (handed off),
                          awaiting-standbys | serving (the handoff failed)
    any but leaving    -> leaving (a graceful stop)
"""

from __future__ import annotations

from math import inf
from typing import Any, Callable, Dict, FrozenSet, List, Mapping, NamedTuple, Optional

from lockservice.core import election
from lockservice.core.election import PeerView

SYNCING = "syncing"
STANDBY = "standby"
AWAITING_STANDBYS = "awaiting-standbys"
READING_PEERS = "reading-peers"
SERVING = "serving"
HANDING_OFF = "handing-off"
LEAVING = "leaving"

# The role each state shows (lockservice.core.election's roles).
ROLE_OF: Dict[str, str] = {
    SYNCING: election.SYNCING,
    STANDBY: election.STANDBY,
    AWAITING_STANDBYS: election.ACTIVE,
    READING_PEERS: election.ACTIVE,
    SERVING: election.ACTIVE,
    HANDING_OFF: election.HANDING_OFF,
    LEAVING: election.LEAVING,
}

# The states in which the node's lock service is frozen (it serves
# nothing, and its waiters stay its own).
FROZEN: FrozenSet[str] = frozenset((AWAITING_STANDBYS, READING_PEERS, HANDING_OFF))

_ACTIVE = frozenset((AWAITING_STANDBYS, READING_PEERS, SERVING))

# Where each state may go next (besides staying).  Which of the active
# states a node enters is its serving gate's call (L{activeState}).
MOVES: Dict[str, FrozenSet[str]] = {
    SYNCING: _ACTIVE | {STANDBY, LEAVING},
    STANDBY: _ACTIVE | {SYNCING, LEAVING},
    AWAITING_STANDBYS: _ACTIVE | {HANDING_OFF, STANDBY, LEAVING},
    READING_PEERS: _ACTIVE | {HANDING_OFF, STANDBY, LEAVING},
    SERVING: _ACTIVE | {HANDING_OFF, STANDBY, LEAVING},
    HANDING_OFF: _ACTIVE | {STANDBY, LEAVING},
    LEAVING: frozenset(),
}


class NodeState:
    """
    The node's state (one of L{MOVES}' keys), moved only along L{MOVES}.

    @ivar current: the state now.
    """

    def __init__(self, unexpected: Callable[[str, str], None]) -> None:
        """
        @param unexpected: told of a move L{MOVES} does not list, as
            C{(from, to)} (a bug: it is logged, and the move made all the
            same, so the node goes on doing what it was told).
        """
        self.current = SYNCING
        self._unexpected = unexpected

    @property
    def role(self) -> str:
        """
        The role the current state shows.
        """
        return ROLE_OF[self.current]

    def move(self, to: str) -> bool:
        """
        Go to state C{to}.

        @return: whether the state changed.
        """
        before = self.current
        if to == before:
            return False
        if to not in MOVES[before]:
            self._unexpected(before, to)
        self.current = to
        return True


def activeState(gate: "Gate") -> str:
    """
    The state of an active node whose serving gate is C{gate}.
    """
    if gate.serving:
        return SERVING
    return READING_PEERS if gate.resuming else AWAITING_STANDBYS


def stateOf(role: str, gate: "Gate") -> str:
    """
    The state of a node that takes C{role}, given its serving gate.
    """
    return activeState(gate) if role == election.ACTIVE else role

# How long a new active waits for a live peer that does not subscribe to
# its stream before it serves anyway (in units of --peer-timeout): a peer
# that neither dies nor follows us is not our standby.
SUBSCRIBE_BOUND = 2.0


def frozenAfter(heartbeat: float, peerTimeout: float) -> float:
    """
    A heartbeat timer this late means the process did not run: half the
    time a peer has to notice, and well over the heartbeat period itself.
    """
    return max(peerTimeout / 2, 2.5 * heartbeat)


def unsubscribed(me: int, views: Mapping[int, PeerView], inbound: Mapping[int, Any]) -> List[int]:
    """
    The live peers that do not receive our replication stream: it did
    not ask for it on its current link (C{inbound[j].replicating}), or its
    heartbeat does not say it follows us (a link left over from an
    earlier term).  A peer leaving, or that distrusts its own clock, holds
    nothing to wait for.
    """
    return [j for j, v in views.items()
            if v.alive and v.role != election.LEAVING and not v.clockSuspect
            and not (j in inbound and inbound[j].replicating and v.leader == me)]


class Verdict(NamedTuple):
    """
    What L{Gate.judge} found.

    @ivar changed: whether serving changed (to L{Gate.serving}).
    @ivar missing: the live peers that do not receive the stream.
    @ivar servingWithout: how long (seconds) the node waited before
        serving without C{missing}: to be logged, once; else None.
    @ivar frozenFor: when serving starts, since when it did not serve
        (seconds), and whether that is since it became active.
    """

    changed: bool
    missing: List[int]
    servingWithout: Optional[float] = None
    frozenFor: float = 0.0
    sinceActive: bool = False


class Gate:
    """
    Whether this node, when active, serves now.

    @ivar serving: the node serves client changes.
    @ivar resuming: it found it did not run for a while, and serves
        nothing until it has read its peers.
    """

    def __init__(self, heartbeat: float, peerTimeout: float, now: float) -> None:
        self.frozenAfter = frozenAfter(heartbeat, peerTimeout)
        self.bound = SUBSCRIBE_BOUND * peerTimeout
        self.serving = False
        self.resuming = False
        self.activeSince = now
        self._frozenAt = -inf  # when this active last stopped serving
        self._unsubscribedSince: Dict[int, float] = {}
        self._unsubscribedLogged = False

    def becameActive(self, now: float) -> None:
        self.activeSince = now
        self._unsubscribedLogged = False
        self._unsubscribedSince.clear()

    def late(self, idle: float) -> bool:
        """
        Whether C{idle} seconds since the last heartbeat timer mean this
        process did not run.
        """
        return idle > self.frozenAfter

    def stopUntilRead(self, idle: float) -> bool:
        """
        After C{idle} seconds without running: whether to stop serving now,
        until the peers are read (see L{readUp}).
        """
        if self.serving and not self.resuming and idle > self.frozenAfter:
            self.resuming = True
            return True
        return False

    def readUp(self) -> None:
        """
        The peers were read since the node resumed.
        """
        self.resuming = False

    def judge(self, active: bool, missing: List[int], now: float) -> Verdict:
        """
        Whether to serve, given our role and the live peers that do not
        receive our stream (C{missing}); L{serving} is set to the answer.
        """
        if not active:
            self.serving = False
            return Verdict(False, missing)
        for j in list(self._unsubscribedSince):
            if j not in missing:
                del self._unsubscribedSince[j]
        for j in missing:
            self._unsubscribedSince.setdefault(j, now)
        serving = not missing
        servingWithout = None
        if self.resuming:
            serving = False
        elif missing:
            # Each peer gets the bound from when it became a live
            # non-subscriber (a restarted node syncs within it).
            waited = now - max(self._unsubscribedSince[j] for j in missing)
            if waited >= self.bound:
                serving = True
                if not self._unsubscribedLogged:
                    self._unsubscribedLogged = True
                    servingWithout = waited
        else:
            self._unsubscribedLogged = False
        if serving == self.serving:
            return Verdict(False, missing, servingWithout)
        self.serving = serving
        if not serving:
            self._frozenAt = now
            return Verdict(True, missing, servingWithout)
        since = max(self.activeSince, self._frozenAt)
        return Verdict(True, missing, servingWithout, now - since, since == self.activeSince)
