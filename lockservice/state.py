# -*- test-case-name: tests.test_state -*-
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

The file, C{DIR/state}, is text, one record per line, ending with a
checksum of everything before it::

    lockservice-state 2
    cluster <hash of the secret and the peer list>
    node <this node's --peers entry, or ->
    mark <token high-water mark>
    term <highest term seen>
    saved <wall-clock microseconds when the locks were written, 0: no locks>
    boot <boot id, or -> <CLOCK_BOOTTIME microseconds when the locks were written>
    locks <count>
    groups <count>
    L <key, hex> <token> <deadline, wall us> <granted, wall us> <share> <holder, hex or -> <d or ->
    ...
    G <group, hex> <created, wall us>
    M <group, hex> <member, hex> <joined, wall us> <updated, wall us>
      <deadline, wall us> <caps, hex or ->            (one line)
    ...
    sha256 <hex digest of every byte above>

(The group extension's groups and members: C{groups} counts the G and M
lines.)

Deadlines are written as wall-clock microseconds relative to C{saved}
(the time left is C{deadline - saved}).  Format 1, written by version
0.1, is read too (no boot line, no holder, no lock-delay).

A file that is corrupt, truncated, of another format version, of another
cluster or of another node is refused with one line (L{StateError}):
nothing of it is used.  It is written atomically (a temporary file,
fsync, rename, fsync of the directory), so a crash leaves the old file or
the new one, never half of one.

Encoding and decoding are pure (L{encode}, L{decode}); L{StateDir} does
the I/O; L{DurableTokens} is the token issuer that records the marks.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, List, Optional, Sequence, Tuple

from twisted.application.service import Service
from twisted.internet.interfaces import IReactorTime
from twisted.internet.task import LoopingCall
from twisted.logger import Logger

from lockservice.core.table import MAX_TOKEN, TokenExhausted, TokenIssuer
from lockservice.core.wire import formatShare, parseShare

if TYPE_CHECKING:
    from lockservice.server.service import LockService

FORMAT = b"lockservice-state 2"
# What version 0.1 wrote: read too, so an upgrade by a restart keeps the
# saved locks.
OLD_FORMAT = b"lockservice-state 1"
FILENAME = "state"
LOCKNAME = "lock"
# How far ahead of the token just issued a recorded mark lies: one disk
# write per ten minutes' worth of microsecond tokens.
MARK_LEAD = 600 * 1_000_000
# After a failed write, try again this far (in tokens) later, not at once:
# a full disk must not cost an fsync per grant.
RETRY_LEAD = 1_000_000
# The least a mark lies above the token just issued: a million grants.
AHEAD_LEAD = 1_000_000


class StateError(Exception):
    """
    The state file cannot be used; the message is one line for the operator.
    """


@dataclass
class SavedLock:
    """
    One held lock, as written at a graceful stop.

    @ivar deadline: when its lease runs out, wall-clock microseconds.
    @ivar granted: when it was granted, wall-clock microseconds.
    @ivar share: C{b"1"} (exclusive), C{b"r"} or a semaphore size.
    @ivar holder: the holder name, or None.
    @ivar delayed: a place kept by the lock-delay (its deadline is the
        delay's end).
    """

    key: bytes
    token: int
    deadline: int
    granted: int
    share: bytes = b"1"
    holder: Optional[bytes] = None
    delayed: bool = False


@dataclass
class SavedGroup:
    """
    A group (C{member} None) or a member of one, as written at a graceful
    stop: times and the member's deadline in wall-clock microseconds.
    """

    group: bytes
    member: Optional[bytes]
    created: int
    updated: int = 0
    deadline: int = 0
    capabilities: bytes = b""


@dataclass
class State:
    """
    @ivar boot: C{(boot id, CLOCK_BOOTTIME microseconds)} when the locks
        were saved, or None when unknown.
    """

    cluster: str
    node: str
    mark: int = 0
    term: int = 0
    saved: int = 0
    locks: List[SavedLock] = field(default_factory=list)
    boot: Optional[Tuple[str, int]] = None
    groups: List[SavedGroup] = field(default_factory=list)


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


