"""Declared inventory parsing (golden output, errors naming the field) and NVML probing with a fake NVML."""

from __future__ import annotations

import types
from pathlib import Path

import pytest
from google.protobuf import text_format

from tessera.common import nodespec
from tessera.nodeagent.inventory import (
    HostFacts,
    InventoryError,
    NvmlUnavailable,
    load_declared,
    parse_declared,
    probe_nvml,
)
from tessera.v1 import common_pb2

HOST = HostFacts(hostname="gpu-a", cpu_count=64, memory_bytes=512 * 1024**3)

DECLARED = """\
gpus:
  - model: a100-80gb
    count: 2
    nvlink: true
  - model: T4
    count: 1
    memory_gb: 15.5
"""

GOLDEN = """\
source: INVENTORY_SOURCE_DECLARED
gpus {
  uuid: "DECLARED-node-a-0"
  model: "A100-80GB"
  memory_bytes: 80000000000
  nvlink_peers: 1
}
gpus {
  index: 1
  uuid: "DECLARED-node-a-1"
  model: "A100-80GB"
  memory_bytes: 80000000000
  nvlink_peers: 0
}
gpus {
  index: 2
  uuid: "DECLARED-node-a-2"
  model: "T4-16GB"
  memory_bytes: 15500000000
}
hostname: "gpu-a"
cpu_count: 64
host_memory_bytes: 549755813888
"""


def test_declared_golden(tmp_path: Path) -> None:
    path = tmp_path / "inv.yaml"
    path.write_text(DECLARED)
    inv = load_declared(path, "node-a", HOST)
    assert text_format.MessageToString(inv) == GOLDEN


def test_declared_nvlink_groups_are_separate() -> None:
    doc = {
        "gpus": [{"model": "H100", "count": 4, "nvlink": True}, {"model": "H100", "count": 2, "nvlink": True}]
    }
    inv = parse_declared(doc, "n", HOST)
    assert [list(g.nvlink_peers) for g in inv.gpus] == [[1, 2, 3], [0, 2, 3], [0, 1, 3], [0, 1, 2], [5], [4]]
    assert {g.model for g in inv.gpus} == {"H100-80GB"}


def test_declared_without_nvlink_has_no_peers() -> None:
    inv = parse_declared({"gpus": [{"model": "A10", "count": 3}]}, "n", HOST)
    assert all(not g.nvlink_peers for g in inv.gpus)
    assert inv.gpus[0].memory_bytes == 24 * 10**9  # the catalog's memory for the model


def test_example_inventories_load() -> None:
    examples = Path(__file__).resolve().parents[2] / "examples" / "inventories"
    files = sorted(examples.glob("*.yaml"))
    # An empty glob would pass the loop below: name the inventories the examples ship.
    assert [f.name for f in files] == ["a10-node.yaml", "a100-node.yaml", "a40-node.yaml"]
    for f in files:
        inv = load_declared(f, "demo")
        assert inv.source == common_pb2.INVENTORY_SOURCE_DECLARED and inv.gpus


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"gpus": [{"model": "X100", "count": 1}]}, "gpus[0].model: unknown GPU model 'X100'"),
        ({"gpus": [{"count": 1}]}, "gpus[0].model: required"),
        ({"gpus": [{"model": "A100", "count": 0}]}, "gpus[0].count: must be an integer in 1..64, got 0"),
        ({"gpus": [{"model": "A100", "count": 65}]}, "gpus[0].count: must be an integer in 1..64"),
        ({"gpus": [{"model": "A100", "count": "4"}]}, "gpus[0].count: must be an integer"),
        ({"gpus": [{"model": "A100", "count": True}]}, "gpus[0].count: must be an integer"),
        ({"gpus": [{"model": "A100"}]}, "gpus[0].count: must be an integer in 1..64, got None"),
        (
            {"gpus": [{"model": "A100", "count": 1}, {"model": "A100", "count": 1, "memory_gb": 0}]},
            "gpus[1].memory_gb: must be a number in (0, 1024]",
        ),
        ({"gpus": [{"model": "A100", "count": 1, "memory_gb": 2000}]}, "gpus[0].memory_gb"),
        ({"gpus": [{"model": "A100", "count": 1, "nvlink": "yes"}]}, "gpus[0].nvlink: must be true or false"),
        ({"gpus": [{"model": "A100", "count": 1, "nvlnk": True}]}, "gpus[0].nvlnk: unknown key"),
        ({"gpus": []}, "gpus: must be a non-empty list"),
        ({"gpu": []}, "gpu: unknown key"),
        ({}, "gpus: must be a non-empty list"),
        ([1, 2], "inventory: must be a mapping"),
        ({"gpus": ["A100"]}, "gpus[0]: must be a mapping"),
    ],
)
def test_declared_errors_name_the_field(doc: object, message: str) -> None:
    with pytest.raises(InventoryError) as err:
        parse_declared(doc, "n", HOST)
    assert message in str(err.value)


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="cannot read"):
        load_declared(tmp_path / "nope.yaml", "n", HOST)


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("gpus: [\n")
    with pytest.raises(InventoryError, match="not valid YAML"):
        load_declared(path, "n", HOST)
    path.write_text("gpus:\n  - model: nope\n    count: 1\n")
    with pytest.raises(InventoryError, match=r"bad\.yaml line 2: field gpus\[0\]\.model"):
        load_declared(path, "n", HOST)


