"""The agent's measure of each job's files and its eviction rule (nodeagent/diskuse.py)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tessera.nodeagent.diskuse import Usage, evictions, human, measure, measure_jobs, parse_bytes

MIB = 1024 * 1024


@pytest.mark.parametrize(("text", "value"), [
    ("0", 0), ("1000000", 1_000_000), ("50G", 50 * 10**9), ("50GB", 50 * 10**9), ("512MiB", 512 * MIB),
    ("1.5Gi", 3 * 2**29), ("2t", 2 * 10**12), (" 10k ", 10_000),
])
def test_sizes_parse_in_decimal_and_binary_units(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "G", "-1G", "10X", "nan", "inf", "1e999", "5%"])
def test_a_bad_size_names_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_bytes(text)


def test_human_sizes() -> None:
    assert [human(n) for n in (512, 2048, 3 * MIB // 2, 5 * 2**30)] == ["512 B", "2.0 KiB", "1.5 MiB", "5.0 GiB"]


def _write(path: Path, n: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(os.urandom(n))


def test_measure_counts_allocated_blocks_once_per_inode_and_never_follows_links(tmp_path: Path) -> None:
    job = tmp_path / "jobs" / "j1"
    _write(job / "attempt-1" / "big.bin", 4 * MIB)
    _write(job / "checkpoints" / "step-1" / "model.pt", 2 * MIB)
    os.link(job / "attempt-1" / "big.bin", job / "attempt-1" / "hardlink.bin")
    outside = tmp_path / "outside.bin"
    _write(outside, 8 * MIB)
    (job / "attempt-1" / "link").symlink_to(outside)
    (job / "attempt-1" / "dirlink").symlink_to(tmp_path)
    with open(job / "sparse.bin", "wb") as f:
        f.truncate(1024 * MIB)  # a 1 GiB hole holds no blocks
    u = measure([job])
    assert 6 * MIB <= u.bytes < 6 * MIB + 256 * 1024  # the data, folders and links: no 8 MiB, no 1 GiB
    assert u.complete and u.entries == 9
    # A root given twice, or inside another, counts once.
    assert measure([job, job / "checkpoints", tmp_path / "missing"]).bytes == u.bytes


def test_a_walk_past_max_entries_stops_and_says_so(tmp_path: Path) -> None:
    for i in range(20):
        (tmp_path / f"f{i}").write_bytes(b"x")
    u = measure([tmp_path], max_entries=5)
    assert (u.entries, u.complete) == (5, False)


def test_a_job_counts_a_checkpoint_folder_on_the_same_file_system(tmp_path: Path) -> None:
    work = tmp_path / "work"
    _write(work / "jobs" / "j1" / "attempt-1" / "rank-0.log", MIB)
    _write(tmp_path / "ckpt" / "j1" / "model.pt", 3 * MIB)
    got = measure_jobs(work, {"j1": {"", str(tmp_path / "ckpt" / "j1"), "/no/such/dir"}, "j2": {""}})
    assert 4 * MIB <= got["j1"].bytes < 4 * MIB + 64 * 1024
    assert got["j2"] == Usage(0, 0)


def u(n: int) -> Usage:
    return Usage(n * MIB, 1)


def test_a_job_over_the_limit_is_evicted_with_both_sizes() -> None:
    got = evictions({"a": u(10), "b": u(200), "c": u(100)}, {}, limit=100 * MIB, free=None, min_free=0)
    assert got == {"b": "evicted by the agent: the job's files on this node hold 200.0 MiB, over the agent's "
                        "--job-disk-limit of 100.0 MiB"}


def test_under_min_free_the_job_that_grew_most_is_evicted() -> None:
    before = {"a": u(50), "b": u(10), "c": u(5)}
    now = {"a": u(60), "b": u(40), "c": u(5), "new": u(900)}  # "new" has no earlier walk: no growth known
    got = evictions(now, before, limit=0, free=100 * MIB, min_free=1024 * MIB)
    assert got == {"b": "evicted by the agent: 100.0 MiB free on its work dir's file system, under its "
                        "--min-free-disk of 1.0 GiB, and the job's files on this node grew the most since the "
                        "last check (by 30.0 MiB, to 40.0 MiB)"}


def test_under_min_free_no_job_is_evicted_when_none_grew_or_one_was_over_its_limit() -> None:
    before = {"a": u(50), "b": u(10)}
    assert evictions({"a": u(50), "b": u(9)}, before, limit=0, free=0, min_free=MIB) == {}
    assert evictions({"a": u(50), "b": u(40)}, before, limit=0, free=None, min_free=MIB) == {}  # free unknown
    assert list(evictions({"a": u(500), "b": u(40)}, before, limit=100 * MIB, free=0, min_free=MIB)) == ["a"]
    assert evictions({"a": u(500)}, before, limit=0, free=2 * MIB, min_free=MIB) == {}  # enough free
