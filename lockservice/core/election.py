# -*- test-case-name: tests.core.test_election -*-
"""
Who should be active: a pure decision over what this node knows of its
peers.  No quorum: among live nodes, priority (the position in --peers,
lower index first) decides, and terms order the claims.

The cluster service calls L{decide} whenever something changes (a
heartbeat, a lost link, a timer) and carries out the action it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, Iterable, Optional

ACTIVE = "active"
HANDING_OFF = "handing-off"
STANDBY = "standby"
SYNCING = "syncing"
LEAVING = "leaving"

ROLES = (ACTIVE, HANDING_OFF, STANDBY, SYNCING, LEAVING)


@dataclass
class PeerView:
    """
    The latest heartbeat of a peer, and whether it is alive right now.
    """

    role: str = SYNCING
    term: int = 0
    leader: Optional[int] = None
    alive: bool = False
    secretMismatch: bool = False
    # The peer distrusts its own clock (see lockservice.cluster.clocktrust):
    # it never serves, and holds no state to wait for or hand over to.
    clockSuspect: bool = False
    # How far its copy of its leader's stream goes (see behind()).
    position: int = 0


@dataclass
class SelfView:
    role: str
    term: int
    leader: Optional[int]
    startupGraceOver: bool
    mayPromote: bool = True
    position: int = 0


def behind(mine: SelfView, theirs: PeerView) -> Optional[bool]:
    """
    Whether a standby's copy of the stream both follow is shorter than
    ours (True) or longer (False); None when they follow different
    leaders: then priority alone decides.  (A node's stream positions rise
    for as long as it runs, and start above its earlier runs'.)  A copy
    is shorter when its link was cut (silent one way, redialled) while
    the active went on answering with the others' acknowledgements: a
    copy that missed answered releases must not take over from one that
    has them.
    """
    if mine.leader is None or theirs.leader != mine.leader:
        return None
    if theirs.position == mine.position:
        return None
    return theirs.position < mine.position


@dataclass(frozen=True)
class Action:
    """
    C{kind} is one of: promote, step-down, follow, bump-term, hand-off.
    C{peer} is the peer concerned; C{term} the new term where one is set.
    """

    kind: str
    peer: Optional[int] = None
    term: Optional[int] = None


def _serving(view: PeerView) -> bool:
    return view.alive and view.role in (ACTIVE, HANDING_OFF)


def mayPromote(me: int, authenticated: Iterable[int], mismatched: Iterable[int]) -> bool:
    """
    Whether a node may take the active role while some peers answer its
    handshakes with a different secret.  It must not quietly run as a
    second active: it may only when it agrees on the secret with more
    nodes (itself included) than it disagrees with, or as many when every
    node it disagrees with has a lower priority.  Of two nodes with
    different secrets, only the higher-priority one serves; of three with
    one odd secret, the odd node never does.

    @param authenticated: peers alive on links that proved our secret.
    @param mismatched: peers that answer our handshakes with another secret.
    """
    mismatched = list(mismatched)
    if not mismatched:
        return True
    agree = 1 + len(list(authenticated))
    if agree != len(mismatched):
        return agree > len(mismatched)
    return all(j > me for j in mismatched)


def decide(me: int, state: SelfView, peers: Dict[int, PeerView]) -> Optional[Action]:
    """
    The one thing this node should do now, or None.

    @param me: this node's index in the priority list (0 is highest).
    @param peers: every other node, by index.
    """
    action = _decide(me, state, peers)
    if action is not None and action.kind == "promote" and not state.mayPromote:
        return None
    return action


def _decide(me: int, state: SelfView, peers: Dict[int, PeerView]) -> Optional[Action]:
    if state.role in (HANDING_OFF, LEAVING):
        return None  # in transit: the handoff itself decides what comes next
    serving = sorted(j for j, v in peers.items() if _serving(v))
    if state.role == ACTIVE:
        claims = [j for j in serving if peers[j].role == ACTIVE]
        higher = [j for j in claims if j < me]
        if higher:
            j = higher[0]
            if peers[j].term >= state.term:
                return Action("step-down", j)
            # A lower term from a higher-priority node is either a stale
            # heartbeat from before a handoff, or a node that has not yet
            # seen our term: it bumps its own term when it does.
        lower = [j for j in claims if j > me]
        if lower:
            top = max(peers[j].term for j in lower)
            if top >= state.term:
                # Split brain and we have priority: out-rank the other side.
                return Action("bump-term", term=top + 1)
        synced = [
            j for j, v in peers.items()
            if j < me and v.alive and v.role == STANDBY and v.leader == me
            and not v.clockSuspect
        ]
        if synced:
            return Action("hand-off", min(synced))
        return None
    # Standby or syncing: follow whoever serves, by priority.
    if serving:
        leader = serving[0]
        if state.leader != leader:
            return Action("follow", leader)
        return None
    stateful = [j for j, v in peers.items()
                if v.alive and v.role == STANDBY and not v.clockSuspect]
    if state.role == STANDBY:
        # The standby whose copy of the common stream goes furthest takes
        # over; among equals, priority.  A shorter one follows it, syncs,
        # and is handed the active role back (its priority) once it has it.
        if any(behind(state, peers[j]) is False for j in stateful):
            return None
        if not any(j < me and behind(state, peers[j]) is not True for j in stateful):
            return Action("promote")
        return None
    # Syncing: we hold no state. Take over only when nobody alive has any,
    # after giving the peers time to be heard from.
    if not state.startupGraceOver or stateful:
        return None
    if any(j < me and v.alive and v.role == SYNCING and not v.clockSuspect
           for j, v in peers.items()):
        return None
    return Action("promote")
