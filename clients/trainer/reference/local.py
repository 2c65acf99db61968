"""Run the reference trainer's ranks on this machine, the way a node agent would: one process per rank
with the worker contract's environment (for tests, benchmarks and trying plans by hand).

Two ways to start the processes:

- `"subprocess"`: `python -m tessera.clients.trainer.reference` per rank, exactly what an agent runs (each
  process imports torch: seconds per rank on a small machine);
- `"fork"`: ranks forked from a multiprocessing forkserver that imported torch and the trainer once
  (`warm_forkserver()`), then run the same `cli.main()` in a real OS process each, talking gloo over
  TCP. Only the interpreter start and the imports are skipped, which keeps multi-rank tests on a
  2-core machine within seconds.

Does not import torch (the forkserver does).

    python -m tessera.clients.trainer.reference.local --plan '{"dp":2,"tp":2,"micro_batch":4}' --iterations 5
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Modules the forkserver imports once, so that forked ranks start warm.
PRELOAD = [
    "torch",
    "torch.distributed.pipelining",
    "torch.distributed.fsdp",
    "torch.distributed.checkpoint",
    "torch.distributed.tensor.parallel",
    "tessera.clients.trainer.reference.train",
]
# Variables of the worker contract (and torch's own) that a launch sets; inherited copies are dropped.
_OWNED = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class RankResult:
    rank: int
    rc: int
    out: str
    err: str


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


def world_size(plan: Mapping[str, Any]) -> int:
    return max(1, int(plan.get("dp", 1) or 1)) * max(1, int(plan.get("tp", 1) or 1)) * max(1, int(plan.get("pp", 1) or 1))


def contract_env(
    *,
    plan: Mapping[str, Any],
    model: Mapping[str, Any],
    checkpoint_dir: str | os.PathLike[str],
    iterations: int,
    global_batch: int,
    rank: int,
    port: int,
    checkpoint_every: int = 1000,
    job_id: str = "local-job",
    attempt: int = 1,
    extra: Mapping[str, str] | None = None,
    base: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The environment an agent gives rank `rank` of a CPU launch of `plan` (declared inventory)."""
    ws = world_size(plan)
    env = {k: v for k, v in (os.environ if base is None else base).items()
           if not k.startswith("TESSERA_") and k not in _OWNED}
    env.update({
        "TESSERA_JOB_ID": job_id,
        "TESSERA_ATTEMPT": str(attempt),
        "RANK": str(rank),
        "LOCAL_RANK": str(rank),
        "WORLD_SIZE": str(ws),
        "LOCAL_WORLD_SIZE": str(ws),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "TESSERA_RENDEZVOUS": f"127.0.0.1:{port}",
        "TESSERA_PLAN": json.dumps(dict(plan)),
        "TESSERA_MODEL": json.dumps(dict(model)),
        "TESSERA_ITERATIONS": str(iterations),
        "TESSERA_GLOBAL_BATCH_SIZE": str(global_batch),
        "TESSERA_CHECKPOINT_DIR": str(checkpoint_dir),
        "TESSERA_CHECKPOINT_EVERY": str(checkpoint_every),
        "TESSERA_INVENTORY_SOURCE": "declared",
        "CUDA_VISIBLE_DEVICES": "",
        "PYTHONUNBUFFERED": "1",
    })
    env.update(extra or {})
    return env


_CTX: Any = None


def warm_forkserver() -> Any:
    """The forkserver context (started on first use, with PRELOAD imported in it)."""
    global _CTX
    if _CTX is None:
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)
        _CTX = ctx
        # Start the server now (a no-op child), so the first launch does not pay for the imports.
        p = ctx.Process(target=_noop)
        p.start()
        p.join()
    return _CTX


def _noop() -> None:
    return None


