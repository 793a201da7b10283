# -*- test-case-name: tests.server.test_groups -*-
"""
The group extension from the client's side (what the tooz driver uses:
groups that exist with no members, members with a capability blob, kept
by their heartbeats).  Each call is one request, sent like any other:
redirected to the active node, moved to the next connection when one
drops, and bounded in time however the node behaves.
"""

from __future__ import annotations

from typing import List, NamedTuple, Optional, Protocol, Union

from twisted.internet.defer import Deferred
from twisted.internet.interfaces import IReactorTime

from lockservice.client.acquiring import (
    CONNECT_WAIT,
    MAX_REDIRECTS,
    NO_ACTIVE_FOR,
    NO_ACTIVE_RETRY,
    secondsField,
)
from lockservice.client.errors import ConnectionDropped, LockError, LockRejected, NoConnection
from lockservice.client.pool import Pool, Tries
from lockservice.client.protocol import Fields
from lockservice.client.timers import Timers
from lockservice.core import wire
from lockservice.core.groups import MAX_CAPABILITIES, escape, unescape
from lockservice.core.groupwire import MAX_PAGE

# A group request with no answer for this long ends with NoConnection.
REQUEST_BOUND = 10.0


class MemberInfo(NamedTuple):
    """
    A member's capability blob, and when it joined and last changed
    (Unix time, seconds).
    """

    capabilities: bytes
    joinedAt: float
    updatedAt: float


class GroupsOwner(Protocol):
    clock: IReactorTime
    closed: bool

    def poolFor(self, rawKey: bytes) -> Pool: ...

    timers: Timers


def _id(value: Union[str, bytes], what: str) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    if not wire.isValidKey(raw):
        raise ValueError(f"invalid {what} {value!r}: 1-250 bytes of UTF-8, no spaces or "
                         "control characters")
    return raw


def _caps(blob: bytes) -> bytes:
    if len(blob) > MAX_CAPABILITIES:
        raise ValueError(f"capabilities over {MAX_CAPABILITIES} bytes")
    return escape(blob)


