"""Device isolation (nodeagent/devicefilter.py) against a real NVIDIA driver, and NCCL through the
sealed rendezvous store (clients/trainer/reference/rendezvous.py), on a lent GPU machine as root.
Both were built and tested without a GPU: the filter against device nodes made with mknod, the
sealed store with gloo (docs/agent.md "GPU isolation", docs/security.md "Rendezvous").

    python3 scripts/device_isolation_check.py [--out FILE]    # scripts/device_smoke.sh isolation

Each case runs in a child process that a Confinement (the keeper's cgroup and device program) took
in before it started, as a keeper's worker is:
- `none`: a cgroup that lets no GPU open. Expected: every /dev/nvidiaN refused (EPERM), nvidiactl and
  nvidia-uvm open, and CUDA sees no device.
- `gpu0`: a cgroup that lets the first GPU's minor number open, CUDA_VISIBLE_DEVICES=0 (the agent
  numbers a rank's GPUs by their place among its attempt's). Expected: that GPU opens, the others
  are refused, CUDA sees one device and runs a matrix product on it, and a one-rank NCCL group made
  through a SealedStore on a TCPStore all-reduces, makes a second group and passes a barrier; a
  value under the NCCL bootstrap's own key written unsealed by another client is refused by name.
Prints one JSON object (also to --out) and exits 0 only when every expectation held.
"""

from __future__ import annotations

import argparse
import errno
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tessera.nodeagent import devicefilter


def opens(path: str) -> str:
    """'ok', or the errno's name of a failed open (EPERM: the cgroup refused it)."""
    try:
        os.close(os.open(path, os.O_RDWR))
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno or 0, str(exc.errno))


def inner(case: str, minors: list[int]) -> dict[str, Any]:
    """What the child, inside its cgroup, can open and run."""
    out: dict[str, Any] = {"case": case, "cgroup": Path("/proc/self/cgroup").read_text().strip()}
    out["open"] = {f"nvidia{m}": opens(f"/dev/nvidia{m}") for m in minors}
    out["open"] |= {name: opens(f"/dev/{name}") for name in ("nvidiactl", "nvidia-uvm") if Path(f"/dev/{name}").exists()}
    import torch

    try:
        out["cuda_devices"] = torch.cuda.device_count()
    except Exception as exc:  # noqa: BLE001 - what CUDA says is the finding
        out["cuda_devices"], out["cuda_error"] = 0, repr(exc)
    if case != "gpu0" or not out["cuda_devices"]:
        return out
    x = torch.randn(2048, 2048, device="cuda")
    out["matmul_sum_finite"] = bool(torch.isfinite((x @ x).sum()).item())
    out["nccl"] = nccl_through_sealed_store()
    return out


def nccl_through_sealed_store() -> dict[str, Any]:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    from tessera.clients.trainer.reference.rendezvous import DEFAULT_PG_PREFIX, ForgedValue, SealedStore

    res: dict[str, Any] = {}
    tcp = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=timedelta(seconds=30))
    sealed = SealedStore(dist.PrefixStore(DEFAULT_PG_PREFIX, tcp), os.urandom(32))
    dist.init_process_group("nccl", store=sealed, rank=0, world_size=1, timeout=timedelta(seconds=60),
                            device_id=torch.device("cuda:0"))  # device_id: the communicator is made now
    t = torch.arange(4, dtype=torch.float32, device="cuda")
    dist.all_reduce(t)
    res["all_reduce"] = t.tolist()
    g = dist.new_group([0])
    dist.all_reduce(t, group=g)
    res["new_group_all_reduce"] = t.tolist()
    dist.barrier()
    res["backend"] = dist.get_backend()
    # A value set through the sealed store is not stored as written; one written past it is refused.
    sealed.set("probe", "plain text")
    res["stored_sealed"] = tcp.get(f"{DEFAULT_PG_PREFIX}/probe") != b"plain text"
    tcp.set(f"{DEFAULT_PG_PREFIX}/forged", b"written by another process")
    try:
        sealed.get("forged")
        res["forged_refused"] = False
    except ForgedValue as exc:
        res["forged_refused"] = "forged" in str(exc)
    dist.destroy_process_group()
    return res


def run_case(case: str, minors: list[int]) -> dict[str, Any]:
    allowed = [] if case == "none" else minors[:1]
    conf = devicefilter.Confinement.create(allowed)
    env = dict(os.environ)
    env.pop("CUDA_VISIBLE_DEVICES", None)  # (`none`: CUDA enumerates what the cgroup lets it open)
    if case == "gpu0":
        env["CUDA_VISIBLE_DEVICES"] = "0"
    try:
        p = subprocess.run([sys.executable, __file__, "--inner", case, "--minors", ",".join(map(str, minors))],
                           check=False, capture_output=True, text=True, timeout=240, env=env,
                           preexec_fn=conf.join)
    finally:
        note = conf.release()
    if p.returncode != 0:
        return {"case": case, "error": p.stderr[-3000:], "release": note}
    got: dict[str, Any] = json.loads(p.stdout.strip().splitlines()[-1])
    got["release"] = note or "removed"
    return got


def expected(got: dict[str, Any], minors: list[int]) -> list[str]:
    """What a case's result missed."""
    miss = []
    case, opened = got["case"], got.get("open", {})
    if "error" in got:
        return [f"{case}: the child failed: {got['error'][-400:]}"]
    allowed = set() if case == "none" else set(minors[:1])
    for m in minors:
        want = "ok" if m in allowed else "EPERM"
        if opened.get(f"nvidia{m}") != want:
            miss.append(f"{case}: /dev/nvidia{m} gave {opened.get(f'nvidia{m}')}, expected {want}")
    for name in ("nvidiactl", "nvidia-uvm"):
        if name in opened and opened[name] != "ok":
            miss.append(f"{case}: /dev/{name} gave {opened[name]}, expected ok")
    if got.get("cuda_devices") != len(allowed):
        miss.append(f"{case}: CUDA saw {got.get('cuda_devices')} devices, expected {len(allowed)}")
    if case == "gpu0":
        n = got.get("nccl", {})
        if not got.get("matmul_sum_finite"):
            miss.append("gpu0: no finite matrix product on the GPU")
        if n.get("all_reduce") != [0.0, 1.0, 2.0, 3.0] or n.get("new_group_all_reduce") != [0.0, 1.0, 2.0, 3.0]:
            miss.append(f"gpu0: NCCL all-reduce through the sealed store gave {n}")
        if not (n.get("stored_sealed") and n.get("forged_refused")):
            miss.append(f"gpu0: the sealed store's checks: {n}")
    return miss


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="")
    ap.add_argument("--inner", default="", help=argparse.SUPPRESS)
    ap.add_argument("--minors", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inner:
        print(json.dumps(inner(args.inner, [int(m) for m in args.minors.split(",") if m])))
        return 0
    import pynvml as nv

    nv.nvmlInit()
    minors = [nv.nvmlDeviceGetMinorNumber(nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())]
    ok, why = devicefilter.probe()
    report: dict[str, Any] = {"minors": minors, "probe": "ok" if ok else why, "cases": []}
    if ok:
        report["cases"] = [run_case(c, minors) for c in ("none", "gpu0")]
    report["missed"] = [m for c in report["cases"] for m in expected(c, minors)] if ok else [f"probe: {why}"]
    text = json.dumps(report, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")
    return 0 if not report["missed"] else 1


if __name__ == "__main__":
    sys.exit(main())
