"""
A node state whose saves fail (a full disk).
"""

from __future__ import annotations

from typing import Any, Tuple

from lockservice.state import NodeState, StateDir
from tests.support.protocol import Node as ProtocolNode


def brokenState(node: ProtocolNode, tmp_path: Any) -> Tuple[NodeState, BrokenDir]:
    directory = BrokenDir(str(tmp_path / "state"), "c", "")
    state = NodeState(directory, lambda: 1_700_000_000_000_000)
    state.start(node.service)
    directory.broken = True
    return state, directory



class BrokenDir(StateDir):
    """
    A state directory whose writes fail (a full or read-only disk).
    """

    broken = False

    def write(self, state: Any) -> None:
        if self.broken:
            raise OSError(28, "No space left on device")
        super().write(state)
