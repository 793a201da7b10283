"""
Helpers for the tooz driver's tests.
"""

from __future__ import annotations

from lockservice.testing.harness import LineClient


def nodeSharesKeys(port: int) -> bool:
    with LineClient(port) as c:
        answer = c.ask(b"A __tooz_probe__ 1 0.000001 r")
        if answer.startswith(b"A "):
            c.ask(b"R __tooz_probe__ " + answer.split(b" ")[2])
        return not answer.startswith(b"E ")
