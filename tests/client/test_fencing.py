from __future__ import annotations

import pytest

from lockservice.client.fencing import FenceGuard, StaleToken


def test_rising_tokens_admitted_and_lower_rejected() -> None:
    guard = FenceGuard()
    guard.admit("acct", 10)
    guard.admit("acct", 10)  # the same holder writing again
    guard.admit("acct", 25)
    with pytest.raises(StaleToken) as e:
        guard.admit("acct", 11)
    assert e.value.highest == 25
    assert guard.highest("acct") == 25


def test_resources_are_independent() -> None:
    guard = FenceGuard()
    guard.admit("a", 100)
    assert guard.check("b", 1) is True
    assert guard.check("a", 99) is False


def test_strict_mode_rejects_equal_token() -> None:
    guard = FenceGuard()
    guard.admit("a", 5, allowEqual=False)
    with pytest.raises(StaleToken):
        guard.admit("a", 5, allowEqual=False)
