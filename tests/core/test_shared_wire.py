"""
The share field of C{A} (SPEC section 3, C{<share>}): parsed to the letter,
bad input answered with exact bytes.
"""

from __future__ import annotations

import pytest

from lockservice.core import wire
from lockservice.core.wire import EXCLUSIVE, READ, Acquire, BadRequest, parseRequest


def parse(line: bytes) -> Acquire:
    request = parseRequest(line, 86400.0, 86400.0)
    assert isinstance(request, Acquire)
    return request


def error(line: bytes) -> bytes:
    with pytest.raises(BadRequest) as caught:
        parseRequest(line, 86400.0, 86400.0)
    return caught.value.answer()


@pytest.mark.parametrize(
    "line, share",
    [
        (b"A k 30 0", EXCLUSIVE),
        (b"A k 30 0 1", EXCLUSIVE),
        (b"A k 30 0 r", READ),
        (b"A k 30 0 2", 2),
        (b"A k 30 0 10", 10),
        (b"A k 30 0 65535", 65535),
    ],
)
def test_valid_shares(line: bytes, share: int) -> None:
    request = parse(line)
    assert (request.key, request.lease, request.wait, request.share) == (b"k", 30.0, 0.0, share)


BAD_SHARE = b"E A k bad share: r, or slots 1-65535 (digits, no leading zero)\n"


@pytest.mark.parametrize(
    "field",
    [b"0", b"65536", b"99999", b"100000", b"x", b"+2", b"01", b"00", b"007", b"R", b"rw",
     b"w", b"2.0", b"-2", b"1e3", b"1_0", "\uff12".encode(), b"\xff", b"r\x00",
     b"18446744073709551617"],
)
def test_bad_share_is_answered_exactly(field: bytes) -> None:
    assert error(b"A k 30 0 " + field) == BAD_SHARE


@pytest.mark.parametrize(
    "line, answer",
    [
        (b"A k 30 0 r x", b"E A k expected: A <key> <lease> <wait> [<share>]\n"),
        (b"A k 30 0 2 2", b"E A k expected: A <key> <lease> <wait> [<share>]\n"),
        (b"A k 30", b"E A k expected: A <key> <lease> <wait> [<share>]\n"),
        (b"A k 30 0 r ", b"E A k fields must be separated by exactly one space\n"),
        (b"A k 30 0  r", b"E A k fields must be separated by exactly one space\n"),
        # The other fields are judged first, as they always were.
        (b"A k 0 0 r", b"E A k bad lease: seconds, 0 < lease <= 86400, digits only\n"),
        (b"A k 30 x 0", b"E A k bad wait: seconds, 0 <= wait <= 86400, digits only\n"),
        (b"A \x01 30 0 r", b"E A * bad key: 1-250 bytes of UTF-8, no spaces or control "
                           b"characters\n"),
        # Only A takes a fifth field.
        (b"N k 1 30 r", b"E N k expected: N <key> <token> <lease>\n"),
        (b"R k 1 r", b"E R k expected: R <key> <token>\n"),
    ],
)
def test_other_bad_lines_with_a_share(line: bytes, answer: bytes) -> None:
    assert error(line) == answer


def test_format_share_round_trips() -> None:
    assert wire.formatShare(EXCLUSIVE) == b""
    for share in (READ, 2, 65535):
        assert wire.parseShare(wire.formatShare(share)) == share
