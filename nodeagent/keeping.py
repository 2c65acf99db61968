"""The agent's side of the keepers: prepare a worker's folders for its user, start its keeper, read
the exit status the keeper leaves behind. docs/agent.md, "Workers run as", "Keepers" and "Self-fencing".

The supervisor builds the worker's argv and environment (tessera.nodeagent.contract) and calls
`Keepers.start`; the keeper (tessera.nodeagent.keeper) then runs the worker as the tenant's user.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from tessera.nodeagent import cgroups, keeperfiles, process
from tessera.nodeagent.errors import FailedPrecondition
from tessera.nodeagent.users import UidCollision, UserMap, WorkerUser, build

DEFAULT_FENCE_GRACE = 10.0
DEFAULT_KEEPER_POLL = 0.2
# Each rank's log is kept under this size, its newest part (nodeagent/logcap.py; 0 = no cap).
DEFAULT_LOG_MAX_BYTES = 256 * 1024 * 1024
KEEPER_MODULE = "tessera.nodeagent.keeper"


def _default_users() -> UserMap:
    return build()


@dataclass
class Keepers:
    """How this agent starts workers: users, fence file, keeper settings, cgroup scopes."""

    fence_file: Path
    users: UserMap = field(default_factory=_default_users)
    grace: float = DEFAULT_FENCE_GRACE
    poll: float = DEFAULT_KEEPER_POLL
    log_max_bytes: int = DEFAULT_LOG_MAX_BYTES
    # The interpreter that runs the keepers: the agent's own (it has tessera installed).
    python: str = sys.executable
    # systemd-run --scope around each keeper (cgroups.probe() said yes).
    scopes: bool = False
    # GPU index -> NVIDIA minor number: each worker may open only its attempt's GPUs here
    # (nodeagent/devicefilter.py); None = no device isolation.
    gpu_minors: Mapping[int, int] | None = None

    def user_for(self, tenant: str) -> WorkerUser:
        """FailedPrecondition for a tenant whose derived uid another tenant has (UidCollision)."""
        try:
            return self.users.for_tenant(tenant)
        except UidCollision as exc:
            raise FailedPrecondition(str(exc)) from None

    def prepare(self, attempt_dir: Path, checkpoint_dir: Path, user: WorkerUser) -> list[str]:
        """Create the attempt folder (with home/ and tmp/) and the checkpoint folder, owned by the
        worker's user (mode 0700) where the agent can switch users. Returns notes for the rank's log.

        The attempt folder belongs to the worker, so another rank of the attempt may already have
        put a symlink where home/ or tmp/ go: folders are opened O_NOFOLLOW and changed through the
        descriptor. An existing checkpoint folder is never taken over: its path comes from the
        Launch, and chowning a directory someone else made could hand a system folder to a tenant.
        """
        self._make_parents(attempt_dir.parent)  # jobs/<job>/ stays the agent's
        for d in (attempt_dir, attempt_dir / "home", attempt_dir / "tmp"):
            self._make_dir(d, user, exist_ok=True)
        self._make_parents(checkpoint_dir.parent)
        if self._make_dir(checkpoint_dir, user, exist_ok=False):
            return []
        st = checkpoint_dir.stat()
        if self.users.switch and st.st_uid != user.uid and st.st_mode & 0o002 == 0:
            note = (f"checkpoint folder {checkpoint_dir} belongs to uid {st.st_uid}, not to "
                    f"{user.describe()}: the worker may not be able to write it")
            return [note]
        return []

    def _make_parents(self, path: Path) -> None:
        """Create the missing folders up to `path`, the agent's, passable (0711) by the workers'
        users whatever the agent's umask (a unit's UMask=0027 would lock them out) but not listable."""
        missing = []
        while not path.exists():
            missing.append(path)
            path = path.parent
        for d in reversed(missing):
            try:
                os.mkdir(d, 0o711)
            except FileExistsError:
                continue
            if self.users.switch:
                os.chmod(d, 0o711)

    def _make_dir(self, path: Path, user: WorkerUser, *, exist_ok: bool) -> bool:
        """mkdir + chown/chmod to the user; False when it existed and exist_ok is False (untouched)."""
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            if not exist_ok:
                return False
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
        try:
            if self.users.switch:
                os.fchown(fd, user.uid, user.gid)
                os.fchmod(fd, 0o700)
        finally:
            os.close(fd)
        return True

    def argv(self, spec_fd: int, exit_file: Path, user: WorkerUser, label: str,
             scope: Sequence[str] = (), gpus: Sequence[int] = ()) -> list[str]:
        out = [*scope, self.python, "-I", "-m", KEEPER_MODULE, "--spec-fd", str(spec_fd),
               "--exit-file", str(exit_file), "--fence-file", str(self.fence_file),
               "--grace", repr(self.grace), "--poll", repr(self.poll), "--label", label,
               "--log-max-bytes", str(self.log_max_bytes)]
        if self.gpu_minors is not None:
            unknown = sorted(set(gpus) - set(self.gpu_minors))
            if unknown:  # GPUs the agent did not see at start: never a worker left unconfined
                raise ValueError(f"GPU isolation: no minor number is known for GPU {unknown[0]} of this node")
            out += ["--gpu-minors", ",".join(str(self.gpu_minors[g]) for g in gpus)]
        if self.users.switch:
            out += ["--uid", str(user.uid), "--gid", str(user.gid), "--groups", ",".join(map(str, user.groups))]
        return out

    def start(self, *, job_id: str, attempt: int, rank: int, attempt_dir: Path, argv: Sequence[str],
              env: Mapping[str, str], keeper_env: Mapping[str, str], user: WorkerUser,
              log_file: IO[bytes], workdir: str = "", gpus: Sequence[int] = ()) -> subprocess.Popen[bytes]:
        """Start the keeper of one worker; OSError/ValueError when it cannot be started. The worker
        runs in `workdir` (the job's), else in the attempt's folder, and with device isolation may
        open only the GPUs `gpus` (indices: the attempt's on this node, contract.node_gpus)."""
        spec = json.dumps({"argv": list(argv), "env": dict(env), "cwd": workdir or str(attempt_dir)}).encode()
        # The job's environment reaches the keeper through a memory file, not its own environment:
        # the keeper may be root, and nothing the job sets may act on it.
        fd = os.memfd_create("tessera-worker-spec")
        try:
            view = memoryview(spec)
            while view:
                view = view[os.write(fd, view):]
            isolated = self.gpu_minors is not None
            scope = cgroups.scope_prefix(job_id, attempt, rank, delegate=isolated) if self.scopes else []
            label = f"{job_id}/{attempt}/{rank}"
            exit_file = keeperfiles.exit_path(attempt_dir, rank)
            return process.spawn(self.argv(fd, exit_file, user, label, scope, gpus), cwd=attempt_dir,
                                 env=keeper_env, log_file=log_file, pass_fds=(fd,))
        finally:
            os.close(fd)

    @staticmethod
    def result(attempt_dir: Path, rank: int) -> tuple[int, str] | None:
        """The exit status the keeper recorded, None when it left none."""
        return keeperfiles.read_exit(keeperfiles.exit_path(attempt_dir, rank))
