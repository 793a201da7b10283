# -*- test-case-name: tests.server.test_http -*-
"""
The admin's force-release: C{POST /locks/<key>/release} or
C{POST /locks/release?key=<key>}, allowed with the node's
C{--admin-secret} as a bearer token, and its reason made fit for the
log.
"""

from __future__ import annotations

import hmac
import unicodedata
from typing import List, Optional

from twisted.web.server import Request

from lockservice.server.monitor import Monitor
from lockservice.server.service import LockService
from lockservice.server.webjson import BadQuery, answerJSON, queryArg, queryKey

REASON_LIMIT = 500


def cleanReason(raw: bytes) -> str:
    """
    A force-release reason fit for one log line and the event ring: control
    characters and line separators escaped (C{\\n}, C{\\x1b}), so a reason
    cannot forge log lines or terminal output; at most L{REASON_LIMIT}
    characters.
    """
    pieces: List[str] = []
    size = 0
    for c in raw.decode("utf-8", "replace").strip():
        piece = (c.encode("unicode_escape").decode("ascii")
                 if unicodedata.category(c) in ("Cc", "Zl", "Zp") else c)
        if size + len(piece) > REASON_LIMIT:
            # Cut, escapes counted, with room for the mark of the cut (and
            # never through an escape).
            while size + 3 > REASON_LIMIT:
                size -= len(pieces.pop())
            pieces.append("...")
            break
        pieces.append(piece)
        size += len(piece)
    return "".join(pieces)


class ForceRelease:
    """
    The admin's C{POST /locks/K/release} or C{POST /locks/release?key=K}
    (with --admin-secret): the grant released through the monitor, which
    logs it and shows it as a force-release.
    """

    def __init__(self, locks: LockService, monitor: Optional[Monitor],
                 adminSecret: Optional[bytes]) -> None:
        self.locks = locks
        self.monitor = monitor
        self.adminSecret = adminSecret

    def render(self, request: Request, path: List[bytes]) -> bytes:
        query = queryArg(request, b"key")
        if path == [b"release"] and query is not None:
            raw = query  # POST /locks/release?key=K: any key, unambiguous
        elif len(path) >= 2 and path[-1] == b"release" and query is None:
            raw = b"/".join(path[:-1])
        else:
            return answerJSON(request, {"error": "POST /locks/<key>/release "
                                            "or /locks/release?key=<key>"}, 404)
        if self.adminSecret is None or self.monitor is None:
            return answerJSON(request, {"error": "force-release is off: no --admin-secret"}, 403)
        if not self._authorized(request):
            request.setHeader(b"www-authenticate", b'Bearer realm="lockservice"')
            return answerJSON(request, {"error": "wrong or missing admin secret"}, 401)
        key = queryKey(raw)
        assert key is not None
        reason = cleanReason(queryArg(request, b"reason") or b"") or "no reason given"
        if self.locks.role != "active":
            active = self.locks.activeAddress
            return answerJSON(request, {
                "error": "this node is not active",
                "active": active.decode() if active is not None else None,
            }, 409)
        # ?token=T names one grant of a shared key; without it, the
        # key's (first-expiring) grant, as for an exclusive key.
        given = queryArg(request, b"token")
        if given is not None:
            if not given.isdigit() or int(given) >= 2**64:
                raise BadQuery("token must be a whole number below 2^64")
            token: Optional[int] = int(given)
            if self.locks.table.placeOf(key, int(given)) is None:
                token = None
        else:
            token = self.locks.table.tokenOf(key)
        if token is None:
            return answerJSON(request, {"error": "key not held",
                                   "key": key.decode("utf-8", "replace")}, 404)
        peer = request.getClientAddress()
        who = f"admin@{getattr(peer, 'host', peer)}"
        table = self.locks.table
        issuedBefore = table.tokens.last
        if not self.monitor.forceRelease(self.locks, key, token, reason, who):
            return answerJSON(request, {"error": "key not held",
                                   "key": key.decode("utf-8", "replace")}, 404)
        # The next token is that of a grant this release made (a waiter's;
        # the first, should it let several readers in), not any grant of
        # the key: a shared key's other holders were there before.
        made = [held.token for held in table.grantsOf(key) if held.token > issuedBefore]
        return answerJSON(request, {
            "key": key.decode("utf-8", "replace"),
            "released_token": token,
            "next_token": min(made) if made else None,
            "reason": reason,
        })

    def _authorized(self, request: Request) -> bool:
        assert self.adminSecret is not None
        header = request.getHeader(b"authorization") or b""
        scheme, _, given = header.partition(b" ")
        if scheme.lower() != b"bearer":
            given = b""
        # Constant time whatever the given secret: no timing oracle.
        return hmac.compare_digest(given.strip(), self.adminSecret)
