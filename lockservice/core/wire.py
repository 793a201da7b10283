# -*- test-case-name: tests.server.test_protocol -*-
"""
Parsing and formatting of the client line protocol (docs/protocol.md).

Pure functions over bytes; nothing here knows about connections.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from typing import List, Optional, Union

from lockservice.core.table import MAX_TOKEN

MAX_LINE = 4096
MAX_KEY = 250

_NUMBER = re.compile(rb"[0-9]+(?:\.[0-9]+)?")
_ASCII_CONTROL = re.compile(rb"[\x00-\x1f\x7f]")
_C1_CONTROL = re.compile("[\x80-\x9f]")


class BadRequest(Exception):
    """
    A request that must be answered C{E op key message}.
    """

    def __init__(self, op: bytes, key: bytes, message: str) -> None:
        super().__init__(message)
        self.op = op
        self.key = key
        self.message = message

    def answer(self) -> bytes:
        return b"E " + self.op + b" " + self.key + b" " + self.message.encode() + b"\n"


# How an acquire shares its key: the fifth
# field of C{A}, as a small int so that a waiter keeps it unboxed.
EXCLUSIVE = 1  # no fifth field, or 1: one holder at a time (a writer)
READ = 0  # "r": any number of readers, no writer meanwhile
MAX_SLOTS = 65535  # a semaphore's slots: 2 .. MAX_SLOTS


class Acquire:
    """
    @ivar share: L{EXCLUSIVE}, L{READ}, or a semaphore's slot count (2 ..
        L{MAX_SLOTS}).
    """

    __slots__ = ("key", "lease", "wait", "share")

    def __init__(self, key: bytes, lease: float, wait: float, share: int = EXCLUSIVE) -> None:
        self.key = key
        self.lease = lease
        self.wait = wait
        self.share = share


class Release:
    __slots__ = ("key", "token")

    def __init__(self, key: bytes, token: int) -> None:
        self.key = key
        self.token = token


class Renew:
    __slots__ = ("key", "token", "lease")

    def __init__(self, key: bytes, token: int, lease: float) -> None:
        self.key = key
        self.token = token
        self.lease = lease


class Ping:
    __slots__ = ("word",)

    def __init__(self, word: bytes) -> None:
        self.word = word


class Identify:
    __slots__ = ("name",)

    def __init__(self, name: bytes) -> None:
        self.name = name


class Withdraw:
    """
    C{C <key>}: withdraw this connection's oldest waiting acquire of C{key}.
    """

    __slots__ = ("key",)

    def __init__(self, key: bytes) -> None:
        self.key = key


class Observe:
    """
    C{O <key> <token|?> <wait>}: the key's newest live grant, once it is
    not C{token} (None for C{?}: at once).
    """

    __slots__ = ("key", "token", "wait")

    def __init__(self, key: bytes, token: Optional[int], wait: float) -> None:
        self.key = key
        self.token = token
        self.wait = wait


Request = Union[Acquire, Release, Renew, Ping, Identify, Withdraw, Observe]

_ARITY = {b"A": 4, b"R": 3, b"N": 4, b"C": 2, b"O": 4, b"P": 2, b"I": 2}
# Fields an op may have beyond its arity (A's optional share).
_OPTIONAL = {b"A": 1}


# Printable ASCII except space: a key made only of these needs no decoding.
_PLAIN_KEY_BYTES = bytes(range(0x21, 0x7F))


def isValidKey(key: bytes) -> bool:
    """
    1-250 bytes of UTF-8 with no space and no control character (Cc).
    """
    if not 0 < len(key) <= MAX_KEY:
        return False
    if not key.translate(None, _PLAIN_KEY_BYTES):
        return True  # the common case: printable ASCII only
    if b" " in key or _ASCII_CONTROL.search(key) is not None:
        return False
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return _C1_CONTROL.search(text) is None


def parseSeconds(field: bytes, maximum: float) -> Optional[float]:
    """
    Parse C{[0-9]+(.[0-9]+)?} no larger than C{maximum}, exactly.

    @return: the value, or None when malformed or too large.
    """
    # bytes.isdigit() accepts ASCII digits only, unlike str.isdigit().
    if field.isdigit():
        value = float(int(field)) if len(field) < 16 else float(field)
    elif _NUMBER.fullmatch(field) is not None:
        value = float(field)
    else:
        return None
    # float() rounds: decide the inclusive upper bound on the exact decimal.
    if value >= maximum and Decimal(field.decode()) > Decimal(repr(maximum)):
        return None
    if value == 0.0 and field.strip(b"0.") != b"":
        # A tiny positive value that underflowed: keep it positive.
        return 5e-324
    return value


def checkSeconds(
    value: Union[str, float], name: str, *, positive: bool, maximum: float = math.inf
) -> float:
    """
    The one validator for a number of seconds given by a person or a program
    (options, CLI arguments, client library arguments).  Text must follow
    the wire grammar C{[0-9]+(.[0-9]+)?}; a number must be finite.

    @param positive: True when 0 is not allowed.
    @raise ValueError: with a message naming C{name}.
    """
    rule = "> 0" if positive else ">= 0"
    if isinstance(value, str):
        parsed = parseSeconds(value.encode("utf-8", "replace"), math.inf)
        if parsed is None:
            raise ValueError(f"{name} must be a number of seconds (digits, e.g. 30 or 0.5), "
                             f"not {value!r}")
        number = parsed
    else:
        number = float(value)
        if not math.isfinite(number) or number < 0:
            raise ValueError(f"{name} must be a finite number of seconds {rule}, not {value!r}")
    if positive and number == 0:
        raise ValueError(f"{name} must be a number of seconds {rule}, not {value!r}")
    if number > maximum:
        raise ValueError(f"{name} must be at most {maximum:g} seconds, not {value!r}")
    return number


def formatSeconds(value: float) -> bytes:
    """
    Seconds in the wire grammar, to the microsecond: never an exponent, and
    a positive value never as C{0} (which means "no limit" for a wait): at
    least C{0.000001}.
    """
    text = f"{value:.6f}".rstrip("0").rstrip(".")
    if text == "0" and value > 0:
        return b"0.000001"
    return text.encode() or b"0"


def parseShare(field: bytes) -> Optional[int]:
    """
    Parse the share field: C{r}, or C{[1-9][0-9]*} at most L{MAX_SLOTS}.

    @return: L{READ}, L{EXCLUSIVE} (for C{1}) or the slot count; None when
        malformed.
    """
    if field == b"r":
        return READ
    # isdigit: ASCII digits only; a leading zero is not the grammar.
    if not field.isdigit() or field[0] == 0x30 or len(field) > 5:
        return None
    slots = int(field)
    return slots if slots <= MAX_SLOTS else None


def formatShare(share: int) -> bytes:
    """
    The share field for C{share}, or C{b""} for an exclusive acquire (which
    sends no fifth field).
    """
    if share == EXCLUSIVE:
        return b""
    return b"r" if share == READ else str(share).encode()


def parseToken(field: bytes) -> Optional[int]:
    if not field.isdigit():
        return None
    significant = field.lstrip(b"0")
    if len(significant) > 20:
        return None
    token = int(significant or b"0")
    return token if token <= MAX_TOKEN else None


_USAGE = {
    b"A": "expected: A <key> <lease> <wait> [<share>]",
    b"R": "expected: R <key> <token>",
    b"N": "expected: N <key> <token> <lease>",
    b"C": "expected: C <key>",
    b"O": "expected: O <key> <token|?> <wait>",
    b"P": "expected: P <word>",
    b"I": "expected: I <name>",
}
_BAD_KEY = "bad key: 1-250 bytes of UTF-8, no spaces or control characters"
_BAD_WORD = "bad word: 1-250 bytes of UTF-8, no spaces or control characters"
_BAD_NAME = "bad name: 1-250 bytes of UTF-8, no spaces or control characters"
_BAD_TOKEN = "bad token: decimal digits, at most 2^64-1"
# The holder name shown for a grant whose connection never sent C{I}.
ANONYMOUS = b"-"
_BAD_SHARE = f"bad share: r, or slots 1-{MAX_SLOTS} (digits, no leading zero)"


def _bad(fields: List[bytes], message: str) -> BadRequest:
    op = fields[0]
    key = fields[1] if len(fields) > 1 else b""
    return BadRequest(
        op if op in _ARITY else b"*", key if isValidKey(key) else b"*", message
    )


def parseRequest(line: bytes, maxLease: float, maxWait: float) -> Request:
    """
    Parse one request line (without its line ending).

    @raise BadRequest: for a malformed line (answered C{E <code>}).
    """
    fields = line.split(b" ")
    op = fields[0]
    arity = _ARITY.get(op)
    if b"" in fields:
        raise _bad(fields, "fields must be separated by exactly one space")
    if arity is None:
        raise _bad(fields, "unknown operation")
    if not arity <= len(fields) <= arity + _OPTIONAL.get(op, 0):
        raise _bad(fields, _USAGE[op])
    key = fields[1]
    if not isValidKey(key):
        raise _bad(fields, _BAD_WORD if op == b"P" else _BAD_NAME if op == b"I" else _BAD_KEY)
    # The common cases of parseSeconds and parseToken are inline below
    # (every request goes through here); anything else takes the full
    # check, which decides exactly as before.  As calls they would cost an
    # uncontended acquire+release pair (121,500 instructions on a node,
    # callgrind): the lease and wait 1,950 instructions (1.6%), the token
    # 1,420 (1.2%).
    if op == b"A":
        field = fields[2]
        lease = float(int(field)) if field.isdigit() and len(field) < 16 else 0.0
        if not 0.0 < lease < maxLease:
            lease = _lease(fields, field, maxLease)
        field = fields[3]
        wait: Optional[float] = (
            float(int(field)) if field.isdigit() and len(field) < 16 else None)
        if wait is None or wait >= maxWait:
            wait = parseSeconds(field, maxWait)
            if wait is None:
                raise _bad(fields, f"bad wait: seconds, 0 <= wait <= {maxWait:g}, digits only")
        if len(fields) == 4:
            return Acquire(key, lease, wait)
        share = parseShare(fields[4])
        if share is None:
            raise _bad(fields, _BAD_SHARE)
        return Acquire(key, lease, wait, share)
    if op == b"R":
        field = fields[2]
        # Fewer than 20 digits: below 2**64 whatever they are.
        return Release(key, int(field) if field.isdigit() and len(field) < 20
                       else _token(fields, field))
    if op == b"N":
        return Renew(key, _token(fields, fields[2]), _lease(fields, fields[3], maxLease))
    if op == b"C":
        return Withdraw(key)
    if op == b"O":
        field = fields[2]
        token = None if field == b"?" else _token(fields, field)
        wait = parseSeconds(fields[3], maxWait)
        if wait is None:
            raise _bad(fields, f"bad wait: seconds, 0 <= wait <= {maxWait:g}, digits only")
        return Observe(key, token, wait)
    if op == b"I":
        if key == ANONYMOUS:
            raise _bad(fields, "bad name: - stands for an unnamed connection")
        return Identify(key)
    return Ping(key)


def _lease(fields: List[bytes], field: bytes, maxLease: float) -> float:
    lease = parseSeconds(field, maxLease)
    if lease is None or lease == 0.0:
        raise _bad(fields, f"bad lease: seconds, 0 < lease <= {maxLease:g}, digits only")
    return lease


def _token(fields: List[bytes], field: bytes) -> int:
    token = parseToken(field)
    if token is None:
        raise _bad(fields, _BAD_TOKEN)
    return token


# -- answers ----------------------------------------------------------------


def granted(key: bytes, token: int) -> bytes:
    return b"A " + key + b" " + str(token).encode() + b"\n"


def timedOut(key: bytes) -> bytes:
    return b"T " + key + b"\n"


def released(key: bytes, ok: bool) -> bytes:
    return b"R " + key + (b" OK\n" if ok else b" STALE\n")


def renewed(key: bytes, ok: bool) -> bytes:
    return b"N " + key + (b" OK\n" if ok else b" STALE\n")


def pong(word: bytes) -> bytes:
    return b"P " + word + b"\n"


def identified(name: bytes) -> bytes:
    return b"I " + name + b"\n"


def withdrawn(key: bytes, ok: bool) -> bytes:
    return b"C " + key + (b" OK\n" if ok else b" NONE\n")


def observed(key: bytes, token: int, holder: Optional[bytes]) -> bytes:
    """
    C{O <key> <newest> <holder>}: 0 and C{-} when nothing holds it.
    """
    return b"O %s %d %s\n" % (key, token, holder or ANONYMOUS)


def redirect(op: bytes, key: bytes, active: Optional[bytes]) -> bytes:
    return b"M " + op + b" " + key + b" " + (active or b"*") + b"\n"


LINE_TOO_LONG = b"E * * line too long\n"
TOO_MANY_CONNECTIONS = b"E * * too many connections\n"
