"""Device isolation on the real kernel (nodeagent/devicefilter.py): a keeper started with --gpu-minors
puts its worker in a cgroup whose eBPF device program refuses every NVIDIA GPU but its own.

No GPU is needed: the kernel checks a device file's major and minor numbers before any driver is
asked, so device nodes made here with mknod (195:N, as /dev/nvidiaN) stand in. Opening one the
program allows fails with ENXIO (no driver behind it); one it refuses fails with EPERM. Skipped
where the tests are not root or the kernel has no cgroup v2 with device programs (then the agent's
--device-isolation auto is off too).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from tessera.common.localcluster import wait_for
from tessera.nodeagent import devicefilter, keeperfiles
from tessera.nodeagent.agent import Agent
from tessera.nodeagent.keeping import Keepers
from tessera.nodeagent.supervisor import Supervisor
from tessera.nodeagent.testing import FakeRegistry, launch_request, wait_until
from tessera.v1 import agent_pb2_grpc, common_pb2
from tests.integration.test_agent_grpc import (
    EPOCH,
    TIMEOUT,
    controller_channel,
    make_agent,
    registered,
    registry,
    worker_in,
)
from tests.integration.test_agent_keeper import attempt, start
from tests.workerenv import worker_dir, worker_python

__all__ = ["registry", "worker_dir"]

AVAILABLE, WHY = devicefilter.probe()
pytestmark = pytest.mark.skipif(not AVAILABLE, reason=f"no device isolation here: {WHY}")
MINORS = (0, 1, 2, 3, 255)  # four GPUs and nvidiactl
# Opens each device node named on its command line and prints {name: errno name}; then its cgroup.
PROBE = (
    "import errno, json, os, sys\n"
    "out = {}\n"
    "for p in sys.argv[1:]:\n"
    "    try:\n"
    "        os.close(os.open(p, os.O_RDWR))\n"
    "        out[os.path.basename(p)] = 'opened'\n"
    "    except OSError as e:\n"
    "        out[os.path.basename(p)] = errno.errorcode[e.errno]\n"
    "print(json.dumps(out))\n"
    "print(open('/proc/self/cgroup').read().strip().splitlines()[-1])\n"
)


@pytest.fixture
def nodes(worker_dir: Path) -> Path:
    """nvidia0..3 and nvidiactl as character devices 195:N that anyone may open (none has a driver)."""
    d = worker_dir / "dev"
    d.mkdir(mode=0o755)
    for m in MINORS:
        path = d / ("nvidiactl" if m == 255 else f"nvidia{m}")
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(devicefilter.NVIDIA_MAJOR, m))
        path.chmod(0o666)
    return d


def argv(nodes: Path) -> list[str]:
    return [worker_python(), "-c", PROBE, *(str(p) for p in sorted(nodes.iterdir()))]


def opened(log: str) -> tuple[dict[str, str], str]:
    lines = [x for x in log.splitlines() if not x.startswith("tessera-")]
    return json.loads(lines[0]), lines[1]


def test_a_confined_worker_opens_its_own_gpus_only_and_its_cgroup_goes_with_it(worker_dir: Path, nodes: Path) -> None:
    d = attempt(worker_dir)
    keeper = start(worker_dir, argv(nodes), "--gpu-minors", "1,3")
    assert keeper.wait(30) == 0
    result, cgroup = opened((d / "rank-0.log").read_text())
    assert result == {"nvidia0": "EPERM", "nvidia1": "ENXIO", "nvidia2": "EPERM", "nvidia3": "ENXIO",
                      "nvidiactl": "ENXIO"}
    name = cgroup.rsplit("/", 1)[1]
    assert cgroup.startswith("0::/") and name.startswith(f"{devicefilter.CGROUP_PREFIX}{keeper.pid}-")
    assert not (devicefilter.own_dir() / name).exists()  # removed at the end
    assert keeperfiles.read_exit(keeperfiles.exit_path(d, 0)) == (0, "")


def test_without_gpu_minors_every_gpu_opens_and_with_none_given_none_does(worker_dir: Path, nodes: Path) -> None:
    d = attempt(worker_dir)
    assert start(worker_dir, argv(nodes)).wait(30) == 0
    free, _ = opened((d / "rank-0.log").read_text())
    assert set(free.values()) == {"ENXIO"}
    (d / "rank-0.log").unlink()
    assert start(worker_dir, argv(nodes), "--gpu-minors", "").wait(30) == 0
    none, _ = opened((d / "rank-0.log").read_text())
    assert none == {"nvidia0": "EPERM", "nvidia1": "EPERM", "nvidia2": "EPERM", "nvidia3": "EPERM",
                    "nvidiactl": "ENXIO"}


def test_the_worker_cannot_leave_its_cgroup(worker_dir: Path, nodes: Path) -> None:
    d = attempt(worker_dir)
    home = devicefilter.own_dir()
    code = (f"import os\ntry:\n    open('{home}/cgroup.procs', 'w').write(str(os.getpid()))\n"
            "    print('left')\nexcept OSError as e:\n    print('stayed', e.strerror)\n"
            f"os.open('{nodes}/nvidia0', os.O_RDWR)\n")
    assert start(worker_dir, [worker_python(), "-c", code], "--gpu-minors", "1").wait(30) == 1
    log = (d / "rank-0.log").read_text()
    assert "stayed Permission denied" in log and "PermissionError" in log


def test_bad_gpu_minors_are_a_usage_error_before_anything_starts(worker_dir: Path) -> None:
    d = attempt(worker_dir)
    assert start(worker_dir, ["/bin/true"], "--gpu-minors", "0,x").wait(30) == 2
    assert "--gpu-minors: '0,x' is not a comma-separated list" in (d / "rank-0.log").read_text()


def test_a_cgroup_that_cannot_be_made_is_an_error_and_a_program_for_every_gpu_loads() -> None:
    home = devicefilter.own_dir()
    taken = home / f"{devicefilter.CGROUP_PREFIX}{os.getpid()}-test"
    taken.mkdir()
    try:
        with pytest.raises(devicefilter.DeviceFilterError, match=f"cannot make the cgroup {taken}: File exists"):
            devicefilter.Confinement.create([0], name=taken.name)
    finally:
        taken.rmdir()
    # 254 GPUs: a verifier log of 4 KiB made the kernel refuse programs from 27 GPUs on (ENOSPC).
    os.close(devicefilter.load(range(254)))
    made = devicefilter.Confinement.create(range(254))
    assert made.path.name.startswith(f"{devicefilter.CGROUP_PREFIX}{os.getpid()}-")
    made.remove()
    assert not made.path.exists()


def test_prune_removes_the_cgroups_of_keepers_that_are_gone_and_kills_what_they_left() -> None:
    # A home of this test's own: a real agent's sweep (or a second run of this suite) on the same host
    # would prune cgroups of the prefix below the shared one, and a race lost there failed CI once.
    home = devicefilter.own_dir() / f"tessera-test-{os.getpid()}-{os.urandom(4).hex()}"
    home.mkdir()
    dead = home / f"{devicefilter.CGROUP_PREFIX}999999999-0a1b"
    left = home / f"{devicefilter.CGROUP_PREFIX}999999998-2c3d"
    alive = home / f"{devicefilter.CGROUP_PREFIX}{os.getpid()}-4e5f"
    for p in (dead, left, alive):
        p.mkdir()
    orphan = subprocess.Popen(["sleep", "600"])
    try:
        (left / "cgroup.procs").write_text(str(orphan.pid))  # a worker's child its SIGKILLed keeper left
        assert dead in devicefilter.prune(home)
        assert orphan.wait(10) == -signal.SIGKILL
        wait_for(lambda: left in devicefilter.prune(home), 10, "the emptied cgroup to go")
        assert not dead.exists() and not left.exists() and alive.exists()
    finally:
        orphan.kill()
        for p in (dead, left, alive, home):
            if p.exists():
                p.rmdir()


@pytest.fixture
async def isolated(registry: tuple[FakeRegistry, str], worker_dir: Path) -> AsyncIterator[Agent]:
    # The declared inventory's indices stand for minor numbers (inventory.minor_numbers).
    a = make_agent(registry[1], worker_dir, gpu_minors={0: 0, 1: 1, 2: 2, 3: 3})
    await a.start()
    yield a
    await a.close(grace=0)


async def test_an_agent_launch_confines_each_rank_to_its_attempts_gpus_on_the_node(
        registry: tuple[FakeRegistry, str], isolated: Agent, nodes: Path) -> None:
    fake, _ = registry
    await registered(isolated)
    status = fake.last_status()
    assert status is not None and status.gpu_isolation == common_pb2.GPU_ISOLATION_DEVICE_CGROUPS
    channel = controller_channel(isolated)
    try:
        req = launch_request("job-1", argv=argv(nodes), gpus=[[0], [2, 3]], epoch=EPOCH)
        await agent_pb2_grpc.NodeAgentStub(channel).Launch(req, timeout=5)

        def ended() -> bool:
            return all((w := worker_in(fake.last_status(), "job-1", r)) is not None
                       and w.state == common_pb2.WORKER_STATE_EXITED for r in (0, 1))

        await wait_until(ended, TIMEOUT, "both ranks to exit")
    finally:
        await channel.close()
    results = []
    for r in (0, 1):
        w = worker_in(fake.last_status(), "job-1", r)
        assert w is not None and w.exit_code == 0, w
        results.append(opened(Path(w.log_path).read_text())[0])
    # Each rank may open every GPU of its attempt on this node (NCCL's peer-to-peer between local
    # ranks opens the peer's), and no other.
    assert results[0] == results[1] == {"nvidia0": "ENXIO", "nvidia1": "EPERM", "nvidia2": "ENXIO",
                                        "nvidia3": "ENXIO", "nvidiactl": "ENXIO"}


async def test_on_an_nvml_node_a_confined_rank_reads_its_gpus_numbered_as_its_cgroup_shows_them(
        worker_dir: Path, nodes: Path) -> None:
    # declared=False: the environment a GPU node gives (minors here are the node's own device nodes).
    keepers = Keepers(worker_dir / keeperfiles.FENCE_FILE, gpu_minors={0: 0, 1: 1, 2: 2, 3: 3})
    sup = Supervisor(worker_dir, range(4), declared=False, keepers=keepers, poll_interval=0.05,
                     worker_python=worker_python())
    code = PROBE + "print(os.environ['CUDA_VISIBLE_DEVICES'])\n"
    req = launch_request("job-1", argv=[worker_python(), "-c", code, *(str(p) for p in sorted(nodes.iterdir()))],
                         gpus=[[3, 2]])  # one rank: the attempt's GPUs here are its own
    await sup.launch(req)
    assert await sup.wait_exited("job-1", 1, TIMEOUT)
    log = Path(sup.statuses()[0].log_path).read_text()
    result, _ = opened(log)
    assert result == {"nvidia0": "EPERM", "nvidia1": "EPERM", "nvidia2": "ENXIO", "nvidia3": "ENXIO",
                      "nvidiactl": "ENXIO"}
    # CUDA would enumerate nvidia2 as 0 and nvidia3 as 1: the rank's order (3, 2) is "1,0".
    assert [x for x in log.splitlines() if not x.startswith("tessera-")][2] == "1,0"
