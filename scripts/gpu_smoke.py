"""A one-node cluster on a GPU machine: estimator, controller, and an agent that reads its inventory
from NVML (no --inventory); it submits examples/jobs/tiny.yaml and waits for it to end.

    python scripts/gpu_smoke.py [--state DIR] [--timeout 240] [--policy crius]
    python scripts/gpu_smoke.py --scenario preempt [--timeout 200]
    python scripts/gpu_smoke.py ... --inventory node.yaml   # a dry run without a GPU: workers on CPU

Runs the daemons through `sys.executable` (so it also works where the package is importable but its
console scripts are not installed). Prints the node, the job's description and its log; exits 0
when the job SUCCEEDED.

`--scenario preempt` (docs/tenants.md, as tests/e2e/test_tenants_e2e.py on CPU): the controller gets
a tenants file; once the node is READY, team-a is given a quota of 1 GPU of the node's type (read
from the node, the file reloaded with SIGHUP). Bob (team-b, no quota) submits a best-effort job of
tiny's model whose steps are padded (TESSERA_TRAINER_MIN_STEP_SECONDS) so it outlives a first
checkpoint; once it has reported a checkpoint, alice (team-a) submits a guaranteed 1-GPU job, which
must preempt it (MIGRATING "preempted: ...", stopped with a checkpoint) and succeed; the best-effort
job must then start again, resume from that checkpoint ("resumed from step k", k > 0) with the same
global batch, and succeed. Prints both jobs' descriptions and the event and log lines that show it;
exits 0 only when all of that was seen, else 1 with what was missing. Every wait is a poll of the
jobs' state with the run's one deadline (--timeout, default 200 s for this scenario).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import signal
import stat
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tessera.clients.sdk import Client
from tessera.common import localcluster as lc
from tessera.v1 import common_pb2 as P
from tessera.v1 import controller_pb2 as C

FINAL = {P.JOB_STATE_SUCCEEDED, P.JOB_STATE_FAILED, P.JOB_STATE_CANCELLED}
ENTRY_POINTS = {"tessera-controller": "tessera.controller.main", "tessera-agent": "tessera.nodeagent.main",
                "tessera-estimator": "tessera.estimator.service.main", "tessctl": "tessera.clients.tessctl"}
# The preempt scenario's jobs: tiny.yaml's model and batch. The best-effort job's steps are padded
# so that after its first checkpoint (iteration 10) it has ~18 s of work left, far more than a round
# (debounced 0.2 s) takes to preempt it once the guaranteed job is submitted.
FILLER_ITERATIONS, URGENT_ITERATIONS, CHECKPOINT_EVERY, STEP_PAD_S = 100, 20, 10, "0.2"
POLL_S = 0.5  # how often the jobs' state is read while waiting on it
# The rank-0 log lines printed: the device and plan, the resume, the stop with a checkpoint, the end.
SAID = re.compile(r"(reference trainer:|resumed from|fresh start|stopped |done )")
ON_CUDA = re.compile(r"^reference trainer: .* device=cuda", re.MULTILINE)


class ScenarioError(Exception):
    """What the preempt scenario did not see; the run exits 1 with it."""


def wrappers(bin_dir: Path) -> None:
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name, module in ENTRY_POINTS.items():
        p = bin_dir / name
        p.write_text(f"#!/bin/sh\nexec {sys.executable} -c "
                     f"'import sys; from {module} import main; sys.exit(main())' \"$@\"\n")
        p.chmod(p.stat().st_mode | stat.S_IEXEC)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--state", default="/tmp/tessera-gpu-smoke")
    ap.add_argument("--timeout", type=float, default=None,
                    help="seconds: the job's wait (default 240), or the whole preempt scenario (default 200)")
    ap.add_argument("--policy", default="crius", help="the controller's --policy")
    ap.add_argument("--scenario", choices=("tiny", "preempt"), default="tiny",
                    help="tiny (default): examples/jobs/tiny.yaml alone; preempt: a guaranteed job preempts a "
                         "best-effort one, which resumes from its checkpoint")
    ap.add_argument("--inventory", metavar="FILE", default=None,
                    help="the agent's declared inventory (docs/inventory.md) instead of NVML: a dry run without a "
                         "GPU, where the workers run on CPU")
    args = ap.parse_args()
    if args.scenario == "preempt":
        return preempt(args)
    root = Path(args.state)
    shutil.rmtree(root, ignore_errors=True)
    wrappers(root / "bin")
    lc.BIN = root / "bin"
    timeout = 240.0 if args.timeout is None else args.timeout
    inventory = None if args.inventory is None else Path(args.inventory).resolve()
    daemons: list[lc.Daemon] = []
    try:
        est = lc.start_estimator(root / "estimator.log")
        daemons.append(est)
        ctl = lc.start_controller(root / "controller", "--estimator", est.address, "--policy", args.policy)
        daemons.append(ctl)
        daemons.append(lc.start_agent(ctl, "gpu-node", inventory, root / "gpu-node"))  # None: NVML inventory
        print(lc.tessctl(ctl.address, "get", "nodes", "-o", "wide").stdout)
        print(lc.tessctl(ctl.address, "describe", "node", "gpu-node").stdout)  # CPUs, host memory, agent version
        out = lc.tessctl(ctl.address, "submit", "-f", str(REPO / "examples/jobs/tiny.yaml"), "-o", "json").stdout
        job = json.loads(out)["id"]
        state = P.JOB_STATE_UNSPECIFIED
        with Client(ctl.address, token=ctl.token) as c:
            t0 = time.monotonic()
            while time.monotonic() - t0 < timeout and state not in FINAL:
                state = c.get(job).state
                time.sleep(1.0)  # a poll of a job that takes seconds, not synchronisation between tests
        print(lc.tessctl(ctl.address, "describe", "job", job).stdout)
        print(lc.tessctl(ctl.address, "logs", job, "--tail", "2000").stdout)
        return 0 if state == P.JOB_STATE_SUCCEEDED else 1
    finally:
        for d in reversed(daemons):
            d.stop()


# -- the preempt scenario ----------------------------------------------------------------------------


def job_spec(name: str, iterations: int, **env: str) -> P.JobSpec:
    """tiny.yaml's model and global batch, `iterations`, a checkpoint every CHECKPOINT_EVERY, 1 GPU."""
    spec = P.JobSpec(name=name, model=P.ModelSpec(hidden_size=64, num_layers=2, num_heads=4, vocab_size=256,
                                                  seq_length=64),
                     global_batch_size=16, iterations=iterations, checkpoint_every=CHECKPOINT_EVERY)
    spec.hint.gpus = 1
    spec.env.update(env)
    return spec


