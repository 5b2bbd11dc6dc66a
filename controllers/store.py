"""SQLite (WAL) store of the controller's state: lightpaths, failed fibres, lost slots, jobs.

Each change is one transaction, so a controller killed at any point restarts from a
consistent state. The optical state (spectrum) is rebuilt from the stored lightpaths.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any

SCHEMA = """
CREATE TABLE IF NOT EXISTS lightpaths (
    id INTEGER PRIMARY KEY,
    vid INTEGER NOT NULL UNIQUE,
    src_dc TEXT NOT NULL, dst_dc TEXT NOT NULL,
    src_host TEXT, dst_host TEXT,
    bitrate_gbps REAL, slots_req INTEGER, policy TEXT NOT NULL,
    nodes TEXT NOT NULL, first_slot INTEGER NOT NULL, n_slots INTEGER NOT NULL,
    modulation TEXT NOT NULL, capacity_gbps REAL NOT NULL,
    job_id INTEGER, created_s REAL NOT NULL, restored INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS failed_fibres (u TEXT NOT NULL, v TEXT NOT NULL,
    PRIMARY KEY (u, v));
CREATE TABLE IF NOT EXISTS lost_slots (u TEXT NOT NULL, v TEXT NOT NULL,
    first_slot INTEGER NOT NULL, n_slots INTEGER NOT NULL, PRIMARY KEY (u, v, first_slot));
CREATE TABLE IF NOT EXISTS jobs (id INTEGER PRIMARY KEY, body TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclass
class LightpathRow:
    """A provisioned lightpath as stored (and as the REST API shows it)."""

    id: int
    vid: int
    src_dc: str
    dst_dc: str
    src_host: str | None
    dst_host: str | None
    bitrate_gbps: float | None
    slots_req: int | None
    policy: str
    nodes: list[str]
    first_slot: int
    n_slots: int
    modulation: str
    capacity_gbps: float
    job_id: int | None
    created_s: float
    restored: int = 0

    def to_dict(self) -> dict[str, Any]:
        """The fields by name, in order (as dataclasses.asdict, without its deep copy of
        every value: only the route's list is mutable)."""
        d = {name: getattr(self, name) for name in _ROW_FIELDS}
        d["nodes"] = list(self.nodes)
        return d

    def copy(self) -> LightpathRow:
        """An independent copy (the route's list too)."""
        return replace(self, nodes=list(self.nodes))


_ROW_FIELDS = tuple(f.name for f in fields(LightpathRow))


def wal_works(directory: Path) -> bool:
    """Whether SQLite's WAL mode works on files in directory (tried on a scratch file)."""
    import contextlib
    import uuid

    probe = directory / f".walprobe-{uuid.uuid4().hex[:8]}.db"
    try:
        db = sqlite3.connect(str(probe), isolation_level=None)
        try:
            mode = db.execute("PRAGMA journal_mode=WAL").fetchone()[0]
            db.execute("CREATE TABLE t (x)")
            db.execute("INSERT INTO t VALUES (1)")
            return str(mode).lower() == "wal"
        finally:
            db.close()
    except sqlite3.Error:
        return False
    finally:
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(OSError):
                Path(f"{probe}{suffix}").unlink()


class Store:
    """Thread-safe wrapper of one SQLite connection in WAL mode."""

    def __init__(self, path: str | Path) -> None:
        self.path = str(path)
        self._lock = threading.Lock()
        wal = wal_works(Path(self.path).parent)
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        # WAL needs shared memory beside the file, which 9p/NFS mounts (a virtme-ng guest's
        # --rwdir) do not give ("disk I/O error"): there a rollback journal.
        self._db.execute("PRAGMA journal_mode=WAL" if wal else "PRAGMA journal_mode=DELETE")
        self._db.execute("PRAGMA synchronous=NORMAL")
        self._db.executescript(SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def _tx(self, statements: list[tuple[str, tuple[Any, ...]]]) -> None:
        with self._lock:
            self._db.execute("BEGIN IMMEDIATE")
            try:
                for sql, params in statements:
                    self._db.execute(sql, params)
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
            self._db.execute("COMMIT")

    @staticmethod
    def _put(row: LightpathRow) -> tuple[str, tuple[Any, ...]]:
        d = row.to_dict()
        d["nodes"] = json.dumps(row.nodes)
        cols = ", ".join(d)
        marks = ", ".join("?" for _ in d)
        return (f"INSERT OR REPLACE INTO lightpaths ({cols}) VALUES ({marks})",
                tuple(d.values()))

    def save(self, rows: list[LightpathRow], delete_ids: list[int] | None = None,
             failed: tuple[str, str] | None = None, repaired: tuple[str, str] | None = None,
             lost: tuple[str, str, list[tuple[int, int]]] | None = None) -> None:
        """Write lightpaths, delete others and record a cut/repair in one transaction.

        lost: (u, v, runs): fibre u-v's slots out of service are now exactly these
        (first_slot, n_slots) runs (a wavelength loss or repair).
        """
        stm = [self._put(r) for r in rows]
        stm += [("DELETE FROM lightpaths WHERE id = ?", (i,)) for i in delete_ids or []]
        if failed:
            stm.append(("INSERT OR IGNORE INTO failed_fibres (u, v) VALUES (?, ?)",
                        tuple(sorted(failed))))
        if repaired:
            stm.append(("DELETE FROM failed_fibres WHERE u = ? AND v = ?",
                        tuple(sorted(repaired))))
        if lost:
            u, v = sorted(lost[:2])
            stm.append(("DELETE FROM lost_slots WHERE u = ? AND v = ?", (u, v)))
            stm += [("INSERT INTO lost_slots (u, v, first_slot, n_slots) VALUES (?, ?, ?, ?)",
                     (u, v, first, n)) for first, n in lost[2]]
        self._tx(stm)

    def lightpaths(self) -> list[LightpathRow]:
        with self._lock:
            cur = self._db.execute("SELECT * FROM lightpaths ORDER BY id")
            names = [c[0] for c in cur.description]
            rows = cur.fetchall()
        out = []
        for r in rows:
            d = dict(zip(names, r, strict=True))
            d["nodes"] = json.loads(d["nodes"])
            out.append(LightpathRow(**d))
        return out

    def failed_fibres(self) -> list[tuple[str, str]]:
        with self._lock:
            return [(u, v) for u, v in self._db.execute("SELECT u, v FROM failed_fibres")]

    def lost_slots(self) -> list[tuple[str, str, int, int]]:
        """(u, v, first_slot, n_slots) of every run of slots out of service."""
        with self._lock:
            return [(u, v, f, n) for u, v, f, n in self._db.execute(
                "SELECT u, v, first_slot, n_slots FROM lost_slots ORDER BY u, v, first_slot")]

    def save_job(self, job_id: int, body: dict[str, Any]) -> None:
        self._tx([("INSERT OR REPLACE INTO jobs (id, body) VALUES (?, ?)",
                   (job_id, json.dumps(body)))])

    def delete_job(self, job_id: int) -> None:
        self._tx([("DELETE FROM jobs WHERE id = ?", (job_id,))])

    def jobs(self) -> dict[int, dict[str, Any]]:
        with self._lock:
            return {i: json.loads(b) for i, b in
                    self._db.execute("SELECT id, body FROM jobs ORDER BY id")}

    def get_meta(self, key: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return row[0] if row else None

    def set_meta(self, key: str, value: str) -> None:
        self._tx([("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))])
