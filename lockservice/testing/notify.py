"""
A stand-in for systemd's end of the notification protocol (tests): a unix
datagram socket that receives C{sd_notify} messages, with the sender's
process id (C{SO_PASSCRED}), as systemd itself does for C{NotifyAccess=}.
"""

from __future__ import annotations

import os
import socket
import struct
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable, List, Optional


@dataclass
class Message:
    """
    One datagram: when it came (monotonic), from which process, and its
    assignments (C{READY=1}, C{STATUS=...}) in order.
    """

    at: float
    pid: int
    assignments: List[str] = field(default_factory=list)

    def has(self, prefix: str) -> bool:
        return any(a.startswith(prefix) for a in self.assignments)

    def status(self) -> Optional[str]:
        for a in self.assignments:
            if a.startswith("STATUS="):
                return a[len("STATUS="):]
        return None


class NotifyListener:
    """
    The socket a test names in C{NOTIFY_SOCKET}: abstract (C{@name}) or a
    path in C{directory}, writable by anyone (a node may run as another
    user).
    """

    def __init__(self, directory: Optional[str] = None) -> None:
        self.socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_PASSCRED, 1)
        if directory is None:
            name = f"lockservice-test-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            self.socket.bind("\0" + name)
            self.address = "@" + name
        else:
            path = os.path.join(directory, "notify.sock")
            self.socket.bind(path)
            os.chmod(path, 0o777)
            self.address = path
        self.messages: List[Message] = []

    def receive(self, timeout: float) -> Optional[Message]:
        """
        The next datagram within C{timeout} seconds, or None.
        """
        self.socket.settimeout(max(timeout, 0.001))
        try:
            data, ancillary, _, _ = self.socket.recvmsg(
                65536, socket.CMSG_SPACE(struct.calcsize("iII")))
        except (TimeoutError, BlockingIOError):
            return None
        pid = -1
        for level, kind, value in ancillary:
            if level == socket.SOL_SOCKET and kind == socket.SCM_CREDENTIALS:
                pid = struct.unpack("iII", value[:struct.calcsize("iII")])[0]
        message = Message(time.monotonic(), pid, data.decode("utf-8", "replace").split("\n"))
        self.messages.append(message)
        return message

    def waitFor(self, predicate: Callable[[Message], bool], timeout: float,
                what: str = "a notification") -> Message:
        """
        The first message, received already or within C{timeout} seconds,
        for which C{predicate} holds.
        """
        for message in self.messages:
            if predicate(message):
                return message
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no {what} within {timeout} s; got: "
                                   + repr([(m.pid, m.assignments) for m in self.messages][-20:]))
            received = self.receive(left)
            if received is not None and predicate(received):
                return received

    def drain(self, seconds: float) -> None:
        """
        Receive whatever comes during C{seconds}.
        """
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.receive(left)

    def fromPid(self, pid: int) -> List[Message]:
        return [m for m in self.messages if m.pid == pid]

    def close(self) -> None:
        self.socket.close()
