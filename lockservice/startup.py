# -*- test-case-name: tests.process.test_tap -*-
"""
What the node's process sets up before it serves: the file descriptor
limit and the connections it allows, glibc's mmap threshold, and
Ctrl+C where a shell left it ignored.
"""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from lockservice.server.protocol import PEER_RESERVE

if TYPE_CHECKING:
    pass


def daemonized() -> bool:
    """
    True once twistd has daemonized this process (its standard error is
    then /dev/null).
    """

    try:
        err, null = os.fstat(2), os.stat(os.devnull)
    except OSError:
        return False
    return (err.st_rdev, err.st_ino) == (null.st_rdev, null.st_ino)


def fitConnections(wanted: int) -> int:
    """
    --max-connections, lowered so that the connections, the peers'
    reserve and the node's own files fit the file descriptor limit: past
    it, accept() fails and the node stops accepting anyone, peers included.
    """
    try:
        import resource

        soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    except (ImportError, ValueError, OSError):
        return wanted
    if soft == resource.RLIM_INFINITY:
        return wanted
    room = max(1, soft - PEER_RESERVE - 64)
    if wanted > room:
        from twisted.logger import Logger

        Logger().warn("--max-connections lowered from {wanted} to {room}: the file "
                      "descriptor limit is {soft}", wanted=wanted, room=room, soft=soft)
        return room
    return wanted


def raiseFileLimit() -> None:
    """
    Every client connection is a file descriptor: lift the soft limit to
    the hard one (often 1024 -> 1048576) so 10,000s of clients fit.
    """
    try:
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        if hard == resource.RLIM_INFINITY or hard > soft:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ImportError, ValueError, OSError):
        pass


# glibc's mallopt() parameter for the size from which a block gets a
# mapping of its own (<malloc.h>), and its default value.
_M_MMAP_THRESHOLD = -3


_MMAP_THRESHOLD = 128 * 1024


def fixMallocThreshold() -> bool:
    """
    Keep large blocks in mappings of their own (glibc malloc).

    glibc raises its mmap threshold each time a mapped block is freed (up
    to 32 MiB).  The lock table's big tables (the dict of held keys, the
    arrays of tokens and times) grow by reallocation, and the freed old
    dict tables raise it, so they end up growing inside the heap, where
    every move leaves a hole that is never given back: about 24 bytes of
    RSS per held key at 1M keys (docs/performance.md).  Setting the
    threshold, to its default value, turns that adjustment off: a table
    above it grows in place by C{mremap}, and a freed one goes back to the
    system.

    @return: True when it was set (a glibc system).
    """
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False  # no mallopt in this C library: nothing to tune
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD))


def allowInterrupt() -> None:
    """
    A process started in the background by a non-interactive shell inherits
    SIGINT as ignored, and Twisted then leaves it ignored: Ctrl+C / SIGINT
    would not start the graceful handoff.  Restore Python's handler so the
    reactor installs its own.
    """
    import signal

    if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)
