"""Which uid/gid runs a job's workers: tenants mapped to users by the agent's configuration.

    --worker-user TENANT=USER[:GROUP]   (repeatable)
    --default-worker-user USER[:GROUP]  (tenants not mapped, and jobs without a tenant; default nobody)

USER and GROUP are names or numeric ids. Without GROUP the user's primary group from the passwd
database is used, and a named user keeps the supplementary groups the group database gives it (a
`video` or `render` membership for GPU device files, for instance); a numeric uid gets none. uid 0,
gid 0 and membership of group 0 are refused when the agent starts: workers never run as root.

An agent that is not root cannot switch users: every worker then runs as the agent's own uid, and
the agent says so once at start (`workers run as the agent's uid`).
"""

from __future__ import annotations

import grp
import hashlib
import os
import pwd
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

TENANT_RE = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}$")
DEFAULT_USER = "nobody"
MAX_UID = 4294967294  # (uid_t)-1 is "no change" to setresuid
MIN_UID_RANGE = 65536


class UserConfigError(ValueError):
    """A worker-user setting that cannot be used; the message names the flag."""


@dataclass(frozen=True)
class WorkerUser:
    name: str  # USER and LOGNAME of the worker, and what the logs say
    uid: int
    gid: int
    groups: tuple[int, ...] = ()  # supplementary groups, exactly

    def describe(self) -> str:
        return f"{self.name} (uid {self.uid}, gid {self.gid})"


class UidCollision(ValueError):
    """Two tenants derive the same uid from --tenant-uids: the second is refused on this node."""


@dataclass(frozen=True)
class UserMap:
    """Tenant -> WorkerUser. `switch` False: the agent is not root and workers run as it does.

    `uid_range` (--tenant-uids START-END): a tenant that `tenants` does not map runs as a uid of its
    own, derived from its name (`derived_uid`), with the same number as its gid and no supplementary
    group, instead of the shared default user (whose workers, of every tenant, could read, overwrite
    and kill each other's). The same name gives the same uid on every node, so files on shared
    storage keep their owner. `_seen` refuses a second tenant that derives a uid already given to
    another one on this node."""

    default: WorkerUser
    tenants: Mapping[str, WorkerUser] = field(default_factory=dict)
    switch: bool = True
    uid_range: tuple[int, int] | None = None
    _seen: dict[int, str] = field(default_factory=dict, compare=False, repr=False)

    def for_tenant(self, tenant: str) -> WorkerUser:
        mapped = self.tenants.get(tenant)
        if mapped is not None or self.uid_range is None or not self.switch or not tenant:
            return mapped or self.default
        uid = derived_uid(tenant, self.uid_range)
        other = self._seen.setdefault(uid, tenant)
        if other != tenant:
            raise UidCollision(f"tenants {other!r} and {tenant!r} both derive uid {uid} from --tenant-uids: "
                               f"map one of them with --worker-user on every node")
        return WorkerUser(name=f"tenant-{tenant}", uid=uid, gid=uid)

    def users(self) -> list[WorkerUser]:
        """Every distinct user a worker may run as (of derived uids, the first of the range: they
        all have the same rights, none of their own)."""
        seen: dict[int, WorkerUser] = {}
        derived = [WorkerUser("tenant-uids", self.uid_range[0], self.uid_range[0])] if self.uid_range else []
        for u in [self.default, *self.tenants.values(), *derived]:
            seen.setdefault(u.uid, u)
        return list(seen.values())


def derived_uid(tenant: str, uid_range: tuple[int, int]) -> int:
    """A tenant's uid in [start, end]: the first 8 bytes of SHA-256 of its name, modulo the range."""
    start, end = uid_range
    digest = hashlib.sha256(tenant.encode()).digest()
    return start + int.from_bytes(digest[:8], "big") % (end - start + 1)


def parse_uid_range(text: str, flag: str = "--tenant-uids") -> tuple[int, int]:
    """START-END -> (start, end); UserConfigError unless 1000 <= START <= END <= 4294967294 and
    the range holds at least 65,536 uids (a smaller one makes two tenants' uids meet too often)."""
    a, sep, b = text.partition("-")
    if not (sep and a.isdigit() and b.isdigit()):
        raise UserConfigError(f"{flag}: {text!r} is not START-END (two uids)")
    start, end = int(a), int(b)
    if not 1000 <= start <= end <= MAX_UID:
        raise UserConfigError(f"{flag}: {text!r} must lie within 1000-{MAX_UID}, START <= END")
    if end - start + 1 < MIN_UID_RANGE:
        raise UserConfigError(f"{flag}: {text!r} holds {end - start + 1:,} uids, fewer than {MIN_UID_RANGE:,}")
    return start, end


