# -*- test-case-name: tests.server.test_state -*-
"""
The clocks a node checks: how long it was down (C{CLOCK_BOOTTIME} within
one boot, else the wall clock), and whether its wall clock is behind the
tokens it has issued.
"""

from __future__ import annotations

from typing import Callable, Optional, Tuple

from twisted.application.service import Service
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from lockservice.core.table import TokenIssuer
from lockservice.state.tokens import DurableTokens

BootClock = Callable[[], Optional[Tuple[str, int]]]


def bootClock() -> Optional[Tuple[str, int]]:
    """
    C{(boot id, microseconds since boot)}: a clock that keeps running
    across a process restart and is never stepped (Linux's
    C{CLOCK_BOOTTIME} counts suspended time too); None where there is
    none.
    """
    import time

    try:
        with open("/proc/sys/kernel/random/boot_id", "rb") as f:
            boot = f.read().strip().decode("ascii")
        return boot, int(time.clock_gettime(time.CLOCK_BOOTTIME) * 1e6)
    except (OSError, AttributeError, ValueError, UnicodeDecodeError):
        return None


def downtime(savedWall: int, savedBoot: Optional[Tuple[str, int]], wall: int,
             boot: Optional[Tuple[str, int]]) -> Optional[int]:
    """
    How long (microseconds) a node was down between a save and now, or
    None when it cannot be known: within one boot, the boot clock says it
    exactly; across boots (or without a boot clock) the wall clock does,
    unless it is behind the moment of the save.
    """
    if savedBoot is not None and boot is not None and savedBoot[0] == boot[0]:
        return max(0, boot[1] - savedBoot[1])
    if wall < savedWall:
        return None
    return wall - savedWall


# A clock this far behind the highest token seen is worth a warning: a
# restart without --state-dir (or a failover to it) could issue lower tokens.
BEHIND_WARN = 5 * 1_000_000


def clockBehind(tokens: TokenIssuer, wallNow: int) -> Optional[str]:
    """
    Why this node's clock looks behind, for /status and the log, or None.

    Tokens never run ahead of the clock on their own (C{max(last + 1,
    now)}): a C{last} well ahead means the clock stepped back, or a peer's
    clock is ahead of ours.  With --state-dir (L{DurableTokens}) tokens
    run ahead by design, and a restart starts above the mark.
    """
    if isinstance(tokens, DurableTokens):
        return None
    behind = tokens.last - wallNow
    if behind <= BEHIND_WARN:
        return None
    return (f"this node's clock is {behind / 1e6:.0f} s behind the highest token it has "
            f"issued or learned: without --state-dir a restart of this node (or a failover "
            f"to it) could issue lower tokens")


class ClockWatch(Service):
    """
    Logs, once each way, when L{clockBehind} starts and stops warning.
    """

    log = Logger()
    interval = 5.0

    def __init__(self, clock: IReactorTime, tokens: Callable[[], TokenIssuer],
                 wallMicros: Callable[[], int]) -> None:
        self.clock = clock
        self.tokens = tokens
        self.wallMicros = wallMicros
        self.warning: Optional[str] = None
        self._loop: Optional[LoopingCall] = None

    def startService(self) -> None:
        super().startService()
        self._loop = LoopingCall(self.check)
        self._loop.clock = self.clock
        self._loop.start(self.interval, now=False)

    def stopService(self) -> None:
        super().stopService()
        if self._loop is not None and self._loop.running:
            self._loop.stop()

    def check(self) -> None:
        warning = clockBehind(self.tokens(), self.wallMicros())
        if (warning is None) != (self.warning is None):
            if warning is not None:
                self.log.warn("{why}", why=warning)
            else:
                self.log.info("this node's clock is no longer behind its tokens")
        self.warning = warning