def clusterIdentity(secret: bytes, peers: Sequence[str]) -> str:
    """
    Who a state file belongs to: a hash of the cluster's secret and its
    peer list (a lone node: of neither), so another cluster's file (or
    this cluster's before its peers changed) is refused.  The secret
    itself cannot be read back from it.
    """
    h = hashlib.sha256(b"lockservice-state-cluster\0")
    h.update(hashlib.sha256(secret).digest())
    h.update(",".join(peers).encode())
    return h.hexdigest()[:32]


def encode(state: State) -> bytes:
    lines = [
        FORMAT,
        b"cluster " + state.cluster.encode(),
        b"node " + (state.node or "-").encode(),
        b"mark %d" % state.mark,
        b"term %d" % state.term,
        b"saved %d" % state.saved,
        b"boot - 0" if state.boot is None else b"boot %s %d" % (state.boot[0].encode(),
                                                                state.boot[1]),
        b"locks %d" % len(state.locks),
        b"groups %d" % len(state.groups),
    ]
    for lock in state.locks:
        lines.append(b"L %s %d %d %d %s %s %s" % (
            lock.key.hex().encode(), lock.token, lock.deadline, lock.granted, lock.share,
            b"-" if lock.holder is None else lock.holder.hex().encode(),
            b"d" if lock.delayed else b"-"))
    for saved in state.groups:
        if saved.member is None:
            lines.append(b"G %s %d" % (saved.group.hex().encode(), saved.created))
        else:
            lines.append(b"M %s %s %d %d %d %s" % (
                saved.group.hex().encode(), saved.member.hex().encode(), saved.created,
                saved.updated, saved.deadline,
                saved.capabilities.hex().encode() if saved.capabilities else b"-"))
    body = b"\n".join(lines) + b"\n"
    return body + b"sha256 " + hashlib.sha256(body).hexdigest().encode() + b"\n"


def _number(field: bytes, what: str) -> int:
    if not (field.isdigit() and len(field) <= 20) or int(field) > MAX_TOKEN:
        raise StateError(f"bad {what} {field[:40]!r}")
    return int(field)


def decode(data: bytes, cluster: Optional[str], node: Optional[str]) -> State:
    """
    Parse a state file of this C{cluster} and C{node} (None: of any, as
    the state tools read it).

    @raise StateError: anything wrong; the whole file is refused.
    """
    end = data.rfind(b"sha256 ")
    old = data.startswith(OLD_FORMAT + b"\n")
    if not data.startswith(FORMAT + b"\n") and not old:
        first = data.split(b"\n", 1)[0][:40]
        if first.startswith(b"lockservice-state "):
            raise StateError(f"format {first[18:].decode(errors='replace')!r} is not "
                             f"{FORMAT[18:].decode()!r} (written by another version)")
        raise StateError("not a lockservice state file")
    if end < 0 or not data.endswith(b"\n"):
        raise StateError("truncated (no checksum at the end)")
    body, digest = data[:end], data[end + 7:-1]
    if hashlib.sha256(body).hexdigest().encode() != digest:
        raise StateError("checksum mismatch (corrupt or truncated)")
    lines = body.split(b"\n")[:-1]
    headers = 6 if old else 8
    try:
        header = dict(line.split(b" ", 1) for line in lines[1:1 + headers])
        state = State(
            cluster=header[b"cluster"].decode("ascii"),
            node="" if header[b"node"] == b"-" else header[b"node"].decode("utf-8"),
            mark=_number(header[b"mark"], "mark"),
            term=_number(header[b"term"], "term"),
            saved=_number(header[b"saved"], "saved time"),
        )
        count = _number(header[b"locks"], "lock count")
        groupCount = 0 if old else _number(header[b"groups"], "group count")
        if not old:
            bootId, bootField = header[b"boot"].split(b" ")
            bootTime = _number(bootField, "boot time")
            if bootId != b"-":
                state.boot = (bootId.decode("ascii"), bootTime)
    except (KeyError, ValueError, UnicodeDecodeError):
        raise StateError("bad header") from None
    if cluster is not None and state.cluster != cluster:
        raise StateError("belongs to another cluster (its --secret or --peers differ)")
    if node is not None and state.node != node:
        raise StateError(f"belongs to node {state.node or '-'}, not {node or '-'}")
    records = lines[1 + headers:1 + headers + count]
    groupRecords = lines[1 + headers + count:]
    if len(records) != count or len(groupRecords) != groupCount:
        raise StateError(f"{len(records)} lock lines and {len(groupRecords)} group lines, "
                         f"header says {count} and {groupCount}")
    for record in groupRecords:
        state.groups.append(_groupRecord(record))
    for record in records:
        fields = record.split(b" ")
        if len(fields) != (6 if old else 8) or fields[0] != b"L":
            raise StateError(f"bad lock line {record[:60]!r}")
        try:
            key = bytes.fromhex(fields[1].decode("ascii"))
            holder = None if old or fields[6] == b"-" else bytes.fromhex(
                fields[6].decode("ascii"))
        except (ValueError, UnicodeDecodeError):
            raise StateError(f"bad key or holder in {record[:60]!r}") from None
        share = fields[5]
        if parseShare(share) is None:
            raise StateError(f"bad share in {record[:60]!r}")
        if not old and fields[7] not in (b"d", b"-"):
            raise StateError(f"bad lock-delay mark in {record[:60]!r}")
        state.locks.append(SavedLock(key, _number(fields[2], "token"),
                                     _number(fields[3], "deadline"),
                                     _number(fields[4], "grant time"), share, holder,
                                     not old and fields[7] == b"d"))
    return state


