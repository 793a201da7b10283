# -*- test-case-name: tests.cluster.test_peerwire -*-
"""
The peer line format: every line a peer channel carries, built and
parsed here and nowhere else, as L{lockservice.core.wire} is for clients.
First the handshake (its rules and proofs are L{lockservice.cluster.peer}):

    HELLO <lo>-<hi> <connector> <acceptor> <nonce>
    CHALLENGE <version> <nonce> <mac>   AUTH <mac>   WELCOME <mac>
    E * * <why>                             a refusal, and the link closes

then, once authenticated:

    HB <term> <role> <leader|-> <last_token> <position> [suspect]
                                            every node, on every link, every --heartbeat;
                                            <position>: how far the node's copy of its
                                            leader's stream goes (an active: its own)
    SYNC                                    follower -> leader: send state, then stream
    OFFER <leader> <term> <position>        follower -> leader, before SYNC, on a heal:
    RELEASED <key> <token>                  what the follower holds and released
    MERGE <key> <token> <remaining_us> <age_us> <share> <holder> [d]
                                            (see L{lockservice.cluster.merge})
    SNAP <term> <last_token>                leader -> follower: a snapshot begins
    H <key> <token> <remaining_us> <age_us> <share> <holder> [d]
                                            one held grant of the snapshot
    SNAPEND                                 the snapshot is complete
    SYNCED                                  follower -> leader: it applied the snapshot
    G <key> <token> <remaining_us> <age_us> <share> <holder> [d]
                                            a grant or a renewal (live stream)
    D <key> <token>                         a release or an expiry (live stream)
    S <position>                            the stream up to here (acknowledged with
                                            --replication ack; and heartbeats say it)
    ACK <position>                          follower -> leader, once per read
    GG <group> <created_us>                 a group (live stream, snapshot, offer)
    GM <group> <member> <joined_us> <updated_us> <remaining_us> <caps>
                                            a member of a group (the same)
    GD <group>                              a group deleted (live stream)
    GL <group> <member>                     a member left (live stream)
    HANDOFF <term>                          old active -> successor
    TAKEN <term> | REFUSED <term>           successor -> old active

A grant carries its share as on the client wire (C{1} for an exclusive
grant, C{r}, or the semaphore's slots) and its holder name (the C{I} name
its connection had when it was granted, C{-} for none).  A place kept by
the lock-delay after its grant expired ends with C{d}: its remaining time
is then the delay's.  A shared key's grants go highest token first, so
that a heal that reads them one by one keeps what
L{lockservice.core.table.fitTogether} keeps of them all.

Parsers raise L{Malformed} (a C{ValueError}) on a line they cannot read.
The hot paths (a snapshot of a million keys, a busy stream) use the line
formats below directly, or L{parseChanges} once per read.  Pure: no I/O,
no clock.
"""

from __future__ import annotations

from typing import Iterable, List, NamedTuple, Optional, Sequence, Tuple

from lockservice.core.election import ROLES, SYNCING
from lockservice.core.groups import GroupRecord, escape, unescape
from lockservice.core.table import EXCLUSIVE
from lockservice.core.table import Change as TableChange
from lockservice.core.wire import parseShare

HELLO = b"HELLO"
CHALLENGE = b"CHALLENGE"
AUTH = b"AUTH"
WELCOME = b"WELCOME"
REFUSAL = b"E"
HB = b"HB"
SYNC = b"SYNC"
SNAP = b"SNAP"
SNAPEND = b"SNAPEND"
SYNCED = b"SYNCED"
HELD = b"H"
GRANT = b"G"
DROP = b"D"
POSITION = b"S"
ACK = b"ACK"
OFFER = b"OFFER"
RELEASED = b"RELEASED"
MERGE = b"MERGE"
HANDOFF = b"HANDOFF"
GROUP = b"GG"
MEMBER = b"GM"
GROUP_DELETED = b"GD"
MEMBER_LEFT = b"GL"
GROUP_LINES = (GROUP, MEMBER, GROUP_DELETED, MEMBER_LEFT)
TAKEN = b"TAKEN"
REFUSED = b"REFUSED"

# The word a heartbeat ends with while its node distrusts its own clock.
SUSPECT = b"suspect"

