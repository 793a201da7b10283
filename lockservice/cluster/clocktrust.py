# -*- test-case-name: tests.cluster.test_cluster_unit -*-
"""
Whether this node may trust its own clock (a node that cannot trust its
own clock never serves beside its peers).

Terms and tokens follow the microsecond clock, so a peer's heartbeat
whose term or token is more than L{PLAUSIBLE_AHEAD} beyond our clock is
refused (one broken or forged peer cannot push the cluster to the end of
the token space).  But refusing is not enough: a node whose clock is two
hours behind refuses every heartbeat of a healthy active, sees nobody
serving, and serves beside it.  So a node that sees such a value treats
its own clock as the suspect: while that peer is alive it does not act as
active, stays standby, and says so in its heartbeats (C{suspect}), so
that the others neither wait for it nor hand it the active role.  Either
way round exactly one side serves: a node far behind defers to its peers,
and the peers of a node far ahead defer to it (its tokens are the higher
ones, so fencing stays right).

Pure: the caller passes what it saw and who is alive.
"""

from __future__ import annotations

from typing import Dict, Iterable, Optional, Tuple

# How far ahead of our clock a peer's token or term may be (microseconds).
PLAUSIBLE_AHEAD = 3600 * 10**6


def aheadBy(value: int, ourMicros: int) -> Optional[int]:
    """
    How far (microseconds) C{value} is beyond what our clock makes
    plausible, or None when it is plausible.
    """
    ahead = value - ourMicros
    return ahead if ahead > PLAUSIBLE_AHEAD else None


def distrustedBy(ahead: Dict[int, Tuple[str, int]], alive: Iterable[int]) -> Optional[int]:
    """
    The live peer (highest priority first) whose heartbeats carried a
    term or token far ahead of our clock, or None: while there is one,
    our clock is the suspect and we do not serve.

    @param ahead: by peer, what its last heartbeat had far ahead of our
        clock (C{"term"} or C{"token"}) and by how many microseconds.
    """
    for j in sorted(alive):
        if j in ahead:
            return j
    return None


def reason(peer: str, what: str, micros: int) -> str:
    """
    Why this node does not serve, for /status and the log.
    """
    return (f"peer {peer} has a {what} {micros / 3.6e9:.1f} h ahead of this node's clock: "
            f"this node's clock looks wrong, so it does not serve while {peer} is alive")
