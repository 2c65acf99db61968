"""Where tests put workers that run as another user, and the interpreter those workers run.

Tests run as root (here and in CI), so the agents they start run workers as `nobody`. Such a worker
needs to reach its work dir and to run `{python}`:

- pytest's tmp_path lives under /tmp/pytest-of-root, mode 0700: `worker_dir` gives a fresh folder
  under the system temporary directory that every user can traverse (0755), removed afterwards;
- the venv's interpreter may sit under a private home (a pyenv build in /root): `worker_python()`
  returns it when `nobody` can run it with this checkout's packages, and otherwise builds
  `build/worker-python`, a venv of a system interpreter of the same version whose site-packages
  adds this venv's (the packages are the same ABI), and returns that. When neither works it fails
  with the reason, naming what to change.
"""

from __future__ import annotations

import os
import pwd
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
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


@pytest.fixture
def worker_dir() -> Iterator[Path]:
    """A fresh folder every user can traverse (tmp_path is 0700 under /tmp/pytest-of-root)."""
    d = Path(tempfile.mkdtemp(prefix="tessera-test-"))
    d.chmod(0o755)
    try:
        yield d
    finally:
        from tessera.common.localcluster import kill_strays

        kill_strays(d)
        shutil.rmtree(d, ignore_errors=True)
