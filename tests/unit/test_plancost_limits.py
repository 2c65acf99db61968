"""`tessctl plan-cost`'s limits: prices at most MAX_PRICE (no `Infinity` in -o json), --max-stages at
most the cost tree's MAX_STAGES, stdin read only up to the file limit, a search too large: each one
line and exit 2."""

from __future__ import annotations

import io
import json
import math
from pathlib import Path

import pytest

from tessera.clients import plancost, tessctl
from tessera.common.yamlfile import MAX_BYTES
from tessera.estimator import cost_tree

JOB = """\
name: plan-me
model: {hidden_size: 1024, num_layers: 8, num_heads: 16, vocab_size: 32000, seq_length: 1024}
global_batch_size: 16
iterations: 50
objective: cost
slo: {iterations_within: 1h}
"""


def _files(tmp_path: Path, prices: str = "{A6000: 6, A30: 4}", quota: str = '{"A6000": 2, "A30": 2}',
           job: str = "job.yaml") -> list[str]:
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "prices.yaml").write_text(prices + "\n")
    (tmp_path / "quota.json").write_text(quota + "\n")
    return ["plan-cost", "-f", job if job == "-" else str(tmp_path / job), "--prices", str(tmp_path / "prices.yaml"),
            "--quota", str(tmp_path / "quota.json"), "--max-stages", "3"]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    rc = tessctl.main(argv, out=out)
    return rc, out.getvalue(), capsys.readouterr().err


def _strict(text: str) -> object:
    def refuse(name: str) -> object:
        raise ValueError(f"not JSON: {name}")
    return json.loads(text, parse_constant=refuse)


def test_a_price_over_the_limit_is_refused_naming_the_type(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    rc, out, err = _run([*_files(tmp_path, prices="{A6000: 1.7976931348623157e308, A30: 4}"), "-o", "json"], capsys)
    assert (rc, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("tessctl: error: ") and "A6000: must be at most 1e+06 per GPU-hour, got " in err
    rc, out, err = _run([*_files(tmp_path, prices="{A6000: 1000000, A30: 1e6}"), "-o", "json"], capsys)
    assert rc == 0, err
    assert _strict(out)["plans"]["espresso"]["feasible"]  # type: ignore[index]


def test_max_stages_over_the_trees_limit_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert plancost.MAX_STAGES == cost_tree.MAX_STAGES
    argv = _files(tmp_path)
    rc, out, err = _run([*argv[:-1], "17"], capsys)
    assert (rc, out, err) == (2, "", "tessctl: error: --max-stages: must be at most 16, got 17\n")
    assert _run([*argv[:-1], "16"], capsys)[0] == 0


class _Pipe:
    """A binary stdin that records how much was asked of it."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.asked: list[int] = []

    def read(self, n: int = -1) -> bytes:
        self.asked.append(n)
        return self.data if n < 0 else self.data[:n]


class _Stdin:
    def __init__(self, data: bytes) -> None:
        self.buffer = _Pipe(data)


def test_stdin_is_read_up_to_the_limit_only(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    big = _Stdin(b"#" * (2 * MAX_BYTES))
    monkeypatch.setattr("sys.stdin", big)
    rc, out, err = _run(_files(tmp_path, job="-"), capsys)
    assert (rc, out) == (2, "") and err.count("\n") == 1 and "<stdin>" in err and "larger than 4 MiB" in err, err
    assert big.buffer.asked == [MAX_BYTES + 1]
    monkeypatch.setattr("sys.stdin", _Stdin(JOB.encode()))
    rc, out, err = _run([*_files(tmp_path, job="-"), "-o", "json"], capsys)
    assert rc == 0, err
    assert _strict(out)["job"] == "plan-me"  # type: ignore[index]


def test_a_search_too_large_is_one_line_and_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cost_tree, "BOUND_WORK", math.inf)  # over the default budget at the first node
    rc, out, err = _run(_files(tmp_path), capsys)
    assert (rc, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("tessctl: error: max_stages: search too large: ")
    assert err.endswith("; lower --max-stages or offer fewer types\n")


@pytest.mark.parametrize("nic", ["1e-300", "0.001", "1e6"])
def test_a_nic_outside_the_pools_bounds_is_refused_as_the_flag(nic: str, tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    # Before: anything > 0 passed the flag's check, and 1e-300 failed later inside a GpuPool,
    # named as its field (nic_gbps) rather than the flag.
    rc, out, err = _run([*_files(tmp_path), "--nic-gbps", nic], capsys)
    assert (rc, out) == (2, "") and err.count("\n") == 1
    assert err.startswith("tessctl: error: --nic-gbps: must be a number 0.0125..10,000 (GB/s")