class Groups:
    """
    The group requests of one client (C{client.groups}).  The answers are
    the node's words: C{"OK"}, C{"NONE"} (no such group), C{"EXISTS"},
    C{"NOTEMPTY"}, C{"NOTJOINED"}.
    """

    def __init__(self, client: GroupsOwner) -> None:
        self.client = client

    # -- one request -----------------------------------------------------------

    def _ask(self, op: bytes, key: bytes, line: bytes) -> "Deferred[Fields]":
        result = Deferred.fromCoroutine(self._send(op, key, line))
        return result.addTimeout(REQUEST_BOUND, self.client.clock,  # type: ignore[arg-type]
                                 onTimeoutCancel=lambda *a: _timedOut(op))  # type: ignore[arg-type]

    async def _send(self, op: bytes, key: bytes, line: bytes) -> Fields:
        client = self.client
        pool = client.poolFor(key)
        tries = Tries(pool)
        redirects = 0
        noActiveSince: Optional[float] = None
        while True:
            if client.closed:
                raise NoConnection("client closed")
            slot = pool.pick()
            if slot is None or slot.protocol is None:
                await pool.whenConnected(CONNECT_WAIT)
                continue
            address = slot.address
            try:
                fields = await slot.protocol.request(op, key, line)
            except ConnectionDropped:
                tries.dropped(address)
                continue
            if fields[0] == b"M":
                target = fields[3] if len(fields) > 3 else b"*"
                if target == b"*":
                    now = client.clock.seconds()
                    noActiveSince = now if noActiveSince is None else noActiveSince
                    if now - noActiveSince >= NO_ACTIVE_FOR:
                        raise NoConnection("no active node (the cluster answers M *)")
                    await client.timers.sleep(NO_ACTIVE_RETRY)
                    continue
                redirects += 1
                if redirects > MAX_REDIRECTS:
                    raise NoConnection("too many redirects; no active node found")
                try:
                    await slot.switchTo(target.decode())
                except NoConnection:
                    pass
                continue
            if fields[0] == b"E":
                raise LockRejected(b" ".join(fields[3:]).decode("utf-8", "replace"))
            return fields

    def _outcome(self, op: bytes, key: bytes, line: bytes, at: int) -> "Deferred[str]":
        def word(fields: Fields) -> str:
            if len(fields) <= at:
                raise LockError(f"unexpected answer {b' '.join(fields)!r}")
            return fields[at].decode("ascii", "replace")

        return self._ask(op, key, line).addCallback(word)

    # -- the requests ---------------------------------------------------------------

    def create(self, group: Union[str, bytes]) -> "Deferred[str]":
        g = _id(group, "group")
        return self._outcome(b"GCREATE", g, b"GCREATE %s\n" % g, 2)

    def delete(self, group: Union[str, bytes]) -> "Deferred[str]":
        g = _id(group, "group")
        return self._outcome(b"GDELETE", g, b"GDELETE %s\n" % g, 2)

    def join(self, group: Union[str, bytes], member: Union[str, bytes], lease: float,
             capabilities: bytes = b"") -> "Deferred[str]":
        g, m = _id(group, "group"), _id(member, "member")
        line = b"GJOIN %s %s %s %s\n" % (g, m, secondsField(lease, "lease"), _caps(capabilities))
        return self._outcome(b"GJOIN", g, line, 3)

    def leave(self, group: Union[str, bytes], member: Union[str, bytes]) -> "Deferred[str]":
        g, m = _id(group, "group"), _id(member, "member")
        return self._outcome(b"GLEAVE", g, b"GLEAVE %s %s\n" % (g, m), 3)

    def beat(self, group: Union[str, bytes], member: Union[str, bytes],
             lease: float) -> "Deferred[str]":
        g, m = _id(group, "group"), _id(member, "member")
        line = b"GBEAT %s %s %s\n" % (g, m, secondsField(lease, "lease"))
        return self._outcome(b"GBEAT", g, line, 3)

    def update(self, group: Union[str, bytes], member: Union[str, bytes],
               capabilities: bytes) -> "Deferred[str]":
        g, m = _id(group, "group"), _id(member, "member")
        return self._outcome(b"GCAPS", g, b"GCAPS %s %s %s\n" % (g, m, _caps(capabilities)), 3)

    def info(self, group: Union[str, bytes], member: Union[str, bytes]
             ) -> "Deferred[Union[str, MemberInfo]]":
        """
        The member's L{MemberInfo}, or the node's word (C{NONE},
        C{NOTJOINED}).
        """
        g, m = _id(group, "group"), _id(member, "member")

        def read(fields: Fields) -> Union[str, MemberInfo]:
            if fields[3] != b"OK":
                return fields[3].decode("ascii", "replace")
            return MemberInfo(unescape(fields[4]), int(fields[5]) / 1e6, int(fields[6]) / 1e6)

        return self._ask(b"GINFO", g, b"GINFO %s %s\n" % (g, m)).addCallback(read)

    def members(self, group: Union[str, bytes]) -> "Deferred[Optional[List[bytes]]]":
        """
        Every live member of C{group} (a page at a time), or None when the
        group does not exist.
        """
        g = _id(group, "group")

        async def every() -> Optional[List[bytes]]:
            found: List[bytes] = []
            after = b"-"
            while True:
                fields = await self._ask(b"GMEMBERS", g,
                                         b"GMEMBERS %s %s %d\n" % (g, after, MAX_PAGE))
                if fields[2] != b"OK":
                    return None
                found.extend(fields[4:])
                if fields[3] == b"-":
                    return found
                after = fields[3]

        return Deferred.fromCoroutine(every())

    def list(self) -> "Deferred[List[bytes]]":
        """
        Every group (a page at a time).
        """
        async def every() -> List[bytes]:
            found: List[bytes] = []
            after = b"-"
            while True:
                fields = await self._ask(b"GLIST", after, b"GLIST %s %d\n" % (after, MAX_PAGE))
                found.extend(fields[3:])
                if fields[2] == b"-":
                    return found
                after = fields[2]

        return Deferred.fromCoroutine(every())


def _timedOut(op: bytes) -> None:
    raise NoConnection(f"no answer to {op.decode()} within {REQUEST_BOUND:g} s")
