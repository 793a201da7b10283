"""
The HTTP endpoint in process: requests through a fake site, a monitor
attached, the admin secret.
"""

from __future__ import annotations

import json
from typing import Any, Optional, Tuple

from treq.testing import StubTreq

from lockservice.server.http import makeRoot
from lockservice.server.monitor import Monitor
from tests.support.protocol import Node as ProtocolNode


def stubFor(node: "ProtocolNode", root: Any) -> StubTreq:
    """
    A StubTreq on C{root}, whose answers are produced on C{node}'s clock
    (the Cooperator's turns): L{settle} runs them.
    """
    stub = StubTreq(root)
    stub.clock = node.clock  # type: ignore[attr-defined]
    return stub


def fetch(stub: StubTreq, path: str):  # type: ignore[no-untyped-def]
    responses: list = []  # type: ignore[type-arg]
    stub.get("http://node" + path).addCallback(
        lambda r: r.content().addCallback(lambda body: responses.append((r, body)))
    )
    settle(stub, lambda: responses)
    assert responses, f"no response for {path}"
    return responses[0]


def withMonitor(node: ProtocolNode, **kw: Any) -> Tuple[StubTreq, Monitor]:
    """
    The resources with a monitor whose wall clock is 1.7e9 + the node's clock.
    """
    clock = node.clock
    monitor = Monitor(clock, node.service.table.clientOf,
                      wallTime=lambda: 1_700_000_000.0 + clock.seconds())
    node.service.notify.attach(monitor)
    return stubFor(node, makeRoot(node.service, None, monitor, **kw)), monitor


SECRET = b"s3cret-admin-token"


def post(stub: StubTreq, path: str, secret: Optional[bytes] = SECRET,
         reason: Optional[str] = "stuck job"):  # type: ignore[no-untyped-def]
    headers = {b"authorization": [b"Bearer " + secret]} if secret is not None else {}
    responses: list = []  # type: ignore[type-arg]
    data = {"reason": reason} if reason is not None else None
    stub.post("http://node" + path, data=data, headers=headers).addCallback(
        lambda r: r.content().addCallback(lambda body: responses.append((r, body)))
    )
    settle(stub, lambda: responses)
    assert responses, f"no response for {path}"
    return responses[0][0].code, json.loads(responses[0][1])



def settle(stub: StubTreq, done: Any) -> None:
    """
    Pump the stub's connections and its clock's turns until C{done()}.
    """
    clock = getattr(stub, "clock", None)
    for _ in range(100_000):
        stub.flush()
        if done() or clock is None:
            return
        clock.advance(0)
