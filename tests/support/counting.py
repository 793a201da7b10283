"""
Counting the work of lockservice's own code (calls and executed lines)
deterministically, with sys.settrace.
"""

from __future__ import annotations

import os
import sys
from types import FrameType
from typing import Any, Callable, NamedTuple, Optional, Tuple

import lockservice


class Work(NamedTuple):
    """
    What one step ran in lockservice's modules, on average.
    """

    lines: float
    calls: float

    def __sub__(self, other: Tuple[Any, ...]) -> "Work":
        return Work(self.lines - other[0], self.calls - other[1])


def counted(step: Callable[[int], None], count: int) -> Work:
    """
    Run C{step(i)} C{count} times (after 20 runs left out of the count:
    first-time paths) and return the lines and calls per run.
    """
    for i in range(20):
        step(i)
    lines = calls = 0

    def inside(frame: FrameType, event: str, arg: object) -> Any:
        nonlocal lines
        if event == "line":
            lines += 1
        return inside

    def trace(frame: FrameType, event: str, arg: object) -> Optional[Callable[..., Any]]:
        nonlocal calls
        if event == "call" and frame.f_code.co_filename.startswith(ROOT):
            calls += 1
            return inside
        return None  # no line events for frames outside lockservice

    previous = sys.gettrace()  # (coverage's, under tox)
    sys.settrace(trace)
    try:
        for i in range(count):
            step(i)
    finally:
        sys.settrace(previous)
    return Work(lines / count, calls / count)



ROOT = os.path.dirname(lockservice.__file__) + os.sep
