# -*- test-case-name: tests.core.test_keystats -*-
"""
Per-second activity over the last few minutes, for the dashboard's
charts: grants, acquires that had to wait, and the hold times of the
grants that ended, in a fixed ring of one slot per second.

Pure: the caller gives the (monotonic) time of each observation.
"""

from __future__ import annotations

import math
from typing import Dict, List


class _Slot:
    __slots__ = ("second", "grants", "waits", "holds", "holdTotal", "holdMax")

    def __init__(self) -> None:
        self.second = -1
        self.grants = 0
        self.waits = 0
        self.holds = 0
        self.holdTotal = 0.0
        self.holdMax = 0.0


class Series:
    """
    The last C{span} seconds of activity, one slot per whole second.
    """

    def __init__(self, span: int = 300) -> None:
        self.span = span
        self._slots = [_Slot() for _ in range(span)]

    def _slot(self, now: float) -> _Slot:
        second = math.floor(now)
        slot = self._slots[second % self.span]
        if slot.second != second:
            slot.__init__()  # type: ignore[misc]
            slot.second = second
        return slot

    def add(self, now: float, grants: int = 0, waits: int = 0, holds: int = 0,
            holdTotal: float = 0.0, holdMax: float = 0.0) -> None:
        """
        Count several events of the second of C{now} at once (a batch).
        """
        slot = self._slot(now)
        slot.grants += grants
        slot.waits += waits
        slot.holds += holds
        slot.holdTotal += holdTotal
        if holdMax > slot.holdMax:
            slot.holdMax = holdMax

    def granted(self, now: float) -> None:
        self._slot(now).grants += 1

    def queued(self, now: float) -> None:
        self._slot(now).waits += 1

    def held(self, now: float, seconds: float) -> None:
        slot = self._slot(now)
        slot.holds += 1
        slot.holdTotal += seconds
        if seconds > slot.holdMax:
            slot.holdMax = seconds

    def last(self, now: float, seconds: int) -> List[Dict[str, float]]:
        """
        One entry per second for the C{seconds} whole seconds before the
        current one (oldest first); C{ago} counts seconds back from now.
        """
        seconds = max(0, min(seconds, self.span - 1))
        current = math.floor(now)
        out: List[Dict[str, float]] = []
        for ago in range(seconds, 0, -1):
            second = current - ago
            slot = self._slots[second % self.span]
            if slot.second != second:
                out.append({"ago": ago, "grants": 0, "waits": 0, "holds": 0,
                            "hold_mean": 0.0, "hold_max": 0.0})
                continue
            out.append({
                "ago": ago,
                "grants": slot.grants,
                "waits": slot.waits,
                "holds": slot.holds,
                "hold_mean": round(slot.holdTotal / slot.holds, 6) if slot.holds else 0.0,
                "hold_max": round(slot.holdMax, 6),
            })
        return out
