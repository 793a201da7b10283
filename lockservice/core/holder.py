"""
A short-lived view of one grant of a lock table.
"""

from __future__ import annotations

from array import array
from typing import Iterator, List, Optional, Protocol

from lockservice.core.slots import _GrantInfo
from lockservice.core.waiters import Waiter, WaitQueue, nameOf


class ViewedTable(Protocol):
    """
    What a view reads of its table (L{lockservice.core.views.TableViews}).
    """

    _granted: "array[float]"
    _expires: "array[float]"
    _clients: List[object]

    def _slotOf(self, key: bytes, token: int) -> int: ...

    def _clientAt(self, slot: int) -> object: ...

    def _move(self, key: bytes, slot: int, token: int, expiresAt: float) -> None: ...

    def queueOf(self, key: bytes) -> Optional[WaitQueue]: ...

    def shareOf(self, key: bytes, token: int) -> int: ...


class StaleHolder(LookupError):
    """
    A L{Holder} view was read after the grant it shows had ended (released,
    expired, handed over): read the table again.
    """


class Holder:
    """
    A short-lived view of one grant of a held key, read from (and, for
    C{expiresAt}, written to) the table.

    A view follows one grant: once that grant has ended (released, expired
    or handed over to a waiter), reading it raises L{StaleHolder} instead
    of showing whatever the table holds for the key since.  Take a view,
    read it, drop it; never keep one across reactor turns.

    @ivar key: the held key.
    @ivar token: the fencing token of the grant.
    """

    __slots__ = ("_table", "key", "token")

    def __init__(self, table: ViewedTable, key: bytes, token: int) -> None:
        self._table = table
        self.key = key
        self.token = token

    def _slot(self) -> int:
        slot = self._table._slotOf(self.key, self.token)
        if slot < 0:
            raise StaleHolder(f"the grant {self.token} of {self.key!r} has ended")
        return slot

    def __repr__(self) -> str:
        return f"<Holder {self.key!r} token {self.token}>"

    @property
    def share(self) -> int:
        """
        How it holds the key: L{EXCLUSIVE}, L{READ}, or the slot count of
        its semaphore.
        """
        self._slot()
        return self._table.shareOf(self.key, self.token)

    @property
    def grantedAt(self) -> float:
        """
        (Monotonic) time of the grant.
        """
        return self._table._granted[self._slot()]

    @property
    def expiresAt(self) -> float:
        """
        (Monotonic) time its lease runs out; a renewal moves it.
        """
        return self._table._expires[self._slot()]

    @expiresAt.setter
    def expiresAt(self, expiresAt: float) -> None:
        self._table._move(self.key, self._slot(), self.token, expiresAt)

    @property
    def client(self) -> object:
        """
        Who holds it: the opaque client its waiter stood for (the server's
        connection), or None when unknown (a grant learned by replication).
        """
        return self._table._clientAt(self._slot())

    @property
    def owner(self) -> Optional[str]:
        """
        The holder's name as shown: L{nameOf} its C{client}, now.
        """
        return nameOf(self.client)

    @property
    def renewals(self) -> int:
        """
        How many times the grant was renewed.
        """
        info = self._table._clients[self._slot()]
        return info.renewals if type(info) is _GrantInfo else 0

    @property
    def queue(self) -> Optional[WaitQueue]:
        """
        The waiters, or None when nobody waits.
        """
        self._slot()  # the grant must still hold the key
        return self._table.queueOf(self.key)

    def waiters(self) -> Iterator[Waiter]:
        """
        The queued waiters, first to be granted first.
        """
        queue = self.queue
        return iter(queue) if queue is not None else iter(())

    @property
    def waiting(self) -> int:
        """
        How many waiters are queued.
        """
        queue = self.queue
        return queue.length if queue is not None else 0
