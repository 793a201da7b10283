# -*- test-case-name: tests.cli.test_cli -*-
"""
A command run in a process group of its own, so that everything it
started can be stopped (C{lockservice run} when its lock is lost).
"""

from __future__ import annotations

import os
import signal
import sys
from typing import TYPE_CHECKING, Any, Dict, List, Optional

if TYPE_CHECKING:
    from twisted.internet.defer import Deferred


class CommandGroup:
    """
    CMD in a process group of its own, so that C{run} can signal
    everything CMD started (a shell's children included), not only CMD.

    When C{run} owns the terminal (its stdin is a terminal and its group is
    the foreground one), CMD's group is made the foreground group while it
    runs, so CMD can read the terminal and gets Ctrl+C from it directly.
    """

    #: How often L{stop} looks whether the group has emptied.
    POLL = 0.05
    #: How long L{stop} waits for the group to empty after SIGKILL.
    AFTER_KILL = 5.0

    def __init__(self, reactor: Any, command: List[str], env: Dict[str, str]) -> None:
        import subprocess

        from twisted.internet.defer import Deferred
        from twisted.internet.threads import deferToThreadPool

        self.reactor = reactor
        self.command = command
        # process_group (3.11) sets the group between fork and exec, so no
        # signal can reach CMD before it is in its own group.
        spawnOptions: Dict[str, Any] = (
            {"process_group": 0} if sys.version_info >= (3, 11)
            else {"preexec_fn": os.setpgrp})
        self.process = subprocess.Popen(command, env=env, **spawnOptions)
        self.pgid = self.process.pid
        self._terminal = self._takeTerminal()
        self.ended: "Deferred[int]" = Deferred()
        # Popen.wait in a thread: the reactor reaps only the processes it
        # spawned, so it never takes CMD's exit status from us.
        waiting = deferToThreadPool(reactor, reactor.getThreadPool(), self.process.wait)
        waiting.addCallback(self._exited)
        self._stopping: "Optional[Deferred[None]]" = None

    def _exited(self, code: int) -> None:
        self._giveTerminalBack()
        self.ended.callback(code if code >= 0 else 128 - code)

    def _takeTerminal(self) -> Optional[int]:
        try:
            if not os.isatty(0) or os.tcgetpgrp(0) != os.getpgrp():
                return None
            os.tcsetpgrp(0, self.pgid)
        except OSError:
            return None
        # CMD may have touched the terminal before it was its group's
        # (stopped by SIGTTIN/SIGTTOU): let it go on.
        self.signal(signal.SIGCONT)
        return os.getpgrp()

    def _giveTerminalBack(self) -> None:
        if self._terminal is None:
            return
        # We are a background group until this call: without ignoring
        # SIGTTOU, tcsetpgrp would stop us.
        old = signal.signal(signal.SIGTTOU, signal.SIG_IGN)
        try:
            os.tcsetpgrp(0, self._terminal)
        except OSError:
            pass
        finally:
            signal.signal(signal.SIGTTOU, old)
            self._terminal = None

    def signal(self, signum: int) -> None:
        """
        Send C{signum} to every process of CMD's group.
        """
        try:
            os.killpg(self.pgid, signum)
        except OSError:
            pass  # the group is gone

    def alive(self) -> bool:
        """
        Whether a process of CMD's group (other than a zombie) still runs.
        """
        try:
            os.killpg(self.pgid, 0)
        except ProcessLookupError:
            return False
        except OSError:
            return True
        if not os.path.isdir("/proc"):
            return True
        # Zombies answer kill(0) too: an orphan that a container's PID 1
        # never reaps must not count as working.
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if len(fields) > 2 and int(fields[2]) == self.pgid and fields[0] != "Z":
                return True
        return False

    def stop(self, grace: float) -> "Deferred[None]":
        """
        SIGTERM the group (if anything is left of it), SIGKILL after
        C{grace} seconds; fires once CMD has ended and the group is empty
        (or C{AFTER_KILL} seconds after the SIGKILL).
        """
        from twisted.internet.defer import Deferred

        if self._stopping is not None:
            return self._stopping
        self._stopping = Deferred()
        started = self.reactor.seconds()
        state = {"killed": False}

        def check() -> None:
            assert self._stopping is not None
            now = self.reactor.seconds()
            if self.ended.called and not self.alive():
                self._stopping.callback(None)
                return
            if not state["killed"] and now - started >= grace:
                state["killed"] = True
                self.signal(signal.SIGKILL)
            elif state["killed"] and now - started >= grace + self.AFTER_KILL:
                self._stopping.callback(None)
                return
            self.reactor.callLater(self.POLL, check)

        if self.alive():
            self.signal(signal.SIGTERM)
            self.signal(signal.SIGCONT)  # a stopped process acts on SIGTERM only once continued
        check()
        return self._stopping

    def abandon(self) -> None:
        """
        C{run} is leaving on an unexpected path: leave nothing running.
        """
        if not self.ended.called or self.alive():
            self.signal(signal.SIGKILL)
        self._giveTerminalBack()
