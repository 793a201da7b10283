"""
How an acquire shares its key (exclusive, read, a semaphore's slot), the
kind of key that follows, and which grants fit together.
"""

from __future__ import annotations

from typing import List, Tuple

# How an acquire shares its key (the fifth field of C{A}); lockservice.core.wire
# parses it into these.
EXCLUSIVE = 1  # one holder at a time: the writer of a read-write key
READ = 0  # a reader of a read-write key; any other int n is a semaphore of n
# A key's kind: READ_WRITE (taken by EXCLUSIVE and READ acquires) or the
# slot count n >= 2 of a semaphore (taken by acquires of n only).
READ_WRITE = 1


def kindOf(share: int) -> int:
    """
    The kind of key an acquire of C{share} takes (and creates).
    """
    return share if share > EXCLUSIVE else READ_WRITE


def describeKind(kind: int) -> str:
    return "read-write" if kind == READ_WRITE else f"a semaphore of {kind} slots"


def fits(held: int, count: int, share: int) -> bool:
    """
    Whether a grant of C{share} fits beside the C{count} grants of a key
    that hold it as C{held} (every grant of a key holds it alike): beside
    none, anything; readers beside readers, never a writer; at most n
    grants of a semaphore of n; never a grant of another kind (or another
    slot count).
    """
    if not count:
        return True
    if held > EXCLUSIVE:
        return share == held and count < held
    return held == READ and share == READ


def fitTogether(grants: List[Tuple[int, int]]) -> List[int]:
    """
    Which of C{grants} (C{(token, share)}, from two sides of a heal) a key
    keeps: highest tokens first, each one that L{fits} beside those kept
    already.  The highest token sets how the key is held, so when both
    sides' grants fit together all are kept, and otherwise the side with
    the highest token keeps its own.

    @return: the tokens kept, highest first.
    """
    kept: List[int] = []
    held = EXCLUSIVE
    seen = set()
    for token, share in sorted(grants, reverse=True):
        if token in seen:
            continue  # the same grant on both sides
        seen.add(token)
        if not kept:
            held = share
        if fits(held, len(kept), share):
            kept.append(token)
    return kept


class ShareMismatch(ValueError):
    """
    An acquire whose share does not match the kind of the key it asks for
    (held or waited for): nothing changed.
    """

    def __init__(self, key: bytes, kind: int) -> None:
        super().__init__(f"the share does not match the key: it is {describeKind(kind)}")
        self.key = key
        self.kind = kind
