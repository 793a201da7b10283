"""
Which client a connection of the wait-for graph stands for: the
connection itself, or the client library instance all connections of one
instance name belong to (see L{lockservice.core.waitfor}).
"""

from __future__ import annotations

import re
import weakref
from typing import Callable, Dict, Optional, Tuple

Client = object  # hashable by identity (the server passes connections)

# A client library instance's connection name: <name>#<12 lowercase hex>.
_INSTANCE = re.compile(r"#[0-9a-f]{12}\Z")


class Instance:
    """
    The one client all connections named C{full} stand for (a client
    library instance); shown by its name without the instance id.  One
    object per name while the graph refers to it, so clients still
    compare by identity.
    """

    __slots__ = ("full", "__weakref__")

    def __init__(self, full: str) -> None:
        self.full = full

    @property
    def name(self) -> str:
        shown = self.full[:-13]
        return shown if shown else self.full

    def __repr__(self) -> str:
        return f"Instance({self.full!r})"


def isInstanceName(name: object) -> bool:
    """
    Whether a connection's C{I} name was given by a client library
    instance (it ends in C{#} and 12 lowercase hex characters).
    """
    return isinstance(name, str) and _INSTANCE.search(name) is not None

# Connection names whose client (an Instance, or the connection) is
# remembered at once.
NAMES_CACHED = 4096


class ConnectionClients:
    """
    The connections and clients of a L{lockservice.core.waitfor.WaitForGraph}.
    """

    connectionHolding: Callable[[bytes], Optional[Client]]
    _instances: "weakref.WeakValueDictionary[str, Instance]"
    _names: Dict[object, "Instance | bool"]
    _pinned: Dict[Client, Tuple[Client, int]]

    # -- connections and clients -------------------------------------------------

    def clientOf(self, conn: Optional[Client]) -> Optional[Client]:
        """
        The client C{conn} belongs to: its L{Instance} when its name is an
        instance name, else the connection itself.
        """
        if conn is None:
            return None
        pinned = self._pinned.get(conn)
        if pinned is not None:
            return pinned[0]
        name = getattr(conn, "name", None)
        known = self._names.get(name)
        if known is None:
            known = self._classify(name)
        return conn if known is False else known

    def _classify(self, name: object) -> "Instance | bool":
        """
        C{name}'s L{Instance}, or False for a name that is not an
        instance name; remembered for the next look-up (a bounded cache:
        the regular expression and a new Instance per wait and grant cost
        more than the rest of the graph's work on a contended key).  The
        cache holds its Instances alive; when it is emptied, an Instance
        still referred to stays the one of its name (the weak dictionary
        keeps it), so clients still compare by identity.
        """
        if len(self._names) >= NAMES_CACHED:
            self._names.clear()
        if not isInstanceName(name):
            self._names[name] = False
            return False
        assert isinstance(name, str)
        instance = self._instances.get(name)
        if instance is None:
            instance = self._instances[name] = Instance(name)
        self._names[name] = instance
        return instance

    def holderOf(self, key: bytes) -> Optional[Client]:
        """
        The client holding C{key} now (None: free, or unknown here).
        """
        return self.clientOf(self.connectionHolding(key))

    def _pin(self, conn: Client) -> Client:
        """
        The client of C{conn} for one more of its waits: the one of its
        first wait while it waits (see C{_pinned}).
        """
        pinned = self._pinned.get(conn)
        if pinned is None:
            client = self.clientOf(conn)
            assert client is not None
            self._pinned[conn] = (client, 1)
            return client
        self._pinned[conn] = (pinned[0], pinned[1] + 1)
        return pinned[0]

    def _unpin(self, conn: Client, pinned: Tuple[Client, int]) -> None:
        """
        One of the waits of C{conn} (pinned as C{pinned}) ended.
        """
        if pinned[1] == 1:
            del self._pinned[conn]
        else:
            self._pinned[conn] = (pinned[0], pinned[1] - 1)