# Line prefixes of the runs applied in bulk: changes to held keys (a
# snapshot, the live stream, with the positions that end each of the
# stream's writes), and a heal's offer.
CHANGES = (b"H ", b"G ", b"D ", b"S ")
OFFERED = (b"MERGE ", b"RELEAS")

# Formats of the hot paths (one % per line, no call): an exclusive grant's
# H/G line (key, token, remaining, age, holder) and a drop, each with its
# newline.
HELD_LINE = b"H %s %d %d %d 1 %s\n"
GRANT_LINE = b"G %s %d %d %d 1 %s\n"
DROP_LINE = b"D %s %d\n"
# The holder field of a grant made on a connection that never sent C{I}.
NO_HOLDER = b"-"
# The last field of a place kept by the lock-delay.
DELAYED = b"d"

# One change parsed from H/G/D lines (see L{lockservice.core.table.Change}).
Change = TableChange


class Malformed(ValueError):
    """
    A peer line that cannot be read.
    """


def micros(seconds: float) -> int:
    return int(seconds * 1e6)


# -- the handshake ------------------------------------------------------------------


def hello(version: bytes, connector: bytes, acceptor: bytes, nonce: bytes) -> bytes:
    return b" ".join([HELLO, version, connector, acceptor, nonce])


def challenge(version: bytes, nonce: bytes, mac: bytes) -> bytes:
    return b" ".join([CHALLENGE, version, nonce, mac])


def auth(mac: bytes) -> bytes:
    return AUTH + b" " + mac


def welcome(mac: bytes) -> bytes:
    return WELCOME + b" " + mac


def refusal(why: bytes) -> bytes:
    """
    The line a refused handshake ends with (the client wire's error form).
    """
    return b"E * * " + why


# -- heartbeats ------------------------------------------------------------------


class Heartbeat(NamedTuple):
    term: int
    role: str
    leader: Optional[int]
    token: int
    suspect: bool
    position: int = 0


def heartbeat(term: int, role: str, leader: Optional[int], token: int,
              suspect: bool, position: int = 0) -> bytes:
    line = b"HB %d %s %s %d %d" % (term, role.encode(),
                                   b"-" if leader is None else b"%d" % leader, token, position)
    return line + b" " + SUSPECT if suspect else line


def parseHeartbeat(fields: Sequence[bytes]) -> Heartbeat:
    """
    An unknown role reads as C{syncing} (a newer peer's role: it holds
    nothing we may rely on).
    """
    try:
        term, token, position = int(fields[1]), int(fields[4]), int(fields[5])
        role = fields[2].decode()
        leader = None if fields[3] == b"-" else int(fields[3])
    except (IndexError, ValueError) as e:
        raise Malformed(fields[:7]) from e
    return Heartbeat(term, role if role in ROLES else SYNCING, leader, token,
                     len(fields) > 6 and fields[6] == SUSPECT, position)


# -- the stream -------------------------------------------------------------------


def snapshotBegins(term: int, token: int) -> bytes:
    return b"SNAP %d %d" % (term, token)


def parseSnapshotBegins(fields: Sequence[bytes]) -> Tuple[int, int]:
    """
    @return: the (term, last token) of a C{SNAP} line.
    """
    return _ints(fields, 2)  # type: ignore[return-value]


def _shareText(share: int) -> bytes:
    return b"r" if share == 0 else b"%d" % share


def grantLine(key: bytes, token: int, remaining: int, age: int, share: int = EXCLUSIVE,
              name: Optional[bytes] = None, delayed: bool = False,
              kind: bytes = GRANT) -> bytes:
    """
    A C{G} (or, as C{kind}, C{H} or C{MERGE}) line with its newline:
    C{remaining} and C{age} in microseconds.
    """
    line = b"%s %s %d %d %d %s %s" % (kind, key, token, remaining, age, _shareText(share),
                                      name or NO_HOLDER)
    return line + b" d\n" if delayed else line + b"\n"


def dropLine(key: bytes, token: int) -> bytes:
    return DROP_LINE % (key, token)


def sharedLines(kind: bytes, key: bytes,
                grants: Iterable[Tuple[int, float, float, int, Optional[bytes], bool]],
                now: float) -> List[bytes]:
    """
    The C{kind} (H, MERGE) lines, without newlines, of every grant of
    C{key}, as (token, grantedAt, expiresAt, share, name, delayed),
    highest first.
    """
    return [grantLine(key, token, micros(expiresAt - now), micros(now - grantedAt), share,
                      name, delayed, kind)[:-1]
            for token, grantedAt, expiresAt, share, name, delayed in grants]


