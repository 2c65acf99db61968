"""<work-dir>/agent-state.json: what a restarted agent needs to pick up where the last one stopped.

It holds the workers (running ones to re-adopt, exited ones still in retention), the attempts
already launched or stopped per job, and the highest controller epoch seen. Written atomically
(temporary file, fsync, rename, fsync of the directory) so a crash leaves the old or the new file,
never half of one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import structlog

from tessera.nodeagent.keeperfiles import write_atomic

log = structlog.get_logger("tessera.nodeagent.state")

STATE_VERSION = 1
FILE_NAME = "agent-state.json"


class StateFile:
    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> dict[str, Any]:
        """The stored state, or {} when there is none. An unreadable file is set aside, not fatal:
        losing it costs re-adoption, while refusing to start would cost the node."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return {}
        except OSError as exc:
            log.error("cannot read agent state; starting without it", path=str(self.path), error=str(exc))
            return {}
        try:
            data = json.loads(text)
            if not isinstance(data, dict) or data.get("version") != STATE_VERSION:
                raise ValueError(
                    f"unsupported state version {data.get('version') if isinstance(data, dict) else '?'}"
                )
        except ValueError as exc:
            aside = self.path.with_suffix(".json.corrupt")
            log.error(
                "agent state is invalid; set aside", path=str(self.path), moved_to=str(aside), error=str(exc)
            )
            try:
                os.replace(self.path, aside)
            except OSError:
                pass
            return {}
        return data

    def write(self, data: dict[str, Any]) -> None:
        """Replace the file atomically with `data` (plus the version)."""
        write_atomic(self.path, {"version": STATE_VERSION, **data}, durable=True)
