"""Device isolation: each worker in a cgroup whose eBPF device program lets it open only the NVIDIA
GPUs its attempt was given on the node (docs/agent.md, "GPU isolation").

CUDA_VISIBLE_DEVICES is advice a worker can ignore. With isolation on, the keeper, still root, makes
a cgroup of its own below its current one on the unified (v2) hierarchy, attaches a
BPF_PROG_TYPE_CGROUP_DEVICE program to it and moves itself in before it starts the worker: the
worker and all it starts inherit the cgroup, and a process that is not root cannot leave it. The
kernel then refuses (EPERM) to open a character device of major 195 (/dev/nvidiaN is 195:N, N the
GPU's minor number) whose minor is under 254 and not given (the attempt's local ranks share
theirs: NCCL's peer-to-peer copies open the peer's GPU); nvidia-modeset and nvidiactl (195:254,
195:255), nvidia-uvm and every other device stay open, as CUDA needs them. Slurm's ConstrainDevices
does the same on cgroup v2.

The program is attached with BPF_F_ALLOW_MULTI, so programs above attached so too (a systemd
unit's DevicePolicy) still apply; one above attached with BPF_F_ALLOW_OVERRIDE would not. Isolation
holds between users: where Yama allows ptrace, a worker can drive another process of its uid in
another cgroup to open that one's GPUs. It works on a hybrid hierarchy too (v1 controllers, v2
mounted at /sys/fs/cgroup/unified): device programs hang on the v2 cgroup of every process.

Standard library only: the keeper imports it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import signal
import struct
import sys
import time
from collections.abc import Iterable
from pathlib import Path

NVIDIA_MAJOR = 195
FIRST_SHARED_MINOR = 254  # nvidia-modeset (254) and nvidiactl (255): every CUDA process opens them
CGROUP_PREFIX = "tessera-gpus-"
_SYSCALL_BPF = {"x86_64": 321, "aarch64": 280}
_BPF_PROG_LOAD, _BPF_PROG_ATTACH = 5, 8
_BPF_PROG_TYPE_CGROUP_DEVICE, _BPF_CGROUP_DEVICE, _BPF_F_ALLOW_MULTI = 15, 6, 2
_BPF_DEVCG_DEV_CHAR = 2
_ATTR_BYTES = 128
# Instruction codes (linux/bpf.h): a 32-bit load from the context, AND and MOV of a constant on a
# 64-bit register, conditional jumps on a constant, exit.
_LDX_W, _AND_K, _MOV_K, _JEQ_K, _JNE_K, _JGE_K, _EXIT = 0x61, 0x57, 0xB7, 0x15, 0x55, 0x35, 0x95


class DeviceFilterError(Exception):
    """Isolation cannot be set up here; the message says why."""


def _insn(code: int, dst: int = 0, src: int = 0, off: int = 0, imm: int = 0) -> bytes:
    return struct.pack("<BBhi", code, (src << 4) | dst, off, imm)


def program(allowed: Iterable[int]) -> bytes:
    """The device program: 1 (allow) unless the device is a character device 195:M, M < 254 and not
    in `allowed`. Its context is struct bpf_cgroup_dev_ctx {u32 access_type; u32 major; u32 minor},
    the device type in the low 16 bits of access_type."""
    minors = sorted({m for m in allowed if 0 <= m < FIRST_SHARED_MINOR})
    tests = [(_JNE_K, 2, _BPF_DEVCG_DEV_CHAR), (_JNE_K, 3, NVIDIA_MAJOR), (_JGE_K, 4, FIRST_SHARED_MINOR)]
    tests += [(_JEQ_K, 4, m) for m in minors]
    out = [_insn(_LDX_W, 2, 1, 0), _insn(_AND_K, 2, imm=0xFFFF), _insn(_LDX_W, 3, 1, 4), _insn(_LDX_W, 4, 1, 8)]
    for i, (code, reg, imm) in enumerate(tests):
        out.append(_insn(code, reg, off=len(tests) - i - 1 + 2, imm=imm))  # to the allowing tail
    out += [_insn(_MOV_K, 0, imm=0), _insn(_EXIT), _insn(_MOV_K, 0, imm=1), _insn(_EXIT)]
    return b"".join(out)


def _bpf(cmd: int, attr: ctypes.Array[ctypes.c_char]) -> int:
    nr = _SYSCALL_BPF.get(platform.machine())
    if nr is None:
        raise DeviceFilterError(f"the bpf system call of {platform.machine()} is not known to Tessera")
    libc = ctypes.CDLL(None, use_errno=True)
    ret = int(libc.syscall(ctypes.c_long(nr), ctypes.c_int(cmd), attr, ctypes.c_uint(_ATTR_BYTES)))
    if ret < 0:
        raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()))
    return ret


def _load(code: bytes, log_bytes: int) -> int:
    insns = ctypes.create_string_buffer(code, len(code))
    license_ = ctypes.create_string_buffer(b"Apache-2.0")
    verifier_log = ctypes.create_string_buffer(max(1, log_bytes))
    attr = ctypes.create_string_buffer(_ATTR_BYTES)
    struct.pack_into("<IIQQIIQII16sII", attr, 0, _BPF_PROG_TYPE_CGROUP_DEVICE, len(code) // 8,
                     ctypes.addressof(insns), ctypes.addressof(license_), 1 if log_bytes else 0, log_bytes,
                     ctypes.addressof(verifier_log) if log_bytes else 0, 0, 0, b"tessera_gpus", 0,
                     _BPF_CGROUP_DEVICE)
    try:
        return _bpf(_BPF_PROG_LOAD, attr)
    except OSError as exc:
        said = verifier_log.value.decode(errors="replace").strip().splitlines()[-1:] if log_bytes else []
        raise DeviceFilterError(f"cannot load the device program: {exc.strerror}{': ' + said[0] if said else ''}"
                                ) from None


def load(allowed: Iterable[int]) -> int:
    """Load the program; its file descriptor (the caller closes it)."""
    code = program(allowed)
    try:
        # No verifier log: the kernel fails a load whose log outgrew its buffer at any point (ENOSPC),
        # which a 4 KiB buffer did from 27 GPUs on. The log is asked for only to explain a failure.
        return _load(code, 0)
    except DeviceFilterError:
        return _load(code, 1 << 20)


def attach(cgroup: Path, prog_fd: int) -> None:
    fd = os.open(cgroup, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        attr = ctypes.create_string_buffer(_ATTR_BYTES)
        struct.pack_into("<IIII", attr, 0, fd, prog_fd, _BPF_CGROUP_DEVICE, _BPF_F_ALLOW_MULTI)
        _bpf(_BPF_PROG_ATTACH, attr)
    except OSError as exc:
        raise DeviceFilterError(f"cannot attach the device program to {cgroup}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo.
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1:i + 4].isdigit():
            out.append(chr(int(field[i + 1:i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _read(path: str) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""


def unified_mount(mountinfo: str | None = None) -> Path | None:
    """Where the cgroup v2 hierarchy is mounted (/sys/fs/cgroup, or /sys/fs/cgroup/unified on a
    hybrid system); None when it is not."""
    for line in (_read("/proc/self/mountinfo") if mountinfo is None else mountinfo).splitlines():
        left, sep, right = line.partition(" - ")
        fields = left.split()
        if sep and right.split()[:1] == ["cgroup2"] and len(fields) >= 5:
            return Path(_unescape(fields[4]))
    return None


def current_cgroup(proc_cgroup: str | None = None) -> str | None:
    """This process's cgroup on the unified hierarchy ("/system.slice/x.service"), from the
    "0::PATH" line of /proc/self/cgroup."""
    for line in (_read("/proc/self/cgroup") if proc_cgroup is None else proc_cgroup).splitlines():
        if line.startswith("0::/"):
            return line[3:].removesuffix(" (deleted)")
    return None


def own_dir() -> Path:
    """This process's cgroup folder on the unified hierarchy; DeviceFilterError when there is none."""
    mount, path = unified_mount(), current_cgroup()
    if mount is None or path is None:
        raise DeviceFilterError("no cgroup v2 hierarchy is mounted (cgroup2 in /proc/self/mountinfo)")
    return mount / path.lstrip("/")