def grantFields(fields: Sequence[bytes]) -> Tuple[int, Optional[bytes], bool]:
    """
    The share, holder name and lock-delay mark of a G/H/MERGE line.

    @raise Malformed: a malformed share, or missing fields.
    """
    if len(fields) not in (7, 8) or (len(fields) == 8 and fields[7] != DELAYED):
        raise Malformed(fields[:8])
    share = parseShare(fields[5])
    if share is None:
        raise Malformed(fields[5])
    name = fields[6]
    return share, (None if name == NO_HOLDER else name), len(fields) == 8


class Changes(NamedTuple):
    """
    What L{parseChanges} read of a run of H/G/D lines.

    @ivar changes: the changes, in order (see L{Change}).
    @ivar malformed: the fields of each line that could not be read.
    @ivar implausible: the tokens of grants refused as too far ahead.
    @ivar position: the last stream position (C{S}) read, or None.
    """

    changes: List[Change]
    malformed: List[Sequence[bytes]]
    implausible: List[int]
    position: Optional[int] = None


def parseChanges(lines: Iterable[bytes], now: float, limit: int) -> Changes:
    """
    A run of C{H}/C{G} (held keys), C{D} (dropped) and C{S} (position)
    lines, read at C{now} (their remaining times and ages become
    deadlines) in one loop: a busy stream is mostly this, and so is a
    snapshot of a million keys.  A grant whose token is above C{limit} is
    left out (a drop is not: it ends nothing we may rely on).
    """
    changes: List[Change] = []
    append = changes.append
    malformed: List[Sequence[bytes]] = []
    implausible: List[int] = []
    position: Optional[int] = None
    for line in lines:
        fields = line.rstrip(b"\r").split(b" ")
        kind = fields[0]
        try:
            if kind == b"S":
                position = int(fields[1])
                continue
            key, token = fields[1], int(fields[2])
            if kind == b"D":
                append((key, token, 0.0, None, EXCLUSIVE, None, False))
                continue
            expiresAt = now + int(fields[3]) / 1e6
            grantedAt = now - int(fields[4]) / 1e6
            if len(fields) == 7 and fields[5] == b"1":
                # An exclusive grant (grantFields, inline: every line).
                name: Optional[bytes] = fields[6]
                share, delayed = EXCLUSIVE, False
                if name == NO_HOLDER:
                    name = None
            else:
                share, name, delayed = grantFields(fields)
        except (IndexError, ValueError):
            malformed.append(fields[:8])
            continue
        if token > limit:
            implausible.append(token)
            continue
        append((key, token, grantedAt, expiresAt, share, name, delayed))
    return Changes(changes, malformed, implausible, position)


def positionLine(position: int) -> bytes:
    return b"S %d\n" % position


def lastPosition(lines: Sequence[bytes]) -> Optional[bytes]:
    """
    The last stream position (C{S}) in one read's lines, as written, or
    None.  Positions end each flush, so it is mostly the last line.
    """
    for index in range(len(lines) - 1, -1, -1):
        line = lines[index]
        if line[:2] == b"S ":
            return line[2:].rstrip(b"\r")
    return None


def ackLine(position: bytes) -> bytes:
    return b"ACK " + position + b"\n"


def parsePosition(fields: Sequence[bytes]) -> int:
    """
    The position of an C{S} or C{ACK} line.
    """
    return _ints(fields, 1)[0]


# -- groups (see lockservice.core.groups) -----------------------------------------


def groupLine(record: GroupRecord, now: float) -> bytes:
    """
    The C{GG} or C{GM} line of C{record}, with its newline (times in wall
    microseconds; a member's lease as the time left).
    """
    if record.member is None:
        return b"GG %s %d\n" % (record.group, record.createdAt)
    return b"GM %s %s %d %d %d %s\n" % (
        record.group, record.member, record.createdAt, record.updatedAt,
        micros(record.expiresAt - now), escape(record.capabilities))


