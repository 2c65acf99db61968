"""structlog setup: JSON lines when stderr is not a terminal, key=value on a terminal."""

from __future__ import annotations

import logging
import sys

import structlog

# The names every daemon's --log-level takes (argparse choices): one list, so a name one daemon
# accepts the others do too (the controller once took any word, silently as info).
LEVELS = ("debug", "info", "warning", "error")

# Fields every line of this process carries from the moment they are bound, in every task (bind_process).
_PROCESS: dict[str, object] = {}


def bind_process(**fields: object) -> None:
    """Add `fields` to every later line of the process, whatever task logs it. Context variables
    reach only the tasks started after the bind: a standby controller's gRPC server, started before
    it led, logged its calls without the `epoch` the leader bound (a live audit)."""
    _PROCESS.update(fields)


def _process_fields(_: object, __: str, event: structlog.typing.EventDict) -> structlog.typing.EventDict:
    for key, value in _PROCESS.items():
        event.setdefault(key, value)
    return event


def configure(level: str = "info", json: bool | None = None) -> None:
    """Configure structlog and the stdlib root logger once per process."""
    as_json = (not sys.stderr.isatty()) if json is None else json
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if as_json else structlog.dev.ConsoleRenderer(colors=False)
    )
    lvl = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    logging.basicConfig(stream=sys.stderr, level=lvl, format="%(message)s")
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            _process_fields,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=True,
    )