class Confinement:
    """The keeper's cgroup: made and filtered by `create`, entered by `join`, removed by `release`."""

    def __init__(self, path: Path, home: Path) -> None:
        self.path, self.home = path, home

    @classmethod
    def create(cls, allowed: Iterable[int], name: str | None = None) -> Confinement:
        """A new cgroup below this process's own (named after it, never one that exists) with the
        device program for `allowed` attached; DeviceFilterError when it cannot be had."""
        home = own_dir()
        path = home / (name or f"{CGROUP_PREFIX}{os.getpid()}-{os.urandom(4).hex()}")
        try:
            os.mkdir(path, 0o755)
        except OSError as exc:
            raise DeviceFilterError(f"cannot make the cgroup {path}: {exc.strerror}") from None
        made = cls(path, home)
        try:
            fd = load(allowed)
            try:
                attach(path, fd)
            finally:
                os.close(fd)  # the attachment holds the program
        except DeviceFilterError:
            made.remove()
            raise
        return made

    def join(self) -> None:
        """Move this process in; its children are born in it."""
        try:
            (self.path / "cgroup.procs").write_text(str(os.getpid()))
        except OSError as exc:
            self.remove()
            raise DeviceFilterError(f"cannot enter the cgroup {self.path}: {exc.strerror}") from None

    def release(self, wait_s: float = 2.0) -> str:
        """Leave the cgroup, kill what is left in it and remove it; never raises. A note when it
        could not be removed."""
        try:
            (self.home / "cgroup.procs").write_text(str(os.getpid()))
            left = ""
        except OSError as exc:
            left = f"cannot leave the cgroup {self.path}: {exc.strerror}; "
        deadline = time.monotonic() + wait_s
        while True:
            kill_members(self.path, whole=not left)
            try:
                os.rmdir(self.path)
                return ""
            except FileNotFoundError:
                return ""
            except OSError as exc:
                if exc.errno != errno.EBUSY or time.monotonic() >= deadline:
                    return f"{left}cannot remove the cgroup {self.path}: {exc.strerror}"
            time.sleep(0.02)

    def remove(self) -> None:
        try:
            os.rmdir(self.path)
        except OSError:
            pass