def groupGoneLine(group: bytes, member: Optional[bytes]) -> bytes:
    if member is None:
        return b"GD %s\n" % group
    return b"GL %s %s\n" % (group, member)


def parseGroupLine(fields: Sequence[bytes], now: float
                   ) -> Tuple[bool, GroupRecord]:
    """
    A C{GG}, C{GM}, C{GD} or C{GL} line: C{(present, record)}, C{present}
    False for a deleted group or a member that left (then only the
    record's group and member count).

    @raise Malformed: a line that cannot be read.
    """
    try:
        kind, group = fields[0], fields[1]
        if kind == GROUP and len(fields) == 3:
            return True, GroupRecord(group, None, int(fields[2]), int(fields[2]), 0.0, b"")
        if kind == MEMBER and len(fields) == 7:
            return True, GroupRecord(group, fields[2], int(fields[3]), int(fields[4]),
                                     now + int(fields[5]) / 1e6, unescape(fields[6]))
        if kind == GROUP_DELETED and len(fields) == 2:
            return False, GroupRecord(group, None, 0, 0, 0.0, b"")
        if kind == MEMBER_LEFT and len(fields) == 3:
            return False, GroupRecord(group, fields[2], 0, 0, 0.0, b"")
    except (IndexError, ValueError) as e:
        raise Malformed(fields[:8]) from e
    raise Malformed(fields[:8])


# -- handoff ----------------------------------------------------------------------


def handoff(term: int) -> bytes:
    return b"HANDOFF %d" % term


def taken(term: int) -> bytes:
    return b"TAKEN %d" % term


def refused(term: int) -> bytes:
    return b"REFUSED %d" % term


def parseTerm(fields: Sequence[bytes]) -> int:
    """
    The term of a C{HANDOFF}, C{TAKEN} or C{REFUSED} line.
    """
    return _ints(fields, 1)[0]


# -- a heal's offer (see merge.py) -------------------------------------------------


def offerLines(origin: Tuple[int, int, int], released: Iterable[Tuple[bytes, int]],
               grants: Iterable[Tuple[bytes, int, int, int, int, Optional[bytes], bool]]
               ) -> bytes:
    """
    The offer, as written on the link: its C{OFFER} line even when it has
    no grant and no note (how far its copy of the stream went still tells
    the winner what ended in the part it missed: see
    L{lockservice.cluster.terms.Eras.further}).

    @param origin: the (leader, term, position) whose stream the lines
        mirror, up to that position.
    @param released: (key, token) of each release note.
    @param grants: (key, token, remaining_us, age_us, share, name, delayed)
        of each held grant or place kept by the lock-delay.
    """
    lines = [b"RELEASED %s %d" % note for note in released]
    lines.extend(grantLine(key, token, remaining, age, share, name, delayed, MERGE)[:-1]
                 for key, token, remaining, age, share, name, delayed in grants)
    return b"".join([b"OFFER %d %d %d\n" % origin] + [line + b"\n" for line in lines])


def parseOffer(fields: Sequence[bytes]) -> Tuple[int, int, int]:
    """
    The (leader, term, position) of an C{OFFER} line.
    """
    return _ints(fields, 3)  # type: ignore[return-value]


class Offered(NamedTuple):
    """
    One C{RELEASED} line (C{released} True; the rest zero) or C{MERGE}
    line of an offer; remaining and age in seconds.
    """

    released: bool
    key: bytes
    token: int
    remaining: float
    age: float
    share: int
    name: Optional[bytes] = None
    delayed: bool = False


def parseOffered(line: bytes) -> Offered:
    fields = line.rstrip(b"\r").split(b" ")
    try:
        key, token = fields[1], int(fields[2])
        if fields[0] == RELEASED:
            return Offered(True, key, token, 0.0, 0.0, EXCLUSIVE)
        share, name, delayed = grantFields(fields)
        return Offered(False, key, token, int(fields[3]) / 1e6, int(fields[4]) / 1e6,
                       share, name, delayed)
    except (IndexError, ValueError) as e:
        raise Malformed(fields[:8]) from e


def _ints(fields: Sequence[bytes], count: int) -> Tuple[int, ...]:
    if len(fields) <= count:
        raise Malformed(fields[:6])
    try:
        return tuple(int(field) for field in fields[1:1 + count])
    except ValueError as e:
        raise Malformed(fields[:6]) from e
