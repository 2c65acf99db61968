"""`tessctl submit --priority / --guarantee`: the job file's `priority:` and `guarantee:` from the
command line (docs/cli.md, docs/tenants.md), checked by the job file's own rules."""

from __future__ import annotations

import argparse
from typing import Any

from tessera.clients.jobfile import (
    GUARANTEE_KEYS,
    PRIORITIES,
    JobFileError,
    check_guarantee_plan,
    revalidate,
    set_priority,
)
from tessera.v1 import common_pb2


def add_priority_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--priority", choices=tuple(PRIORITIES), default=None,
                   help="override the job file's priority (default: the file's, else best-effort; "
                        "best-effort drops the file's guarantee)")
    p.add_argument("--guarantee", type=guarantee_argument, default=None, metavar="KEY=VALUE[,KEY=VALUE]",
                   help=f"override the job file's guarantee: {', '.join(GUARANTEE_KEYS)}, e.g. "
                        "gpus=8,cpus=64,gpu_type=A100-80GB,plan=zero-dp (a guaranteed job without one is "
                        "promised its gpus hint); implies --priority guaranteed")


def parse_guarantee(text: str) -> dict[str, Any]:
    """"gpus=8,plan=zero-dp" as the job file's guarantee mapping (numbers as integers)."""
    out: dict[str, Any] = {}
    for item in text.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep or not key:
            raise JobFileError("guarantee", f"expects KEY=VALUE pairs separated by commas, got {item!r}")
        if key in out:
            raise JobFileError(f"guarantee.{key}", "given twice")
        out[key] = int(value) if value.lstrip("-").isdigit() and key in ("gpus", "cpus") else value
    return out


def guarantee_argument(text: str) -> str:
    """argparse type of --guarantee: `text` once its pairs make a guarantee on their own (the flag
    replaces the file's whole guarantee), so a bad value is a usage error naming the flag (exit 2)
    rather than a job file's error; what depends on the file is checked when it is applied."""
    try:
        spec = common_pb2.JobSpec()
        set_priority(spec, "guaranteed", parse_guarantee(text))
        check_guarantee_plan(spec.guarantee)
    except JobFileError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def apply_priority_arguments(spec: common_pb2.JobSpec, args: argparse.Namespace) -> None:
    """The flags onto a parsed job file's spec, then its bounds again (JobFileError naming the field)."""
    if args.priority is None and args.guarantee is None:
        return
    priority = args.priority or "guaranteed"  # --guarantee alone: a guarantee is for a guaranteed job
    if args.guarantee is not None or priority == "best-effort":
        spec.ClearField("guarantee")
    set_priority(spec, priority, parse_guarantee(args.guarantee) if args.guarantee is not None else None)
    revalidate(spec)
