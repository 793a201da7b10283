# -*- test-case-name: tests.test_partition -*-
"""
Real network faults between real nodes: each node in its own network
namespace, all on one bridge, with iptables rules inside a node's
namespace to cut or reset its links.

    root namespace (tests, clients)      10.213.N.1  bridge lsbrN
      |-- veth -- namespace lsN-0        10.213.N.2  node 0
      |-- veth -- namespace lsN-1        10.213.N.3  node 1
      ...

Traffic stays on addresses inside namespaces this lab made (and the
bridge's own address); everything is removed on L{Lab.close}.  Needs root,
C{ip} and C{iptables}; L{unavailable} says why not when they are missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import List, Optional, Sequence

from lockservice.testing.harness import Cluster, Node, freePort


def unavailable() -> Optional[str]:
    """
    None when network namespaces and iptables can be used here, else why not.
    """
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "iptables"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (iproute2/iptables)"
    name = f"lsprobe{os.getpid()}"
    try:
        _run(["ip", "netns", "add", name])
        try:
            _run(["ip", "netns", "exec", name, "iptables", "-L", "-n"])
        finally:
            _run(["ip", "netns", "del", name], check=False)
    except (OSError, subprocess.CalledProcessError) as e:
        return f"cannot use a network namespace with iptables: {e}"
    return None


def _run(cmd: Sequence[str], check: bool = True) -> None:
    subprocess.run(list(cmd), check=check, stdout=subprocess.DEVNULL,
                   stderr=subprocess.PIPE, timeout=30)


class Lab:
    """
    A bridge and C{size} namespaces, one per node.
    """

    def __init__(self, size: int, lab: Optional[int] = None) -> None:
        self.id = lab if lab is not None else 100 + os.getpid() % 150
        self.size = size
        self.bridge = f"lsbr{self.id}"
        self.subnet = f"10.213.{self.id}"
        self.hub = f"{self.subnet}.1"
        self.namespaces = [f"ls{self.id}-{i}" for i in range(size)]
        self._made: List[str] = []

    def address(self, i: int) -> str:
        return f"{self.subnet}.{i + 2}"

    def open(self) -> "Lab":
        self.close()
        _run(["ip", "link", "add", self.bridge, "type", "bridge"])
        self._made.append("bridge")
        _run(["ip", "addr", "add", f"{self.hub}/24", "dev", self.bridge])
        _run(["ip", "link", "set", self.bridge, "up"])
        # Where bridged frames pass the host's iptables (br_netfilter), a
        # FORWARD policy of DROP would cut the nodes off from each other.
        _run(["iptables", "-I", "FORWARD", "-i", self.bridge, "-o", self.bridge,
              "-j", "ACCEPT"], check=False)
        for i, ns in enumerate(self.namespaces):
            outer, inner = f"lsv{self.id}x{i}", f"lsv{self.id}y{i}"
            _run(["ip", "netns", "add", ns])
            _run(["ip", "link", "add", outer, "type", "veth", "peer", "name", inner])
            _run(["ip", "link", "set", inner, "netns", ns])
            _run(["ip", "link", "set", outer, "master", self.bridge])
            _run(["ip", "link", "set", outer, "up"])
            _run(["ip", "netns", "exec", ns, "ip", "addr", "add",
                  f"{self.address(i)}/24", "dev", inner])
            _run(["ip", "netns", "exec", ns, "ip", "link", "set", inner, "up"])
            _run(["ip", "netns", "exec", ns, "ip", "link", "set", "lo", "up"])
        return self

    def close(self) -> None:
        for ns in self.namespaces:
            _run(["ip", "netns", "del", ns], check=False)
        _run(["ip", "link", "del", self.bridge], check=False)
        _run(["iptables", "-D", "FORWARD", "-i", self.bridge, "-o", self.bridge,
              "-j", "ACCEPT"], check=False)

    def __enter__(self) -> "Lab":
        return self.open()

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- nodes --------------------------------------------------------------

    def nodes(self, port: int, logDir: str, args: Sequence[str] = ()) -> List[Node]:
        """
        One node per namespace, all on C{port}, in priority order.
        """
        addresses = [f"{self.address(i)}:{port}" for i in range(self.size)]
        made = []
        for i in range(self.size):
            node = Node(port, peers=[port] * self.size, args=args, logDir=logDir,
                        name=f"node{i}")
            node.host = self.address(i)
            node.address = addresses[i]
            node.peerAddresses = addresses
            node.prefix = ["ip", "netns", "exec", self.namespaces[i]]
            made.append(node)
        return made

    # -- faults -------------------------------------------------------------

    def _iptables(self, i: int, *rule: str) -> None:
        _run(["ip", "netns", "exec", self.namespaces[i], "iptables", *rule])

    def cutPeers(self, i: int, target: str = "DROP", inbound: bool = True,
                 outbound: bool = True, bothEnds: bool = False) -> None:
        """
        Cut node C{i}'s links to the other nodes (clients, on the bridge's
        own address, still reach it).  C{target} C{"RESET"} answers with
        TCP resets instead of dropping; C{bothEnds} puts the rules in the
        other nodes' namespaces too, so both ends of each link see resets.
        """
        jump = ["REJECT", "--reject-with", "tcp-reset"] if target == "RESET" else ["DROP"]
        # Resets themselves pass (REJECT would silently drop them), so the
        # far end of each link does see the RST.
        proto = ["-p", "tcp", "!", "--tcp-flags", "RST", "RST"] if target == "RESET" else []
        others = f"{self.subnet}.0/24"
        if bothEnds:
            for k in range(self.size):
                if k != i:
                    self._iptables(k, "-A", "INPUT", *proto, "-s", self.address(i), "-j", *jump)
                    self._iptables(k, "-A", "OUTPUT", *proto, "-d", self.address(i), "-j", *jump)
        if inbound:
            self._iptables(i, "-A", "INPUT", "-s", self.hub, "-j", "ACCEPT")
            self._iptables(i, "-A", "INPUT", *proto, "-s", others, "-j", *jump)
        if outbound:
            self._iptables(i, "-A", "OUTPUT", "-d", self.hub, "-j", "ACCEPT")
            self._iptables(i, "-A", "OUTPUT", *proto, "-d", others, "-j", *jump)

    def cutClients(self, i: int) -> None:
        """
        Cut node C{i} off from the clients (the root namespace) only.
        """
        self._iptables(i, "-I", "INPUT", "-s", self.hub, "-j", "DROP")
        self._iptables(i, "-I", "OUTPUT", "-d", self.hub, "-j", "DROP")

    def heal(self, i: Optional[int] = None) -> None:
        for k in range(self.size) if i is None else [i]:
            self._iptables(k, "-F", "INPUT")
            self._iptables(k, "-F", "OUTPUT")


class LabCluster(Cluster):
    """
    A L{lockservice.testing.harness.Cluster} with one node per namespace of
    C{lab} (starting a node inside a namespace takes longer: 30 s to be
    ready).
    """

    readyTimeout = 30.0

    def __init__(self, lab: Lab, logDir: str, args: Sequence[str] = ()) -> None:
        self.lab = lab
        self.logDir = logDir
        self.nodes = lab.nodes(freePort(), logDir, args)
