"""Workers that run as another user, for the local cluster (demo, tests, benchmarks).

Run as root, an agent runs its workers as `nobody` (docs/agent.md), and checks at start that they can
reach its work dir and run `{python}`. On a development machine neither is a given:

- the venv's interpreter may sit under a private home (a pyenv build in /root): `worker_python()`
  returns it when `nobody` can run it with this checkout's packages, and otherwise builds
  `build/worker-python`, a venv of a system interpreter of the same version whose site-packages
  adds this venv's (the packages are the same ABI), and returns that. When neither works it fails
  with the reason, naming what to change;
- a temporary folder (pytest's tmp_path is 0700 under /tmp/pytest-of-root): `open_for_workers(dir)`
  adds traverse-only permission (o+x, not listing) to the folders above `dir` that lie inside the
  system temporary directory, and touches nothing else.
"""

from __future__ import annotations

import os
import pwd
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent  # the checkout
SHIM = REPO / "build" / "worker-python"
PROBE = "import tessera.nodeagent.keeperfiles, tessera.clients.trainer"
_cached: str | None = None


def _nobody() -> tuple[int, int]:
    pw = pwd.getpwnam("nobody")
    return pw.pw_uid, pw.pw_gid


def _runs_as_nobody(python: str) -> str | None:
    """None when nobody can run `python` and import tessera with it; else why not."""
    uid, gid = _nobody()
    try:
        cp = subprocess.run([python, "-c", PROBE], cwd="/", user=uid, group=gid, extra_groups=[],
                            env={"PATH": os.defpath}, capture_output=True, timeout=120, check=False)
    except OSError as exc:
        return str(exc)
    if cp.returncode != 0:
        return cp.stderr.decode(errors="replace").strip()[-300:]
    return None


def _build_shim() -> str:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [p for p in (f"/usr/bin/{version}", f"/usr/local/bin/{version}") if os.access(p, os.X_OK)]
    site = sysconfig.get_paths()["purelib"]
    errors = []
    for base in candidates:
        tmp = SHIM.with_name(f".worker-python.{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        subprocess.run([base, "-m", "venv", "--without-pip", str(tmp)], check=True, capture_output=True)
        shim_site = tmp / "lib" / version / "site-packages"
        (shim_site / "tessera-dev-venv.pth").write_text(f"import site; site.addsitedir({site!r})\n")
        python = str(tmp / "bin" / "python")
        why = _runs_as_nobody(python)
        if why is None:
            shutil.rmtree(SHIM, ignore_errors=True)
            os.replace(tmp, SHIM)  # the venv's paths are relative to its bin/, so it moves
            return str(SHIM / "bin" / "python")
        errors.append(f"{base}: {why}")
        shutil.rmtree(tmp, ignore_errors=True)
    raise RuntimeError(
        f"workers run as nobody cannot run {sys.executable} ({_runs_as_nobody(sys.executable)}), and no "
        f"system {version} could stand in for it ({'; '.join(errors) or 'none found'}): make the venv "
        "and its interpreter readable by other users, or install a system python of the same version"
    )


def worker_python() -> str:
    """An interpreter the agents' workers (nobody, when the tests run as root) can run."""
    global _cached
    if _cached is None:
        if os.geteuid() != 0 or _runs_as_nobody(sys.executable) is None:
            _cached = sys.executable
        elif (SHIM / "bin" / "python").exists() and _runs_as_nobody(str(SHIM / "bin" / "python")) is None:
            _cached = str(SHIM / "bin" / "python")
        else:
            _cached = _build_shim()
    return _cached




def open_for_workers(work_dir: Path) -> None:
    """Let other users traverse the folders above `work_dir` that are inside the system temporary
    directory (mode |= 0o011), so workers run as `nobody` reach their attempt folders."""
    tmp = Path(tempfile.gettempdir()).resolve()
    p = work_dir.resolve().parent
    while p != tmp and tmp in p.parents:
        try:
            mode = p.stat().st_mode
            if not mode & stat.S_IXOTH:
                p.chmod(stat.S_IMODE(mode) | 0o011)
        except FileNotFoundError:
            pass
        p = p.parent


def agent_flags(work_dir: Path, extra: tuple[str, ...]) -> list[str]:
    """What an agent started by the local cluster needs for its workers, as root: --worker-python
    (unless `extra` names one) and traversable folders above its work dir. Nothing when not root."""
    if os.geteuid() != 0:
        return []
    open_for_workers(work_dir)
    return [] if "--worker-python" in extra else ["--worker-python", worker_python()]
