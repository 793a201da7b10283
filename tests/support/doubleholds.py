"""
A check shared by the tests of every client face: no key was ever held by
two at once.
"""

from __future__ import annotations

from typing import List, Tuple


def assertNoDoubleHolds(spans: List[Tuple[float, float, int]], killedAt: float) -> None:
    """
    No two holds overlap, except a hold that began on the killed active
    (before the kill) with one the successor granted after it: the
    failover window.  Work went on after the failover.
    """
    ordered = sorted(spans)
    latest = ordered[0]
    for span in ordered[1:]:
        s1, e1, t1 = latest
        s2, e2, t2 = span
        if s2 < e1:
            acrossTheKill = s1 < killedAt <= s2
            assert acrossTheKill, f"held twice outside the failover window: {t1} and {t2}"
        if e2 > e1:
            latest = span
    assert any(s > killedAt for s, _, _ in spans)
