"""Bounds on what a node reports (Register, Heartbeat): forged statuses are refused naming the field,
and what real agents send passes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tessera.common import nodespec
from tessera.common.inventoryfile import InventoryError, parse_inventory, read_inventory_file
from tessera.nodeagent.inventory import HostFacts, declared_inventory
from tessera.v1 import agent_pb2 as A
from tessera.v1 import common_pb2 as S

INVENTORIES = sorted((Path(__file__).resolve().parents[2] / "examples" / "inventories").glob("*.yaml"))


def status(**kw: object) -> A.NodeStatus:
    inv = S.NodeInventory(hostname="gpu-01.example.org", cpu_count=64, host_memory_bytes=512 * 2**30,
                          gpus=[S.Gpu(index=i, uuid=f"GPU-{i:08x}-aaaa", model="A100-80GB", memory_bytes=80 * 10**9,
                                      nvlink_peers=[p for p in range(4) if p != i]) for i in range(4)])
    st = A.NodeStatus(node_id="node-a", address="10.0.0.1:50052", inventory=inv, agent_version="0.1.0",
                      workers=[A.WorkerStatus(job_id="j-0123456789ab", attempt=1, rank=0, gpu_indices=[0, 1],
                                              reason="exited with code 1", log_path="/var/lib/x/rank-0.log",
                                              progress=S.Progress(iteration=-5, loss=float("nan")))])
    for k, v in kw.items():
        st.ClearField(k)
        if isinstance(v, list):
            getattr(st, k).extend(v)
        else:
            getattr(st, k).CopyFrom(v)
    return st


@pytest.mark.parametrize("path", INVENTORIES, ids=lambda p: p.name)
def test_what_real_agents_send_passes(path: Path) -> None:
    inv = declared_inventory(read_inventory_file(path), "node-a", HostFacts("host-1", 8, 16 * 2**30))
    assert nodespec.status_errors(status(inventory=inv, workers=[])) == []


def test_nvml_style_names_pass() -> None:
    st = status()
    st.inventory.gpus[0].model = "NVIDIA GeForce RTX 4090 (24GB)"  # NVML's name for a GPU the catalog lacks
    st.inventory.gpus[1].uuid = "MIG-GPU-5a3b/1/0"
    st.address = "[fe80::1]:50052"
    assert nodespec.status_errors(st) == []


def test_gpus_left_out_pass_beside_the_offered_ones() -> None:
    st = status()
    st.inventory.left_out.add(index=5, uuid="GPU-00000005-aaaa", model="A100-80GB",
                              reason="MIG mode is on: CUDA gives a process one MIG slice")
    assert nodespec.status_errors(st) == []


def test_workers_on_gpus_no_longer_offered_are_kept() -> None:
    """A GPU left out since (MIG turned on, a recovery action) or off the bus is still in the records
    of the workers that ran on it, kept an hour: the node's status must not be refused for them
    (a review: every heartbeat was, and the node was lost)."""
    st = status()
    del st.inventory.gpus[3]
    st.inventory.gpus[0].ClearField("nvlink_peers")
    st.inventory.gpus[1].ClearField("nvlink_peers")
    st.inventory.gpus[2].ClearField("nvlink_peers")
    st.inventory.left_out.add(index=3, uuid="GPU-left", model="A100-80GB", reason="MIG mode is on")
    st.workers[0].gpu_indices[:] = [3]
    st.workers.add(job_id="j-0123456789ac", attempt=1, rank=0, gpu_indices=[9])  # off the bus
    assert nodespec.status_errors(st) == []


def test_worker_reports_are_bounded_not_judged() -> None:
    # progress numbers and reasons come from the job's own workers: refusing them would let a job
    # make its node unreachable; only their size is bounded
    assert nodespec.status_errors(status()) == []
    st = status()
    st.workers[0].reason = "x" * 5000
    assert [f for f, _ in nodespec.status_errors(st)] == ["status.workers[0].reason"]


def _forged(mutate: object) -> list[str]:
    st = status()
    mutate(st)  # type: ignore[operator]
    return [f for f, _ in nodespec.status_errors(st)]


@pytest.mark.parametrize("mutate, field", [
    (lambda s: s.inventory.gpus.extend(S.Gpu(index=i + 4, uuid=f"G{i}", model="A100-80GB", memory_bytes=1)
                                       for i in range(20_000)), "status.inventory.gpus"),
    (lambda s: setattr(s.inventory.gpus[3], "model", "A100\u202e-80GB"), "status.inventory.gpus[3].model"),
    (lambda s: setattr(s.inventory.gpus[3], "model", "A100\x1b[2J"), "status.inventory.gpus[3].model"),
    (lambda s: setattr(s.inventory.gpus[3], "model", ""), "status.inventory.gpus[3].model"),
    (lambda s: setattr(s.inventory.gpus[2], "model", "M" * 65), "status.inventory.gpus[2].model"),
    (lambda s: setattr(s.inventory.gpus[1], "index", 0), "status.inventory.gpus[1].index"),
    (lambda s: setattr(s.inventory.gpus[1], "index", 64), "status.inventory.gpus[1].index"),
    (lambda s: setattr(s.inventory.gpus[1], "index", -1), "status.inventory.gpus[1].index"),
    (lambda s: setattr(s.inventory.gpus[0], "memory_bytes", 0), "status.inventory.gpus[0].memory_bytes"),
    (lambda s: setattr(s.inventory.gpus[0], "memory_bytes", 2**62), "status.inventory.gpus[0].memory_bytes"),
    (lambda s: setattr(s.inventory.gpus[0], "foreign_used_bytes", -1), "status.inventory.gpus[0].foreign_used_bytes"),
    (lambda s: setattr(s.inventory.gpus[0], "uuid", "GPU\n1"), "status.inventory.gpus[0].uuid"),
    (lambda s: s.inventory.gpus[0].nvlink_peers.append(99), "status.inventory.gpus[0].nvlink_peers"),
    # An audit's forged node (2026-11-27): a peer the node does not have, a peer twice, a device twice.
    (lambda s: s.inventory.gpus[0].nvlink_peers.append(40), "status.inventory.gpus[0].nvlink_peers"),
    (lambda s: s.inventory.gpus[0].nvlink_peers.append(1), "status.inventory.gpus[0].nvlink_peers"),
    (lambda s: setattr(s.inventory.gpus[2], "uuid", "GPU-00000000-aaaa"), "status.inventory.gpus[2].uuid"),
    (lambda s: setattr(s.inventory, "hostname", "evil\u202ehost"), "status.inventory.hostname"),
    (lambda s: setattr(s.inventory, "hostname", "h" * 300), "status.inventory.hostname"),
    (lambda s: setattr(s.inventory, "cpu_count", -2), "status.inventory.cpu_count"),
    (lambda s: setattr(s.inventory, "host_memory_bytes", 2**62), "status.inventory.host_memory_bytes"),
    (lambda s: s.inventory.ClearField("gpus"), "status.inventory.gpus"),
    # GPUs left out (MIG mode): indices and UUIDs of their own, a one-line reason, bounded in number.
    (lambda s: s.inventory.left_out.add(index=2, uuid="GPU-x", model="A100-80GB", reason="MIG"),
     "status.inventory.left_out[0].index"),
    (lambda s: s.inventory.left_out.add(index=64, uuid="GPU-x", model="A100-80GB", reason="MIG"),
     "status.inventory.left_out[0].index"),
    (lambda s: s.inventory.left_out.add(index=5, uuid="GPU-00000001-aaaa", model="A100-80GB", reason="MIG"),
     "status.inventory.left_out[0].uuid"),
    (lambda s: s.inventory.left_out.add(index=5, uuid="GPU-x", model="A100\x1b[2J", reason="MIG"),
     "status.inventory.left_out[0].model"),
    (lambda s: s.inventory.left_out.add(index=5, uuid="GPU-x", model="A100-80GB", reason=""),
     "status.inventory.left_out[0].reason"),
    (lambda s: s.inventory.left_out.add(index=5, uuid="GPU-x", model="A100-80GB", reason="MIG\nforged line"),
     "status.inventory.left_out[0].reason"),
    (lambda s: s.inventory.left_out.extend(S.LeftOutGpu(index=i, uuid=f"L{i}", model="A100-80GB", reason="MIG")
                                           for i in range(4, 100)), "status.inventory.left_out"),
    (lambda s: setattr(s, "node_id", "Node A"), "status.node_id"),
    (lambda s: setattr(s, "node_id", ""), "status.node_id"),
    (lambda s: setattr(s, "address", "10.0.0.1"), "status.address"),
    (lambda s: setattr(s, "address", "10.0.0.1:99999"), "status.address"),
    (lambda s: setattr(s, "address", "host;rm -rf /:1"), "status.address"),
    (lambda s: setattr(s, "agent_version", "v\u202e1"), "status.agent_version"),
    (lambda s: setattr(s, "agent_commit", "\x1b[2Jdeadbeef"), "status.agent_commit"),
    (lambda s: setattr(s, "agent_commit", "f" * 65), "status.agent_commit"),
    (lambda s: setattr(s, "gpu_isolation", 99), "status.gpu_isolation"),
    (lambda s: setattr(s, "gpu_isolation_note", "not root\x1b[2J"), "status.gpu_isolation_note"),
    (lambda s: setattr(s, "gpu_isolation_note", "x" * 301), "status.gpu_isolation_note"),
    (lambda s: s.workers.extend(A.WorkerStatus(job_id="j-1") for _ in range(5000)), "status.workers"),
    (lambda s: setattr(s.workers[0], "job_id", "../../etc"), "status.workers[0].job_id"),
    (lambda s: setattr(s.workers[0], "rank", -1), "status.workers[0].rank"),
    (lambda s: setattr(s.workers[0], "state", 99), "status.workers[0].state"),
    (lambda s: s.workers[0].gpu_indices.append(64), "status.workers[0].gpu_indices"),
    (lambda s: s.workers[0].gpu_indices.append(-1), "status.workers[0].gpu_indices"),
    (lambda s: s.attempt_marks.extend(A.AttemptMark(job_id=f"j-{i}", attempt=1) for i in range(2001)),
     "status.attempt_marks"),
    (lambda s: s.attempt_marks.add(job_id="../x", attempt=1), "status.attempt_marks[0].job_id"),
    (lambda s: s.attempt_marks.add(job_id="j-1", attempt=-4), "status.attempt_marks[0].attempt"),
])
def test_forged_statuses_are_refused_naming_the_field(mutate: object, field: str) -> None:
    assert _forged(mutate)[:1] == [field]


def test_inventory_files_share_the_node_bounds() -> None:
    with pytest.raises(InventoryError, match="at most 64"):
        parse_inventory({"gpus": [{"model": "A100", "count": 64}, {"model": "A40", "count": 1}]})


def test_features_are_bounded_names() -> None:
    assert nodespec.status_errors(status(features=["rendezvous-key", "x-1"])) == []
    for bad in (["Rendezvous"], [""], ["a" * 65], ["ok"] * 17, ["semi;colon"]):
        assert [f for f, _ in nodespec.status_errors(status(features=bad))] == ["status.features"], bad
