"""
Lockers: threads that take and give back their own keys through the
blocking client while a test changes the cluster under them.
"""

from __future__ import annotations

import threading
import time
from typing import Dict, List

from lockservice.client import sync
from lockservice.client.errors import LockError

LOCKERS = 6


class Lockers:
    """
    Threads that acquire and release their own key over and over through
    the client (it follows redirects and failovers), checking that every
    key's tokens rise and that no answered grant is lost (its release,
    within its lease, must answer OK).
    """

    def __init__(self, addresses: str, name: str) -> None:
        self.client = sync.connect(addresses, name=name)
        self.stop = threading.Event()
        self.grants = 0
        self.released = 0
        self.lost: List[str] = []
        self.fallen: List[str] = []
        self.lastToken: Dict[str, int] = {}
        self.threads = [threading.Thread(target=self._run, args=(f"up/{i}",), daemon=True)
                        for i in range(LOCKERS)]

    def start(self) -> "Lockers":
        for thread in self.threads:
            thread.start()
        return self

    def _run(self, key: str) -> None:
        while not self.stop.is_set():
            try:
                lock = self.client.acquire(key, lease=30, wait=10)
            except LockError:
                time.sleep(0.05)  # no active for a moment (a handoff): try again
                continue
            self.grants += 1
            if lock.token <= self.lastToken.get(key, 0):
                self.fallen.append(f"{key}: {lock.token} after {self.lastToken[key]}")
            self.lastToken[key] = lock.token
            time.sleep(0.01)
            try:
                if lock.release():
                    self.released += 1
                else:
                    self.lost.append(f"{key} {lock.token}: release answered STALE")
            except LockError as e:
                self.lost.append(f"{key} {lock.token}: release failed: {e}")

    def finish(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(30)
        self.client.close()
