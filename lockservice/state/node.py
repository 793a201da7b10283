# -*- test-case-name: tests.server.test_state -*-
"""
A running node's state directory: restores the token mark and the saved
locks and groups at start, records marks while it runs, saves what it
holds at a graceful stop with nobody to hand it to.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Callable, List, Optional, Tuple

from twisted.logger import Logger

from lockservice.core.wire import formatShare, parseShare

if TYPE_CHECKING:
    from lockservice.server.service import LockService
from lockservice.state.clocks import BootClock, bootClock, downtime
from lockservice.state.directory import StateDir
from lockservice.state.fileformat import SavedGroup, SavedLock, State, StateError
from lockservice.state.tokens import AHEAD_LEAD, MARK_LEAD, RETRY_LEAD, DurableTokens


class NodeState:
    """
    A running node's state directory: restores the token mark and the
    saved locks at start, records marks while it runs, saves the held
    locks at a graceful stop with nobody to hand them to.
    """

    log = Logger()

    def __init__(self, directory: StateDir, wallMicros: Callable[[], int],
                 terms: Callable[[], int] = lambda: 0, boot: BootClock = bootClock) -> None:
        """
        @param terms: the highest cluster term this node has seen (recorded
            beside the token mark).
        @param boot: the clock that says how long the node was down (see
            L{bootClock}).
        """
        self.directory = directory
        self.wallMicros = wallMicros
        self.terms = terms
        self.boot = boot
        self.state = State(directory.cluster, directory.node)
        self.tokens: Optional[DurableTokens] = None
        # The highest token or term recorded before this start.
        self.restored = 0
        # Whether the last write of the state file failed, why (one line),
        # and how many writes have failed since the start (/status, /ready,
        # lockservice_state_save_failures_total).
        self.saveFailing = False
        self.saveError: Optional[str] = None
        self.saveFailures = 0

    def start(self, locks: "LockService") -> Tuple[int, int]:
        """
        Read the directory, make C{locks} issue tokens above every token
        recorded, write the new mark (before anything is served) and
        install the saved locks whose lease has not run out.

        @return: C{(kept, ended)}: saved locks installed, and saved locks
            whose lease ran out while the node was down.
        @raise StateError: the directory or its file cannot be used.
        """
        loaded = self.directory.open()
        if loaded is not None:
            self.state = loaded
        saved, self.state.locks = self.state.locks, []
        savedGroups, self.state.groups = self.state.groups, []
        restored = self.restored = max(self.state.mark, self.state.term)
        self.tokens = DurableTokens(self.wallMicros, max(locks.table.tokens.last, restored),
                                    0, self.recordMark)
        locks.table.tokens = self.tokens
        try:
            # The saved locks leave the file before any is served: a later
            # crash must not bring back locks released meanwhile.  The mark
            # stays: the first token above it records the next one.
            self.state.mark = restored
            self.directory.write(self.state)
            self.tokens.mark = restored
        except OSError as e:
            raise StateError(f"--state-dir {self.directory.path}: cannot write "
                             f"{self.directory.file}: {e.strerror}") from None
        wall = self.wallMicros()
        down = downtime(self.state.saved, self.state.boot, wall, self.boot())
        self._restoreGroups(locks, savedGroups, down)
        if saved and down is None:
            self.log.warn(
                "the {n} saved locks in {file} are treated as expired: the wall clock is "
                "behind the moment they were saved and this is another boot, so how long "
                "the node was down cannot be known", n=len(saved), file=self.directory.file)
            return 0, len(saved)
        kept = 0
        for lock in saved:
            # Time left at the save, less the time down: a lease runs no
            # longer after a restart than it was granted for, whatever the
            # wall clock did meanwhile.
            assert down is not None
            left = min(lock.deadline - self.state.saved, lock.deadline - lock.granted)
            remaining = (left - down) / 1e6
            if remaining > 0:
                share = parseShare(lock.share)
                assert share is not None  # decode() checked it
                age = (self.state.saved - lock.granted + down) / 1e6
                locks.installHolder(lock.key, lock.token, remaining, max(0.0, age), share,
                                    lock.holder, lock.delayed)
                kept += 1
        return kept, len(saved) - kept

    def _restoreGroups(self, locks: "LockService", saved: List[SavedGroup],
                       down: Optional[int]) -> None:
        """
        The groups saved at the last graceful stop, and the members whose
        lease did not run out meanwhile (none when how long the node was
        down cannot be known: see L{downtime}).
        """
        from lockservice.core.groups import GroupRecord

        now = locks.clock.seconds()
        records = []
        for group in saved:
            if group.member is None:
                records.append(GroupRecord(group.group, None, group.created, group.created,
                                           0.0, b""))
            elif down is not None:
                left = (group.deadline - self.state.saved - down) / 1e6
                if left > 0:
                    records.append(GroupRecord(group.group, group.member, group.created,
                                               group.updated, now + left, group.capabilities))
        locks.groups.install(records)

    def _writeMark(self, token: int) -> None:
        mark = max(self.wallMicros() + MARK_LEAD, token + AHEAD_LEAD)
        self.state.mark = max(mark, self.state.mark)
        self.state.term = max(self.state.term, self.terms())
        self.directory.write(self.state)
        assert self.tokens is not None
        self.tokens.mark = mark

    def recordMark(self, token: int) -> None:
        """
        Called before C{token} (above the last mark) is issued or learned.
        """
        try:
            self._writeMark(token)
        except OSError as e:
            assert self.tokens is not None
            self.tokens.mark = token + RETRY_LEAD
            if not self._saveFailed(e):
                self.log.error(
                    "cannot record the token mark in {file}: {why}; tokens may fall "
                    "after a restart with a clock behind until it works again",
                    file=self.directory.file, why=e.strerror, event="state_save_failed")
            return
        if self.saveFailing:
            self.saveFailing = False
            self.log.info("recording the token mark in {file} works again",
                          file=self.directory.file, event="state_save_recovered")

    def _saveFailed(self, e: OSError) -> bool:
        """
        Count a failed write of the state file.

        @return: whether the previous write had failed too.
        """
        failing, self.saveFailing = self.saveFailing, True
        self.saveFailures += 1
        self.saveError = f"cannot write {self.directory.file}: {e.strerror or e}"
        return failing

    def stopped(self, locks: "LockService", keepLocks: bool) -> int:
        """
        A graceful stop: record the exact highest token (nothing is issued
        any more, so the next start need not jump ahead of it) and, with
        C{keepLocks} (nobody took them over), every held lock, served
        again at the next start.

        @return: how many locks were saved (-1: the write failed, logged).
        """
        now, wall = locks.clock.seconds(), self.wallMicros()
        saved = []
        if keepLocks:
            # Every grant, a shared key's each with its share (highest token
            # first, so they are installed again in the order they fit).
            for key, token, grantedAt, expiresAt, share, name, delayed in \
                    locks.table.everyGrant():
                if expiresAt is not None and expiresAt > now:
                    saved.append(SavedLock(key, token, wall + int((expiresAt - now) * 1e6),
                                           wall - int((now - grantedAt) * 1e6),
                                           formatShare(share) or b"1", name, delayed))
            self.state.groups = [
                SavedGroup(r.group, r.member, r.createdAt, r.updatedAt,
                           wall + int((r.expiresAt - now) * 1e6) if r.member is not None else 0,
                           r.capabilities)
                for r in locks.groups.registry.records(now)]
            self.state.saved = wall
            self.state.boot = self.boot()
        self.state.locks = saved
        self.state.term = max(self.state.term, self.terms())
        self.state.mark = max(locks.table.tokens.last, self.terms())
        try:
            self.directory.write(self.state)
        except OSError as e:
            self._saveFailed(e)
            self.log.error("could not save the {n} held locks to {file}: {why}",
                           n=len(saved), file=self.directory.file, why=e.strerror,
                           event="state_save_failed")
            return -1
        self.saveFailing = False
        if self.tokens is not None:
            # A token learned from now on records a mark again.
            self.tokens.mark = self.state.mark
        if keepLocks:
            self.log.warn("saved {n} held locks to {file}: they are served again at the "
                          "next start", n=len(saved), file=self.directory.file,
                          event="state_saved")
        return len(saved)
