# -*- test-case-name: tests.client.test_client -*-
"""
Leader election, built from the lock (the recipe every official client
follows): candidates acquire the election's key (kept alive, waiting for
ever) on a connection whose name's value is their campaign value; the
holder leads, and its fencing token fences what it does as leader;
anyone observes who leads; releasing the key (or losing its lease)
resigns.

Two leaders can exist for a moment: inside a failover or partition
window, or when a resignation crosses a grant or an expiry.  The
leadership's token is what the resources a leader touches must check.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from twisted.internet.defer import Deferred

from lockservice.client.errors import LockLost
from lockservice.client.lock import Lock
from lockservice.core import wire

# A leadership's lease unless the campaign says otherwise (seconds).
DEFAULT_LEADER_LEASE = 10.0


class Leader(NamedTuple):
    """
    Who leads an election: its campaign C{value}, the leadership's fencing
    C{token}, and the full C{holder} name the node shows.
    """

    value: Optional[str]
    token: int
    holder: Optional[str]


def campaignName(value: str, instance: str) -> bytes:
    """
    The connection name a campaign for C{value} is made under:
    C{<value>#<instance>}.

    @raise ValueError: C{value} cannot be a name's value (empty, a space
        or a control character, or too long once C{#<instance>} is added):
        refused before anything is sent.
    """
    if not isinstance(value, str) or not value:
        raise ValueError(f"invalid campaign value {value!r}: a non-empty string")
    name = value.encode("utf-8", "surrogatepass") + b"#" + instance.encode("ascii")
    if not wire.isValidKey(name):
        raise ValueError(f"invalid campaign value {value!r}: no spaces or control "
                         f"characters, at most {wire.MAX_KEY - 1 - len(instance)} bytes")
    return name


class Leadership:
    """
    This client leads C{election} with C{value}.

    @ivar token: the leadership's fencing token.
    @ivar lock: the election key's lock (kept alive).
    @ivar lost: fires with a L{LockLost} the moment this client can no
        longer be sure it leads (as for a lock).
    """

    def __init__(self, election: str, value: str, lock: Lock) -> None:
        self.election = election
        self.value = value
        self.lock = lock
        self.token = lock.token
        self.lost: "Deferred[LockLost]" = lock.lost

    def __repr__(self) -> str:
        return f"Leadership(election={self.election!r}, value={self.value!r}, " \
               f"token={self.token})"

    def resign(self) -> "Deferred[bool]":
        """
        Stop leading: release the election's key (retried like any
        release).
        """
        return self.lock.release()
