"""
The baseline: a trivial Twisted line echo server, the practical ceiling
of a CPython Twisted server on the machine.
"""

from __future__ import annotations

import subprocess
import sys
import time

# -- the echo ceiling -------------------------------------------------------------


def echoServer(port: int) -> None:
    from twisted.internet import reactor
    from twisted.internet.protocol import Factory
    from twisted.protocols.basic import LineOnlyReceiver

    class Echo(LineOnlyReceiver):
        delimiter = b"\n"

        def lineReceived(self, line: bytes) -> None:
            self.transport.write(line + b"\n")  # type: ignore[union-attr]

    reactor.listenTCP(port, Factory.forProtocol(Echo), interface="127.0.0.1")  # type: ignore[attr-defined, arg-type]
    reactor.run()  # type: ignore[attr-defined]


def startEcho(port: int) -> subprocess.Popen:  # type: ignore[type-arg]
    from lockservice.testing.harness import ping

    proc = subprocess.Popen([sys.executable, "-m", "lockservice.bench", "echo-server",
                             "--port", str(port)])
    deadline = time.monotonic() + 15
    while not ping(port, 0.5):
        if time.monotonic() > deadline:
            proc.kill()
            raise RuntimeError("echo server did not start")
        time.sleep(0.05)
    return proc
