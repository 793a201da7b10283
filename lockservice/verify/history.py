"""
What a chaos run records (acquires, critical sections, fenced accesses,
faults) and the checkers that read it: each counts violations, and a run
passes only when every count is 0.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from lockservice.client.fencing import FenceGuard, StaleToken

now = time.monotonic


@dataclass
class AcquireRecord:
    worker: str
    key: str
    wait: float
    start: float
    end: Optional[float] = None
    outcome: Optional[str] = None  # granted, timeout, error
    token: Optional[int] = None


@dataclass
class Section:
    worker: str
    key: str
    token: int
    enter: float
    exit: float


@dataclass
class Access:
    key: str
    token: int
    at: float
    accepted: bool


@dataclass
class Fault:
    kind: str
    start: float
    windowEnd: Optional[float] = None  # None: not a window where overlap is allowed
    detail: str = ""


@dataclass
class History:
    acquires: List[AcquireRecord] = field(default_factory=list)
    sections: List[Section] = field(default_factory=list)
    accesses: List[Access] = field(default_factory=list)
    faults: List[Fault] = field(default_factory=list)
    gaps: Dict[str, List[float]] = field(default_factory=dict)
    abandoned: List[Tuple[float, float, Optional[float]]] = field(default_factory=list)
    abandonedWaiters: List[Tuple[float, Optional[float]]] = field(default_factory=list)
    resetPromotions: int = 0
    handoffChecks: int = 0
    handoffLost: int = 0
    releasesUndone: int = 0
    staleReleases: int = 0
    failedReleases: int = 0


class FencedResource:
    """
    The protected resource: every access carries the token; the fence
    refuses a token lower than one already accepted.  Every access is
    recorded, accepted or not.
    """

    def __init__(self, history: History) -> None:
        self.guard = FenceGuard()
        self.history = history

    def write(self, key: str, token: int) -> bool:
        try:
            self.guard.admit(key, token)
            accepted = True
        except StaleToken:
            accepted = False
        self.history.accesses.append(Access(key, token, now(), accepted))
        return accepted


# -- checkers ------------------------------------------------------------------------


def checkFence(h: History) -> int:
    """
    What the resource actually accepted, judged on its own record (not on
    the guard's logic): per key, an accepted token lower than one accepted
    before is a violation, and so are two grants whose accepted accesses
    interleave (an overlap of accepted critical sections: A, B, A).
    """
    violations = 0
    byKey: Dict[str, List[Access]] = {}
    for access in sorted(h.accesses, key=lambda a: a.at):
        if access.accepted:
            byKey.setdefault(access.key, []).append(access)
    for accepted in byKey.values():
        highest = -1
        spans: Dict[int, List[float]] = {}
        for access in accepted:
            if access.token < highest:
                violations += 1
            highest = max(highest, access.token)
            span = spans.setdefault(access.token, [access.at, access.at])
            span[1] = access.at
        ordered = sorted(spans.values())
        for (_, end), (start, _) in zip(ordered, ordered[1:], strict=False):
            if start < end:
                violations += 1
    return violations


def checkTokens(h: History) -> int:
    """
    No token is issued twice, and a grant requested after another grant was
    acknowledged carries a higher token (across failovers and split brains).
    """
    grants = [a for a in h.acquires if a.outcome == "granted"]
    violations = len(grants) - len({a.token for a in grants})
    byAck = sorted(grants, key=lambda a: a.end or 0.0)
    byStart = sorted(grants, key=lambda a: a.start)
    highest = -1
    i = 0
    for g in byStart:
        while i < len(byAck) and (byAck[i].end or 0.0) < g.start:
            highest = max(highest, byAck[i].token or 0)
            i += 1
        if (g.token or 0) <= highest:
            violations += 1
    return violations


def overlaps(h: History) -> List[Tuple[Section, Section]]:
    pairs = []
    byKey: Dict[str, List[Section]] = {}
    for s in h.sections:
        byKey.setdefault(s.key, []).append(s)
    for sections in byKey.values():
        sections.sort(key=lambda s: s.enter)
        for i, a in enumerate(sections):
            for b in sections[i + 1:]:
                if b.enter >= a.exit:
                    break
                pairs.append((a, b))
    return pairs


def checkOverlaps(h: History) -> Tuple[int, int]:
    """
    @return: (overlapping critical sections, of which outside any fault window)
    """
    windows = [(f.start, f.windowEnd) for f in h.faults if f.windowEnd is not None]
    found = overlaps(h)
    outside = 0
    for a, b in found:
        start, end = max(a.enter, b.enter), min(a.exit, b.exit)
        if not any(ws <= start and end <= we for ws, we in windows):
            outside += 1
    return len(found), outside


def checkAcquires(h: History) -> Tuple[int, int]:
    """
    @return: (acquires that never ended, acquires that ended later than wait + 1 s)
    """
    lost = sum(1 for a in h.acquires if a.outcome is None)
    late = sum(1 for a in h.acquires
               if a.end is not None and a.wait > 0 and a.end - a.start > a.wait + 1.0)
    return lost, late


def checkAbandoned(h: History) -> int:
    """
    A lock whose holder was killed is granted again within lease + 10%.
    """
    return sum(1 for grantedAt, lease, regranted in h.abandoned
               if regranted is None or regranted - grantedAt > lease * 1.1)


def checkAbandonedWaiters(h: History) -> int:
    """
    A waiter killed while queued is withdrawn: when the key is released,
    the next acquire gets it within a second (not after the dead waiter's
    lease).
    """
    return sum(1 for releasedAt, regranted in h.abandonedWaiters
               if regranted is None or regranted - releasedAt > 1.0)


# -- the run ---------------------------------------------------------------------------
