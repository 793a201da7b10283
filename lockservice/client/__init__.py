"""
The client library and the resource-side fencing helper.

    from lockservice.client import connect      # Twisted (Deferreds)
    from lockservice.client import sync         # blocking, thread-safe
    from lockservice.client import aio          # asyncio

(C{sync} and C{aio} are modules, imported on use; the tooz driver is
C{lockservice.client.tooz_driver}.)
"""

from lockservice.client.api import Lock, LockClient, connect
from lockservice.client.errors import (
    ForkedClient,
    LockError,
    LockLost,
    LockRejected,
    LockTimeout,
    NoConnection,
    ReleaseFailed,
)
from lockservice.client.fencing import FenceGuard, StaleToken
from lockservice.tls import ClientTLS

__all__ = [
    "ClientTLS",
    "ForkedClient",
    "Lock",
    "LockClient",
    "LockError",
    "LockLost",
    "LockRejected",
    "LockTimeout",
    "NoConnection",
    "ReleaseFailed",
    "connect",
    "FenceGuard",
    "StaleToken",
]
