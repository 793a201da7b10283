"""
A cron job that fences its database write with the lock's token (the
blocking face).  Run it from several hosts at once: one does the work,
and a late writer (a paused or partitioned one) is refused by the database.

    python examples/cron_fenced.py 127.0.0.1:7700 /tmp/report.db
"""

import sqlite3
import sys

from lockservice.client import sync


def fencedWrite(db: sqlite3.Connection, token: int, value: str) -> bool:
    # The check and the write in one statement: a token lower than the last
    # one that wrote is a holder whose lock was taken over meanwhile.
    cursor = db.execute(
        "UPDATE report SET value = ?, last_token = ? WHERE id = 1 AND last_token < ?",
        (value, token, token))
    db.commit()
    return cursor.rowcount == 1


def main(address: str, path: str) -> int:
    db = sqlite3.connect(path)
    db.execute("CREATE TABLE IF NOT EXISTS report (id INTEGER PRIMARY KEY, value TEXT, "
               "last_token INTEGER NOT NULL)")
    db.execute("INSERT OR IGNORE INTO report VALUES (1, '', 0)")
    db.commit()
    client = sync.connect(address, name="nightly-report")
    try:
        with client.lock("reports/nightly", lease=10, wait=5) as lock:
            value = f"built under token {lock.token}"      # the real work goes here
            if lock.lost.is_set() or not fencedWrite(db, lock.token, value):
                print("lost the lock before writing: not written", file=sys.stderr)
                return 1
            print(f"written: {value}")
    except sync.LockTimeout:
        print("another run holds the lock: skipping this run")
    finally:
        client.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
