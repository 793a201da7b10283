# -*- test-case-name: tests.client.test_client -*-
"""
The client's arguments, checked before anything is sent: keys and names,
shares, semaphore slots, and the connection name a client sends.
"""

from __future__ import annotations

from typing import Optional, Union

from lockservice.client.lock import Share
from lockservice.core import wire


def encodeKey(key: Union[str, bytes], what: str = "key") -> bytes:
    raw = key.encode("utf-8") if isinstance(key, str) else key
    if not wire.isValidKey(raw):
        raise ValueError(f"invalid {what} {key!r}: 1-250 bytes of UTF-8, "
                         "no spaces or control characters")
    return raw


MAX_SLOTS = 65535
# The suffix every connection name gets (conventions: `I <name>#<12 hex>`),
# so the node's deadlock check can join the connections of one client.
INSTANCE_HEX = 12


def checkShare(share: Share) -> Share:
    """
    A share argument, normalised: None (exclusive; C{1} is the same), C{"r"}
    (a read lock) or an int of 2..65535 (a semaphore of that many slots).

    @raise ValueError: for anything else (checked before anything is sent).
    """
    if share is None or share == "r":
        return share
    if isinstance(share, int) and not isinstance(share, bool):
        if share == 1:
            return None
        if 2 <= share <= MAX_SLOTS:
            return share
    raise ValueError(f"invalid share {share!r}: None or 1 (exclusive), \"r\" (read), "
                     f"or an int of 2..{MAX_SLOTS} (semaphore slots)")


def shareField(share: Share) -> bytes:
    """
    The optional fifth field of C{A} for a normalised share: nothing for an
    exclusive acquire, so exclusive requests stay the four-field line every node reads.
    """
    if share is None:
        return b""
    return b" " + str(share).encode("ascii")


def wireName(name: Optional[bytes], instance: str) -> bytes:
    """
    What a client sends as C{I <...>}: its name plus C{#<instance>}.
    """
    return (name or b"") + b"#" + instance.encode("ascii")


def checkSlots(slots: int) -> int:
    """
    A semaphore's slot count: an int of 2..65535.

    @raise ValueError: for anything else (checked before anything is sent).
    """
    if isinstance(slots, bool) or not isinstance(slots, int) or not 2 <= slots <= MAX_SLOTS:
        raise ValueError(f"invalid slots {slots!r}: an int of 2..{MAX_SLOTS}")
    return slots

