"""
The Deferred-returning client library and the resource-side fencing helper.

    from lockservice.client import connect
"""

from lockservice.client.api import Lock, LockClient, connect
from lockservice.client.errors import (
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
