"""A cgroup per worker where systemd allows it: each keeper (and so its worker) in a transient scope.

`systemd-run --scope` registers a transient scope unit with the system manager and execs the command
in it, keeping its pid: the keeper, its worker and everything they start share one cgroup, which
systemd accounts for and which outlives a restart of the agent's own unit whatever its KillMode.
It is used when systemd runs the machine (`/run/systemd/system` exists, as sd_booted(3) checks) and
a probe `systemd-run --scope true` succeeds at agent start; otherwise the agent logs once why
cgroups are unavailable and runs keepers without one (containers, CI machines, non-root agents).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from collections.abc import Sequence

SYSTEMD_RUN = "systemd-run"
_UNIT_UNSAFE = re.compile(r"[^A-Za-z0-9_.-]")


def systemd_runs() -> bool:
    """systemd is the init system (sd_booted(3))."""
    return os.path.isdir("/run/systemd/system")


@functools.cache
def probe() -> tuple[bool, str]:
    """(available, why not). Once per process: the agent asks at start for device isolation
    (nodeagent/main.py) and again for its keepers' scopes, and each ask ran `systemd-run`."""
    if not systemd_runs():
        return False, "systemd is not the init system here (no /run/systemd/system)"
    exe = shutil.which(SYSTEMD_RUN)
    if exe is None:
        return False, "systemd-run is not installed"
    try:
        cp = subprocess.run([exe, "--scope", "--quiet", "--collect", "--", "true"], capture_output=True,
                            timeout=15, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"systemd-run --scope failed: {exc}"
    if cp.returncode != 0:
        return False, f"systemd-run --scope failed: {cp.stderr.decode(errors='replace').strip()[:200]}"
    return True, ""


def scope_prefix(job_id: str, attempt: int, rank: int, *, delegate: bool = False) -> list[str]:
    """argv prefix that runs the rest in a transient scope of its own; `delegate`: the keeper may
    make a cgroup inside it (device isolation, nodeagent/devicefilter.py), which systemd then leaves alone."""
    unit = _UNIT_UNSAFE.sub("_", f"tessera-{job_id}-a{attempt}-r{rank}-{os.urandom(3).hex()}")
    return [SYSTEMD_RUN, "--scope", "--quiet", "--collect", f"--unit={unit}.scope",
            *(["--property=Delegate=yes"] if delegate else []), "--"]


def run_delegated(argv: Sequence[str]) -> tuple[bool, str]:
    """Run `argv` in a transient scope that systemd delegates to it (it may make cgroups below):
    (exited 0, its last line of output)."""
    exe = shutil.which(SYSTEMD_RUN)
    if exe is None:
        return False, "systemd-run is not installed"
    try:
        cp = subprocess.run([exe, "--scope", "--quiet", "--collect", "--property=Delegate=yes", "--", *argv],
                            capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return False, f"systemd-run --scope failed: {exc}"
    lines = (cp.stdout + cp.stderr).decode(errors="replace").strip().splitlines()
    return cp.returncode == 0, lines[-1][:300] if lines else f"exit status {cp.returncode}"
