"""
Checks shared by the conformance tests.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any, Dict, Optional

TOKEN = re.compile(r"[0-9]+")
SECONDS = re.compile(r"[0-9]+(\.[0-9]+)?")


def ok(result: Dict[str, Any]) -> Dict[str, Any]:
    assert result.get("ok") is True, f"expected ok, got {result}"
    return result


def err(result: Dict[str, Any], code: str) -> Dict[str, Any]:
    assert result.get("ok") is False and result.get("error") == code, \
        f"expected error {code!r}, got {result}"
    return result


def token_of(result: Dict[str, Any]) -> str:
    """
    The token of an ok result: a JSON string of decimal digits.
    """
    ok(result)
    token = result.get("token")
    assert isinstance(token, str), f"token must be a JSON string, got {token!r} in {result}"
    assert TOKEN.fullmatch(token), f"token must be decimal digits, got {token!r}"
    assert int(token) < 2**64
    return token


def value_of(name: Optional[str]) -> Optional[str]:
    """
    A connection name's value: the part before its last '#'.
    """
    if name is None:
        return None
    return name.rsplit("#", 1)[0] if "#" in name else name


def seconds_field(text: str) -> Decimal:
    """
    A lease/wait field as the wire must carry it: the seconds grammar, no
    exponent, at most 6 decimals (to the microsecond).
    """
    assert SECONDS.fullmatch(text), f"{text!r} is not in the seconds grammar [0-9]+(.[0-9]+)?"
    if "." in text:
        assert len(text.split(".")[1]) <= 6, f"{text!r}: more than 6 decimals (not to the µs)"
    return Decimal(text)


def same_seconds(wire: str, wanted: float, spent: float = 0.0) -> None:
    """
    C{wire} carries C{wanted} to the microsecond; a positive value is at
    least 0.000001.  C{spent}: a wait may be written as what is left of
    it, up to that many seconds less.
    """
    value = seconds_field(wire)
    want = Decimal(repr(wanted))
    if spent and wanted > 0 and Decimal(repr(wanted - spent)) <= value <= want:
        return
    if wanted > 0:
        assert value >= Decimal("0.000001"), f"{wanted!r} written as {wire!r} (must be >= 0.000001)"
    if want >= Decimal("0.000001") or wanted == 0:
        assert abs(value - want) <= Decimal("0.000001"), \
            f"{wanted!r} written as {wire!r}: not that value to the microsecond"
    else:
        assert value == Decimal("0.000001"), f"{wanted!r} written as {wire!r}, not 0.000001"
