# -*- test-case-name: tests.server.test_groups -*-
"""
Groups and their members: the registry behind lockservice's group
extension (what tooz's coordination API needs beyond locks: groups that
exist with no members, the members of a group, a capability blob per
member, and when each joined and last changed).

A member stays a member for the lease it joined with, renewed by its
heartbeats (tooz's C{heartbeat()}); one that stops beating is gone when
its lease runs out.  Expiry is lazy: a lookup leaves out (and forgets)
the members whose lease ran out, so no timer runs per member.

Pure: every call that depends on time is told the current (monotonic)
time, and the wall time (microseconds) for the times a member shows.
"""

from __future__ import annotations

from itertools import islice
from typing import Callable, Dict, Iterator, List, NamedTuple, Optional, Tuple

# A capability blob is at most this many bytes (its escaped form must
# also fit one request line).
MAX_CAPABILITIES = 3072
# How many groups, and members per group, the registry holds at most.
MAX_GROUPS = 100_000
MAX_MEMBERS = 100_000


class Member:
    """
    One member of a group.

    @ivar capabilities: its blob (bytes, possibly empty).
    @ivar joinedAt, updatedAt: wall-clock microseconds when it joined and
        when its capabilities last changed.
    @ivar expiresAt: (monotonic) time its lease runs out.
    """

    __slots__ = ("capabilities", "joinedAt", "updatedAt", "expiresAt")

    def __init__(self, capabilities: bytes, joinedAt: int, updatedAt: int,
                 expiresAt: float) -> None:
        self.capabilities = capabilities
        self.joinedAt = joinedAt
        self.updatedAt = updatedAt
        self.expiresAt = expiresAt


class Group:
    """
    @ivar createdAt: wall-clock microseconds when it was created.
    @ivar members: member id -> L{Member}.
    """

    __slots__ = ("createdAt", "members")

    def __init__(self, createdAt: int) -> None:
        self.createdAt = createdAt
        self.members: Dict[bytes, Member] = {}


# What a request is answered.
OK = b"OK"
NONE = b"NONE"  # the group does not exist
EXISTS = b"EXISTS"  # the group (or the member) exists already
NOTEMPTY = b"NOTEMPTY"  # the group has members
NOTJOINED = b"NOTJOINED"  # that member is not in the group


class GroupRecord(NamedTuple):
    """
    One group or member, as replication, a heal's offer and the state
    file carry it: C{member} None for the group itself; times in
    wall-clock microseconds, C{expiresAt} monotonic.
    """

    group: bytes
    member: Optional[bytes]
    createdAt: int
    updatedAt: int
    expiresAt: float
    capabilities: bytes


class GroupObserver:
    """
    Told of every change (replication): subclass and override.
    """

    def groupSet(self, record: GroupRecord) -> None:
        """
        A group was created, or a member joined, renewed or changed.
        """

    def groupUnset(self, group: bytes, member: Optional[bytes]) -> None:
        """
        A group was deleted, or a member left.
        """


