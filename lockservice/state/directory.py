# -*- test-case-name: tests.server.test_state -*-
"""
The state directory of one node: its file written atomically and
durably, and a lock so that two nodes never share one directory.
"""

from __future__ import annotations

import os
from typing import Optional, Sequence

from lockservice.state.fileformat import State, StateError, decode, encode

FILENAME = "state"


LOCKNAME = "lock"


class StateDir:
    """
    The state directory of one node: C{DIR/state}, written atomically, and
    C{DIR/lock}, held (C{flock}) while the node runs so that two nodes
    never share one directory.
    """

    def __init__(self, path: str, cluster: str, node: str,
                 alsoCluster: Sequence[str] = ()) -> None:
        """
        @param cluster: the identity this node writes (see
            L{clusterIdentity<lockservice.state.fileformat.clusterIdentity>}).
        @param alsoCluster: identities a file it reads may have besides:
            the same cluster under a secret being rotated (--accept-secret).
        """
        self.path = path
        self.cluster = cluster
        self.alsoCluster = list(alsoCluster)
        self.node = node
        self.file = os.path.join(path, FILENAME)
        self._lock: Optional[int] = None

    def open(self) -> Optional[State]:
        """
        Take the directory and read its state (None: none yet).

        @raise StateError: the directory cannot be used, or its file is
            refused (see L{decode}).
        """
        where = f"--state-dir {self.path}"
        try:
            os.makedirs(self.path, exist_ok=True)
            self._lock = os.open(os.path.join(self.path, LOCKNAME),
                                 os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as e:
            raise StateError(f"{where}: {e.strerror}") from None
        import fcntl

        try:
            fcntl.flock(self._lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise StateError(f"{where} is in use by another running node") from None
        try:
            with open(self.file, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise StateError(f"{where}: cannot read {self.file}: {e.strerror}") from None
        try:
            state = decode(data, None, None)
            accepted = state.cluster if state.cluster in self.alsoCluster else self.cluster
            state = decode(data, accepted, self.node)  # refused: says why
        except StateError as e:
            raise StateError(f"{where}: refusing {self.file}: {e}; move it away to start "
                             "without it") from None
        state.cluster = self.cluster  # written from now on under this node's identity
        return state

    def write(self, state: State) -> None:
        """
        Replace the state file atomically and durably.

        @raise OSError: it could not be written (the old file stays).
        """
        temporary = self.file + ".tmp"
        data = encode(state)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, self.file)
        directory = os.open(self.path, os.O_RDONLY)
        try:
            os.fsync(directory)
        finally:
            os.close(directory)
