# -*- test-case-name: tests.server.test_state -*-
"""

What a node keeps on disk with C{--state-dir DIR} (docs/consistency.md,
"What survives what").

Two things survive a restart:

  - the token high-water mark: before a node issues (or learns) a token
    above the last mark it recorded, it records a new one, the clock plus
    L{MARK_LEAD} (ten minutes of microseconds), so a disk write happens
    once per ten minutes of tokens, not per grant.  (While tokens run
    ahead of the clock, after a restart, they rise by one per grant: then
    L{AHEAD_LEAD} above the token is as rare a write, and a node that
    crashes and restarts in a loop moves its tokens ahead of the clock by
    about a second per restart, not by ten minutes.)  After a restart
    C{last_token} starts at the mark: tokens keep rising whatever the
    clock says (a token is C{max(last_token + 1, now)} with
    C{last_token} restored).  Cluster terms follow the same mark.
  - the held locks, written by a node that stops gracefully with nobody to
    hand them to (a lone node, or the last active of a cluster): keys,
    tokens, shares (every reader's and every semaphore slot's grant),
    holder names, places kept by the lock-delay, and deadlines, so a lease
    that ran out while the node was down is gone when it starts.  The next
    start takes them and rewrites the file without them at once: a table
    is served (or handed over) by one start only, never brought back by a
    later crash.

How long the node was down is measured on a clock that survives a
restart and ignores wall-clock steps: Linux's C{CLOCK_BOOTTIME}, with the
boot it belongs to (C{/proc/sys/kernel/random/boot_id}).  Within one boot
the downtime is exact whatever the wall clock did meanwhile.  After a
reboot only the wall clock is left: a wall clock behind the moment of the
save cannot say how long the node was down, and then every saved lease is
treated as expired (no lease may run longer than it was granted for).

Modules: L{fileformat<lockservice.state.fileformat>} (the file, pure),
L{directory<lockservice.state.directory>} (its I/O),
L{tokens<lockservice.state.tokens>} (the issuer that records marks),
L{clocks<lockservice.state.clocks>} (downtime, a clock behind its tokens),
L{node<lockservice.state.node>} (a running node's state).
"""

from lockservice.state.clocks import (
    BEHIND_WARN,
    BootClock,
    ClockWatch,
    bootClock,
    clockBehind,
    downtime,
)
from lockservice.state.directory import (
    FILENAME,
    LOCKNAME,
    StateDir,
)
from lockservice.state.fileformat import (
    FORMAT,
    OLD_FORMAT,
    SavedGroup,
    SavedLock,
    State,
    StateError,
    clusterIdentity,
    decode,
    encode,
)
from lockservice.state.node import (
    NodeState,
)
from lockservice.state.tokens import (
    AHEAD_LEAD,
    MARK_LEAD,
    RETRY_LEAD,
    DurableTokens,
)

__all__ = [
    "FORMAT",
    "OLD_FORMAT",
    "StateError",
    "SavedLock",
    "SavedGroup",
    "State",
    "clusterIdentity",
    "encode",
    "decode",
    "FILENAME",
    "LOCKNAME",
    "StateDir",
    "MARK_LEAD",
    "RETRY_LEAD",
    "AHEAD_LEAD",
    "DurableTokens",
    "BootClock",
    "bootClock",
    "downtime",
    "BEHIND_WARN",
    "clockBehind",
    "ClockWatch",
    "NodeState",
]
