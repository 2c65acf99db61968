"""Opaque jobs, wait, watch and logs with real processes (docs/opaque-jobs.md, docs/cli.md).

A controller and one agent with two declared A40s run unchanged programs: `python -c`, a script
that waits for a file, and an unchanged torchrun script with no Tessera import. Synchronised on job
states and log lines, never on sleeps.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.clients.sdk import RpcError
from tessera.common.localcluster import env as cluster_env
from tessera.v1 import common_pb2 as P
from tests.e2e.cluster import Cluster
from tests.procs import REPO, tessctl, wait_for

pytestmark = pytest.mark.slow

TORCH_SCRIPT = """\
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.tensor([float(rank + 1)])
dist.all_reduce(t)
assert t.item() == world * (world + 1) / 2, t
print(f"allreduce ok rank={rank} world={world} sum={t.item():g}", flush=True)
dist.destroy_process_group()
"""

# Prints 50 lines, waits for the file named in argv[1], prints one more line and exits 0.
WAITER = """\
import os, sys, time
for i in range(1, 51):
    print(f"line {i}", flush=True)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.05)
print("after go", flush=True)
"""


def job_file(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


def tessctl_proc(cl: Cluster, *args: str) -> subprocess.Popen[str]:
    """tessctl as a process still running while the test goes on (tests.procs.tessctl waits)."""
    cmd = [sys.executable, "-m", "tessera.clients.tessctl", "--controller", cl.controller.address, *args]
    env = cluster_env({"TESSERA_TOKEN": cl.controller.token})
    return subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def run(cl: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return tessctl(cl.controller.address, *args, check=False, timeout=240)


def test_opaque_jobs_wait_and_logs(cluster_factory, worker_dir: Path) -> None:  # type: ignore[no-untyped-def]
    cl: Cluster = cluster_factory([("node-a", "a40-node.yaml")])
    addr = cl.controller.address

    # A plain `python -c` job: no model, no iterations; submit --wait exits 0 on success.
    ok = job_file(worker_dir / "ok.yaml", "name: print-one\nentrypoint: ['{python}', '-c', 'print(1)']\n")
    proc = run(cl, "submit", "-f", ok, "--wait")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "SUCCEEDED" in proc.stdout

    # Exit 1: FAILED with its last log line in the reason; submit --wait exits 1.
    bad = job_file(worker_dir / "bad.yaml", (
        "name: exits-one\nmax_retries: 0\n"
        "entrypoint: ['{python}', '-c', 'import sys; print(\"boom: bad input\", flush=True); sys.exit(1)']\n"))
    proc = run(cl, "-o", "json", "submit", "-f", bad, "--wait")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    failed = json.loads(proc.stdout.strip().splitlines()[-1])
    assert failed["state"] == "JOB_STATE_FAILED"
    assert "exit code 1" in failed["reason"] and "last log line: boom: bad input" in failed["reason"]

    # A job with the reference trainer reports progress: submit --wait prints it (plain lines, piped).
    trainer = job_file(worker_dir / "trainer.yaml", (
        "name: tiny-trainer\nmodel: {hidden_size: 64, num_layers: 2, num_heads: 4, vocab_size: 256, seq_length: 64}\n"
        "global_batch_size: 8\niterations: 40\ngpus: 1\n"))
    proc = run(cl, "submit", "-f", trainer, "--wait")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    progress = [ln for ln in proc.stdout.splitlines() if " progress: " in ln]
    assert progress and progress[-1].split(" progress: ")[1].startswith("40/40"), proc.stdout

    # A missing working directory: the agent refuses to start the rank, with that reason.
    nowd = job_file(worker_dir / "nowd.yaml", ("name: no-workdir\nmax_retries: 0\nworkdir: /nonexistent/dir\n"
                                               "entrypoint: ['{python}', '-c', 'print(1)']\n"))
    proc = run(cl, "-o", "json", "submit", "-f", nowd, "--wait")
    assert proc.returncode == 1
    assert "cannot enter workdir /nonexistent/dir" in json.loads(proc.stdout.splitlines()[-1])["reason"]

    # max_runtime: the attempt is stopped and the job FAILED with the limit as its reason.
    slow = job_file(worker_dir / "slow.yaml", ("name: too-slow\nmax_runtime: 2s\nworkdir: " + str(worker_dir) + "\n"
                                               "entrypoint: ['{python}', '-c', 'import time; time.sleep(600)']\n"))
    proc = run(cl, "-o", "json", "submit", "-f", slow, "--wait")
    assert proc.returncode == 1
    assert json.loads(proc.stdout.splitlines()[-1])["reason"] == "max_runtime 2s exceeded"

    # tessctl wait on a running job returns when it ends; logs --tail N gives N whole lines; -f streams.
    script = worker_dir / "waiter.py"
    script.write_text(WAITER)
    go = worker_dir / "go"
    with cl.client() as c:
        job = c.submit(P.JobSpec(name="waiter", entrypoint=["{python}", str(script), str(go)], workdir=str(worker_dir)))
        c.wait(job.id, {"RUNNING"}, timeout=60)
        wait_for(lambda: "line 50" in tessctl(addr, "logs", job.id, "--rank", "0", check=False).stdout, 30,
                 "50 lines logged")
        tail = tessctl(addr, "logs", job.id, "--tail", "3", "--rank", "0").stdout
        assert tail == "line 48\nline 49\nline 50\n"
        assert tessctl(addr, "logs", job.id, "--tail", "2", "--all-ranks").stdout == "[rank 0] line 49\n[rank 0] line 50\n"
        waiter = tessctl_proc(cl, "wait", job.id)
        follower = tessctl_proc(cl, "logs", job.id, "-f", "--tail", "1", "--rank", "0")
        assert follower.stdout is not None and follower.stdout.readline() == "line 50\n"
        assert waiter.poll() is None  # still waiting: the job runs until `go` exists
        go.write_text("")
        assert follower.stdout.readline() == "after go\n"
        rest, _ = follower.communicate(timeout=60)
        assert rest == "" and follower.returncode == 0
        out, err = waiter.communicate(timeout=60)
        assert waiter.returncode == 0, out + err
        assert f"{job.id} SUCCEEDED" in out

        # Another tenant cannot read the logs, watch the job, or see it in a list watch.
        with cl.client_as("bob") as bob:
            for call in (lambda: list(bob.stream_logs(job.id)), lambda: list(bob.watch_job(job.id))):
                with pytest.raises(RpcError) as e:
                    call()
                assert e.value.code == "NOT_FOUND"
            listed = bob.watch_jobs()
            first = next(listed)
            assert first.batch_end and not first.HasField("job")  # bob's list is empty
            listed.close()


def test_unchanged_torchrun_script(cluster_factory, worker_dir: Path) -> None:  # type: ignore[no-untyped-def]
    pytest.importorskip("torch")
    cl: Cluster = cluster_factory([("node-a", "a40-node.yaml")])
    script = worker_dir / "allreduce.py"
    script.write_text(TORCH_SCRIPT)
    spec = job_file(worker_dir / "torchrun.yaml", (
        f"name: torchrun-opaque\ncell: 2 x A40\nlauncher: torchrun\nentrypoint: ['{script}']\nmax_retries: 0\n"))
    proc = run(cl, "-o", "json", "submit", "-f", spec, "--wait")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    job_id = json.loads(proc.stdout.splitlines()[-1])["id"]
    logs = tessctl(cl.controller.address, "logs", job_id, "--rank", "0").stdout
    assert "allreduce ok rank=0 world=2 sum=3" in logs and "allreduce ok rank=1 world=2 sum=3" in logs
