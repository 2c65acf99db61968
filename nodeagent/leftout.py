"""Which GPUs a node does not offer for scheduling, and why (docs/agent.md, "GPUs left out"): the
NVML probe (nodeagent/inventory.py) reports them in NodeInventory.left_out instead of its GPUs.
Each NVML call may be missing or fail on its own; a GPU is left out only on an answer that says so.
"""

from __future__ import annotations

from typing import Any

# Why a GPU in MIG mode is left out: CUDA lets a process enumerate a single MIG device ("CUDA Device
# Enumeration" in NVIDIA's MIG user guide), so a rank given the card would get one slice of it, and
# ranks cannot train across slices; the estimator sizes jobs for whole cards.
MIG_REASON = ("MIG mode is on: CUDA gives a process one MIG slice, not the card, and Tessera schedules "
              "whole GPUs (nvidia-smi -i INDEX -mig 0 turns it off)")

PROHIBITED_REASON = ("compute mode is Prohibited: no process may use the GPU "
                     "(nvidia-smi -i INDEX -c DEFAULT allows it)")


# NVML's recovery actions (nvmlDeviceGetFieldValues, NVML_FI_DEV_GET_GPU_RECOVERY_ACTION), by value:
# what NVIDIA's memory error management guide ("Error Recovery and Response Flags") says to do before
# the GPU takes new work. 0 (NONE) means it is usable.
RECOVERY_ACTIONS = {1: "a GPU reset", 2: "a reboot of the node", 3: "its peer-to-peer traffic drained",
                    4: "a drain and a GPU reset", 5: "its IMEX domain recovered", 6: "a bus reset",
                    7: "a reboot of the system"}


def why(nv: Any, handle: Any, recovery_check: bool = True) -> str:
    """Why the GPU cannot be offered ("" when it can): MIG mode, a compute mode that lets no process
    make a CUDA context on it, or (with `recovery_check`: `tessera-agent --gpu-recovery-check`) a
    fault after which NVML says it needs a recovery action."""
    if _mig_on(nv, handle):
        return MIG_REASON
    query = getattr(nv, "nvmlDeviceGetComputeMode", None)
    try:
        prohibited = query is not None and query(handle) == getattr(nv, "NVML_COMPUTEMODE_PROHIBITED", 2)
    except nv.NVMLError:
        prohibited = False
    if prohibited:
        return PROHIBITED_REASON
    action = _recovery_action(nv, handle) if recovery_check else 0
    if action:
        need = RECOVERY_ACTIONS.get(action, f"recovery action {action}")
        return f"NVML says the GPU needs {need} before it takes new work (recovery action {action})"
    return ""


def _recovery_action(nv: Any, handle: Any) -> int:
    """NVML's recovery action for the GPU (0: none, or a driver that does not say)."""
    field = getattr(nv, "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION", None)
    query = getattr(nv, "nvmlDeviceGetFieldValues", None)
    if field is None or query is None:
        return 0
    try:
        (value,) = query(handle, [field])
    except nv.NVMLError:
        return 0
    if value.nvmlReturn != getattr(nv, "NVML_SUCCESS", 0):
        return 0  # this field unknown to the driver: an older one
    return int(value.value.uiVal)


def _mig_on(nv: Any, handle: Any) -> bool:
    """Whether the GPU is in MIG mode now (a pending change counts from the GPU's next reset)."""
    query = getattr(nv, "nvmlDeviceGetMigMode", None)
    if query is None:
        return False
    try:
        current, _pending = query(handle)
    except nv.NVMLError:
        return False  # no MIG on this GPU (before Ampere: Not Supported), or a driver without the call
    return bool(current == getattr(nv, "NVML_DEVICE_MIG_ENABLE", 1))
