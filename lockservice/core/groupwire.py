# -*- test-case-name: tests.server.test_groups -*-
"""
The group extension's requests on the client port (what tooz's
coordination API needs beyond locks; see L{lockservice.core.groups}).
Its operations have names of several letters, never one (single letters
are the lock protocol's own), and follow its rules: one request a line,
fields separated by one space, answers echoing the operation and its
group, a malformed request answered C{E <op> <group> <message>}.

    GCREATE <group>                       GCREATE <group> OK|EXISTS
    GDELETE <group>                       GDELETE <group> OK|NONE|NOTEMPTY
    GLIST <after|-> <limit>               GLIST <after|-> <next|-> <group>...
    GJOIN <group> <member> <lease> <caps> GJOIN <group> <member> OK|NONE|EXISTS
    GLEAVE <group> <member>               GLEAVE <group> <member> OK|NONE|NOTJOINED
    GBEAT <group> <member> <lease>        GBEAT <group> <member> OK|NONE|NOTJOINED
    GCAPS <group> <member> <caps>         GCAPS <group> <member> OK|NONE|NOTJOINED
    GMEMBERS <group> <after|-> <limit>    GMEMBERS <group> OK <next|-> <member>...
                                          GMEMBERS <group> NONE
    GINFO <group> <member>                GINFO <group> <member> OK <caps> <joined> <updated>
                                          GINFO <group> <member> NONE|NOTJOINED

Groups and members are 1-250 bytes under the key rules.  A lease is
seconds as for C{A}; a member not renewed (C{GBEAT}) within it is gone.
C{<caps>} is the member's capability blob, escaped (L{escape}: printable
ASCII as is, other bytes as C{%XX}, C{-} for none; at most 3,072 bytes
before escaping).  A page (C{<limit>}: 1-100) goes from after C{<after>}
in id order; C{<next>} is where the next page starts (C{-}: none).
C{<joined>} and C{<updated>} are Unix times in microseconds.  A standby
answers C{M <op> <group> <host:port>} like any other.
"""

from __future__ import annotations

from typing import Dict, List, NamedTuple, Optional

from lockservice.core import wire
from lockservice.core.groups import MAX_CAPABILITIES, escape, unescape

__all__ = ["GroupRequest", "OPS", "MAX_PAGE", "parseGroupRequest", "escape", "unescape"]

MAX_PAGE = 100

# op -> (its fields after the op, a usage line)
_FORMS = {
    b"GCREATE": (("group",), "GCREATE <group>"),
    b"GDELETE": (("group",), "GDELETE <group>"),
    b"GLIST": (("after", "limit"), "GLIST <after|-> <limit>"),
    b"GJOIN": (("group", "member", "lease", "caps"), "GJOIN <group> <member> <lease> <caps>"),
    b"GLEAVE": (("group", "member"), "GLEAVE <group> <member>"),
    b"GBEAT": (("group", "member", "lease"), "GBEAT <group> <member> <lease>"),
    b"GCAPS": (("group", "member", "caps"), "GCAPS <group> <member> <caps>"),
    b"GMEMBERS": (("group", "after", "limit"), "GMEMBERS <group> <after|-> <limit>"),
    b"GINFO": (("group", "member"), "GINFO <group> <member>"),
}
OPS = frozenset(_FORMS)


class GroupRequest(NamedTuple):
    """
    A parsed group request: C{key} is what its answer echoes (the group;
    for C{GLIST} its cursor as written).
    """

    op: bytes
    key: bytes
    group: Optional[bytes] = None
    member: Optional[bytes] = None
    lease: float = 0.0
    capabilities: bytes = b""
    after: Optional[bytes] = None
    limit: int = 0


def parseGroupRequest(fields: List[bytes], maxLease: float) -> GroupRequest:
    """
    Parse a line already split on spaces whose op is one of L{OPS}.

    @raise wire.BadRequest: anything malformed (C{E <op> <group> ...}).
    """
    op = fields[0]
    names, usage = _FORMS[op]
    key = fields[1] if len(fields) > 1 and wire.isValidKey(fields[1]) else b"*"
    if len(fields) != 1 + len(names) or b"" in fields:
        raise wire.BadRequest(op, key, "expected: " + usage)
    values = dict(zip(names, fields[1:], strict=True))
    request: Dict[str, object] = {"op": op, "key": fields[1]}
    for name in ("group", "member"):
        if name in values:
            if not wire.isValidKey(values[name]):
                raise wire.BadRequest(op, key, f"bad {name}: 1-250 bytes of UTF-8, no spaces "
                                               "or control characters")
            request[name] = values[name]
    if "lease" in values:
        lease = wire.parseSeconds(values["lease"], maxLease)
        if lease is None or lease == 0.0:
            raise wire.BadRequest(op, key, f"bad lease: seconds, 0 < lease <= {maxLease:g}, "
                                           "digits only")
        request["lease"] = lease
    if "caps" in values:
        try:
            caps = unescape(values["caps"])
        except ValueError:
            raise wire.BadRequest(op, key, "bad capabilities: printable ASCII, other bytes "
                                           "as %XX, - for none") from None
        if len(caps) > MAX_CAPABILITIES:
            raise wire.BadRequest(op, key, f"capabilities over {MAX_CAPABILITIES} bytes")
        request["capabilities"] = caps
    if "after" in values:
        after = values["after"]
        if after != b"-" and not wire.isValidKey(after):
            raise wire.BadRequest(op, key, "bad cursor: - or a group or member id")
        request["after"] = None if after == b"-" else after
    if "limit" in values:
        limit = values["limit"]
        if not limit.isdigit() or not 1 <= int(limit) <= MAX_PAGE:
            raise wire.BadRequest(op, key, f"bad limit: 1-{MAX_PAGE}")
        request["limit"] = int(limit)
    return GroupRequest(**request)  # type: ignore[arg-type]


def answer(request: GroupRequest, *words: bytes) -> bytes:
    """
    The answer line to C{request}: its op, its key (and member), C{words}.
    """
    head = [request.op, request.key]
    if request.member is not None:
        head.append(request.member)
    return b" ".join(head + list(words)) + b"\n"
