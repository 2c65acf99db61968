"""<work-dir>/agent-state.json: what a restarted agent needs to pick up where the last one stopped.

It holds the workers (running ones to re-adopt, exited ones still in retention), the attempts
already launched or stopped per job, and the highest controller epoch seen. Written atomically
(temporary file, fsync, rename, fsync of the directory) so a crash leaves the old or the new file,
never half of one.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import structlog

from tessera.nodeagent.keeperfiles import write_atomic

log = structlog.get_logger("tessera.nodeagent.state")

STATE_VERSION = 1
FILE_NAME = "agent-state.json"
MAX_BYTES = 64 * 1024 * 1024  # 2,000 exited workers' records are far below it
MAX_EPOCH = 2**62


def checked(data: object) -> dict[str, Any]:
    """`data` when its fields have the types `Agent._persist` writes; ValueError naming the first
    that does not (each worker record is checked where it is restored)."""
    if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
        raise ValueError(f"unsupported state version {data.get('version') if isinstance(data, dict) else '?'}")
    epoch = data.get("controller_epoch", 0)
    if isinstance(epoch, bool) or not isinstance(epoch, int) or not 0 <= epoch < MAX_EPOCH:
        raise ValueError(f"controller_epoch: {str(epoch)[:40]} is not an epoch")
    if not isinstance(data.get("draining", False), bool):
        raise ValueError("draining: not true or false")  # noqa: TRY004 - load() sets ValueError aside
    for name in ("launched", "stopped"):
        table = data.get(name, {})
        if not isinstance(table, dict) or not all(
                isinstance(n, int) and not isinstance(n, bool) for n in table.values()):
            raise ValueError(f"{name}: not a map of job to attempt")
    if not isinstance(data.get("workers", []), list) or not all(isinstance(w, dict) for w in data.get("workers", [])):
        raise ValueError("workers: not a list of records")
    return data


class StateFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, Any]:
        """The stored state, or {} when there is none. An unreadable file is set aside, not fatal:
        losing it costs re-adoption, while refusing to start would cost the node. Unreadable: not
        UTF-8 JSON, over MAX_BYTES, not a plain file (a symlink to /dev/zero hung the start), or
        fields of other types than the agent writes (`draining: "no"` drained the node, an epoch of
        1e30 refused every controller, a list where a map goes crashed every start)."""
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.error("cannot read agent state; starting without it", path=str(self.path), error=str(exc))
            return {}
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ValueError("not a plain file")
            with os.fdopen(fd, "rb", closefd=False) as f:
                raw = f.read(MAX_BYTES + 1)
            if len(raw) > MAX_BYTES:
                raise ValueError(f"over {MAX_BYTES} bytes")
            data = checked(json.loads(raw.decode("utf-8")))
        except (ValueError, OSError, RecursionError) as exc:
            aside = self.path.with_suffix(".json.corrupt")
            log.error(
                "agent state is invalid; set aside", path=str(self.path), moved_to=str(aside), error=str(exc)
            )
            try:
                os.replace(self.path, aside)
            except OSError:
                pass
            return {}
        finally:
            os.close(fd)
        return data

    def write(self, data: dict[str, Any]) -> None:
        """Replace the file atomically with `data` (plus the version)."""
        write_atomic(self.path, {"version": STATE_VERSION, **data}, durable=True)