def _id_or_name(text: str) -> int | str:
    return int(text) if text.isdigit() else text


def resolve(spec: str, flag: str) -> WorkerUser:
    """USER[:GROUP] -> WorkerUser; UserConfigError naming `flag` when unknown or root."""
    user_s, _, group_s = spec.partition(":")
    if not user_s:
        raise UserConfigError(f"{flag}: {spec!r} names no user (USER[:GROUP])")
    user = _id_or_name(user_s)
    try:
        pw = pwd.getpwuid(user) if isinstance(user, int) else pwd.getpwnam(user)
    except KeyError:
        pw = None
    if pw is None and isinstance(user, str):
        raise UserConfigError(f"{flag}: no user {user!r} on this node")
    uid = pw.pw_uid if pw is not None else int(user)
    name = pw.pw_name if pw is not None else str(uid)
    if group_s:
        group = _id_or_name(group_s)
        try:
            gid = grp.getgrgid(group).gr_gid if isinstance(group, int) else grp.getgrnam(group).gr_gid
        except KeyError:
            if isinstance(group, str):
                raise UserConfigError(f"{flag}: no group {group!r} on this node") from None
            gid = group
    elif pw is not None:
        gid = pw.pw_gid
    else:
        raise UserConfigError(f"{flag}: uid {uid} has no passwd entry: give its group too (UID:GID)")
    groups = tuple(g for g in os.getgrouplist(pw.pw_name, gid) if g != gid) if pw is not None else ()
    if uid == 0 or gid == 0 or 0 in groups:
        raise UserConfigError(
            f"{flag}: {spec!r} is root (uid 0, gid 0 or a member of group 0): workers never run as root"
        )
    return WorkerUser(name=name, uid=uid, gid=gid, groups=groups)


def parse_tenant_users(values: Sequence[str], flag: str = "--worker-user") -> dict[str, str]:
    """TENANT=USER[:GROUP] flags -> {tenant: "USER[:GROUP]"}; UserConfigError on a bad or repeated tenant."""
    out: dict[str, str] = {}
    for value in values:
        tenant, sep, spec = value.partition("=")
        if not sep or not spec:
            raise UserConfigError(f"{flag}: {value!r} is not TENANT=USER[:GROUP]")
        if not TENANT_RE.fullmatch(tenant):
            raise UserConfigError(f"{flag}: tenant {tenant!r} does not match {TENANT_RE.pattern}")
        if tenant in out:
            raise UserConfigError(f"{flag}: tenant {tenant!r} is mapped twice")
        out[tenant] = spec
    return out


def agent_user() -> WorkerUser:
    """The agent's own identity, for an agent that cannot switch users."""
    uid, gid = os.geteuid(), os.getegid()
    try:
        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = str(uid)
    return WorkerUser(name=name, uid=uid, gid=gid, groups=())


def build(tenant_users: Sequence[str] = (), default: str = DEFAULT_USER, *, is_root: bool | None = None,
          tenant_uids: str = "") -> UserMap:
    """The agent's UserMap from its flags. Not root: every worker runs as the agent (switch=False),
    and the flags are still checked so that a typo is found before the agent runs as root."""
    mapping = parse_tenant_users(tenant_users)
    resolved = {t: resolve(s, f"--worker-user {t}") for t, s in mapping.items()}
    default_user = resolve(default, "--default-worker-user")
    uid_range = parse_uid_range(tenant_uids) if tenant_uids else None
    root = os.geteuid() == 0 if is_root is None else is_root
    if not root:
        return UserMap(default=agent_user(), tenants={}, switch=False)
    return UserMap(default=default_user, tenants=resolved, switch=True, uid_range=uid_range)


def probe_access(user: WorkerUser, python: str, work_dir: str) -> str | None:
    """Why `user` cannot start `python` in `work_dir` (None when it can), found by trying: a worker
    needs both, and a venv under a private home (/root/...) or a work dir under a 0700 folder is
    the usual reason it cannot."""
    try:
        cp = subprocess.run(
            # chdir inside the probe: Popen's cwd= would be entered before the user switch, as root.
            [python, "-I", "-S", "-c", "import os, sys; os.chdir(sys.argv[1])", work_dir], cwd="/",
            env={"PATH": os.defpath},
            user=user.uid, group=user.gid, extra_groups=list(user.groups),
            stdin=subprocess.DEVNULL, capture_output=True, timeout=60, check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{user.describe()} cannot run {python} in {work_dir}: {exc}"
    if cp.returncode != 0:
        err = cp.stderr.decode(errors="replace").strip().splitlines()
        return f"{user.describe()} cannot run {python}: exit {cp.returncode}: {err[-1] if err else ''}"
    return None
