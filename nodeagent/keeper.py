"""The keeper: one small process per worker, between the agent and the job's program.

    python -I -m tessera.nodeagent.keeper --spec-fd N --exit-file PATH --fence-file PATH
        [--uid UID --gid GID [--groups G,G]] [--grace S] [--poll S] [--label TEXT] [--log-max-bytes N]
        [--gpu-minors M,M]

The agent starts it (root when the agent is root) in a session of its own; the keeper

- reads the worker's argv, environment and working directory from the inherited file `--spec-fd`
  (JSON), never from its own environment: the keeper runs with the agent's trusted environment and
  `python -I`, so nothing a job sets (LD_PRELOAD, PYTHONPATH...) runs with the keeper's privileges;
- starts the worker as --uid/--gid (supplementary groups exactly --groups) in a process group of its
  own (in the keeper's session, which the agent counts as the worker's for NVML memory), with
  a parent-death signal so the worker dies if the keeper is killed; uid 0 is refused, and a keeper
  running as root refuses to start without --uid;
- forwards SIGTERM and SIGINT to the worker's process group, and on KILL_NOW (SIGUSR1, the agent's
  "grace is over") SIGKILLs it;
- fences: every --poll seconds it reads the agent's fence file; once time.monotonic() passes the
  deadline there, it SIGTERMs the worker's group and SIGKILLs it --grace seconds later, whatever the
  agent is doing (stopped, partitioned, dead). An agent renewing later cannot undo it;
- with --gpu-minors, starts the worker in a cgroup of its own where only those NVIDIA GPUs can be
  opened (tessera.nodeagent.devicefilter), and removes it, with anything left in it, at the end;
- with --log-max-bytes, gives the worker a pipe for its output and copies it into the rank's log
  (its own stdout), keeping the log under that size (tessera.nodeagent.logcap);
- is a child subreaper: when the worker has exited (or its grace is over), SIGKILLs what is left
  of its process group and every process it left outside it (they were orphaned to the keeper),
  writes the exit status atomically to --exit-file, then exits with the worker's status (128+N
  for signal N).

Standard library only, and it imports nothing from Tessera but tessera.nodeagent.keeperfiles,
tessera.nodeagent.logcap and tessera.nodeagent.devicefilter: it must work when the agent is stopped
or gone, and start quickly for every rank.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

from tessera.nodeagent.devicefilter import Confinement, DeviceFilterError
from tessera.nodeagent.keeperfiles import KILL_NOW, read_fence, write_exit
from tessera.nodeagent.logcap import MIN_MAX_BYTES, LogPump

EXIT_USAGE = 2
EXIT_SPAWN_FAILED = 127
MAX_SPEC_BYTES = 64 * 1024 * 1024
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        raise UsageError(message)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="tessera-keeper", description="Start one worker, forward signals, fence it, record its exit.")
    p.add_argument("--spec-fd", type=int, required=True, help="inherited fd holding the worker's JSON spec")
    p.add_argument("--exit-file", required=True, help="where the exit status is written")
    p.add_argument("--fence-file", required=True, help="the agent's fence file (monotonic deadline)")
    p.add_argument("--uid", type=int, help="run the worker as this uid (needs root)")
    p.add_argument("--gid", type=int, help="... and this gid")
    p.add_argument("--groups", default="", help="supplementary gids, comma separated (default: none)")
    p.add_argument("--grace", type=float, default=10.0, help="SIGTERM to SIGKILL when fenced, seconds")
    p.add_argument("--poll", type=float, default=0.2, help="how often the fence file is read, seconds")
    p.add_argument("--label", default="", help="job/attempt/rank, for messages")
    p.add_argument("--log-max-bytes", type=int, default=0,
                   help="keep the log (stdout) under this size, its newest part (0 = no cap)")
    p.add_argument("--gpu-minors", metavar="M,M",
                   help="the worker may open only these NVIDIA GPUs (minor numbers; '' = none) of the node")
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    """Parse and check the arguments; UsageError with one line on any problem."""
    args = build_parser().parse_args(argv)
    if args.spec_fd < 3:
        raise UsageError(f"--spec-fd: {args.spec_fd} is not an inherited file (must be >= 3)")
    if not 0 <= args.grace <= 3600 or not 0.01 <= args.poll <= 60:  # also refuses NaN
        raise UsageError("--grace must be in 0..3600 and --poll in 0.01..60 seconds")
    if args.log_max_bytes and args.log_max_bytes < MIN_MAX_BYTES:
        raise UsageError(f"--log-max-bytes must be 0 (no cap) or at least {MIN_MAX_BYTES}")
    if args.gpu_minors is not None:
        try:
            args.gpu_minors = [int(m) for m in args.gpu_minors.split(",") if m.strip()]
        except ValueError:
            raise UsageError(f"--gpu-minors: {args.gpu_minors!r} is not a comma-separated list of minors") from None
        if any(not 0 <= m < 1 << 20 for m in args.gpu_minors):
            raise UsageError("--gpu-minors: a minor number is in 0..2^20")
    if (args.uid is None) != (args.gid is None):
        raise UsageError("--uid and --gid go together")
    try:
        args.groups = [int(g) for g in args.groups.split(",") if g.strip()]
    except ValueError:
        raise UsageError(f"--groups: {args.groups!r} is not a comma-separated list of gids") from None
    if args.uid is not None:
        if args.uid <= 0 or args.gid <= 0 or any(g <= 0 for g in args.groups):
            raise UsageError("refusing uid or gid 0 (root) or a negative id for a worker")
        if os.geteuid() != 0 and args.uid != os.geteuid():
            raise UsageError(f"--uid {args.uid}: only root can run a worker as another user")
    elif os.geteuid() == 0:
        raise UsageError("running as root: --uid and --gid are required (workers never run as root)")
    return args


def read_spec(fd: int) -> tuple[list[str], dict[str, str], str]:
    """(argv, env, cwd) from the spec file the agent passed; UsageError when malformed."""
    chunks, size = [], 0
    try:
        os.lseek(fd, 0, os.SEEK_SET)
        while chunk := os.read(fd, 1 << 20):
            size += len(chunk)
            if size > MAX_SPEC_BYTES:
                raise UsageError("--spec-fd: spec too large")
            chunks.append(chunk)
    except OSError as exc:
        raise UsageError(f"--spec-fd: cannot read: {exc.strerror}") from None
    finally:
        try:
            os.close(fd)
        except OSError:
            pass
    try:
        spec = json.loads(b"".join(chunks))
        argv, env, cwd = spec["argv"], spec["env"], spec["cwd"]
    except (ValueError, KeyError, TypeError):
        raise UsageError("--spec-fd: not a JSON object with argv, env and cwd") from None
    if not (isinstance(argv, list) and argv and all(isinstance(a, str) for a in argv)):
        raise UsageError("--spec-fd: argv must be a non-empty list of strings")
    if not (isinstance(env, dict) and all(isinstance(k, str) and isinstance(v, str) for k, v in env.items())):
        raise UsageError("--spec-fd: env must map strings to strings")
    if not isinstance(cwd, str) or not cwd.startswith("/"):
        raise UsageError("--spec-fd: cwd must be an absolute path")
    return argv, env, cwd


class WorkdirError(OSError):
    """The worker's directory cannot be entered as the worker's user."""


def _die_with_parent() -> None:
    # Runs in the child after it took the worker's uid (a credential change clears the setting, so
    # it must come after): if the keeper is killed, the worker gets SIGKILL instead of running on
    # unfenced.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def _children() -> list[int]:
    """Live processes whose parent is this one (what a subreaper inherits when they are orphaned)."""
    me, out = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2:].split()  # after "pid (comm) ": state, ppid, ...
        if len(fields) > 1 and int(fields[1]) == me and fields[0] != b"Z":
            out.append(int(entry))
    return out


def kill_descendants(worker: int, rounds: int = 50) -> int:
    """SIGKILL every process left under the keeper but the worker itself, the ones that left the
    worker's process group (setsid, a double fork) included: as a child subreaper the keeper
    inherits them when their parents die. Killing one hands its children to the keeper, so it goes
    round until none is left (bounded). Never reaps the worker (its status is the keeper's to
    read). Returns how many it killed."""
    killed: set[int] = set()
    for _ in range(rounds):
        alive = [pid for pid in _children() if pid != worker]
        if not alive:
            break
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
                killed.add(pid)
            except OSError:
                pass
        time.sleep(0.02)
        for pid in alive:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass
    return len(killed)


def say(label: str, text: str) -> None:
    """One line in the rank's log (the keeper's stderr is the worker's log)."""
    try:
        sys.stderr.write(f"tessera-keeper[{label}]: {text}\n")
        sys.stderr.flush()
    except OSError:
        pass