def kill_members(cgroup: Path, *, whole: bool = True) -> None:
    """SIGKILL every process in `cgroup`: at once through cgroup.kill (Linux 5.14) when `whole`,
    else (or without it) each one listed but this process."""
    if whole:
        try:
            (cgroup / "cgroup.kill").write_text("1")
            return
        except OSError:
            pass
    try:
        pids = [int(p) for p in (cgroup / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return
    for pid in pids:
        if pid != os.getpid():
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


def probe() -> tuple[bool, str]:
    """(available, why not): a device program can be loaded and attached to a cgroup made below this
    process's own, which is removed again."""
    if os.geteuid() != 0:
        return False, "the agent is not root"
    try:
        Confinement.create([], name=f"{CGROUP_PREFIX}{os.getpid()}-probe").remove()
    except DeviceFilterError as exc:
        return False, str(exc)
    return True, ""


def prune(home: Path | None = None) -> list[Path]:
    """Remove the cgroups of keepers that are gone (SIGKILLed before they removed their own), first
    killing what their workers left in them; the ones removed."""
    try:
        home = home or own_dir()
        entries = [e for e in os.scandir(home) if e.name.startswith(CGROUP_PREFIX) and e.is_dir()]
    except (OSError, DeviceFilterError):
        return []
    removed = []
    for entry in entries:
        keeper = entry.name[len(CGROUP_PREFIX):].split("-")[0]
        if keeper.isdigit() and Path(f"/proc/{keeper}").exists():
            continue  # its keeper lives (or its pid was reused: kept until a later sweep)
        kill_members(Path(entry.path))
        try:
            os.rmdir(entry.path)
            removed.append(Path(entry.path))
        except OSError:
            continue  # still emptying: the next sweep
    return removed


if __name__ == "__main__":  # the agent's probe inside a delegated systemd scope (nodeagent/main.py)
    available, why_not = probe()
    print(why_not or "device programs can be attached here")
    sys.exit(0 if available else 1)
