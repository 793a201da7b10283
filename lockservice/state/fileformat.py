# -*- test-case-name: tests.server.test_state -*-
"""
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

Encoding and decoding are pure (L{encode}, L{decode}).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import List, Optional, Sequence, Tuple

from lockservice.core.table import MAX_TOKEN
from lockservice.core.wire import parseShare

FORMAT = b"lockservice-state 2"


# What version 0.1 wrote: read too, so an upgrade by a restart keeps the
# saved locks.
OLD_FORMAT = b"lockservice-state 1"


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