def _killpg(pgid: int, sig: int) -> None:
    if pgid > 1:
        try:
            os.killpg(pgid, sig)
        except OSError:
            pass


class Keeper:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.fence_file = Path(args.fence_file)
        self.pid = 0
        self.pending: list[int] = []  # signals received before the worker existed
        self.kill_at: float | None = None
        self.fence_reason = ""
        self.fence: tuple[float, float] | None = None  # (deadline, renewed) of the newest renewal seen
        self.pump: LogPump | None = None
        self.confinement: Confinement | None = None

    def on_signal(self, signum: int, frame: FrameType | None) -> None:
        if self.pid <= 0:
            self.pending.append(signum)
            return
        if signum == KILL_NOW:
            _killpg(self.pid, signal.SIGKILL)
        else:
            _killpg(self.pid, signum)

    def start(self, argv: list[str], env: dict[str, str], cwd: str) -> subprocess.Popen[bytes]:
        a = self.args
        kw: dict[str, Any] = {}
        if a.uid is not None:
            kw = {"user": a.uid, "group": a.gid, "extra_groups": a.groups}
        r, w = os.pipe()

        def child() -> None:
            _die_with_parent()
            # The directory is entered here, after the uid change, so the worker's own permissions
            # decide: Popen's cwd= is entered as root, and a job's workdir reached folders (another
            # tenant's checkpoint) its user could not.
            try:
                os.chdir(cwd)
            except OSError as exc:
                os.write(w, (exc.strerror or str(exc)).encode())
                raise

        if self.pump is not None:
            kw |= {"stdout": self.pump.write_fd, "stderr": self.pump.write_fd}
        try:
            return subprocess.Popen(
                # Its own process group inside the keeper's session: signals to the group reach the
                # worker's children, and the agent still counts the session's GPU memory as its own.
                argv, env=env, stdin=subprocess.DEVNULL, process_group=0, close_fds=True,
                preexec_fn=child, **kw,  # noqa: PLW1509 (the keeper has one thread)
            )
        except subprocess.SubprocessError:
            os.set_blocking(r, False)
            try:
                why = os.read(r, 512).decode(errors="replace")
            except BlockingIOError:
                why = ""
            if why:
                raise WorkdirError(why) from None
            raise
        finally:
            os.close(r)
            os.close(w)

    def confine(self) -> None:
        """With --gpu-minors, move into a cgroup of our own that lets the worker we start open only
        its GPUs (DeviceFilterError when it cannot be made: the worker never runs unconfined)."""
        if self.args.gpu_minors is not None:
            confinement = Confinement.create(self.args.gpu_minors)
            confinement.join()
            self.confinement = confinement

    def unconfine(self) -> None:
        if self.confinement is not None:
            note = self.confinement.release()
            self.confinement = None
            if note:
                say(self.args.label, note)

    def check_fence(self, now: float) -> None:
        got = read_fence(self.fence_file)
        # A newer renewal replaces the deadline; an unreadable or older file keeps the last one, so a
        # deleted or garbled file never lifts the fence.
        # A renewal "after now" was written before this boot (the monotonic clock restarted): ignored.
        if got is not None and got[1] <= now and (self.fence is None or got[1] >= self.fence[1]):
            self.fence = got
        if self.fence_reason or self.fence is None or now < self.fence[0]:
            return
        self.fence_reason = f"fenced: no lease renewal for {now - self.fence[1]:.1f} s"
        say(self.args.label, f"{self.fence_reason}; SIGTERM to the worker, SIGKILL in {self.args.grace:g} s")
        _killpg(self.pid, signal.SIGTERM)
        self.kill_at = now + self.args.grace

    def run(self, argv: list[str], env: dict[str, str], cwd: str, exit_file: Path) -> int:
        for sig in (signal.SIGTERM, signal.SIGINT, KILL_NOW):
            signal.signal(sig, self.on_signal)
        # Orphans of the worker (a daemon it started with setsid and a double fork) come to the
        # keeper rather than to init, so that they end with the worker instead of outliving a
        # cancel unfenced (kill_descendants).
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        self.check_fence(time.monotonic())
        if self.fence_reason:  # already past the deadline: never start
            write_exit(exit_file, EXIT_SPAWN_FAILED, self.fence_reason + " before the worker started", 0)
            return EXIT_SPAWN_FAILED
        if self.args.log_max_bytes:
            try:
                self.pump = LogPump(sys.stdout.fileno(), self.args.log_max_bytes, self.args.label)
            except (OSError, ValueError) as exc:
                say(self.args.label, f"the log has no cap: {exc}")
        try:
            self.confine()
            proc = self.start(argv, env, cwd)
        except (OSError, ValueError, subprocess.SubprocessError, DeviceFilterError) as exc:
            who = f" as uid {self.args.uid}" if self.args.uid is not None else ""
            if isinstance(exc, DeviceFilterError):
                reason = f"spawn failed: GPU isolation: {exc}"
            elif isinstance(exc, WorkdirError):
                reason = f"spawn failed: cannot enter workdir {cwd}{who}: {exc}"
            else:
                reason = f"spawn failed: cannot run {argv[0]!r} in {cwd}{who}: {exc}"
            say(self.args.label, reason)
            self.unconfine()
            write_exit(exit_file, EXIT_SPAWN_FAILED, reason, 0)
            return EXIT_SPAWN_FAILED
        finally:
            if self.pump is not None:
                self.pump.close_writer()
        self.pid = proc.pid
        for signum in self.pending:
            self.on_signal(signum, None)
        while (rc := self._wait_worker()) is None:
            now = time.monotonic()
            self.check_fence(now)
            if self.kill_at is not None and now >= self.kill_at:
                say(self.args.label, "grace period over; SIGKILL to the worker")
                _killpg(self.pid, signal.SIGKILL)
                kill_descendants(self.pid)
                self.kill_at = None
            # Signal handlers still run at once (they forward the signal).
            if self.pump is not None:
                self.pump.pump(self.args.poll)
            else:
                time.sleep(self.args.poll)
        proc.returncode = rc
        _killpg(self.pid, signal.SIGKILL)  # leftovers of the worker's group would hold GPU memory
        n = kill_descendants(self.pid)
        self.unconfine()
        if self.pump is not None:
            self.pump.drain()  # before the keeper's own last lines, which go straight to the log
            self.pump.close()
        if n:
            say(self.args.label, f"killed {n} process(es) the worker left outside its process group")
        write_exit(exit_file, rc, self.fence_reason, self.pid)
        return rc if rc >= 0 else 128 - rc

    def _wait_worker(self) -> int | None:
        """The worker's exit code once it has exited (reaping the orphans the keeper inherited on
        the way, which would stay zombies), else None."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return -signal.SIGKILL  # cannot happen while the worker is our child: never wait forever
            if pid == 0:
                return None
            if pid == self.pid:
                return os.waitstatus_to_exitcode(status)


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse_args(argv)
        spec = read_spec(args.spec_fd)
    except UsageError as exc:
        say("?", f"error: {exc}")
        return EXIT_USAGE
    exit_file = Path(args.exit_file)
    try:
        return Keeper(args).run(*spec, exit_file)
    except OSError as exc:  # the exit file could not be written: the agent falls back to our status
        say(args.label, f"error: {exc}")
        return EXIT_SPAWN_FAILED


if __name__ == "__main__":
    sys.exit(main())
