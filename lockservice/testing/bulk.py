"""
Fill a node with many held keys quickly (snapshot tests and benchmarks):
pipelined acquires on one connection, answers read by a second thread so
the server never stops reading from us.
"""

from __future__ import annotations

import socket
import threading
from typing import List


def holdMany(port: int, count: int, host: str = "127.0.0.1", lease: int = 3600,
             prefix: str = "bulk/", batch: int = 5000, timeout: float = 300.0) -> int:
    """
    Acquire C{count} distinct keys; return how many were granted.
    """
    sock = socket.create_connection((host, port), timeout=timeout)
    granted: List[int] = [0]

    def read() -> None:
        buffer = b""
        seen = 0
        while seen < count:
            chunk = sock.recv(1 << 20)
            if not chunk:
                return
            buffer += chunk
            lines = buffer.split(b"\n")
            buffer = lines.pop()
            seen += len(lines)
            granted[0] += sum(1 for line in lines if line.startswith(b"A "))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        for start in range(0, count, batch):
            end = min(count, start + batch)
            sock.sendall(b"".join(b"A %s%d %d 0\n" % (prefix.encode(), i, lease)
                                  for i in range(start, end)))
        reader.join(timeout)
    finally:
        sock.close()
    return granted[0]
