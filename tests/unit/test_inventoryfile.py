"""Declared inventory files: the one parser (tessera.common.inventoryfile), its golden spec, every bad
input as `FILE line N: field F: why`, and the agent and the CLI reading through it alike."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tessera.clients.estimate import load_cluster
from tessera.common.inventoryfile import GpuGroupSpec, InventoryError, InventorySpec, read_inventory_file
from tessera.estimator.clusterfile import ClusterFileError
from tessera.nodeagent.inventory import HostFacts, load_declared
from tessera.v1 import estimator_pb2

HOST = HostFacts("gpu-a", 8, 0)

VALID = """\
# a mixed node
gpus:
  - model: a100-80gb
    count: 2
    nvlink: true
  - {model: T4, count: 1, memory_gb: 15.5}
"""


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "inv.yaml"
    path.write_text(text)
    return path


def test_valid_file_gives_the_spec(tmp_path: Path) -> None:
    assert read_inventory_file(_write(tmp_path, VALID)) == InventorySpec((
        GpuGroupSpec("A100-80GB", 2, 80 * 10**9, True),
        GpuGroupSpec("T4-16GB", 1, 15_500_000_000, False),
    ))


BAD = [
    ("gpus:\n  - model: X100\n    count: 1\n", 2, "gpus[0].model", "unknown GPU model 'X100'"),
    ("gpus:\n  - count: 1\n", 2, "gpus[0].model", "required, a catalog GPU name such as A100-80GB"),
    ("gpus:\n  - model: A100\n    count: 0\n", 3, "gpus[0].count", "must be an integer in 1..64, got 0"),
    ("gpus:\n  - model: A100\n    count: '4'\n", 3, "gpus[0].count", "must be an integer in 1..64, got '4'"),
    ("gpus:\n  - model: A100\n    count: true\n", 3, "gpus[0].count", "must be an integer in 1..64, got True"),
    ("gpus:\n  - model: A100\n", 2, "gpus[0].count", "must be an integer in 1..64, got None"),
    ("gpus:\n  - {model: A100, count: 1}\n  - model: A100\n    count: 1\n    memory_gb: 0\n", 5,
     "gpus[1].memory_gb", "must be a number in (0, 1024], got 0"),
    ("gpus:\n  - model: A100\n    count: 1\n    memory_gb: .nan\n", 4, "gpus[0].memory_gb",
     "must be a finite number, got '.nan'"),
    ("gpus:\n  - model: A100\n    count: 1\n    nvlink: 'yes'\n", 4, "gpus[0].nvlink",
     "must be true or false, got 'yes'"),
    ("gpus:\n  - model: A100\n    count: 1\n    nvlnk: true\n", 4, "gpus[0].nvlnk",
     "unknown key (known: count, memory_gb, model, nvlink)"),
    ("gpus:\n  - model: A100\n    count: 1\n    count: 2\n", 4, "gpus[0].count", "duplicate key (first at line 3)"),
    ("\ngpus: []\n", 2, "gpus", "must be a non-empty list of GPU groups"),
    ("gpus:\n  - A100\n", 2, "gpus[0]", "must be a mapping with model and count"),
    ("gpus:\n  - {model: A100, count: 1}\ngpu: []\n", 3, "gpu", "unknown key (known: cpus, gpus, host_memory_gb)"),
    ("gpus:\n  - {model: A100, count: 1}\ncpus: 0\n", 3, "cpus", "must be an integer in 1..65536, got 0"),
    ("gpus:\n  - {model: A100, count: 1}\ncpus: 2.5\n", 3, "cpus", "must be an integer"),
    ("gpus:\n  - {model: A100, count: 1}\nhost_memory_gb: -1\n", 3, "host_memory_gb", "must be a number in (0, "),
    ("- 1\n- 2\n", 1, "inventory", "must be a mapping with a 'gpus' list"),
]


@pytest.mark.parametrize(("text", "line", "field", "why"), BAD, ids=[f"{b[2]}:{b[3][:24]}" for b in BAD])
def test_bad_input_names_file_line_and_field(tmp_path: Path, text: str, line: int, field: str, why: str) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(InventoryError) as err:
        read_inventory_file(path)
    assert (err.value.file, err.value.line, err.value.field) == (str(path), line, field)
    assert err.value.reason.startswith(why), err.value.reason
    assert str(err.value) == f"{path} line {line}: field {field}: {err.value.reason}"


@pytest.mark.parametrize(("text", "line", "field", "why"), BAD[:4], ids=[b[2] for b in BAD[:4]])
def test_the_agent_and_the_cli_report_the_same_error(
    tmp_path: Path, text: str, line: int, field: str, why: str
) -> None:
    path = _write(tmp_path, text)
    with pytest.raises(InventoryError) as agent:
        load_declared(path, "n", HOST)
    with pytest.raises(ClusterFileError) as cli:
        load_cluster([str(path)])
    assert str(agent.value) == str(cli.value)
    assert str(cli.value).startswith(f"{path} line {line}: field {field}: {why}")


def test_the_agent_and_the_cli_read_the_same_gpus(tmp_path: Path) -> None:
    path = _write(tmp_path, VALID)
    inv = load_declared(path, "n", HOST)
    pools = load_cluster([str(path)]).pools
    # One node: a pool per GPU type and link, its GPUs those the agent declares.
    assert [(p.gpu, p.num_gpus, p.intra_link) for p in pools] == [
        ("A100-80GB", 2, estimator_pb2.INTRA_LINK_NVLINK), ("T4-16GB", 1, estimator_pb2.INTRA_LINK_PCIE)]
    assert sorted(g.model for g in inv.gpus) == sorted(p.gpu for p in pools for _ in range(p.num_gpus))


def test_unreadable_file(tmp_path: Path) -> None:
    with pytest.raises(InventoryError) as err:
        read_inventory_file(tmp_path / "nope.yaml")
    assert str(err.value).startswith(f"{tmp_path / 'nope.yaml'}: cannot read: ")


def test_the_cli_reads_inventories_without_the_agent() -> None:
    """The CLI's inventory path must not import tessera.nodeagent (clients never -> nodeagent)."""
    example = Path(__file__).resolve().parents[2] / "examples" / "inventories" / "a100-node.yaml"
    code = (
        "import sys\n"
        "from tessera.clients import tessctl\n"
        "from tessera.clients.estimate import load_cluster\n"
        f"assert load_cluster([{str(example)!r}]).pools[0].num_gpus == 4\n"
        "leaked = sorted(m for m in sys.modules if m.startswith('tessera.nodeagent'))\n"
        "assert not leaked, leaked\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
