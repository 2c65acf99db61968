"""What the estimator learns, kept on disk across restarts: fitted performance models (FitPerformance
and their online refits from ReportStepTimes) and measured Cell iteration times.

One SQLite file (WAL, synchronous=FULL, as the controller's store): every learned value is written
when it is learned, so a restart or a crash loses nothing that was answered. Caches and the live
step-time windows are not kept: they are rebuilt from the next requests.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from dataclasses import asdict
from pathlib import Path
from typing import Any, cast

from tessera.common.errors import TesseraError
from tessera.common.privatefile import private_database
from tessera.estimator import perf_model as pm

# (Cell model signature, GPU type, GPUs, stages)
MeasuredKey = tuple[str, str, int, int]
Fitted = tuple[pm.Params, pm.Mode, pm.Environment, tuple[pm.Sample, ...]]

SCHEMA = """
CREATE TABLE IF NOT EXISTS fitted (model_key TEXT NOT NULL, gpu TEXT NOT NULL, body TEXT NOT NULL,
                                   PRIMARY KEY (model_key, gpu));
CREATE TABLE IF NOT EXISTS measured (signature TEXT NOT NULL, gpu TEXT NOT NULL, gpus INTEGER NOT NULL,
                                     stages INTEGER NOT NULL, seconds REAL NOT NULL,
                                     PRIMARY KEY (signature, gpu, gpus, stages));
"""


class StateError(TesseraError, OSError):
    """The state database cannot be opened or a row in it read (INTERNAL: the operator's to fix)."""


def _sample_dict(s: pm.Sample) -> dict[str, Any]:
    d = asdict(s)
    d["config"]["placement"] = list(s.config.placement.gpus_per_node)
    return d


def _sample(d: dict[str, Any]) -> pm.Sample:
    c = d["config"]
    config = pm.RunConfig(pm.Workload(**c["workload"]), pm.Plan(**c["plan"]),
                          pm.Placement(tuple(c["placement"])), cpus=c["cpus"], fwd_time=c["fwd_time"])
    return pm.Sample(config, d["iter_time"], t_cc=d["t_cc"], t_oo=d["t_oo"], time=d["time"])


def encode_fitted(f: Fitted) -> str:
    params, mode, env, samples = f
    return json.dumps({"params": asdict(params), "mode": mode, "env": asdict(env),
                       "samples": [_sample_dict(s) for s in samples]}, sort_keys=True)


def decode_fitted(text: str) -> Fitted:
    d = json.loads(text)
    mode = pm.mode_of(d["mode"])
    return (pm.Params(**d["params"]), mode, pm.Environment(**d["env"]),
            tuple(_sample(s) for s in d["samples"]))


class EstimatorState:
    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        try:
            private_database(self.path)  # 0600 whatever the umask, and so its -wal and -shm
            self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=FULL")
            self._db.executescript(SCHEMA)
        except (sqlite3.Error, OSError) as exc:
            raise StateError(f"{self.path}: {exc}") from exc

    def load(self) -> tuple[dict[tuple[str, str], Fitted], dict[MeasuredKey, float]]:
        """Everything kept, oldest write first (INSERT OR REPLACE gives a rewritten row a new rowid);
        a row that no longer decodes (written by another version) is an error naming it, not
        silently dropped."""
        with self._lock:
            fitted_rows = self._db.execute("SELECT model_key, gpu, body FROM fitted ORDER BY rowid").fetchall()
            measured_rows = self._db.execute("SELECT signature, gpu, gpus, stages, seconds FROM measured "
                                             "ORDER BY rowid").fetchall()
        fitted: dict[tuple[str, str], Fitted] = {}
        for key, gpu, body in fitted_rows:
            try:
                fitted[(key, gpu)] = decode_fitted(body)
            except (ValueError, KeyError, TypeError) as exc:
                raise StateError(f"{self.path}: fitted model ({key!r}, {gpu!r}) cannot be read: {exc}") from exc
        measured = {cast(MeasuredKey, (sig, gpu, int(n), int(st))): float(sec)
                    for sig, gpu, n, st, sec in measured_rows}
        return fitted, measured

    def put_fitted(self, model_key: str, gpu: str, fitted: Fitted) -> None:
        body = encode_fitted(fitted)
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO fitted (model_key, gpu, body) VALUES (?, ?, ?)",
                             (model_key, gpu, body))

    def put_measured(self, key: MeasuredKey, seconds: float) -> None:
        with self._lock:
            self._db.execute("INSERT OR REPLACE INTO measured (signature, gpu, gpus, stages, seconds) "
                             "VALUES (?, ?, ?, ?, ?)", (*key, seconds))

    def drop_fitted(self, model_key: str, gpu: str) -> None:
        with self._lock:
            self._db.execute("DELETE FROM fitted WHERE model_key = ? AND gpu = ?", (model_key, gpu))

    def drop_measured(self, key: MeasuredKey) -> None:
        with self._lock:
            self._db.execute("DELETE FROM measured WHERE signature = ? AND gpu = ? AND gpus = ? AND stages = ?", key)

    def close(self) -> None:
        with self._lock:
            self._db.close()
