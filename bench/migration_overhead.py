"""Migration overhead of the reference trainer on CPU, per model size: stop with a checkpoint, restart on
a new plan, first step.

For each model size, the trainer runs plan A (default DP 2, DDP) as the agent runs it (one
`python -m tessera.clients.trainer.reference` process per rank, gloo, the worker contract's environment); after
a few steps every rank gets SIGTERM (the agent's stop), checkpoints (DCP) and exits 0. Then plan B
(default TP 2; or PP 2 / ZeRO-3 / ..., `--to`) starts on the same checkpoint directory, reshards the
checkpoint and trains. Measured (wall clock, this machine, both plans on the same 2 processes' worth
of cores):

- `stop_seconds`: SIGTERM to the exit of the last rank (finish the step in flight, all-reduce the stop
  flag, write the checkpoint, exit); `checkpoint_write_seconds`: the checkpoint alone, as rank 0 says;
- `start_seconds`: launch of plan B to its "reference trainer:" line (interpreter, torch import, plan);
- `load_seconds`: reading and resharding the checkpoint, as rank 0 of plan B says;
- `time_to_first_step_seconds`: launch of plan B to its first finished step;
- `overhead_seconds` = stop + time to first step - one steady step of B: the training time a
  migration costs beyond the step it would have done anyway (what Morphling's 78 s per
  reconfiguration measures on real jobs, with bigger models, GPUs and a Kubernetes relaunch).

    python bench/migration_overhead.py                    # sizes xs s m, DP 2 -> TP 2
    python bench/migration_overhead.py --sizes xs s m l --to '{"dp":1,"pp":2,"micro_batch":2,"grad_accum":4}'

Prints one JSON object and writes it to OUT/migration_overhead.json (default bench/results).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchio import write_result

from tessera.clients.trainer.reference.local import plan_envs

SIZES: dict[str, dict[str, Any]] = {
    "xs": {"name": "xs", "hidden_size": 64, "num_layers": 2, "num_heads": 4, "vocab_size": 512, "seq_length": 64},
    "s": {"name": "s", "hidden_size": 256, "num_layers": 4, "num_heads": 4, "vocab_size": 4096, "seq_length": 128},
    "m": {"name": "m", "hidden_size": 512, "num_layers": 8, "num_heads": 8, "vocab_size": 8192, "seq_length": 128},
    "l": {"name": "l", "hidden_size": 768, "num_layers": 12, "num_heads": 12, "vocab_size": 16384,
          "seq_length": 128},
}
GLOBAL_BATCH = 8
MORPHLING_SECONDS = 78.0
STEP = re.compile(r"step iteration=(\d+)/\d+ loss=\S+ step_time=(\S+)")


def params_of(m: dict[str, Any]) -> int:
    """Parameters of the reference GPT (tied head)."""
    h, layers, v, s = m["hidden_size"], m["num_layers"], m["vocab_size"], m["seq_length"]
    block = 4 * (h * h + h) + 2 * 2 * h + (h * 4 * h + 4 * h) + (4 * h * h + h)
    return v * h + s * h + layers * block + 2 * h


@dataclass
class Proc:
    """One rank: its process and its stdout lines with the monotonic time each arrived."""

    popen: subprocess.Popen[str]
    lines: queue.Queue[tuple[float, str] | None] = field(default_factory=queue.Queue)
    seen: list[tuple[float, str]] = field(default_factory=list)

    def start_reader(self) -> None:
        def read() -> None:
            assert self.popen.stdout is not None
            for line in self.popen.stdout:
                self.lines.put((time.monotonic(), line))
            self.lines.put(None)

        threading.Thread(target=read, daemon=True).start()

    def wait_line(self, pattern: str, deadline: float) -> tuple[float, str]:
        for t, line in self.seen:
            if re.search(pattern, line):
                return t, line
        while True:
            item = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if item is None:
                raise RuntimeError(f"rank ended before {pattern!r}: {''.join(x for _, x in self.seen)[-2000:]}"
                                   f"{self.popen.stderr.read() if self.popen.stderr else ''}")
            self.seen.append(item)
            if re.search(pattern, item[1]):
                return item

    def drain(self, deadline: float) -> None:
        while True:
            item = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            if item is None:
                return
            self.seen.append(item)


def start(plan: dict[str, Any], model: dict[str, Any], ckpt: Path, cwd: Path) -> list[Proc]:
    envs = plan_envs(plan, model=model, checkpoint_dir=ckpt, iterations=100_000, global_batch=GLOBAL_BATCH,
                     checkpoint_every=100_000, extra={"TESSERA_TORCH_THREADS": "1"})
    procs = []
    for env in envs:
        p = Proc(subprocess.Popen([sys.executable, "-m", "tessera.clients.trainer.reference"], env=env, cwd=cwd,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        p.start_reader()
        procs.append(p)
    return procs


def stop(procs: list[Proc], timeout: float) -> float:
    """SIGTERM every rank (the agent's stop); seconds until the last one exited (all must exit 0)."""
    t0 = time.monotonic()
    for p in procs:
        p.popen.send_signal(signal.SIGTERM)
    deadline = t0 + timeout
    for p in procs:
        rc = p.popen.wait(timeout=max(0.1, deadline - time.monotonic()))
        if rc != 0:
            raise RuntimeError(f"rank exited {rc}: {p.popen.stderr.read() if p.popen.stderr else ''}")
    t1 = time.monotonic()
    for p in procs:
        p.drain(deadline)
    return t1 - t0


def measure(size: str, plan_a: dict[str, Any], plan_b: dict[str, Any], steps: int, timeout: float) -> dict[str, Any]:
    model = SIZES[size]
    with tempfile.TemporaryDirectory(prefix="tessera-migration-") as tmp:
        root = Path(tmp)
        ckpt = root / "ckpt"
        deadline = time.monotonic() + timeout
        a = start(plan_a, model, ckpt, root)
        try:
            a[0].wait_line(rf"step iteration={steps}/", deadline)
            stop_s = stop(a, timeout)
        finally:
            for p in a:
                if p.popen.poll() is None:
                    p.popen.kill()
        ckpt_line = next(line for _, line in a[0].seen if line.startswith(("checkpoint ", "[rank 0] checkpoint ")))
        write_s = float(re.search(r"seconds=(\S+)", ckpt_line).group(1))  # type: ignore[union-attr]
        stopped_at = int(re.search(r"checkpoint iteration=(\d+)", ckpt_line).group(1))  # type: ignore[union-attr]
        ckpt_dir = ckpt / f"step-{stopped_at}"
        ckpt_bytes = sum(f.stat().st_size for f in ckpt_dir.rglob("*") if f.is_file())

        t_launch = time.monotonic()
        b = start(plan_b, model, ckpt, root)
        try:
            t_banner, _ = b[0].wait_line(r"reference trainer:", deadline)
            _, resumed = b[0].wait_line(r"resumed from step", deadline)
            t_first, _ = b[0].wait_line(rf"step iteration={stopped_at + 1}/", deadline)
            b[0].wait_line(rf"step iteration={stopped_at + 3}/", deadline)
            stop(b, timeout)
        finally:
            for p in b:
                if p.popen.poll() is None:
                    p.popen.kill()
        load_s = float(re.search(r"load_seconds=(\S+)", resumed).group(1))  # type: ignore[union-attr]
        steady = [float(m.group(2)) for _, line in b[0].seen if (m := STEP.search(line))
                  and int(m.group(1)) > stopped_at + 1]
        steady_s = min(steady) if steady else 0.0
        first_s = t_first - t_launch
        shutil.rmtree(ckpt, ignore_errors=True)
    return {
        "model": size,
        "dims": {k: v for k, v in model.items() if k != "name"},
        "parameters": params_of(model),
        "plan_from": plan_a,
        "plan_to": plan_b,
        "stopped_at_step": stopped_at,
        "checkpoint_bytes": ckpt_bytes,
        "stop_seconds": round(stop_s, 3),
        "checkpoint_write_seconds": round(write_s, 3),
        "start_seconds": round(t_banner - t_launch, 3),
        "load_seconds": round(load_s, 3),
        "time_to_first_step_seconds": round(first_s, 3),
        "steady_step_seconds": round(steady_s, 4),
        "overhead_seconds": round(stop_s + first_s - steady_s, 3),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", nargs="+", default=["xs", "s", "m"], choices=sorted(SIZES))
    p.add_argument("--from", dest="plan_a", default='{"dp":2,"micro_batch":4}', help="plan A (TESSERA_PLAN JSON)")
    p.add_argument("--to", dest="plan_b", default='{"dp":1,"tp":2,"micro_batch":8}', help="plan B")
    p.add_argument("--steps", type=int, default=3, help="steps on plan A before the stop")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per size, in all")
    p.add_argument("--out", default=str(Path(__file__).resolve().parent / "results"))
    args = p.parse_args(argv)
    plan_a, plan_b = json.loads(args.plan_a), json.loads(args.plan_b)
    results = []
    for size in args.sizes:
        r = measure(size, plan_a, plan_b, args.steps, args.timeout)
        print(f"{size}: {r['parameters'] / 1e6:.1f}M params, overhead {r['overhead_seconds']:.2f} s "
              f"(stop {r['stop_seconds']:.2f}, first step after {r['time_to_first_step_seconds']:.2f})",
              file=sys.stderr, flush=True)
        results.append(r)
    import torch

    report = {
        "benchmark": "migration_overhead",
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__, "device": "cpu", "backend": "gloo"},
        "global_batch": GLOBAL_BATCH,
        "morphling_seconds_per_reconfiguration": MORPHLING_SECONDS,
        "results": results,
    }
    write_result(args.out, "migration_overhead.json", report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
