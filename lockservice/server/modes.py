# -*- test-case-name: tests.server.test_leases -*-
"""
What a lock service does with its clients' requests: one of three modes,
changed only by L{LockService.setMode<lockservice.server.service.LockService.setMode>}.

    SERVING      grants, releases, renewals; waits end and leases expire.
    FROZEN       every request is answered C{M <op> <key> *} (ask again
                 soon); queued waiters and observers stay; leases stay
                 filed and none expires; the table changes only by a merge.
    REDIRECTING  requests are answered C{M <op> <key> <active>}, and queued
                 waiters and observers are sent there; the table mirrors
                 the active's, and no lease is filed.

A node is frozen for more reasons than a handoff (the node's states are
L{lockservice.cluster.serving}'s); the role it shows while frozen
(C{/status}, the metrics, the peers' heartbeats) is C{handing-off},
whatever the reason, as it always was.

Any mode may follow any other (the cluster decides).  A move does what
the two rows differ in:

                 leases        expiry   queued waiters and observers
    SERVING      filed         on       stay
    FROZEN       filed         off      stay
    REDIRECTING  not filed     off      sent to the active
"""

from __future__ import annotations

from typing import Dict, FrozenSet, Optional

from lockservice.core.election import ACTIVE, HANDING_OFF, LEAVING, STANDBY, SYNCING

SERVING = "serving"
FROZEN = "frozen"
REDIRECTING = "redirecting"

# The role a mode shows, where it has one of its own (a redirecting node
# shows why it redirects: standby, syncing or leaving).
SHOWN_ROLE: Dict[str, str] = {SERVING: ACTIVE, FROZEN: HANDING_OFF}

MODE_OF_ROLE: Dict[str, str] = {
    ACTIVE: SERVING,
    HANDING_OFF: FROZEN,
    STANDBY: REDIRECTING,
    SYNCING: REDIRECTING,
    LEAVING: REDIRECTING,
}

# The modes whose table is this node's own: its leases are filed (they
# expire only while serving) and its waiters stay queued.
OWN_TABLE: FrozenSet[str] = frozenset((SERVING, FROZEN))

def modeOf(role: str) -> str:
    """
    The mode of a node that shows C{role}.
    """
    return MODE_OF_ROLE.get(role, REDIRECTING)


def roleShown(mode: str, role: Optional[str]) -> str:
    """
    The role a node in C{mode} shows: its mode's own, else C{role} (why it
    redirects), else C{standby}.
    """
    return SHOWN_ROLE.get(mode) or role or STANDBY
