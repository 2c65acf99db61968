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

from tessera.common.contract import EVICTED_REASON

MAX_ENTRIES = 1_000_000
INTERVAL_S = 30.0
_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4,
          "ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}


@dataclass(frozen=True)
class Usage:
    bytes: int
    entries: int
    complete: bool = True  # False: the walk stopped at max_entries, or a folder could not be read


def parse_bytes(text: str) -> int:
    """'50G', '512MiB', '1000000' -> bytes (k/M/G/T are powers of 1000, Ki/Mi/Gi/Ti of 1024; a
    trailing B is allowed); ValueError naming the text otherwise."""
    s = text.strip()
    num = s.rstrip("bBiIkKmMgGtT")
    unit = s[len(num):].lower().removesuffix("b")
    try:
        value = float(num)
    except ValueError:
        raise ValueError(f"{text!r} is not a size (a number, optionally with k, M, G, T, Ki, Mi, Gi or Ti)") from None
    if unit not in _UNITS or not value >= 0 or value == float("inf"):
        raise ValueError(f"{text!r} is not a size (a number >= 0, optionally with k, M, G, T, Ki, Mi, Gi or Ti)")
    return int(value * _UNITS[unit])


def human(n: int) -> str:
    for unit, size in (("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def measure(roots: Iterable[Path], max_entries: int = MAX_ENTRIES) -> Usage:
    """Allocated bytes and entries under `roots` (missing roots count nothing); each root stays on
    its own file system, an inode met twice (a hard link, a root inside another) counts once."""
    seen: set[tuple[int, int]] = set()
    total = entries = 0
    complete = True
    for root in roots:
        try:
            st = os.lstat(root)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or (st.st_dev, st.st_ino) in seen:
            continue
        seen.add((st.st_dev, st.st_ino))
        total += st.st_blocks * 512
        dev, stack = st.st_dev, [str(root)]
        while stack:
            try:
                with os.scandir(stack.pop()) as it:
                    for entry in it:
                        entries += 1
                        if entries > max_entries:
                            return Usage(total, entries - 1, complete=False)
                        try:
                            est = entry.stat(follow_symlinks=False)
                        except OSError:
                            continue  # removed while walking
                        key = (est.st_dev, est.st_ino)
                        if key in seen:
                            continue
                        seen.add(key)
                        total += est.st_blocks * 512
                        if stat.S_ISDIR(est.st_mode) and est.st_dev == dev:
                            stack.append(entry.path)
            except OSError:
                complete = False  # unreadable (or removed) folder: counted as far as it was seen
    return Usage(total, entries, complete)


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
        out[job] = measure(roots, max_entries)
    return out


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer can still allocate on the file system holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def evictions(usage: Mapping[str, Usage], before: Mapping[str, Usage], limit: int,
              free: int | None, min_free: int) -> dict[str, str]:
    """Job -> why the agent kills its workers now. `usage`: this walk, per job with live workers;
    `before`: the previous walk; `limit`, `min_free`: 0 = not enforced; `free`: None = unknown."""
    out = {}
    if limit:
        for job in sorted(usage):
            if usage[job].bytes > limit:
                out[job] = (f"{EVICTED_REASON}the job's files on this node hold {human(usage[job].bytes)}, "
                            f"over the agent's --job-disk-limit of {human(limit)}")
    if min_free and free is not None and free < min_free and not out:
        growth = {j: u.bytes - before[j].bytes for j, u in usage.items() if j in before}
        grown = sorted((g, j) for j, g in growth.items() if g > 0)
        if grown:
            g, job = grown[-1]
            out[job] = (f"{EVICTED_REASON}{human(free)} free on its work dir's file system, under its "
                        f"--min-free-disk of {human(min_free)}, and the job's files on this node grew the most "
                        f"since the last check (by {human(g)}, to {human(usage[job].bytes)})")
    return out