# --- NVML, through a fake module ----------------------------------------------------------------------


class FakeNVMLError(Exception):
    pass


def fake_nvml(
    gpus: list[tuple[str, int]],
    procs: dict[int, list[tuple[int, int | None]]] | None = None,
    p2p: set[frozenset[int]] | None = None,
    fail_init: bool = False,
    p2p_supported: bool = True,
) -> types.SimpleNamespace:
    procs = procs or {}
    p2p = p2p or set()
    calls: list[str] = []

    def init() -> None:
        calls.append("init")
        if fail_init:
            raise FakeNVMLError("Driver Not Loaded")

    def p2p_status(a: int, b: int, cap: int) -> int:
        if not p2p_supported:
            raise FakeNVMLError("Not Supported")
        return 0 if frozenset((a, b)) in p2p else 4

    def compute(h: int) -> list[types.SimpleNamespace]:
        return [types.SimpleNamespace(pid=pid, usedGpuMemory=mem) for pid, mem in procs.get(h, [])]

    def graphics(h: int) -> list[types.SimpleNamespace]:
        raise FakeNVMLError("Not Supported")

    def nvlink_state(h: int, link: int) -> int:
        raise FakeNVMLError("Not Supported")

    return types.SimpleNamespace(
        NVMLError=FakeNVMLError,
        NVML_P2P_CAPS_INDEX_NVLINK=2,
        NVML_P2P_STATUS_OK=0,
        NVML_FEATURE_ENABLED=1,
        NVML_NVLINK_MAX_LINKS=2,
        calls=calls,
        nvmlInit=init,
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: len(gpus),
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetName=lambda h: gpus[h][0].encode() if h % 2 else gpus[h][0],  # bytes on old releases
        nvmlDeviceGetMemoryInfo=lambda h: types.SimpleNamespace(total=gpus[h][1]),
        nvmlDeviceGetUUID=lambda h: f"GPU-{h:04d}",
        nvmlDeviceGetP2PStatus=p2p_status,
        nvmlDeviceGetComputeRunningProcesses=compute,
        nvmlDeviceGetGraphicsRunningProcesses=graphics,
        nvmlDeviceGetNvLinkState=nvlink_state,
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(busId=f"0000:{h:02x}:00.0"),
    )


def test_probe_nvml_maps_names_peers_and_foreign_memory() -> None:
    gb = 10**9
    nv = fake_nvml(
        [
            ("NVIDIA A100-SXM4-80GB", 80 * gb),
            ("NVIDIA A100-SXM4-80GB", 80 * gb),
            ("NVIDIA Quantum Q9000", 8 * gb),
        ],
        procs={0: [(999_999_991, 3 * gb), (4242, 5 * gb)], 1: [(999_999_992, None)]},
        p2p={frozenset((0, 1))},
    )
    # 4242 is a worker's session leader: its memory is the agent's own, not foreign.
    inv = probe_nvml(own_pids={4242}, nvml=nv, host=HOST)  # type: ignore[arg-type]
    assert inv.source == common_pb2.INVENTORY_SOURCE_NVML
    assert [g.model for g in inv.gpus] == ["A100-80GB", "A100-80GB", "NVIDIA Quantum Q9000"]
    assert [g.uuid for g in inv.gpus] == ["GPU-0000", "GPU-0001", "GPU-0002"]
    assert [list(g.nvlink_peers) for g in inv.gpus] == [[1], [0], []]
    assert [g.foreign_used_bytes for g in inv.gpus] == [3 * gb, 0, 0]
    assert inv.gpus[0].memory_bytes == 80 * gb
    assert (inv.hostname, inv.cpu_count) == ("gpu-a", 64)
    assert nv.calls == ["init", "shutdown"]
    seen: dict[int, set[int]] = {}
    probe_nvml(own_pids={4242}, nvml=nv, host=HOST, sessions=seen)  # type: ignore[arg-type]
    assert seen == {0: {4242}, 1: set(), 2: set()}  # the workers seen on each GPU (nodeagent/gpuguard.py)