class Run:
    """The one deadline of the scenario and the waits on it."""

    def __init__(self, timeout: float) -> None:
        self.t0 = time.monotonic()
        self.deadline = self.t0 + timeout

    def elapsed(self) -> float:
        return time.monotonic() - self.t0

    def note(self, msg: str) -> None:
        print(f"[{self.elapsed():6.1f}s] {msg}", flush=True)

    def wait(self, c: Client, job_id: str, pred: Callable[[C.Job], bool], what: str,
             done_ok: bool = False) -> C.Job:
        """Poll job `job_id` until pred(job) holds (or, with `done_ok`, the job has ended); ScenarioError
        when the deadline passes, or when the job ends first without `done_ok`."""
        while True:
            job = c.get(job_id)
            if pred(job):
                self.note(f"{what}: {P.JobState.Name(job.state)}, iteration {job.progress.iteration}, "
                          f"checkpoint {job.progress.checkpoint_iteration}, attempt {job.attempt}")
                return job
            if job.state in FINAL and done_ok:
                self.note(f"{what}: the job already ended {P.JobState.Name(job.state)}")
                return job
            if job.state in FINAL:
                raise ScenarioError(f"job {job_id} ended {P.JobState.Name(job.state)} ({job.reason}) while waiting "
                                    f"for {what}")
            if time.monotonic() > self.deadline:
                raise ScenarioError(f"timed out after {self.elapsed():.0f}s waiting for {what}; job {job_id} is "
                                    f"{P.JobState.Name(job.state)} ({job.reason})")
            time.sleep(POLL_S)


def node_gpu_type(c: Client, run: Run) -> str:
    """The GPU model of the READY node with one GPU (as `get nodes` shows it)."""
    nodes = lc.wait_for(lambda: [n for n in c.nodes() if n.state == P.NODE_STATE_READY],
                        max(0.0, run.deadline - time.monotonic()), "the node to be READY", POLL_S)
    models = sorted({g.model for n in nodes for g in n.inventory.gpus})
    if len(models) != 1:
        raise ScenarioError(f"the node's GPUs must be of one type, got {models or 'none'}")
    return str(models[0])


def give_quota(ctl: lc.Daemon, tenants: Path, gpu_type: str) -> None:
    """team-a gets a quota of 1 `gpu_type`; the controller reloads the file on SIGHUP."""
    from tessera.common import gpus as catalog

    try:
        gpu_type = catalog.lookup(gpu_type).name
    except catalog.UnknownGpuError:
        raise ScenarioError(f"the node's GPU {gpu_type!r} is not in the catalog (common/gpus.py): no quota can "
                            "name it") from None
    tenants.write_text(f"tenants:\n  team-a:\n    quota: {{{gpu_type}: 1}}\n  team-b: {{}}\n")
    ctl.proc.send_signal(signal.SIGHUP)
    ctl.wait_event("tenants_loaded", 30, skip=1)
    print(f"tenants file reloaded: team-a has a quota of 1 x {gpu_type}, team-b none\n{tenants.read_text()}")


