"""
The Deferred-returning client library and the resource-side fencing helper.

    from lockservice.client import connect
"""

from lockservice.client.api import (
    Lock,
    LockClient,
    LockError,
    LockRejected,
    LockTimeout,
    NoConnection,
    ReleaseFailed,
    connect,
)
from lockservice.client.fencing import FenceGuard, StaleToken

__all__ = [
    "Lock",
    "LockClient",
    "LockError",
    "LockRejected",
    "LockTimeout",
    "NoConnection",
    "ReleaseFailed",
    "connect",
    "FenceGuard",
    "StaleToken",
]
