# -*- test-case-name: tests.server.test_groups -*-
"""
The group extension on one node: requests answered from the registry
(L{lockservice.core.groups}) by the active node, redirected by the
others, and every change told to the registry's observers (replication).
"""

from __future__ import annotations

from typing import Callable, List, Optional

from twisted.internet.interfaces import IReactorTime

from lockservice.core import wire
from lockservice.core.groups import OK, GroupRecord, Registry, escape
from lockservice.core.groupwire import GroupRequest, answer


class GroupService:
    """
    @ivar registry: the groups and their members.
    """

    def __init__(self, clock: IReactorTime, wallMicros: Callable[[], int],
                 serving: Callable[[], bool],
                 activeAddress: Callable[[], Optional[bytes]]) -> None:
        """
        @param serving: whether this node serves now (else it redirects).
        """
        self.clock = clock
        self.wallMicros = wallMicros
        self.serving = serving
        self.activeAddress = activeAddress
        self.registry = Registry()

    def handle(self, request: GroupRequest) -> bytes:
        """
        The answer to C{request}.
        """
        if not self.serving():
            return wire.redirect(request.op, request.key, self.activeAddress())
        registry = self.registry
        now = self.clock.seconds()
        op = request.op
        group, member = request.group, request.member
        try:
            if op == b"GCREATE":
                assert group is not None
                return answer(request, registry.create(group, self.wallMicros()))
            if op == b"GDELETE":
                assert group is not None
                return answer(request, registry.delete(group, now))
            if op == b"GLIST":
                page, after = registry.list(request.after, request.limit)
                return answer(request, after or b"-", *page)
            assert group is not None
            if op == b"GMEMBERS":
                found = registry.membersOf(group, request.after, request.limit, now)
                if found is None:
                    return answer(request, b"NONE")
                members, after = found
                return answer(request, OK, after or b"-", *members)
            assert member is not None
            if op == b"GJOIN":
                return answer(request, registry.join(group, member, request.lease,
                                                     request.capabilities, now,
                                                     self.wallMicros()))
            if op == b"GLEAVE":
                return answer(request, registry.leave(group, member, now))
            if op == b"GBEAT":
                return answer(request, registry.beat(group, member, request.lease, now))
            if op == b"GCAPS":
                return answer(request, registry.update(group, member, request.capabilities,
                                                       now, self.wallMicros()))
            outcome, record = registry.info(group, member, now)
            if record is None:
                return answer(request, outcome)
            return answer(request, OK, escape(record.capabilities), b"%d" % record.joinedAt,
                          b"%d" % record.updatedAt)
        except ValueError as e:  # a limit
            return wire.BadRequest(op, request.key, str(e)).answer()

    # -- what the cluster drives --------------------------------------------------

    def install(self, records: List[GroupRecord]) -> None:
        now = self.clock.seconds()
        for record in records:
            self.registry.install(record, now)

    def remove(self, group: bytes, member: Optional[bytes]) -> None:
        self.registry.remove(group, member)