def test_probe_nvml_without_p2p_query_reads_links() -> None:
    nv = fake_nvml([("Tesla V100-SXM2-32GB", 32 * 10**9)] * 2, p2p_supported=False)

    def state(h: int, link: int) -> int:
        if link == 0:
            return 1
        raise FakeNVMLError("Invalid Argument")

    nv.nvmlDeviceGetNvLinkState = state
    nv.nvmlDeviceGetNvLinkRemotePciInfo = lambda h, link: types.SimpleNamespace(
        busId=f"0000:{1 - h:02X}:00.0"
    )
    inv = probe_nvml(nvml=nv, host=HOST)  # type: ignore[arg-type]
    assert [list(g.nvlink_peers) for g in inv.gpus] == [[1], [0]]
    assert {g.model for g in inv.gpus} == {"V100-32GB"}


def test_probe_nvml_unavailable() -> None:
    with pytest.raises(NvmlUnavailable, match="Driver Not Loaded"):
        probe_nvml(nvml=fake_nvml([], fail_init=True), host=HOST)  # type: ignore[arg-type]


def test_declared_cpus_and_host_memory_replace_the_machines() -> None:
    """A declared node may declare its host (tests stand in for larger machines); without, the OS's."""
    doc = {"gpus": [{"model": "A100", "count": 2}], "cpus": 16, "host_memory_gb": 128}
    inv = parse_declared(doc, "node-a", HOST)
    assert (inv.cpu_count, inv.host_memory_bytes) == (16, 128 * 10**9)
    plain = parse_declared({"gpus": [{"model": "A100", "count": 2}]}, "node-a", HOST)
    assert (plain.cpu_count, plain.host_memory_bytes) == (64, 512 * 1024**3)


def test_probe_nvml_leaves_out_gpus_in_mig_mode() -> None:
    """CUDA gives a process one MIG slice of such a card, never the card: it is not offered, and
    says why; NVLink peers name only offered GPUs."""
    gb = 10**9
    nv = fake_nvml([("NVIDIA A100-SXM4-80GB", 80 * gb)] * 3, p2p={frozenset((0, 1)), frozenset((1, 2))})
    modes = {0: [0, 0], 1: [1, 1], 2: [0, 1]}  # (current, pending): GPU 2 turns MIG on at its next reset

    def mig_mode(h: int) -> list[int]:
        return modes[h]

    nv.nvmlDeviceGetMigMode = mig_mode
    nv.NVML_DEVICE_MIG_ENABLE = 1
    seen: dict[int, set[int]] = {}
    inv = probe_nvml(nvml=nv, host=HOST, sessions=seen)  # type: ignore[arg-type]
    assert [g.index for g in inv.gpus] == [0, 2]
    assert [list(g.nvlink_peers) for g in inv.gpus] == [[], []]
    assert [(g.index, g.uuid, g.model) for g in inv.left_out] == [(1, "GPU-0001", "A100-80GB")]
    assert inv.left_out[0].reason.startswith("MIG mode is on")
    assert set(seen) == {0, 2}
    assert nodespec.inventory_errors(inv, "inventory") == []


def test_probe_nvml_counts_gpus_without_mig_support_as_whole() -> None:
    """Before Ampere the query is Not Supported; an old nvidia-ml-py lacks it."""
    nv = fake_nvml([("Tesla V100-SXM2-32GB", 32 * 10**9)] * 2)

    def unsupported(h: int) -> list[int]:
        raise FakeNVMLError("Not Supported")

    nv.nvmlDeviceGetMigMode = unsupported
    assert [g.index for g in probe_nvml(nvml=nv, host=HOST).gpus] == [0, 1]  # type: ignore[arg-type]
    del nv.nvmlDeviceGetMigMode
    inv = probe_nvml(nvml=nv, host=HOST)  # type: ignore[arg-type]
    assert [g.index for g in inv.gpus] == [0, 1] and not inv.left_out


