"""What the agent's NVML probe decides about each GPU of this machine, with the raw NVML answers it
decides from (docs/agent.md, "GPUs left out"): MIG mode, compute mode, the recovery action field.
For a lent GPU machine (scripts/device_smoke.sh runs it first): the left-out checks were written
against NVIDIA's documentation and fakes, and this shows what a real driver answers.

    python3 scripts/nvml_facts.py
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tessera.nodeagent import inventory


def raw(nv: Any, h: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, call in (("mig_mode", lambda: list(nv.nvmlDeviceGetMigMode(h))),
                       ("compute_mode", lambda: nv.nvmlDeviceGetComputeMode(h)),
                       ("minor", lambda: nv.nvmlDeviceGetMinorNumber(h))):
        try:
            out[name] = call()
        except Exception as exc:  # noqa: BLE001 (each answer on its own, as the probe takes them)
            out[name] = f"error: {exc}"
    try:
        (v,) = nv.nvmlDeviceGetFieldValues(h, [nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION])
        out["recovery_action"] = {"nvmlReturn": int(v.nvmlReturn), "valueType": int(v.valueType),
                                  "uiVal": int(v.value.uiVal), "ullVal": int(v.value.ullVal)}
    except Exception as exc:  # noqa: BLE001
        out["recovery_action"] = f"error: {exc}"
    return out


def main() -> int:
    import pynvml as nv

    try:
        nv.nvmlInit()
    except nv.NVMLError as exc:
        print(f"nvml_facts: NVML does not start here: {exc}", file=sys.stderr)
        return 1
    try:
        per_gpu = [raw(nv, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())]
    finally:
        nv.nvmlShutdown()
    inv = inventory.probe_nvml()
    print(json.dumps({"raw": per_gpu,
                      "offered": [[g.index, g.model, g.uuid] for g in inv.gpus],
                      "left_out": [[g.index, g.model, g.reason] for g in inv.left_out]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
