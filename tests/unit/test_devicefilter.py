"""Device isolation's pure parts (nodeagent/devicefilter.py): the eBPF program, run here by a small
interpreter of the few instructions it uses, the cgroup paths read from /proc, and how the agent
passes each rank's GPUs to its keeper. The kernel's side is tests/integration/test_device_isolation.py."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import pytest

from tessera.nodeagent import cgroups, contract, devicefilter, inventory, keeper, main
from tessera.nodeagent.inventory import HostFacts, parse_declared
from tessera.nodeagent.keeping import Keepers
from tessera.nodeagent.testing import launch_request
from tessera.nodeagent.users import build
from tessera.v1 import common_pb2

CHAR, BLOCK = 2, 1
READ_WRITE = (2 | 4) << 16  # BPF_DEVCG_ACC_READ | BPF_DEVCG_ACC_WRITE, in access_type's high bits


def run(code: bytes, access_type: int, major: int, minor: int) -> int:
    """Execute the program on one device context, as the kernel would; fails on anything else."""
    ctx = (access_type, major, minor)
    regs = [0] * 11
    pc = 0
    for _ in range(1000):
        op, regbyte, off, imm = struct.unpack_from("<BBhi", code, pc * 8)
        dst, src = regbyte & 0xF, regbyte >> 4
        pc += 1
        if op == 0x61:  # r_dst = *(u32 *)(ctx + off)
            assert src == 1 and off % 4 == 0
            regs[dst] = ctx[off // 4]
        elif op == 0x57:
            regs[dst] &= imm
        elif op == 0xB7:
            regs[dst] = imm
        elif op in (0x15, 0x55, 0x35):
            taken = {0x15: regs[dst] == imm, 0x55: regs[dst] != imm, 0x35: regs[dst] >= imm}[op]
            pc += off if taken else 0
        elif op == 0x95:
            return regs[0]
        else:
            raise AssertionError(f"unknown instruction {op:#x}")
    raise AssertionError("no exit")


def allows(allowed: list[int], major: int, minor: int, kind: int = CHAR) -> bool:
    return run(devicefilter.program(allowed), READ_WRITE | kind, major, minor) == 1


def test_the_program_allows_the_given_gpus_the_shared_nodes_and_every_other_device() -> None:
    given = [1, 5]
    assert [m for m in range(254) if allows(given, 195, m)] == [1, 5]
    assert allows(given, 195, 254) and allows(given, 195, 255)  # nvidia-modeset, nvidiactl
    assert allows(given, 1, 3) and allows(given, 1, 5)  # /dev/null, /dev/zero
    assert allows(given, 508, 0) and allows(given, 237, 1)  # nvidia-uvm, nvidia-caps (dynamic majors)
    assert allows(given, 195, 0, kind=BLOCK)  # a block device 195:0 is no GPU
    assert [m for m in range(256) if not allows([], 195, m)] == list(range(254))
    # Minors outside a GPU's range are ignored rather than encoded.
    assert devicefilter.program([1, 300, 254, -1]) == devicefilter.program([1])
    assert len(devicefilter.program(range(254))) == (4 + 3 + 254 + 4) * 8


def test_mountinfo_and_proc_cgroup_give_the_unified_folder() -> None:
    pure = ("24 30 0:22 / /sys/fs/cgroup rw,nosuid shared:9 - cgroup2 cgroup2 rw,nsdelegate\n"
            "25 30 0:23 / /proc rw - proc proc rw\n")
    hybrid = ("30 25 0:26 / /sys/fs/cgroup ro - tmpfs tmpfs ro\n"
              "31 30 0:27 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw\n"
              "32 30 0:28 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n")
    assert devicefilter.unified_mount(pure) == Path("/sys/fs/cgroup")
    assert devicefilter.unified_mount(hybrid) == Path("/sys/fs/cgroup/unified")
    assert devicefilter.unified_mount("32 30 0:28 / /sys/fs/cgroup/devices rw - cgroup cgroup rw,devices\n") is None
    assert devicefilter.unified_mount("9 1 0:5 / /mnt/my\\040cg rw - cgroup2 none rw\n") == Path("/mnt/my cg")
    assert devicefilter.current_cgroup("0::/system.slice/tessera-agent.service\n") == "/system.slice/tessera-agent.service"
    assert devicefilter.current_cgroup("5:devices:/\n1:name=systemd:/\n0::/\n") == "/"
    assert devicefilter.current_cgroup("5:devices:/x\n") is None


def test_keeper_takes_gpu_minors() -> None:
    base = ["--spec-fd", "5", "--exit-file", "/x/e", "--fence-file", "/x/f", "--uid", "65534", "--gid", "65534"]
    assert keeper.parse_args(base).gpu_minors is None
    assert keeper.parse_args([*base, "--gpu-minors", "3,0"]).gpu_minors == [3, 0]
    assert keeper.parse_args([*base, "--gpu-minors", ""]).gpu_minors == []
    for bad, why in [("a", "is not a comma-separated list"), ("-1", "a minor number is in"),
                     (str(1 << 20), "a minor number is in")]:
        with pytest.raises(keeper.UsageError, match=why):
            keeper.parse_args([*base, "--gpu-minors", bad])


def test_keepers_pass_each_rank_its_gpus_minors_and_delegate_the_scope(tmp_path: Path) -> None:
    k = Keepers(tmp_path / "fence.json", users=build())
    user = k.users.default
    assert "--gpu-minors" not in k.argv(5, tmp_path / "e", user, "j/1/0", gpus=[0, 1])
    k.gpu_minors = {0: 4, 1: 6, 2: 7}
    out = k.argv(5, tmp_path / "e", user, "j/1/0", gpus=[2, 0])
    assert out[out.index("--gpu-minors") + 1] == "7,4"
    out = k.argv(5, tmp_path / "e", user, "j/1/1", gpus=[])
    assert out[out.index("--gpu-minors") + 1] == ""  # a rank without GPUs may open none
    with pytest.raises(ValueError, match="no minor number is known for GPU 3 of this node"):
        k.argv(5, tmp_path / "e", user, "j/1/0", gpus=[0, 3])
    assert "--property=Delegate=yes" in cgroups.scope_prefix("j", 1, 0, delegate=True)
    assert "--property=Delegate=yes" not in cgroups.scope_prefix("j", 1, 0)


class FakeNvml:
    class NVMLError(Exception):
        pass

    def __init__(self, minors: dict[int, int], fail: bool = False, missing_fails: bool = False) -> None:
        self.minors, self.fail, self.missing_fails = minors, fail, missing_fails

    def nvmlInit(self) -> None: ...

    def nvmlShutdown(self) -> None: ...

    def nvmlDeviceGetHandleByIndex(self, i: int) -> int:
        return i

    def nvmlDeviceGetMinorNumber(self, h: int) -> int:
        if self.fail or (self.missing_fails and h not in self.minors):
            raise self.NVMLError("Not Supported")
        return self.minors[h]


def test_minor_numbers_come_from_nvml_and_a_declared_inventory_uses_its_indices() -> None:
    declared = parse_declared({"gpus": [{"model": "A100-80GB", "count": 3}]}, "n", HostFacts("h", 8, 1 << 30))
    assert inventory.minor_numbers(declared) == {0: 0, 1: 1, 2: 2}
    probed = common_pb2.NodeInventory(source=common_pb2.INVENTORY_SOURCE_NVML,
                                      gpus=[common_pb2.Gpu(index=0), common_pb2.Gpu(index=1)])
    nv: Any = FakeNvml({0: 2, 1: 0})
    assert inventory.minor_numbers(probed, nv) == {0: 2, 1: 0}
    # A GPU left out now (a recovery action) is offered again once it clears: its minor is known.
    probed.left_out.add(index=2, uuid="GPU-2", model="A100-80GB", reason="NVML says the GPU needs a GPU reset")
    assert inventory.minor_numbers(probed, FakeNvml({0: 2, 1: 0, 2: 1})) == {0: 2, 1: 0, 2: 1}  # type: ignore[arg-type]
    # One NVML cannot answer for (a faulted GPU) is left without: isolation stays on for the others.
    assert inventory.minor_numbers(probed, FakeNvml({0: 2, 1: 0}, missing_fails=True)) == {0: 2, 1: 0}  # type: ignore[arg-type]
    with pytest.raises(inventory.NvmlUnavailable, match="cannot give the GPUs' minor numbers: Not Supported"):
        inventory.minor_numbers(probed, FakeNvml({}, fail=True))  # type: ignore[arg-type]


def test_device_isolation_modes(monkeypatch: pytest.MonkeyPatch) -> None:
    declared = parse_declared({"gpus": [{"model": "A100-80GB", "count": 2}]}, "n", HostFacts("h", 8, 1 << 30))
    monkeypatch.setattr(main, "isolation_available", lambda: (False, "the agent is not root"))
    assert main.gpu_minors("off", declared) == (None, "--device-isolation off")
    assert main.gpu_minors("auto", declared) == (None, "the agent is not root")
    with pytest.raises(main.AgentUsageError, match="--device-isolation on: the agent is not root"):
        main.gpu_minors("on", declared)
    monkeypatch.setattr(main, "isolation_available", lambda: (False, "no cgroup2\nmount \x1b here"))
    assert main.gpu_minors("auto", declared) == (None, "no cgroup2 mount ? here")  # one printable line
    monkeypatch.setattr(main, "isolation_available", lambda: (True, ""))
    assert main.gpu_minors("on", declared) == main.gpu_minors("auto", declared) == ({0: 0, 1: 1}, "")
    assert main.gpu_minors("off", declared) == (None, "--device-isolation off")
    args = main.build_parser().parse_args(["--controller", "c:1", "--node-id", "n", "--work-dir", "/w"])
    assert args.device_isolation == "auto"
    with pytest.raises(main.AgentUsageError, match="--device-isolation: invalid choice: 'yes'"):
        main.build_parser().parse_args(["--controller", "c:1", "--node-id", "n", "--work-dir", "/w",
                                        "--device-isolation", "yes"])


def test_a_confined_rank_names_its_gpus_as_cuda_numbers_them_in_its_cgroup() -> None:
    assert contract.visible_devices([2, 3]) == "2,3"
    assert contract.visible_devices([2, 3], confined_to=[2, 3]) == "0,1"
    assert contract.visible_devices([5, 1, 3], confined_to=[1, 3, 5]) == "2,0,1"  # the rank's order kept
    # The cgroup lets every local rank of the attempt open all of the attempt's GPUs here (NCCL's
    # peer-to-peer): the second rank's GPU 6 is CUDA's device 2 in it.
    req = launch_request(gpus=[[1, 3], [6]])
    assert contract.node_gpus(req) == [1, 3, 6]
    assert contract.visible_devices([6], confined_to=contract.node_gpus(req)) == "2"
    assert contract.visible_devices([], confined_to=[]) == ""


def test_under_systemd_the_probe_runs_in_a_delegated_scope_and_never_below_the_agents_unit(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(main.os, "geteuid", lambda: 0)
    ran: list[list[str]] = []
    monkeypatch.setattr(cgroups, "run_delegated", lambda argv: (ran.append(list(argv)), (True, "ok"))[1])
    monkeypatch.setattr(devicefilter, "probe", lambda: (True, "probed in the agent's own cgroup"))
    monkeypatch.setattr(cgroups, "systemd_runs", lambda: False)
    assert main.isolation_available() == (True, "probed in the agent's own cgroup") and not ran
    monkeypatch.setattr(cgroups, "systemd_runs", lambda: True)
    monkeypatch.setattr(cgroups, "probe", lambda: (False, "systemd-run --scope failed: Access denied"))
    ok, why = main.isolation_available()
    assert not ok and "keepers get no scope of their own (systemd-run --scope failed: Access denied)" in why
    assert not ran
    monkeypatch.setattr(cgroups, "probe", lambda: (True, ""))
    assert main.isolation_available() == (True, "ok")
    assert ran[0][1:] == ["-I", "-m", "tessera.nodeagent.devicefilter"]
    monkeypatch.setattr(main.os, "geteuid", lambda: 1000)
    assert main.isolation_available() == (False, "the agent is not root")


def test_ptrace_across_a_users_processes_is_told_from_yamas_scope(tmp_path: Path) -> None:
    scope = tmp_path / "ptrace_scope"
    assert main.ptrace_open(str(scope))  # no Yama: any process may trace another of its uid
    for text, open_ in (("0\n", True), ("1\n", False), ("3\n", False)):
        scope.write_text(text)
        assert main.ptrace_open(str(scope)) is open_


def test_the_systemd_scope_probe_runs_once_per_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The agent asks at start for isolation and again for its keepers' scopes: one systemd-run."""
    runs: list[list[str]] = []

    class Done:
        returncode, stderr = 0, b""

    def run(argv: list[str], **_: Any) -> Done:
        runs.append(argv)
        return Done()

    monkeypatch.setattr(cgroups, "systemd_runs", lambda: True)
    monkeypatch.setattr(cgroups.shutil, "which", lambda name: "/usr/bin/" + name)
    monkeypatch.setattr(cgroups.subprocess, "run", run)
    cgroups.probe.cache_clear()
    try:
        assert cgroups.probe() == (True, "") and cgroups.probe() == (True, "")
        assert len(runs) == 1 and runs[0][:2] == ["/usr/bin/systemd-run", "--scope"]
    finally:
        cgroups.probe.cache_clear()  # the next test's process state, not this fake's
