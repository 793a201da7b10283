# -*- test-case-name: tests.client.test_client_sharding -*-
"""
The addresses a client is given: one cluster or several.
"""

from __future__ import annotations

from typing import List, Mapping, Optional, Sequence, Tuple, Union

from lockservice.client.endpoints import Address

Addresses = Union[
    str,
    Sequence[Address],
    Sequence[Sequence[Address]],
    Mapping[str, Sequence[Address]],
]


def parseClusters(addresses: Addresses) -> Tuple[List[List[Address]], Optional[List[bytes]]]:
    """
    The clusters named by C{addresses}, and their ids when named:

      - C{"a:1,b:2"}: one cluster; C{"a:1,b:2;c:3,d:4"}: two clusters
      - C{["a:1", "b:2"]} (strings or endpoints): one cluster
      - C{[["a:1", "b:2"], ["c:3"]]}: one cluster per inner list
      - C{{"east": ["a:1"], "west": ["c:3"]}}: named clusters

    A cluster's id (its weight in the key-to-cluster hashing) is its name,
    else its first address as written: keep it stable.
    """
    if isinstance(addresses, str):
        clusters = [[a.strip() for a in part.split(",") if a.strip()]
                    for part in addresses.split(";") if part.strip()]
        return clusters, None  # type: ignore[return-value]
    if isinstance(addresses, Mapping):
        names = list(addresses)
        return [list(addresses[n]) for n in names], [n.encode("utf-8") for n in names]
    items = list(addresses)
    if items and all(isinstance(a, (list, tuple)) for a in items):
        return [list(a) for a in items], None  # type: ignore[arg-type]
    return [items], None  # type: ignore[list-item]
