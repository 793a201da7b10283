"""
Waiters and the FIFO queue of a held key, and the names a client is
shown and granted under.
"""

from __future__ import annotations

from typing import Iterator, Optional

from lockservice.core.shares import EXCLUSIVE


class Waiter:
    """
    One acquire request in a key's queue.

    The table links queued waiters into an intrusive doubly linked list
    (C{prev}/C{next}), so withdrawing any one of them costs O(1) however
    long its queue is.

    @ivar key: the key asked for.
    @ivar lease: the lease (seconds) the grant will run for.
    @ivar queuedAt: (monotonic) time it joined the queue.
    @ivar queued: True while it is in a queue.
    @ivar share: how it would hold the key: L{EXCLUSIVE}, L{READ}, or a
        semaphore's slot count.
    """

    __slots__ = ("key", "lease", "share", "queuedAt", "queued", "prev", "next")

    # The holder name a grant to this waiter is made under (see
    # L{LockTable}): a bare waiter has none; the service's waiters give
    # their connection's C{I} name as it is when the grant is made.
    ident: Optional[bytes] = None

    def __init__(self, key: bytes, lease: float, share: int = EXCLUSIVE) -> None:
        self.key = key
        self.lease = lease
        self.share = share
        self.queuedAt = 0.0
        self.queued = False
        self.prev: Optional[Waiter] = None
        self.next: Optional[Waiter] = None

    def client(self) -> object:
        """
        Who will hold the key if this waiter is granted: an opaque object
        the table keeps with the grant (one per client, shared by all its
        grants, so it costs no memory per key).  The service's waiters
        give their connection; a bare waiter stands for itself.
        """
        return self

    def holderName(self) -> Optional[str]:
        """
        The name this waiter is shown by (L{nameOf} its client).
        """
        return nameOf(self.client())


class WaitQueue:
    """
    The FIFO queue of a held key: a doubly linked list of L{Waiter}s.

    @ivar head: the first waiter (next to be granted), or None.
    @ivar tail: the last waiter, or None.
    @ivar length: how many waiters are queued.
    """

    __slots__ = ("head", "tail", "length")

    def __init__(self) -> None:
        self.head: Optional[Waiter] = None
        self.tail: Optional[Waiter] = None
        self.length = 0

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[Waiter]:
        waiter = self.head
        while waiter is not None:
            following = waiter.next
            yield waiter
            waiter = following

    def append(self, waiter: Waiter) -> None:
        waiter.prev = self.tail
        waiter.next = None
        if self.tail is None:
            self.head = waiter
        else:
            self.tail.next = waiter
        self.tail = waiter
        self.length += 1

    def remove(self, waiter: Waiter) -> None:
        """
        Unlink C{waiter}, which must be in this queue: O(1).
        """
        self.cut(waiter, waiter, 1)
        waiter.prev = waiter.next = None

    def cut(self, first: Waiter, last: Waiter, count: int) -> None:
        """
        Unlink the C{count} consecutive waiters C{first} .. C{last} at once:
        O(1).  Their own links are left as they are (nobody follows them).
        """
        before, after = first.prev, last.next
        if before is None:
            self.head = after
        else:
            before.next = after
        if after is None:
            self.tail = before
        else:
            after.prev = before
        self.length -= count

    def popleft(self) -> Waiter:
        waiter = self.head
        assert waiter is not None
        self.remove(waiter)
        return waiter


def nameOf(client: object) -> Optional[str]:
    """
    The name a client is shown by: its C{name} now (a connection that
    renames itself with C{I} is shown by its new name for every key it
    holds), or None for an unknown client.
    """
    return getattr(client, "name", None) if client is not None else None
