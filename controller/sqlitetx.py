"""One write transaction of the SQLite store (controller/store.py, `SqliteStore._tx`): the store's
lock held from BEGIN IMMEDIATE to COMMIT, or ROLLBACK when the body raises."""

from __future__ import annotations

import sqlite3
import threading


class WriteTx:
    """`with WriteTx(lock, db) as db:` one transaction, all or nothing, under `lock`: the store's,
    which its reads take too (its one connection is used from more than one thread)."""

    def __init__(self, lock: threading.Lock, db: sqlite3.Connection) -> None:
        self.lock, self.db = lock, db

    def __enter__(self) -> sqlite3.Connection:
        self.lock.acquire()
        try:
            self.db.execute("BEGIN IMMEDIATE")
        except BaseException:
            # A BEGIN that fails ("database is locked" past busy_timeout, an I/O error) must not
            # keep the lock: every later call, reads too, would block the loop's thread for good.
            self.lock.release()
            raise
        return self.db

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        try:
            if exc_type is not None:
                self._rollback()
                return
            try:
                self.db.execute("COMMIT")
            except BaseException:
                self._rollback()  # a failed COMMIT leaves the transaction open
                raise
        finally:
            self.lock.release()

    def _rollback(self) -> None:
        if self.db.in_transaction:
            try:
                self.db.execute("ROLLBACK")
            except sqlite3.Error:
                pass  # the error that got us here is the one the caller sees
