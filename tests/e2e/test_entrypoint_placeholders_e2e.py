"""The live audit's scripts, unchanged and with no Tessera import, given their settings through the
entrypoint's placeholders (docs/launchers.md): under torchrun, `--ckpt {checkpoint_dir}` reached the
script as the literal `{checkpoint_dir}`; under `/usr/bin/env {python} {entrypoint}`, env was asked
to run a program named `{python}`.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.e2e.cluster import Cluster
from tests.procs import tessctl

pytestmark = pytest.mark.slow

# Exits 0 only when its --ckpt is the job's checkpoint folder (the same path on every attempt).
CKPT_SCRIPT = """\
import os, sys
ckpt = sys.argv[sys.argv.index("--ckpt") + 1]
assert ckpt == os.environ["TESSERA_CHECKPOINT_DIR"] and ckpt.startswith("/"), ckpt
print(f"ckpt ok rank={os.environ['RANK']} python={sys.executable}", flush=True)
"""


def _submit(cl: Cluster, path: Path, text: str) -> str:
    path.write_text(text)
    proc = tessctl(cl.controller.address, "-o", "json", "submit", "-f", str(path), "--wait", check=False, timeout=240)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return str(json.loads(proc.stdout.splitlines()[-1])["id"])


def test_entrypoint_placeholders_reach_unchanged_scripts(cluster_factory, worker_dir: Path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    cl: Cluster = cluster_factory([("node-a", "a40-node.yaml")])
    script = worker_dir / "ckpt.py"
    script.write_text(CKPT_SCRIPT)

    torchrun = _submit(cl, worker_dir / "torchrun.yaml", (
        f"name: ckpt-torchrun\ncell: 2 x A40\nlauncher: torchrun\nmax_retries: 0\n"
        f"entrypoint: ['{script}', --steps, '60', --ckpt, '{{checkpoint_dir}}']\n"))
    logs = tessctl(cl.controller.address, "logs", torchrun, "--rank", "0").stdout
    assert "ckpt ok rank=0" in logs and "ckpt ok rank=1" in logs, logs

    env = _submit(cl, worker_dir / "env.yaml", (
        "name: ckpt-env\ncell: 1 x A40\nmax_retries: 0\n"
        "launcher: {argv: [/usr/bin/env, '{python}', '{entrypoint}']}\n"
        f"entrypoint: ['{script}', --ckpt, '{{checkpoint_dir}}']\n"))
    logs = tessctl(cl.controller.address, "logs", env, "--rank", "0").stdout
    assert "ckpt ok rank=0 python=/" in logs, logs