def event_lines(job: C.Job, kinds: tuple[str, ...]) -> list[str]:
    return [f"  {job.spec.name} {e.kind:<10} {e.message}" for e in job.events if e.kind in kinds]


def check_preempt(admin: Client, be_id: str, g_id: str, first_ckpt: int, on_gpu: bool) -> None:
    """Everything the scenario must show, from the ended jobs; ScenarioError naming what is missing."""
    be, g = admin.get(be_id, with_events=True), admin.get(g_id, with_events=True)
    print("== the preempt and resume, from the jobs' events")
    for line in event_lines(be, ("PLACED", "MIGRATING", "STOPPED", "REQUEUED", "SUCCEEDED")):
        print(line)
    for line in event_lines(g, ("PLACED", "SUCCEEDED")):
        print(line)
    logs = {}
    for what, job_id, attempt in (("best-effort job, attempt 1", be_id, 1), ("guaranteed job", g_id, 0),
                                  (f"best-effort job, attempt {be.attempt}", be_id, be.attempt)):
        logs[what] = admin.logs(job_id, attempt=attempt, tail_bytes=1_000_000).data.decode(errors="replace")
        said = [ln for ln in logs[what].splitlines() if SAID.match(ln)]
        print(f"== {what} (rank 0 log)\n" + "\n".join(f"  {ln}" for ln in said))
    log = logs[f"best-effort job, attempt {be.attempt}"]
    missing = []
    if on_gpu:  # NVML inventory: every attempt ran on the GPU (declared: CPU, docs/agent.md)
        off = [what for what, text in logs.items() if not ON_CUDA.search(text)]
        if off:
            missing.append(f"not on the GPU (no 'device=cuda' in the trainer's first line): {', '.join(off)}")
    if g.state != P.JOB_STATE_SUCCEEDED or g.progress.iteration != URGENT_ITERATIONS:
        missing.append(f"the guaranteed job ended {P.JobState.Name(g.state)} at iteration {g.progress.iteration} "
                       f"({g.reason})")
    if be.state != P.JOB_STATE_SUCCEEDED or be.progress.iteration != FILLER_ITERATIONS:
        missing.append(f"the best-effort job ended {P.JobState.Name(be.state)} at iteration {be.progress.iteration} "
                       f"({be.reason})")
    kinds = [e.kind for e in be.events]
    # Every policy's words name the guaranteed job to the admin ("preempted: guaranteed job J of
    # tenant team-a reclaims ...", morphling's too since 2026-11-28).
    preempted = [e for e in be.events if e.kind == "MIGRATING" and "preempted" in e.message and g_id in e.message]
    placed = [e for e in be.events if e.kind == "PLACED"]
    stopped = [i for i, k in enumerate(kinds) if k in ("STOPPED", "REQUEUED")]
    if not preempted:
        missing.append(f"no MIGRATING event 'preempted ... {g_id} ...' on the best-effort job")
    elif not stopped or not placed or not (kinds.index("MIGRATING") < stopped[0] < kinds.index("PLACED", stopped[0])):
        missing.append(f"the best-effort job was not stopped and placed again after its preemption: {kinds}")
    if be.attempt < 2:
        missing.append(f"the best-effort job ran {be.attempt} attempt(s), not a second one after the preemption")
    if placed and g.end_time and placed[-1].time < g.end_time - 1.0:
        missing.append("the best-effort job was placed again before the guaranteed job ended")
    g_placed = [e.time for e in g.events if e.kind == "PLACED"]
    if g.spec.priority != P.PRIORITY_GUARANTEED or g.spec.guarantee.num_gpus != 1:
        missing.append("the second job is not guaranteed 1 GPU")
    if preempted and (not g_placed or g_placed[0] < preempted[0].time):
        missing.append("the guaranteed job was not placed after the best-effort job's preemption")
    resumed = re.search(r"resumed from step (\d+)", log)
    if resumed is None or int(resumed.group(1)) < first_ckpt:
        missing.append(f"the best-effort job's last attempt did not resume from a checkpoint >= {first_ckpt} "
                       f"(log: {resumed.group(0) if resumed else 'no resume line'})")
    batch = re.search(r"global_batch=(\d+)", log)
    p = be.plan
    if batch is None or int(batch.group(1)) != 16 or p.dp * p.micro_batch * p.grad_accum != 16:
        missing.append(f"the resumed attempt's global batch is not 16 (log: {batch.group(0) if batch else 'none'}, "
                       f"plan dp={p.dp} micro_batch={p.micro_batch} grad_accum={p.grad_accum})")
    if missing:
        raise ScenarioError("; ".join(missing))
    print(f"preempted at {preempted[0].message!r}; resumed from step {resumed.group(1) if resumed else '?'} "
          f"on attempt {be.attempt} with global batch 16")