class Registry:
    """
    Every group of one node.

    @ivar observers: told of every change (see L{GroupObserver}).
    """

    def __init__(self) -> None:
        self.groups: Dict[bytes, Group] = {}
        self.observers: List[GroupObserver] = []
        self.members = 0

    def __len__(self) -> int:
        return len(self.groups)

    def _set(self, group: bytes, member: Optional[bytes]) -> None:
        if not self.observers:
            return
        record = self.record(group, member)
        if record is not None:
            for observer in self.observers:
                observer.groupSet(record)

    def _unset(self, group: bytes, member: Optional[bytes]) -> None:
        for observer in self.observers:
            observer.groupUnset(group, member)

    def _live(self, group: Group, now: float) -> Dict[bytes, Member]:
        """
        C{group}'s members, the ones whose lease ran out forgotten first.
        """
        members = group.members
        expired = [m for m, member in members.items() if member.expiresAt <= now]
        for m in expired:
            del members[m]
        self.members -= len(expired)
        return members

    # -- requests ------------------------------------------------------------

    def create(self, group: bytes, wall: int) -> bytes:
        if group in self.groups:
            return EXISTS
        if len(self.groups) >= MAX_GROUPS:
            raise ValueError("too many groups")
        self.groups[group] = Group(wall)
        self._set(group, None)
        return OK

    def delete(self, group: bytes, now: float) -> bytes:
        found = self.groups.get(group)
        if found is None:
            return NONE
        if self._live(found, now):
            return NOTEMPTY
        del self.groups[group]
        self._unset(group, None)
        return OK

    def join(self, group: bytes, member: bytes, lease: float, capabilities: bytes,
             now: float, wall: int) -> bytes:
        found = self.groups.get(group)
        if found is None:
            return NONE
        members = self._live(found, now)
        if member in members:
            return EXISTS
        if len(members) >= MAX_MEMBERS:
            raise ValueError("too many members")
        members[member] = Member(capabilities, wall, wall, now + lease)
        self.members += 1
        self._set(group, member)
        return OK

    def leave(self, group: bytes, member: bytes, now: float) -> bytes:
        found = self.groups.get(group)
        if found is None:
            return NONE
        if member not in self._live(found, now):
            return NOTJOINED
        del found.members[member]
        self.members -= 1
        self._unset(group, member)
        return OK

    def beat(self, group: bytes, member: bytes, lease: float, now: float) -> bytes:
        """
        A member's heartbeat: its lease runs C{lease} seconds from C{now}.
        """
        found = self.groups.get(group)
        if found is None:
            return NONE
        record = self._live(found, now).get(member)
        if record is None:
            return NOTJOINED
        record.expiresAt = now + lease
        self._set(group, member)
        return OK

    def update(self, group: bytes, member: bytes, capabilities: bytes, now: float,
               wall: int) -> bytes:
        found = self.groups.get(group)
        if found is None:
            return NONE
        record = self._live(found, now).get(member)
        if record is None:
            return NOTJOINED
        record.capabilities = capabilities
        record.updatedAt = wall
        self._set(group, member)
        return OK

    def membersOf(self, group: bytes, after: Optional[bytes], limit: int,
                  now: float) -> Optional[Tuple[List[bytes], Optional[bytes]]]:
        """
        Up to C{limit} live members of C{group} in id order, from after
        C{after} (None: the first), and the cursor of the next page (None:
        none); None when the group does not exist.
        """
        found = self.groups.get(group)
        if found is None:
            return None
        return _page(sorted(self._live(found, now)), after, limit)

    def info(self, group: bytes, member: bytes, now: float
             ) -> Tuple[bytes, Optional[Member]]:
        found = self.groups.get(group)
        if found is None:
            return NONE, None
        record = self._live(found, now).get(member)
        return (OK, record) if record is not None else (NOTJOINED, None)

    def list(self, after: Optional[bytes], limit: int
             ) -> Tuple[List[bytes], Optional[bytes]]:
        return _page(sorted(self.groups), after, limit)

    # -- replication, heals, the state file ------------------------------------

    def record(self, group: bytes, member: Optional[bytes]) -> Optional[GroupRecord]:
        found = self.groups.get(group)
        if found is None:
            return None
        if member is None:
            return GroupRecord(group, None, found.createdAt, found.createdAt, 0.0, b"")
        record = found.members.get(member)
        if record is None:
            return None
        return GroupRecord(group, member, record.joinedAt, record.updatedAt, record.expiresAt,
                           record.capabilities)

    def records(self, now: float) -> Iterator[GroupRecord]:
        """
        Every group, each followed by its live members.
        """
        for group, found in list(self.groups.items()):
            yield GroupRecord(group, None, found.createdAt, found.createdAt, 0.0, b"")
            for member, record in list(self._live(found, now).items()):
                yield GroupRecord(group, member, record.joinedAt, record.updatedAt,
                                  record.expiresAt, record.capabilities)

    def install(self, record: GroupRecord, now: float) -> None:
        """
        A group or member learned from a peer (a standby's stream, a
        snapshot, a heal's merge, a restart): a member keeps the later of
        the two leases when both sides have it.
        """
        found = self.groups.get(record.group)
        if found is None:
            found = self.groups[record.group] = Group(record.createdAt)
        if record.member is None or record.expiresAt <= now:
            return
        known = found.members.get(record.member)
        if known is None:
            self.members += 1
        elif known.expiresAt > record.expiresAt:
            return
        found.members[record.member] = Member(record.capabilities, record.createdAt,
                                              record.updatedAt, record.expiresAt)

    def remove(self, group: bytes, member: Optional[bytes]) -> None:
        """
        A group deleted, or a member gone, learned from a peer.
        """
        found = self.groups.get(group)
        if found is None:
            return
        if member is None:
            self.members -= len(found.members)
            del self.groups[group]
        elif found.members.pop(member, None) is not None:
            self.members -= 1

    def clear(self) -> None:
        self.groups.clear()
        self.members = 0


def _page(ids: List[bytes], after: Optional[bytes], limit: int
          ) -> Tuple[List[bytes], Optional[bytes]]:
    start = 0
    if after is not None:
        from bisect import bisect_right

        start = bisect_right(ids, after)
    page = list(islice(ids, start, start + limit))
    more = start + limit < len(ids)
    return page, (page[-1] if more and page else None)


# -- the capability blob on the wire ---------------------------------------------

_PLAIN = frozenset(range(0x21, 0x7F)) - {0x25}  # printable, no space, no %


def escape(blob: bytes) -> bytes:
    """
    A capability blob as one field: printable ASCII as it is, every other
    byte (and C{%}) as C{%XX}; C{-} for the empty blob.
    """
    if not blob:
        return b"-"
    if blob == b"-":
        return b"%2D"
    out = bytearray()
    for byte in blob:
        if byte in _PLAIN:
            out.append(byte)
        else:
            out += b"%%%02X" % byte
    return bytes(out)


def unescape(field: bytes) -> bytes:
    """
    @raise ValueError: not a well-formed escaped blob.
    """
    if field == b"-":
        return b""
    out = bytearray()
    i = 0
    while i < len(field):
        byte = field[i]
        if byte == 0x25:
            hexa = field[i + 1:i + 3]
            if len(hexa) != 2 or not all(c in b"0123456789ABCDEFabcdef" for c in hexa):
                raise ValueError("bad escape")
            out.append(int(hexa, 16))
            i += 3
        elif byte in _PLAIN:
            out.append(byte)
            i += 1
        else:
            raise ValueError("bad byte")
    return bytes(out)


Clock = Callable[[], float]
