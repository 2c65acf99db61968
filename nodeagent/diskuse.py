"""What each job's files hold on this node's disk, and which jobs the agent evicts for it
(`tessera-agent --job-disk-limit`, `--min-free-disk`; docs/agent.md, "Disk limits").

A job's files on a node are its folder under the work dir (`jobs/<job>/`: every attempt's folder,
rank logs included, and the default checkpoint folder) and the checkpoint folder its Launch named
when that lies on the same file system. They are measured as `du` does: allocated blocks (a sparse
file counts what it holds), each inode once, symbolic links never followed, other file systems
never entered. The kubelet enforces a pod's ephemeral-storage limit the same way: a periodic walk,
then eviction. Two limits follow from the measure:

- over `--job-disk-limit`: the job's live workers are killed at once (no SIGTERM: a trainer
  answers one with a checkpoint, which writes more);
- under `--min-free-disk` free on the work dir's file system: the job whose files grew the most
  since the last walk is killed, the one filling the disk; none when no job grew.

A walk that meets more than `max_entries` entries stops there and counts what it saw, so a job
that made millions of files cannot make the walk itself the load.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tessera.common.contract import EVICTED_REASON

MAX_ENTRIES = 1_000_000
# Under --min-free-disk a job is killed only for growing at least this much in one check (or 1% of
# the reserve): a rank log's few KiB or MiB never are.
MIN_GROWTH = 64 * 1024 * 1024
WALKS = 3  # walks of a job whose files moved under the walk before it counts as unmeasurable
INTERVAL_S = 30.0
_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
          "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}


@dataclass(frozen=True)
class Usage:
    bytes: int
    entries: int
    # Why some of the files could not be measured ("" = all were): more than max_entries, a path
    # too long or a folder unreadable, files that kept moving. A limit then counts them as over.
    problem: str = ""
    racy: bool = False  # an entry vanished between its listing and its stat: worth one more walk

    @property
    def complete(self) -> bool:
        return not self.problem


def parse_bytes(text: str) -> int:
    """'50G', '512MiB', '1000000' -> bytes (k/M/G/T are powers of 1000, Ki/Mi/Gi/Ti of 1024; a
    trailing B is allowed); ValueError naming the text otherwise."""
    s = text.strip()
    num = s.rstrip("bBiIkKmMgGtT")
    unit = s[len(num):].lower().removesuffix("b")
    what = "is not a size (a number >= 0, optionally with k, M, G, T, Ki, Mi, Gi or Ti)"
    try:
        value = float(num) * _UNITS[unit]
    except (ValueError, KeyError):
        raise ValueError(f"{text!r} {what}") from None
    if not 0 <= value < 2**63:  # also nan and inf
        raise ValueError(f"{text!r} {what}")
    if 0 < value < 1:
        raise ValueError(f"{text!r} is under one byte (0 turns the check off)")
    return int(value)


def human(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def human_over(n: int, limit: int) -> tuple[str, str]:
    """`n` and `limit` (n > limit) as `human` gives them, or in bytes where `human` rounds both to
    one figure: "hold 2.0 MiB, over ... 2.0 MiB" read as no excess at all."""
    a, b = human(n), human(limit)
    return (a, b) if a != b else (f"{n:,} B", f"{limit:,} B")


_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_GONE = (FileNotFoundError, NotADirectoryError)  # renamed or removed while walking


def measure(roots: Iterable[Path], max_entries: int = MAX_ENTRIES) -> Usage:
    """Allocated bytes and entries under `roots` (missing roots count nothing); each root stays on
    its own file system, an inode met twice (a hard link, a root inside another) counts once.

    The walk goes from folder descriptor to folder descriptor (openat, fstatat), so no path length
    limits it and a folder renamed once opened is walked all the same; it holds one descriptor per
    level of depth, so a tree too deep for the descriptors it may open is a problem, not a crash."""
    seen: set[tuple[int, int]] = set()
    total = entries = 0
    racy = False
    for root in roots:
        try:
            fd = os.open(root, _DIR_FLAGS)
        except _GONE:
            continue
        except OSError as exc:
            return Usage(total, entries, f"cannot open {root}: {exc.strerror or exc}", racy)
        stack: list[tuple[int, Any]] = []  # (folder descriptor, its scandir iterator), one per level
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) in seen:
                os.close(fd)
                continue
            seen.add((st.st_dev, st.st_ino))
            total += st.st_blocks * 512
            dev = st.st_dev
            stack.append((fd, os.scandir(fd)))
            while stack:
                parent, it = stack[-1]
                entry = next(it, None)
                if entry is None:
                    stack.pop()
                    os.close(parent)
                    continue
                entries += 1
                if entries > max_entries:
                    return Usage(total, entries - 1, f"more than {max_entries:,} files and folders", racy)
                try:
                    est = entry.stat(follow_symlinks=False)  # fstatat on the parent's descriptor
                except _GONE:
                    racy = True
                    continue
                key = (est.st_dev, est.st_ino)
                if key in seen:
                    continue
                seen.add(key)
                total += est.st_blocks * 512
                if stat.S_ISDIR(est.st_mode) and est.st_dev == dev:
                    try:
                        child = os.open(entry.name, _DIR_FLAGS, dir_fd=parent)
                    except _GONE:
                        racy = True
                        continue
                    stack.append((child, os.scandir(child)))
        except OSError as exc:  # unreadable folder, out of descriptors, an I/O error
            return Usage(total, entries, f"cannot read a folder under {root}: {exc.strerror or exc}", racy)
        finally:
            for d, it in stack:
                it.close()
                os.close(d)
    return Usage(total, entries, "", racy)


def measure_jobs(work_dir: Path, jobs: Mapping[str, Iterable[str]], max_entries: int = MAX_ENTRIES) -> dict[str, Usage]:
    """Each job's files on this node: its folder under `work_dir`, and the checkpoint folders its
    Launches named (`jobs`' values) that lie on the work dir's file system (shared storage is the
    storage's to limit)."""
    dev = os.stat(work_dir).st_dev
    out = {}
    for job, checkpoint_dirs in jobs.items():
        roots = [work_dir / "jobs" / job]
        for d in sorted(c for c in checkpoint_dirs if c):
            try:
                if os.stat(d).st_dev == dev:
                    roots.append(Path(d))
            except OSError:
                continue
        u = measure(roots, max_entries)
        for _ in range(WALKS - 1):
            if not u.racy:
                break
            u = measure(roots, max_entries)
        out[job] = Usage(u.bytes, u.entries, f"its files kept moving through {WALKS} walks", True) \
            if u.racy and not u.problem else u
    return out


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer can still allocate on the file system holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def evictions(usage: Mapping[str, Usage], before: Mapping[str, Usage], limit: int,
              free: int | None, min_free: int, consumed: int | None) -> dict[str, str]:
    """Job -> why the agent kills its workers now. `usage`: this walk, per job with live workers;
    `before`: the previous walk; `limit`, `min_free`: 0 = not enforced; `free`: bytes free now,
    `consumed`: bytes the file system lost since the previous walk (None = unknown).

    - A limit set and a job over it, or whose files could not all be measured (fail closed: a
      job must not escape a limit by hiding its files from the walk).
    - Under `min_free` while the file system is still filling: the job that grew the most, when
      its growth is at least half of what the file system lost and at least MIN_GROWTH (or 1% of
      `min_free`): the one filling it, not a job whose rank log grew a little meanwhile. Killing
      does not free space, so a disk that is low but no longer filling gets no eviction.
    """
    out = {}
    pressure = bool(min_free) and free is not None and free < min_free
    for job in sorted(usage):
        u = usage[job]
        if limit and u.bytes > limit:
            held, most = human_over(u.bytes, limit)
            out[job] = (f"{EVICTED_REASON}the job's files on this node hold {held}, "
                        f"over the agent's --job-disk-limit of {most}")
        elif u.problem and (limit or pressure):
            flag = "--job-disk-limit" if limit else "--min-free-disk"
            out[job] = (f"{EVICTED_REASON}the job's files on this node cannot all be measured ({u.problem}), "
                        f"and the agent enforces {flag}")
    if pressure and free is not None and not out and consumed is not None and consumed > 0:
        growth = {j: u.bytes - before[j].bytes for j, u in usage.items() if j in before}
        grown = sorted((g, j) for j, g in growth.items() if g > 0)
        if grown and grown[-1][0] * 2 >= consumed and grown[-1][0] >= max(MIN_GROWTH, min_free // 100):
            g, job = grown[-1]
            out[job] = (f"{EVICTED_REASON}{human(free)} free on its work dir's file system, under its "
                        f"--min-free-disk of {human(min_free)}, and the job's files on this node took "
                        f"{human(g)} of the {human(consumed)} it lost since the last check (now "
                        f"{human(usage[job].bytes)})")
    return out
