"""Command-line parsing and the addresses the agent reports (in process; the program itself is tested
in tests/integration/test_agent_process.py)."""

from __future__ import annotations

import argparse
import os
import socket
from pathlib import Path

import pytest

from tessera.nodeagent.agent import AgentConfig, advertise_host, join_host_port, local_host
from tessera.nodeagent.main import AgentUsageError, build_parser, parse_config


def test_parse_config_defaults(tmp_path: Path) -> None:
    work = tmp_path / "new" / "dir"
    config, args = parse_config(
        ["--controller", "ctl:50051", "--node-id", "gpu-07.rack2", "--work-dir", str(work), "--insecure"]
    )
    assert work.is_dir() and config.work_dir == work.resolve()
    assert (config.listen, config.advertise, config.kill_workers_on_exit) == ("127.0.0.1:0", None, False)
    assert args.inventory is None and args.log_level == "info" and args.gpu_recovery_check == "on"
    assert config.worker_threads is None
    config, _ = parse_config(["--controller", "c:1", "--node-id", "n", "--work-dir", str(work), "--worker-threads", "6",
                              "--insecure"])
    assert config.worker_threads == 6
    assert (config.job_disk_limit, config.min_free_disk, config.disk_check_seconds) == (0, 0, 30.0)
    config, _ = parse_config(["--controller", "c:1", "--node-id", "n", "--work-dir", str(work), "--insecure",
                              "--job-disk-limit", "50Gi", "--min-free-disk", "0.5%"])
    total = os.statvfs(work).f_blocks * os.statvfs(work).f_frsize
    assert (config.job_disk_limit, config.min_free_disk) == (50 * 2**30, int(total * 0.005))


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--node-id=-bad"], "--node-id: '-bad' does not match"),
        (["--node-id", "a" * 64], "--node-id: "),
        (["--controller", "ctl:0"], "--controller: 'ctl:0' is not host:port (port 1-65535; IPv6 as [addr]:port)"),
        (["--controller", "ctl:1,nohost"], "--controller: 'nohost' has no port: expected host:port, e.g. nohost:50054"),
        (["--listen", "localhost"], "--listen: 'localhost' has no port: expected host:port, e.g. localhost:7070"),
        (["--listen", "unix:/run/agent.sock"], "--listen: 'unix:/run/agent.sock' is not host:port: the controller"),
        (["--metrics-listen", "nope"], "--metrics-listen: 'nope' has no port: expected host:port, e.g. nope:9452"),
        (["--metrics-listen", "0.0.0.0:9452"], "--metrics-listen: 0.0.0.0 is reachable from other machines"),
        (["--metrics-listen", "127.0.0.1:0", "--metrics-token-file", "/nonexistent/token"],
         "--metrics-token-file: /nonexistent/token: cannot read"),
        (["--metrics-token-file", "/nonexistent/token"], "--metrics-token-file: needs --metrics-listen"),
        (["--stop-grace", "-1"], "--stop-grace: must be >= 0"),
        (["--job-disk-limit", "lots"], "--job-disk-limit: 'lots' is not a size"),
        (["--min-free-disk", "120%"], "--min-free-disk: '120%' is not a percentage in 0..100"),
        (["--min-free-disk=-5G"], "--min-free-disk: '-5G' is not a size"),
        (["--disk-check-interval", "0"], "--disk-check-interval: must be in 0.1..86400 seconds"),
        (["--worker-threads", "0"], "--worker-threads: must be >= 1, got 0"),
    ],
)
def test_parse_config_errors(tmp_path: Path, extra: list[str], message: str) -> None:
    argv = ["--controller", "ctl:50051", "--node-id", "n1", "--work-dir", str(tmp_path), "--insecure", *extra]
    with pytest.raises(AgentUsageError) as err:
        parse_config(argv)
    assert str(err.value).startswith(message)


def test_unwritable_work_dir(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(AgentUsageError, match="--work-dir: .* is not a writable directory"):
        parse_config(["--controller", "c:1", "--node-id", "n", "--work-dir", str(blocker / "sub"), "--insecure"])


def config(listen: str, advertise: str | None = None) -> AgentConfig:
    return AgentConfig(controller="c:1", node_id="n", work_dir=Path("/w"), listen=listen, advertise=advertise)


def test_addresses() -> None:
    assert advertise_host(config("10.0.0.7:7070")) == "10.0.0.7"
    assert advertise_host(config("0.0.0.0:7070")) == socket.gethostname()  # a wildcard cannot be dialled
    assert advertise_host(config("0.0.0.0:7070", advertise="gpu-07.mgmt")) == "gpu-07.mgmt"
    assert join_host_port("::1", 7070) == "[::1]:7070" and join_host_port("h", 1) == "h:1"
    assert local_host("0.0.0.0:0") == "127.0.0.1" and local_host("[::]:0") == "::1"
    assert local_host("10.0.0.7:0") == "10.0.0.7" and local_host("[fd00::1]:0") == "fd00::1"


def test_help_shows_percent_signs_once() -> None:
    """argparse %-formats help strings but not metavars: `%%` in a metavar would show as `%%`."""
    text = " ".join(build_parser().format_help().split())
    assert "--min-free-disk SIZE|N%" in text and "e.g. 5% or 20G" in text
    assert "%%" not in text


def test_a_node_whose_gpus_are_all_left_out_does_not_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """NVML finds GPUs but every one is in MIG mode: the agent says so at start instead of
    registering a node the controller refuses (a node reports at least one GPU)."""
    from tessera.nodeagent import inventory, leftout, main
    from tessera.v1 import common_pb2

    inv = common_pb2.NodeInventory(source=common_pb2.INVENTORY_SOURCE_NVML)
    inv.left_out.add(index=0, uuid="GPU-0", model="A100-80GB", reason=leftout.MIG_REASON)
    monkeypatch.setattr(inventory, "probe_nvml", lambda recovery_check: inv)
    args = argparse.Namespace(inventory=None, gpu_recovery_check="on")  # no --inventory: NVML
    with pytest.raises(AgentUsageError, match="no GPU to offer \\(GPU 0: MIG mode is on"):
        main.load_inventory(args)
    inv.gpus.add(index=1, uuid="GPU-1", model="A100-80GB", memory_bytes=80 * 10**9)
    got, prober = main.load_inventory(args)
    assert got == inv and prober is not None
    assert prober() == inv  # the agent's later probes: the same NVML probe, with the same flag