def _forked_rank(env: Mapping[str, str], out_path: str, err_path: str, cwd: str, argv: Sequence[str]) -> None:
    """Body of a forked rank: the contract's environment, stdout/stderr to files, then cli.main()."""
    os.environ.clear()
    os.environ.update(env)
    os.chdir(cwd)
    for fd, path in ((1, out_path), (2, err_path)):
        f = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.dup2(f, fd)
        os.close(f)
    from tessera.clients.trainer.reference.cli import main

    try:
        rc = main(list(argv))
    except SystemExit as e:
        rc = e.code if isinstance(e.code, int) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)


class Ranks:
    """Running ranks (see start_ranks): their pids, their output so far, and a bounded wait."""

    def __init__(self, envs: Sequence[Mapping[str, str]], mode: str, cwd: str, argv: Sequence[str]) -> None:
        if mode not in ("subprocess", "fork"):
            raise ValueError(f"mode must be 'subprocess' or 'fork', got {mode!r}")
        self.mode = mode
        self._tmp = tempfile.TemporaryDirectory(prefix="tessera-ranks-")
        self._paths = [(Path(self._tmp.name) / f"rank-{r}.out", Path(self._tmp.name) / f"rank-{r}.err")
                       for r in range(len(envs))]
        for out, err in self._paths:
            out.touch()
            err.touch()
        self._procs: list[Any] = []
        if mode == "subprocess":
            for env, (out, err) in zip(envs, self._paths, strict=True):
                with open(out, "w") as fo, open(err, "w") as fe:
                    self._procs.append(subprocess.Popen([sys.executable, "-m", "tessera.clients.trainer.reference", *argv],
                                                        env=dict(env), cwd=cwd, stdout=fo, stderr=fe))
        else:
            ctx = warm_forkserver()
            for env, (out, err) in zip(envs, self._paths, strict=True):
                proc = ctx.Process(target=_forked_rank, args=(dict(env), str(out), str(err), cwd, list(argv)))
                proc.start()
                self._procs.append(proc)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self._procs]

    def output(self, rank: int) -> str:
        return self._paths[rank][0].read_text()

    def wait_for_output(self, rank: int, text: str, timeout: float) -> str:
        """Poll rank's stdout until it contains `text` (bounded by `timeout`; TimeoutError after, or
        RuntimeError if every rank ended first). Returns the output so far."""
        deadline = time.monotonic() + timeout
        while True:
            out = self.output(rank)
            if text in out:
                return out
            if all(not self._alive(p) for p in self._procs):
                raise RuntimeError(f"ranks ended before rank {rank} printed {text!r}: {out[-1500:]}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"rank {rank} did not print {text!r} in {timeout:.0f} s: {out[-1500:]}")
            time.sleep(0.05)

    def _alive(self, p: Any) -> bool:
        return p.poll() is None if self.mode == "subprocess" else p.is_alive()

    def _rc(self, p: Any) -> int:
        if self.mode == "subprocess":
            return int(p.returncode)
        return p.exitcode if p.exitcode is not None else -1

    def kill(self) -> None:
        for p in self._procs:
            if self._alive(p):
                p.kill()
        for p in self._procs:
            (p.wait if self.mode == "subprocess" else p.join)()

    def wait(self, timeout: float) -> list[RankResult]:
        """Wait for every rank (at most `timeout` seconds in all; then kill them and raise TimeoutError)."""
        deadline = time.monotonic() + timeout
        try:
            for p in self._procs:
                left = max(0.1, deadline - time.monotonic())
                if self.mode == "subprocess":
                    try:
                        p.wait(timeout=left)
                    except subprocess.TimeoutExpired:
                        break
                else:
                    p.join(left)
            if any(self._alive(p) for p in self._procs):
                tails = "".join(self.output(r)[-400:] + err.read_text()[-800:]
                                for r, (_, err) in enumerate(self._paths))
                self.kill()
                raise TimeoutError(f"ranks still running after {timeout:.0f} s: {tails}")
            return [RankResult(r, self._rc(p), out.read_text(), err.read_text())
                    for r, (p, (out, err)) in enumerate(zip(self._procs, self._paths, strict=True))]
        finally:
            if not any(self._alive(p) for p in self._procs):
                self._tmp.cleanup()


def start_ranks(envs: Sequence[Mapping[str, str]], *, mode: str = "subprocess",
                cwd: str | os.PathLike[str] | None = None, argv: Sequence[str] = ()) -> Ranks:
    """Start one trainer process per environment (with flags `argv`); stdout and stderr go to files
    readable while they run."""
    return Ranks(envs, mode, str(cwd or os.getcwd()), argv)


def run_ranks(envs: Sequence[Mapping[str, str]], *, mode: str = "subprocess", timeout: float = 180.0,
              cwd: str | os.PathLike[str] | None = None, argv: Sequence[str] = ()) -> list[RankResult]:
    """Start one process per environment (the trainer with flags `argv`), wait for all (at most
    `timeout` seconds, then kill them and raise TimeoutError) and return their exit codes and output,
    by rank."""
    return start_ranks(envs, mode=mode, cwd=cwd, argv=argv).wait(timeout)


def plan_envs(plan: Mapping[str, Any], *, model: Mapping[str, Any], checkpoint_dir: str | os.PathLike[str],
              iterations: int, global_batch: int, checkpoint_every: int = 1000,
              extra: Mapping[str, str] | None = None, attempt: int = 1) -> list[dict[str, str]]:
    """The environments of every rank of `plan` on this machine (a fresh rendezvous port)."""
    port = free_port()
    return [contract_env(plan=plan, model=model, checkpoint_dir=checkpoint_dir, iterations=iterations,
                         global_batch=global_batch, rank=r, port=port, checkpoint_every=checkpoint_every,
                         extra=extra, attempt=attempt)
            for r in range(world_size(plan))]


def launch(plan: Mapping[str, Any], *, model: Mapping[str, Any], checkpoint_dir: str | os.PathLike[str],
           iterations: int, global_batch: int, mode: str = "subprocess", timeout: float = 180.0,
           checkpoint_every: int = 1000, extra: Mapping[str, str] | None = None,
           cwd: str | os.PathLike[str] | None = None, attempt: int = 1,
           argv: Sequence[str] = ()) -> list[RankResult]:
    """Run all ranks of `plan` to completion on this machine (a fresh rendezvous port)."""
    envs = plan_envs(plan, model=model, checkpoint_dir=checkpoint_dir, iterations=iterations,
                     global_batch=global_batch, checkpoint_every=checkpoint_every, extra=extra, attempt=attempt)
    return run_ranks(envs, mode=mode, timeout=timeout, cwd=cwd, argv=argv)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tessera.clients.trainer.reference.local",
                                description="Run every rank of a plan on this machine (CPU, gloo).")
    p.add_argument("--plan", required=True, help="TESSERA_PLAN JSON, e.g. '{\"dp\":2,\"tp\":2,\"micro_batch\":4}'")
    p.add_argument("--model", default='{"name":"tiny","hidden_size":32,"num_layers":2,"num_heads":2,'
                                      '"vocab_size":64,"seq_length":32}')
    p.add_argument("--iterations", type=int, default=10)
    p.add_argument("--global-batch", type=int, default=8)
    p.add_argument("--checkpoint-dir", default="checkpoints")
    p.add_argument("--checkpoint-every", type=int, default=1000)
    p.add_argument("--mode", choices=("subprocess", "fork"), default="subprocess")
    p.add_argument("--timeout", type=float, default=600.0)
    args = p.parse_args(argv)
    results = launch(json.loads(args.plan), model=json.loads(args.model), checkpoint_dir=args.checkpoint_dir,
                     iterations=args.iterations, global_batch=args.global_batch, mode=args.mode,
                     timeout=args.timeout, checkpoint_every=args.checkpoint_every)
    for r in results:
        if r.rank == 0 or r.rc != 0:
            sys.stdout.write(r.out)
            sys.stderr.write(r.err)
    return max((abs(r.rc) for r in results), default=0)


if __name__ == "__main__":
    sys.exit(main())