def _groupRecord(record: bytes) -> SavedGroup:
    fields = record.split(b" ")
    try:
        group = bytes.fromhex(fields[1].decode("ascii"))
        if fields[0] == b"G" and len(fields) == 3:
            return SavedGroup(group, None, _number(fields[2], "group time"))
        if fields[0] == b"M" and len(fields) == 7:
            return SavedGroup(group, bytes.fromhex(fields[2].decode("ascii")),
                              _number(fields[3], "member time"), _number(fields[4], "member time"),
                              _number(fields[5], "member deadline"),
                              b"" if fields[6] == b"-"
                              else bytes.fromhex(fields[6].decode("ascii")))
    except (IndexError, ValueError, UnicodeDecodeError):
        pass
    raise StateError(f"bad group line {record[:60]!r}")


class StateDir:
    """
    The state directory of one node: C{DIR/state}, written atomically, and
    C{DIR/lock}, held (C{flock}) while the node runs so that two nodes
    never share one directory.
    """

    def __init__(self, path: str, cluster: str, node: str) -> None:
        self.path = path
        self.cluster = cluster
        self.node = node
        self.file = os.path.join(path, FILENAME)
        self._lock: Optional[int] = None

    def open(self) -> Optional[State]:
        """
        Take the directory and read its state (None: none yet).

        @raise StateError: the directory cannot be used, or its file is
            refused (see L{decode}).
        """
        where = f"--state-dir {self.path}"
        try:
            os.makedirs(self.path, exist_ok=True)
            self._lock = os.open(os.path.join(self.path, LOCKNAME),
                                 os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise StateError(f"{where}: {e.strerror}") from None
        import fcntl

        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise StateError(f"{where} is in use by another running node") from None
        try:
            with open(self.file, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StateError(f"{where}: cannot read {self.file}: {e.strerror}") from None
        try:
            return decode(data, self.cluster, self.node)
        except StateError as e:
            raise StateError(f"{where}: refusing {self.file}: {e}; move it away to start "
                             "without it") from None

    def write(self, state: State) -> None:
        """
        Replace the state file atomically and durably.

        @raise OSError: it could not be written (the old file stays).
        """
        temporary = self.file + ".tmp"
        data = encode(state)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, self.file)
        directory = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)


class DurableTokens(TokenIssuer):
    """
    A token issuer that calls C{record(token)} before it issues or learns
    a token above C{mark}; C{record} moves C{mark} ahead.  The hot path
    gains one integer comparison (L{TokenIssuer.issue} is copied, not
    called, to keep it one call).
    """

    __slots__ = ("mark", "_record")

    def __init__(self, wallMicros: Callable[[], int], last: int, mark: int,
                 record: Callable[[int], None]) -> None:
        super().__init__(wallMicros, last)
        self.mark = mark
        self._record = record

    def issue(self) -> int:
        token = max(self.last + 1, self._wallMicros())
        if token > MAX_TOKEN:
            raise TokenExhausted("fencing token space exhausted")
        if token > self.mark:
            self._record(token)
        self.last = token
        return token

    def observe(self, token: int) -> None:
        if token > self.last:
            if token > self.mark:
                self._record(token)
            self.last = token


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
                if expiresAt > now:
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