def preempt(args: argparse.Namespace) -> int:
    run = Run(200.0 if args.timeout is None else args.timeout)
    root = Path(args.state)
    shutil.rmtree(root, ignore_errors=True)
    wrappers(root / "bin")
    lc.BIN = root / "bin"
    tenants = root / "tenants.yaml"
    tenants.write_text("tenants:\n  team-a: {}\n  team-b: {}\n")  # the quota's type is known once the node is up
    inventory = None if args.inventory is None else Path(args.inventory).resolve()
    daemons: list[lc.Daemon] = []
    ids: dict[str, str] = {}
    ctl: lc.Daemon | None = None
    ok, failure = False, ""
    try:
        est = lc.start_estimator(root / "estimator.log")
        daemons.append(est)
        # Fast rounds as in tests/e2e (lc.FAST_CONTROLLER: debounce 0.2 s), and a round every 5 s besides.
        ctl = lc.start_controller(root / "controller", "--estimator", est.address, "--policy", args.policy,
                                  "--tenants", str(tenants), "--round-interval", "5")
        daemons.append(ctl)
        # None: NVML inventory. Its workers stop with it, also when the scenario fails half-way.
        daemons.append(lc.start_agent(ctl, "gpu-node", inventory, root / "gpu-node", "--kill-workers-on-exit"))
        with Client(ctl.address, token=ctl.token) as admin, \
                Client(ctl.address, token=ctl.tokens["bob"]) as bob, \
                Client(ctl.address, token=ctl.tokens["alice"]) as alice:
            gpu_type = node_gpu_type(admin, run)
            run.note(f"node READY with 1 x {gpu_type}")
            print(lc.tessctl(ctl.address, "get", "nodes", "-o", "wide").stdout)
            give_quota(ctl, tenants, gpu_type)

            be = bob.submit(job_spec("best-effort", FILLER_ITERATIONS, TESSERA_TRAINER_MIN_STEP_SECONDS=STEP_PAD_S))
            ids["best-effort"] = be.id
            run.note(f"bob (team-b) submitted best-effort job {be.id}")
            run.wait(admin, be.id, lambda j: j.state == P.JOB_STATE_RUNNING, "best-effort job RUNNING")
            first = run.wait(admin, be.id, lambda j: j.progress.checkpoint_iteration >= CHECKPOINT_EVERY,
                             "best-effort job past its first checkpoint")
            spec = job_spec("guaranteed", URGENT_ITERATIONS)
            spec.priority = P.PRIORITY_GUARANTEED  # promised its hint: 1 GPU, within team-a's quota
            g = alice.submit(spec)
            ids["guaranteed"] = g.id
            run.note(f"alice (team-a) submitted guaranteed job {g.id} (guarantee {g.spec.guarantee.num_gpus} GPU)")
            run.wait(admin, be.id, lambda j: j.state != P.JOB_STATE_RUNNING or j.attempt > first.attempt,
                     "best-effort job preempted")
            run.wait(admin, g.id, lambda j: j.state == P.JOB_STATE_RUNNING, "guaranteed job RUNNING", done_ok=True)
            run.wait(admin, g.id, lambda j: j.state in FINAL, "guaranteed job ended", done_ok=True)
            run.wait(admin, be.id, lambda j: j.attempt > first.attempt and j.state == P.JOB_STATE_RUNNING,
                     "best-effort job running again", done_ok=True)
            run.wait(admin, be.id, lambda j: j.state in FINAL, "best-effort job ended", done_ok=True)
            for job_id in (g.id, be.id):
                print(lc.tessctl(ctl.address, "describe", "job", job_id).stdout)
            check_preempt(admin, be.id, g.id, first.progress.checkpoint_iteration, on_gpu=inventory is None)
        ok = True
        run.note("preempt scenario: OK")
        return 0
    except Exception as exc:  # noqa: BLE001 - any failure is the scenario's: one line, exit 1
        why = str(exc) if isinstance(exc, ScenarioError) else f"{type(exc).__name__}: {exc}"
        failure = f"gpu_smoke --scenario preempt FAILED after {run.elapsed():.0f}s: {why}"
        print(failure, flush=True)
        return 1
    finally:
        if not ok and ctl is not None and ctl.proc.poll() is None:
            for name, job_id in ids.items():  # what there is to read, for the report
                cp = lc.tessctl(ctl.address, "describe", "job", job_id, check=False)
                print(f"== {name} job {job_id}\n{cp.stdout}{cp.stderr}", flush=True)
        for d in reversed(daemons):
            d.stop()
        if failure:
            print(failure, file=sys.stderr, flush=True)  # again, last: the line to read


if __name__ == "__main__":
    raise SystemExit(main())
