"""TrainerContext: what the agent gave this process (the worker contract's variables), and its line
back to the agent (progress reports, stop and checkpoint requests, signals).

This module must stay free of torch (and imports grpc only when it first reports): a trainer imports
it before it chooses a device, and tessera.clients imports it without the trainer extra.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from types import FrameType
from typing import Any, Self

from tessera.clients.trainer.checkpoints import CheckpointRef, checkpoint_writer, claim, latest_checkpoint
from tessera.clients.trainer.plan import DEFAULT_MODEL, ContractError, ModelDims, Plan, json_object
from tessera.common.contract import RENDEZVOUS_KEY_BYTES

log = logging.getLogger(__name__)

# Defaults used when a variable is absent (a run by hand, outside Tessera).
DEFAULT_JOB_ID = "local"
DEFAULT_ITERATIONS = 100
DEFAULT_MICRO_BATCH = 8
DEFAULT_CHECKPOINT_DIR = "checkpoints"
DEFAULT_CHECKPOINT_EVERY = 10
DEFAULT_REPORT_INTERVAL_S = 0.5
DEFAULT_REPORT_DEADLINE_S = 1.0
# A worker that cannot reach its agent for this long stops itself (env TESSERA_AGENT_LOSS_TIMEOUT).
DEFAULT_AGENT_LOSS_TIMEOUT_S = 60.0
# After a failed report, unforced reports wait this long (doubling per failure, capped at 10 s).
_FAILURE_BACKOFF_S = 1.0
_FAILURE_BACKOFF_MAX_S = 10.0


def _env_float(e: Mapping[str, str], name: str, default: float) -> float:
    raw = e.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ContractError(f"{name} must be a number, got {raw!r}") from None


def _env_key(e: Mapping[str, str]) -> bytes:
    """TESSERA_RENDEZVOUS_KEY: 32 bytes in hex, or b"" when unset or empty."""
    raw = e.get("TESSERA_RENDEZVOUS_KEY", "").strip()
    try:
        key = bytes.fromhex(raw)
    except ValueError:
        key = b"?"
    if raw and len(key) != RENDEZVOUS_KEY_BYTES:
        raise ContractError(f"TESSERA_RENDEZVOUS_KEY must be {2 * RENDEZVOUS_KEY_BYTES} hex digits")
    return key


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ContractError(f"{name} must be an integer, got {raw!r}") from None


class TrainerContext:
    """What the agent gave this process, and its line back to the agent.

    Attributes mirror the contract variables. `stop_requested` and `checkpoint_requested` are set by
    signals (SIGTERM/SIGINT, once `install_signal_handlers()` ran) and by the agent's answers to
    `report()`; the training loop reads them at step boundaries and clears `checkpoint_requested`
    after checkpointing.
    """

    def __init__(
        self,
        *,
        job_id: str = DEFAULT_JOB_ID,
        attempt: int = 1,
        rank: int = 0,
        local_rank: int = 0,
        world_size: int = 1,
        local_world_size: int = 1,
        master_addr: str = "127.0.0.1",
        master_port: int = 29500,
        plan: Plan | None = None,
        model: ModelDims = DEFAULT_MODEL,
        iterations: int = DEFAULT_ITERATIONS,
        global_batch_size: int = 0,
        checkpoint_dir: str | os.PathLike[str] = DEFAULT_CHECKPOINT_DIR,
        checkpoint_every: int = 0,
        agent_addr: str = "",
        worker_token: str = "",
        rendezvous_key: bytes = b"",
        inventory_source: str = "",
        cuda_visible_devices: str | None = None,
        in_tessera: bool = False,
        report_interval_s: float = DEFAULT_REPORT_INTERVAL_S,
        report_deadline_s: float = DEFAULT_REPORT_DEADLINE_S,
        agent_loss_timeout_s: float = DEFAULT_AGENT_LOSS_TIMEOUT_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.job_id = job_id
        self.attempt = attempt
        self.rank = rank
        self.local_rank = local_rank
        self.world_size = world_size
        self.local_world_size = local_world_size
        self.master_addr = master_addr
        self.master_port = master_port
        self.plan = plan if plan is not None else Plan(dp=world_size, micro_batch=DEFAULT_MICRO_BATCH)
        self.model = model
        self.iterations = iterations
        self.global_batch_size = global_batch_size or self.plan.global_batch
        self.checkpoint_dir = Path(checkpoint_dir)
        self.checkpoint_every = checkpoint_every
        self.agent_addr = agent_addr
        self.worker_token = worker_token
        # Seals the rendezvous store's values (reference/rendezvous.py); b"" = a plain store.
        self.rendezvous_key = rendezvous_key
        self.inventory_source = inventory_source
        self.cuda_visible_devices = cuda_visible_devices
        self.in_tessera = in_tessera
        self.report_interval_s = report_interval_s
        self.report_deadline_s = report_deadline_s
        self.agent_loss_timeout_s = agent_loss_timeout_s

        self.stop_requested = False
        self.checkpoint_requested = False
        self.stop_reason = ""

        self._clock = clock
        self._next_report_at = float("-inf")
        self._failures = 0
        self._failing_since = 0.0
        self._channel: Any = None
        self._stub: Any = None
        self._signals_received = 0

    # ---- construction

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, **overrides: Any) -> TrainerContext:
        """Read the worker contract from `env` (default os.environ).

        Absent variables take the defaults of a run by hand: rank 0 of 1, no agent, the plan
        dp=WORLD_SIZE with micro_batch 8, a tiny model, 100 iterations, ./checkpoints. Present but
        malformed variables raise ContractError. Keyword `overrides` replace any constructor argument.
        """
        e = os.environ if env is None else env
        world_size = _env_int(e, "WORLD_SIZE", 1)
        if world_size < 1:
            raise ContractError(f"WORLD_SIZE must be >= 1, got {world_size}")
        rank = _env_int(e, "RANK", 0)
        if not 0 <= rank < world_size:
            raise ContractError(f"RANK={rank} is outside WORLD_SIZE={world_size}")
        global_batch = _env_int(e, "TESSERA_GLOBAL_BATCH_SIZE", 0)
        plan_raw = e.get("TESSERA_PLAN", "").strip()
        if plan_raw:
            plan = Plan.from_dict(json_object(plan_raw, "TESSERA_PLAN"), default_dp=world_size,
                                  default_micro_batch=DEFAULT_MICRO_BATCH)
        else:
            plan = Plan(dp=world_size, micro_batch=DEFAULT_MICRO_BATCH)
        model_raw = e.get("TESSERA_MODEL", "").strip()
        model = ModelDims.from_dict(json_object(model_raw, "TESSERA_MODEL")) if model_raw \
            else DEFAULT_MODEL

        master_addr = e.get("MASTER_ADDR", "")
        master_port = _env_int(e, "MASTER_PORT", 0)
        rendezvous = e.get("TESSERA_RENDEZVOUS", "").strip()
        if rendezvous and (not master_addr or not master_port):
            host, _, port = rendezvous.rpartition(":")
            master_addr = master_addr or host.strip("[]")
            if not master_port:
                try:
                    master_port = int(port)
                except ValueError:
                    raise ContractError(f"TESSERA_RENDEZVOUS must be host:port, got {rendezvous!r}") \
                        from None

        kwargs: dict[str, Any] = {
            "job_id": e.get("TESSERA_JOB_ID", "") or DEFAULT_JOB_ID,
            "attempt": _env_int(e, "TESSERA_ATTEMPT", 1),
            "rank": rank,
            "local_rank": _env_int(e, "LOCAL_RANK", rank),
            "world_size": world_size,
            "local_world_size": _env_int(e, "LOCAL_WORLD_SIZE", world_size),
            "master_addr": master_addr or "127.0.0.1",
            "master_port": master_port or 29500,
            "plan": plan,
            "model": model,
            "iterations": _env_int(e, "TESSERA_ITERATIONS", DEFAULT_ITERATIONS),
            "global_batch_size": global_batch or plan.global_batch,
            "checkpoint_dir": e.get("TESSERA_CHECKPOINT_DIR", "") or DEFAULT_CHECKPOINT_DIR,
            "checkpoint_every": _env_int(e, "TESSERA_CHECKPOINT_EVERY", 0),
            "agent_addr": e.get("TESSERA_AGENT_ADDR", "").strip(),
            "worker_token": e.get("TESSERA_WORKER_TOKEN", "").strip(),
            "rendezvous_key": _env_key(e),
            "inventory_source": e.get("TESSERA_INVENTORY_SOURCE", "").strip().lower(),
            "cuda_visible_devices": e.get("CUDA_VISIBLE_DEVICES"),
            "in_tessera": bool(e.get("TESSERA_JOB_ID")),
            "agent_loss_timeout_s": _env_float(e, "TESSERA_AGENT_LOSS_TIMEOUT", DEFAULT_AGENT_LOSS_TIMEOUT_S),
        }
        kwargs.update(overrides)
        return cls(**kwargs)

    # ---- derived

    @property
    def rendezvous(self) -> str:
        return f"{self.master_addr}:{self.master_port}"

    @property
    def is_rank0(self) -> bool:
        return self.rank == 0

    @property
    def gpu_allowed(self) -> bool:
        """False when the agent gave this rank no GPU (empty CUDA_VISIBLE_DEVICES, or a declared
        inventory): the worker must run on CPU. True does not mean a GPU exists."""
        if self.inventory_source == "declared":
            return False
        return self.cuda_visible_devices is None or self.cuda_visible_devices.strip() != ""

    def checkpoint_interval(self, default: int = DEFAULT_CHECKPOINT_EVERY) -> int:
        """TESSERA_CHECKPOINT_EVERY, or `default` when it is 0 (the trainer's choice)."""
        return self.checkpoint_every if self.checkpoint_every > 0 else default

    def claim_checkpoints(self) -> None:
        """Raise the checkpoint directory's FENCE to this attempt: no older attempt promotes or
        prunes from now on. StaleAttempt (a RuntimeError) if a later attempt already has."""
        claim(self.checkpoint_dir, self.attempt)

    def latest_checkpoint(self) -> CheckpointRef | None:
        """The checkpoint to resume from, read after claiming the directory for this attempt (so
        no older attempt can promote a newer one behind it). StaleAttempt if this attempt is stale."""
        self.claim_checkpoints()
        return latest_checkpoint(self.checkpoint_dir)

    def checkpoint_writer(self, iteration: int, meta: Mapping[str, Any] | None = None,
                          keep: int = 2) -> contextlib.AbstractContextManager[Path]:
        """`checkpoint_writer` in this job's checkpoint directory, fenced by this attempt (call on
        rank 0 only)."""
        return checkpoint_writer(self.checkpoint_dir, iteration, meta, keep, attempt=self.attempt)

    # ---- signals

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT set `stop_requested` (checkpoint at the next step boundary, exit 0).

        A second SIGINT raises KeyboardInterrupt, so Ctrl-C twice still interrupts a run by hand.
        Must be called from the main thread.
        """
        signal.signal(signal.SIGTERM, self._on_signal)
        signal.signal(signal.SIGINT, self._on_signal)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        if signum == signal.SIGINT and self.stop_requested and self.stop_reason == "SIGINT":
            raise KeyboardInterrupt
        self.stop_requested = True
        self.stop_reason = self.stop_reason or signal.Signals(signum).name

    def should_stop(self) -> bool:
        return self.stop_requested

    def request_stop(self, reason: str = "requested") -> None:
        self.stop_requested = True
        self.stop_reason = self.stop_reason or reason

    # ---- progress

    def report(
        self,
        iteration: int,
        loss: float,
        samples_per_second: float,
        step_time_seconds: float,
        peak_memory_bytes: int = 0,
        checkpoint_iteration: int = -1,
        *,
        force: bool = False,
    ) -> bool:
        """Send progress to the agent (NodeAgent.ReportProgress). True if it was delivered.

        Throttled: skipped (False) when the last attempt was less than `report_interval_s` ago, unless
        `force` (use it at the end and right after a checkpoint). After a transport failure the next
        unforced attempt waits longer (doubling up to 10 s). Never raises on transport errors: they
        are logged and training goes on. Without an agent address this is a no-op returning False.
        The answer's stop_requested / checkpoint_requested set the attributes of the same name
        (they are never cleared by an answer).
        """
        if not self.agent_addr:
            return False
        now = self._clock()
        if not force and now < self._next_report_at:
            return False
        self._next_report_at = now + self.report_interval_s
        try:
            import grpc

            from tessera.v1 import agent_pb2, common_pb2

            stub = self._ensure_stub()
            request = agent_pb2.ReportProgressRequest(
                job_id=self.job_id,
                attempt=self.attempt,
                rank=self.rank,
                progress=common_pb2.Progress(
                    iteration=int(iteration),
                    loss=float(loss),
                    samples_per_second=float(samples_per_second),
                    step_time_seconds=float(step_time_seconds),
                    peak_memory_bytes=int(peak_memory_bytes),
                    time=time.time(),
                    checkpoint_iteration=int(checkpoint_iteration),
                ),
            )
            response = stub.ReportProgress(request, timeout=self.report_deadline_s,
                                           metadata=(("tessera-worker-token", self.worker_token),))
        except grpc.RpcError as e:
            self._on_report_failure(now, f"{e.code().name}: {e.details()}")
            return False
        except Exception as e:  # noqa: BLE001 - reporting must never take the training down
            self._on_report_failure(now, f"{type(e).__name__}: {e}")
            return False
        if self._failures:
            log.warning("tessera: progress reports reach the agent at %s again", self.agent_addr)
        self._failures = 0
        if response.stop_requested and not self.stop_requested:
            self.stop_requested = True
            self.stop_reason = self.stop_reason or "agent"
        if response.checkpoint_requested:
            self.checkpoint_requested = True
        return True

    def _on_report_failure(self, now: float, why: str) -> None:
        if self._failures == 0:
            self._failing_since = now
        self._failures += 1
        # Self-fencing: a worker whose agent is gone (killed, node partitioned) has likely been
        # requeued elsewhere by now; it checkpoints and stops instead of training on as a duplicate.
        if (self.in_tessera and self.agent_loss_timeout_s > 0 and not self.stop_requested
                and now - self._failing_since >= self.agent_loss_timeout_s):
            log.warning("tessera: agent %s unreachable for %.0fs: stopping (checkpoint, then exit)",
                        self.agent_addr, now - self._failing_since)
            self.stop_requested = True
            self.stop_reason = self.stop_reason or "agent unreachable"
        backoff = min(_FAILURE_BACKOFF_MAX_S, _FAILURE_BACKOFF_S * 2 ** (self._failures - 1))
        self._next_report_at = max(self._next_report_at, now + backoff)
        if self._failures == 1 or self._failures % 20 == 0:
            log.warning("tessera: progress report to agent %s failed (%d in a row), training goes on: %s",
                        self.agent_addr, self._failures, why)

    def _ensure_stub(self) -> Any:
        if self._stub is None:
            from tessera.common.rpc import sync_channel
            from tessera.v1 import agent_pb2_grpc

            # The agent's unix socket (unix:<work-dir>/agent.sock): local, so plaintext; the
            # attempt's secret in every call is what the agent checks (docs/security.md).
            self._channel = sync_channel(self.agent_addr, insecure=True)
            self._stub = agent_pb2_grpc.NodeAgentStub(self._channel)
        return self._stub

    def close(self) -> None:
        """Close the channel to the agent (report() reopens it if called again)."""
        if self._channel is not None:
            self._channel.close()
        self._channel = None
        self._stub = None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"TrainerContext(job_id={self.job_id!r}, attempt={self.attempt}, rank={self.rank}/"
                f"{self.world_size}, plan={self.plan}, model={self.model}, iterations={self.iterations}, "
                f"global_batch_size={self.global_batch_size}, checkpoint_dir={str(self.checkpoint_dir)!r})")
