"""
Many threads, one blocking client: a web server's worker threads (Django,
Flask under gunicorn --threads) share one client per process.

    python examples/sync_threads.py 127.0.0.1:7700
"""

import sys
import threading

from lockservice.client import sync

counter = 0


def main(address: str) -> int:
    client = sync.connect(address, name="threads-example")

    def worker() -> None:
        global counter
        for _ in range(10):
            with client.lock("examples/threads", lease=5, wait=30):
                counter += 1

    threads = [threading.Thread(target=worker) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    client.close()
    print(f"counter = {counter} (expected 80)")
    return 0 if counter == 80 else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "127.0.0.1:7700"))
