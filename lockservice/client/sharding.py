# -*- test-case-name: tests.client.test_client_sharding -*-
"""
Which cluster serves a key, when a deployment runs several independent
clusters (shards): rendezvous (highest-random-weight) hashing.

Every (cluster, key) pair gets a pseudo-random weight; the key goes to the
cluster with the highest.  Adding a cluster moves only the keys for which
the new cluster's weight is the highest -- about 1/N of them, all to the
new cluster -- and removing one moves only its own keys.
"""

from __future__ import annotations

import hashlib
from typing import Sequence


def weight(clusterId: bytes, key: bytes) -> int:
    """
    The weight of C{key} on the cluster named C{clusterId}: 64 bits of
    BLAKE2b, stable across processes and Python versions (unlike hash()).
    """
    # A newline cannot occur in a key or an address, so the pair is unambiguous.
    digest = hashlib.blake2b(clusterId + b"\n" + key, digest_size=8,
                             person=b"lockservice").digest()
    return int.from_bytes(digest, "big")


def choose(clusterIds: Sequence[bytes], key: bytes) -> int:
    """
    The index in C{clusterIds} of the cluster that serves C{key}.
    """
    if len(clusterIds) == 1:
        return 0
    best, bestWeight = 0, -1
    for i, clusterId in enumerate(clusterIds):
        w = weight(clusterId, key)
        if w > bestWeight:
            best, bestWeight = i, w
    return best