def test_probe_nvml_leaves_out_gpus_no_process_may_use() -> None:
    """Compute mode Prohibited: no CUDA context can be made on the GPU. Exclusive-process still runs
    one rank, so it is offered."""
    nv = fake_nvml([("NVIDIA H100 80GB HBM3", 80 * 10**9)] * 3)
    modes = {0: 0, 1: 2, 2: 3}  # default, prohibited, exclusive-process
    nv.nvmlDeviceGetComputeMode = lambda h: modes[h]
    nv.NVML_COMPUTEMODE_PROHIBITED = 2
    inv = probe_nvml(nvml=nv, host=HOST)  # type: ignore[arg-type]
    assert [g.index for g in inv.gpus] == [0, 2]
    assert [(g.index, g.reason.split(":")[0]) for g in inv.left_out] == [(1, "compute mode is Prohibited")]


def test_probe_nvml_leaves_out_gpus_that_need_a_recovery_action() -> None:
    """After a fault NVML names what the GPU needs before new work (a reset, a reboot); a field the
    driver does not know, or NONE, leaves it offered."""
    nv = fake_nvml([("NVIDIA H100 80GB HBM3", 80 * 10**9)] * 4)
    actions = {0: (0, 0), 1: (0, 1), 2: (0, 2), 3: (3, 1)}  # (field's nvmlReturn, action); 3: NOT_SUPPORTED

    def fields(h: int, ids: list[int]) -> list[types.SimpleNamespace]:
        assert ids == [230]
        ret, action = actions[h]
        return [types.SimpleNamespace(nvmlReturn=ret, value=types.SimpleNamespace(uiVal=action))]

    nv.nvmlDeviceGetFieldValues = fields
    nv.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION = 230
    inv = probe_nvml(nvml=nv, host=HOST)  # type: ignore[arg-type]
    assert [g.index for g in inv.gpus] == [0, 3]
    assert [(g.index, g.reason) for g in inv.left_out] == [
        (1, "NVML says the GPU needs a GPU reset before it takes new work (recovery action 1)"),
        (2, "NVML says the GPU needs a reboot of the node before it takes new work (recovery action 2)")]
    assert nodespec.inventory_errors(inv, "inventory") == []
    # tessera-agent --gpu-recovery-check off: for a driver that names an action on healthy GPUs
    assert [g.index for g in probe_nvml(nvml=nv, host=HOST, recovery_check=False).gpus] == [0, 1, 2, 3]  # type: ignore[arg-type]


def test_a_mig_card_nvml_says_little_about_leaves_the_others_whole() -> None:
    """In MIG mode NVML may refuse the card's memory (only a privileged caller reads it) and its
    peer-to-peer status: the card is still left out by name, the offered GPUs keep their NVLink
    peers (a review: the probe failed, or every GPU lost its peers)."""
    gb = 10**9
    nv = fake_nvml([("NVIDIA H100 80GB HBM3", 80 * gb)] * 3, p2p={frozenset((0, 2))})
    nv.nvmlDeviceGetMigMode = lambda h: [1, 1] if h == 1 else [0, 0]
    nv.NVML_DEVICE_MIG_ENABLE = 1
    memory, p2p = nv.nvmlDeviceGetMemoryInfo, nv.nvmlDeviceGetP2PStatus

    def refused_on_1(f):  # type: ignore[no-untyped-def]
        def call(h, *rest):  # type: ignore[no-untyped-def]
            if 1 in (h, *rest[:1]):
                raise FakeNVMLError("Insufficient Permissions")
            return f(h, *rest)
        return call

    nv.nvmlDeviceGetMemoryInfo, nv.nvmlDeviceGetP2PStatus = refused_on_1(memory), refused_on_1(p2p)
    inv = probe_nvml(nvml=nv, host=HOST)  # type: ignore[arg-type]
    assert [(g.index, list(g.nvlink_peers)) for g in inv.gpus] == [(0, [2]), (2, [0])]
    assert [(g.index, g.model) for g in inv.left_out] == [(1, "NVIDIA H100 80GB HBM3")]
    assert nodespec.inventory_errors(inv, "inventory") == []
    nv.nvmlDeviceGetMigMode = lambda h: [0, 0]
    with pytest.raises(NvmlUnavailable, match="cannot read the memory of GPU 1: Insufficient Permissions"):
        probe_nvml(nvml=nv, host=HOST)  # type: ignore[arg-type]  # an offered GPU: no inventory
