"""The agent's measure of each job's files and its eviction rule (nodeagent/diskuse.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tessera.nodeagent import diskuse
from tessera.nodeagent.diskuse import Usage, evictions, human, human_over, measure, measure_jobs, parse_bytes
from tests.workerenv import worker_python

MIB = 1024 * 1024


@pytest.mark.parametrize(("text", "value"), [
    ("0", 0), ("1000000", 1_000_000), ("50G", 50 * 10**9), ("50GB", 50 * 10**9), ("512MiB", 512 * MIB),
    ("1.5Gi", 3 * 2**29), ("2t", 2 * 10**12), (" 10k ", 10_000),
])
def test_sizes_parse_in_decimal_and_binary_units(text: str, value: int) -> None:
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["", "G", "-1G", "10X", "nan", "inf", "1e999", "1e308G", "5%", "1.5.2"])
def test_a_bad_size_names_the_text(text: str) -> None:
    with pytest.raises(ValueError, match="is not a size"):
        parse_bytes(text)


def test_a_size_under_one_byte_is_refused_rather_than_read_as_off() -> None:
    with pytest.raises(ValueError, match="'0.5' is under one byte"):
        parse_bytes("0.5")


def test_human_sizes() -> None:
    assert [human(n) for n in (512, 2048, 3 * MIB // 2, 5 * 2**30)] == ["512 B", "2.0 KiB", "1.5 MiB", "5.0 GiB"]


def test_a_size_over_a_limit_that_rounds_to_the_same_figure_is_given_in_bytes() -> None:
    assert human_over(2 * MIB + 4096, 2 * MIB) == ("2,101,248 B", "2,097,152 B")
    assert human_over(3 * MIB, 2 * MIB) == ("3.0 MiB", "2.0 MiB")


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
    assert (u.entries, u.complete, u.problem) == (5, False, "more than 5 files and folders")


def test_files_below_paths_longer_than_path_max_are_measured(tmp_path: Path) -> None:
    """A worker can nest folders past PATH_MAX (4,096 bytes) through folder descriptors; a walk by
    path names could not stat below it and missed what was there."""
    fd = os.open(tmp_path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(20):  # 20 x 251 bytes
            os.mkdir("d" * 250, dir_fd=fd)
            child = os.open("d" * 250, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = child
        out = os.open("big.bin", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd)
        os.write(out, os.urandom(4 * MIB))
        os.close(out)
    finally:
        os.close(fd)
    u = measure([tmp_path])
    assert u.complete and u.entries == 21 and 4 * MIB <= u.bytes < 4 * MIB + 256 * 1024


def test_files_that_keep_moving_count_as_unmeasurable_after_three_walks(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    walks = []

    def racy(roots: object, max_entries: int = 0) -> Usage:
        walks.append(1)
        return Usage(MIB, 3, racy=len(walks) < 4)

    (tmp_path / "jobs").mkdir()
    monkeypatch.setattr(diskuse, "measure", racy)
    assert measure_jobs(tmp_path, {"j1": {""}})["j1"] == Usage(MIB, 3, "its files kept moving through 3 walks", True)
    assert measure_jobs(tmp_path, {"j1": {""}})["j1"] == Usage(MIB, 3)  # the 4th walk was calm
    assert len(walks) == 4


def test_an_unreadable_folder_is_a_problem(worker_dir: Path) -> None:
    """As an agent that is not root finds a folder its workers (its own uid) made unreadable: here the
    walk runs as nobody, over a folder of nobody's with mode 000."""
    job = worker_dir / "job"
    _write(job / "locked" / "big.bin", MIB)
    (job / "locked").chmod(0)
    if os.geteuid() == 0:
        for p in (job, job / "locked", job / "locked" / "big.bin"):
            os.chown(p, 65534, 65534)
    code = (f"from pathlib import Path; from tessera.nodeagent.diskuse import measure; "
            f"print(measure([Path({str(job)!r})]).problem)")
    cp = subprocess.run([worker_python(), "-c", code], capture_output=True, text=True, timeout=60, check=True,
                        user=65534 if os.geteuid() == 0 else None)
    assert cp.stdout.strip() == f"cannot read a folder under {job}: Permission denied"


def u(n: int, problem: str = "") -> Usage:
    return Usage(n * MIB, 1, problem)


def test_a_job_over_the_limit_is_evicted_with_both_sizes() -> None:
    got = evictions({"a": u(10), "b": u(200), "c": u(100)}, {}, limit=100 * MIB, free=None, min_free=0, consumed=None)
    assert got == {"b": "evicted by the agent: the job's files on this node hold 200.0 MiB, over the agent's "
                        "--job-disk-limit of 100.0 MiB"}


def test_a_job_whose_files_cannot_all_be_measured_counts_as_over_a_limit() -> None:
    hidden = {"a": u(1, "more than 1,000,000 files and folders"), "b": u(1)}
    why = ("evicted by the agent: the job's files on this node cannot all be measured (more than 1,000,000 files "
           "and folders), and the agent enforces --job-disk-limit")
    assert evictions(hidden, {}, limit=100 * MIB, free=None, min_free=0, consumed=None) == {"a": why}
    assert evictions(hidden, {}, limit=0, free=None, min_free=0, consumed=None) == {}  # nothing enforced


def test_under_min_free_the_job_filling_the_disk_is_evicted() -> None:
    before = {"a": u(50), "b": u(10), "c": u(5)}
    now = {"a": u(60), "b": u(110), "c": u(5), "new": u(900)}  # "new" has no earlier walk: no growth known
    got = evictions(now, before, limit=0, free=100 * MIB, min_free=1024 * MIB, consumed=150 * MIB)
    assert got == {"b": "evicted by the agent: 100.0 MiB free on its work dir's file system, under its "
                        "--min-free-disk of 1.0 GiB, and the job's files on this node took 100.0 MiB of the "
                        "150.0 MiB it lost since the last check (now 110.0 MiB)"}


def test_under_min_free_no_job_is_evicted_that_is_not_what_fills_it() -> None:
    before = {"a": u(500), "b": u(100)}
    grew = {"a": u(500), "b": u(200)}

    def got(now: dict[str, Usage], consumed: int | None, free: int = 0, limit: int = 0,
            min_free: int = 1024 * MIB) -> list[str]:
        return list(evictions(now, before, limit=limit, free=free, min_free=min_free, consumed=consumed))

    assert got({"a": u(500), "b": u(90)}, 100 * MIB) == []  # no job grew: the space went elsewhere
    assert got(grew, 300 * MIB) == []  # b's 100 MiB is not half of the 300 MiB lost
    assert got(grew, 200 * MIB) == ["b"]
    assert got({"a": u(500), "b": u(101)}, 1 * MIB) == []  # 1 MiB (a log) is under the 64 MiB floor
    assert got(grew, 200 * MIB, min_free=20 * 1024 * MIB) == []  # ... and 1% of a 20 GiB reserve
    assert got(grew, 0) == got(grew, None) == []  # not filling now (or unknown): killing frees nothing
    assert got(grew, 200 * MIB, free=2048 * MIB) == []  # enough free
    assert got({"a": u(5000), "b": u(400)}, 5000 * MIB, limit=1000 * MIB) == ["a"]  # one eviction a check
