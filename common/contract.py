"""Names of the worker contract (docs/worker-contract.md) that every component must agree on."""

from __future__ import annotations

# Set by the agent for every worker; a job's env may not override them. Other TESSERA_* names are
# the job's to set (trainer knobs such as TESSERA_TORCH_THREADS or TESSERA_AGENT_LOSS_TIMEOUT).
CONTRACT_VARS: frozenset[str] = frozenset(
    {
        "TESSERA_JOB_ID",
        "TESSERA_ATTEMPT",
        "RANK",
        "LOCAL_RANK",
        "WORLD_SIZE",
        "LOCAL_WORLD_SIZE",
        "MASTER_ADDR",
        "MASTER_PORT",
        "TESSERA_RENDEZVOUS",
        "TESSERA_PLAN",
        "TESSERA_MODEL",
        "TESSERA_ITERATIONS",
        "TESSERA_GLOBAL_BATCH_SIZE",
        "TESSERA_CHECKPOINT_DIR",
        "TESSERA_CHECKPOINT_EVERY",
        "TESSERA_AGENT_ADDR",
        # The attempt's secret for ReportProgress (docs/security.md).
        "TESSERA_WORKER_TOKEN",
        # The attempt's key for sealing its rendezvous store's values (docs/security.md).
        "TESSERA_RENDEZVOUS_KEY",
        "CUDA_VISIBLE_DEVICES",
        "TESSERA_INVENTORY_SOURCE",
        # Not in the contract table, but the agent sets it: NVML numbers GPUs in PCI bus order while
        # CUDA's default order is "fastest first", so without it CUDA_VISIBLE_DEVICES=2 could be
        # another GPU than NVML's index 2 (the one the controller placed the rank on).
        "CUDA_DEVICE_ORDER",
    }
)

# The reference trainer's exit status for a job it cannot run as configured (a model structure or a plan
# option it does not build, named in its last line; docs/trainer.md): retrying the same launch cannot help.
TRAINER_REFUSED_EXIT = 3

# The first word of WorkerStatus.reason for a worker the agent's own fence stopped (no heartbeat
# acknowledged for fence_seconds; docs/fencing.md), e.g. "fenced: no heartbeat acknowledged for
# 10.0s". Its exit (0 after a checkpoint, or a signal) is no verdict on the job: the controller
# requeues the attempt without spending a retry.
FENCED_REASON = "fenced"
# How a worker's reason begins when its agent killed it for its disk use (nodeagent/diskuse.py):
# the reason says why, where "killed by SIGKILL" alone would suggest the OOM killer.
EVICTED_REASON = "evicted by the agent: "
# The size of an attempt's rendezvous key (LaunchRequest.rendezvous_key, TESSERA_RENDEZVOUS_KEY in hex).
RENDEZVOUS_KEY_BYTES = 32
