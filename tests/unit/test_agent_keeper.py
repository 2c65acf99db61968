"""The keeper's pieces without processes: its arguments and spec, the fence and exit files, the
agent's self-fence, and the tenant -> user map. The keeper as a process is in
tests/integration/test_agent_keeper.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tessera.nodeagent import keeper, keeperfiles, users
from tessera.nodeagent.selffence import SelfFence, fence_seconds

ROOT = os.geteuid() == 0


def args(*extra: str) -> list[str]:
    return ["--spec-fd", "5", "--exit-file", "/x/rank-0.exit", "--fence-file", "/x/fence.json", *extra]


def test_keeper_arguments() -> None:
    ok = keeper.parse_args(args("--uid", "65534", "--gid", "65534", "--groups", "44,46") if ROOT else args())
    assert ok.spec_fd == 5 and ok.grace == 10.0 and ok.poll == 0.2
    if ROOT:
        assert (ok.uid, ok.gid, ok.groups) == (65534, 65534, [44, 46])


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["--uid", "0", "--gid", "0"], "refusing uid or gid 0"),
        (["--uid", "65534", "--gid", "0"], "refusing uid or gid 0"),
        (["--uid", "65534", "--gid", "65534", "--groups", "0"], "refusing uid or gid 0"),
        (["--uid", "65534", "--gid", "65534", "--groups", "a,b"], "--groups: 'a,b' is not"),
        (["--uid", "65534"], "--uid and --gid go together"),
        (["--grace", "nan"], "--grace must be in 0..3600"),
        (["--poll", "0"], "--poll in 0.01..60"),
    ],
)
def test_keeper_refuses_bad_arguments(extra: list[str], message: str) -> None:
    with pytest.raises(keeper.UsageError, match=message):
        keeper.parse_args(args(*extra))


def test_keeper_needs_a_spec_fd_and_never_runs_a_root_worker() -> None:
    with pytest.raises(keeper.UsageError, match="--spec-fd: 1 is not an inherited file"):
        keeper.parse_args(["--spec-fd", "1", "--exit-file", "e", "--fence-file", "f"])
    with pytest.raises(keeper.UsageError, match="the following arguments are required: --exit-file"):
        keeper.parse_args(["--spec-fd", "5", "--fence-file", "f"])
    if ROOT:
        with pytest.raises(keeper.UsageError, match="running as root: --uid and --gid are required"):
            keeper.parse_args(args())


def _fd(data: bytes) -> int:
    fd = os.memfd_create("spec")
    os.write(fd, data)
    return fd


def test_keeper_spec() -> None:
    spec = {"argv": ["/bin/true", "x"], "env": {"A": "1"}, "cwd": "/tmp"}
    assert keeper.read_spec(_fd(json.dumps(spec).encode())) == (["/bin/true", "x"], {"A": "1"}, "/tmp")
    for bad, message in [
        (b"not json", "not a JSON object"),
        (json.dumps({**spec, "argv": []}).encode(), "argv must be a non-empty list"),
        (json.dumps({**spec, "env": {"A": 1}}).encode(), "env must map strings"),
        (json.dumps({**spec, "cwd": "rel"}).encode(), "cwd must be an absolute path"),
    ]:
        with pytest.raises(keeper.UsageError, match=message):
            keeper.read_spec(_fd(bad))


def test_the_keeper_imports_nothing_but_the_standard_library() -> None:
    code = ("import sys, tessera.nodeagent.keeper; "
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'grpc', 'structlog', 'google', 'yaml'}))")
    out = subprocess.run([sys.executable, "-I", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_fence_file_round_trip_and_hostile_content(tmp_path: Path) -> None:
    path = tmp_path / keeperfiles.FENCE_FILE
    assert keeperfiles.read_fence(path) is None
    assert keeperfiles.write_fence(path, 100.0, 7.5) == 107.5
    assert keeperfiles.read_fence(path) == (107.5, 100.0)
    for content in (b"", b"[1]", b'{"deadline": "x", "renewed": 1}', b'{"deadline": NaN, "renewed": 1}',
                    b'{"deadline": true, "renewed": 1}', b"{" + b" " * 5000 + b"}"):
        path.write_bytes(content)
        assert keeperfiles.read_fence(path) is None, content
    path.unlink()
    path.symlink_to(tmp_path / "elsewhere.json")
    keeperfiles.write_fence(tmp_path / "elsewhere.json", 1.0, 1.0)
    assert keeperfiles.read_fence(path) is None  # never read through a symlink


def test_exit_file_round_trip_and_bounds(tmp_path: Path) -> None:
    path = keeperfiles.exit_path(tmp_path, 3)
    assert path.name == "rank-3.exit" and keeperfiles.read_exit(path) is None
    keeperfiles.write_exit(path, -9, "fenced: no lease renewal for 2.0 s", 123)
    assert keeperfiles.read_exit(path) == (-9, "fenced: no lease renewal for 2.0 s")
    for data in ({"exit_code": "0"}, {"exit_code": 10**6}, {"exit_code": True}, {"exit_code": 0, "reason": 5}):
        path.write_text(json.dumps(data))
        assert keeperfiles.read_exit(path) is None, data
    # The worker's uid can write the file: a NUL, once in the agent's status, made the controller
    # refuse every heartbeat of the node; a lone surrogate kept the agent from encoding its status.
    path.write_text(json.dumps({"exit_code": 3, "reason": "oops\0 \ud800" + "x" * 600}))
    assert keeperfiles.read_exit(path) == (3, "oops\\x00 \\ud800" + "x" * 493)
    path.write_text("[" * 2000 + "]" * 2000)  # 4 KB a worker may write: json's RecursionError, once fatal
    assert keeperfiles.read_exit(path) is None
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_fence_seconds_default_to_half_the_lease() -> None:
    assert fence_seconds(4.0, 15.0) == 4.0
    assert fence_seconds(0.0, 15.0) == 7.5
    assert fence_seconds(float("nan"), 10.0) == 5.0
    assert fence_seconds(-1.0, 0.0) == 0.0
    assert fence_seconds(1e9, 0.0) == 3600.0


def test_self_fence_renews_from_the_send_time_and_never_goes_back(tmp_path: Path) -> None:
    now = [1000.0]
    fence = SelfFence(tmp_path, clock=lambda: now[0])
    assert fence.deadline is None and not fence.expired() and not fence.check()
    fence.renew(999.0, 2.0)
    assert fence.deadline == 1001.0 and keeperfiles.read_fence(fence.path) == (1001.0, 999.0)
    fence.renew(998.0, 10.0)  # an older call answered late
    assert fence.deadline == 1001.0
    fence.renew(999.5, 0.0)  # no fence from the controller: nothing written
    assert fence.deadline == 1001.0
    now[0] = 1001.0
    assert fence.expired() and fence.check() and not fence.check()  # logged once per lapse
    fence.renew(1001.0, 2.0)
    assert not fence.expired() and fence.seconds_since_renewal() == 0.0
    # A restarted agent inherits the deadline its predecessor left for the keepers.
    assert SelfFence(tmp_path, clock=lambda: now[0]).deadline == 1003.0
    # A file from before a reboot (renewed "after" now) is removed.
    assert SelfFence(tmp_path, clock=lambda: 5.0).deadline is None and not fence.path.exists()


def test_worker_users_refuse_root_and_resolve_names() -> None:
    for spec in ("root", "0", "nobody:0", "nobody:root", "0:65534"):
        with pytest.raises(users.UserConfigError, match="workers never run as root"):
            users.resolve(spec, "--default-worker-user")
    nobody = users.resolve("nobody", "--default-worker-user")
    assert nobody.uid == 65534 and nobody.name == "nobody" and 0 not in nobody.groups
    assert users.resolve("12345:65534", "--x") == users.WorkerUser("12345", 12345, 65534, ())
    with pytest.raises(users.UserConfigError, match="uid 12345 has no passwd entry"):
        users.resolve("12345", "--x")
    with pytest.raises(users.UserConfigError, match="no user 'no-such-user'"):
        users.resolve("no-such-user", "--x")
    with pytest.raises(users.UserConfigError, match="no group 'no-such-group'"):
        users.resolve("nobody:no-such-group", "--x")


def test_tenant_map_flags() -> None:
    m = users.build(["team-a=nobody", "team-b=12345:65534"], "nobody", is_root=True)
    assert m.switch and m.for_tenant("team-b").uid == 12345 and m.for_tenant("other").uid == 65534
    assert m.for_tenant("").name == "nobody" and len(m.users()) == 2
    with pytest.raises(users.UserConfigError, match="tenant 'team-a' is mapped twice"):
        users.build(["team-a=nobody", "team-a=nobody"], is_root=True)
    with pytest.raises(users.UserConfigError, match="is not TENANT=USER"):
        users.build(["nobody"], is_root=True)
    with pytest.raises(users.UserConfigError, match="--worker-user team-a: 'root' is root"):
        users.build(["team-a=root"], is_root=True)
    # Not root: workers run as the agent, whatever the map says (a bad map is still an error).
    solo = users.build(["team-a=nobody"], is_root=False)
    assert not solo.switch and solo.for_tenant("team-a").uid == os.geteuid()


@pytest.mark.skipif(not ROOT, reason="only root changes owners")
def test_folders_belong_to_the_worker_and_nothing_else_is_taken_over(tmp_path: Path) -> None:
    from tessera.nodeagent.keeping import Keepers

    nobody = users.resolve("nobody", "--x")
    keepers = Keepers(tmp_path / "fence.json", users=users.UserMap(default=nobody))
    att = tmp_path / "jobs" / "j" / "attempt-1"
    assert keepers.prepare(att, tmp_path / "ckpt" / "j", nobody) == []
    for d in (att, att / "home", att / "tmp", tmp_path / "ckpt" / "j"):
        st = d.stat()
        assert (st.st_uid, st.st_gid, st.st_mode & 0o777) == (65534, 65534, 0o700), d
    for d in (tmp_path / "jobs", tmp_path / "jobs" / "j", tmp_path / "ckpt"):
        st = d.stat()
        assert (st.st_uid, st.st_mode & 0o777) == (0, 0o711), d  # the agent's, passable
    # Another rank's worker planted a symlink where tmp/ goes: refused, the target untouched.
    victim = tmp_path / "victim"
    victim.mkdir(mode=0o755)
    att2 = tmp_path / "jobs" / "j" / "attempt-2"
    att2.mkdir()
    (att2 / "tmp").symlink_to(victim)
    with pytest.raises(OSError):
        keepers.prepare(att2, tmp_path / "ckpt" / "j", nobody)
    assert (victim.stat().st_uid, victim.stat().st_mode & 0o777) == (0, 0o755)
    # An existing checkpoint folder someone else owns is left alone, and the rank's log says so.
    other = tmp_path / "ckpt" / "other"
    other.mkdir(mode=0o755)
    (note,) = keepers.prepare(tmp_path / "jobs" / "k" / "attempt-1", other, nobody)
    assert "belongs to uid 0" in note and other.stat().st_uid == 0


def test_rank_logs_are_never_read_or_appended_through_a_symlink(tmp_path: Path) -> None:
    from tessera.nodeagent import worklogs
    from tessera.nodeagent.errors import FailedPrecondition

    att = tmp_path / "jobs" / "j" / "attempt-1"
    att.mkdir(parents=True)
    secret = tmp_path / "jobs" / "other-tenant.log"
    secret.write_text("another tenant's log")
    (att / "rank-0.log").symlink_to(secret)  # planted by the worker, which owns its attempt folder
    with pytest.raises(FailedPrecondition, match="cannot read"):
        worklogs.read_tail(tmp_path, "j", 1, 0, 100, [])
    worklogs.append(att / "rank-0.log", "tessera-agent: note\n")
    assert secret.read_text() == "another tenant's log"


@pytest.mark.timeout(30)  # the defect hung here
def test_a_fifo_or_hard_link_where_a_log_goes_is_refused_at_once(tmp_path: Path) -> None:
    """A worker owns its attempt folder: a FIFO where the next rank's log goes made the agent's
    open() wait for a reader for good (its loop hung, every job on the node was fenced); a hard
    link to an agent file would be written into or read out."""
    from tessera.nodeagent import worklogs
    from tessera.nodeagent.errors import FailedPrecondition

    att = tmp_path / "jobs" / "j" / "attempt-1"
    att.mkdir(parents=True)
    os.mkfifo(att / "rank-1.log")
    with pytest.raises(OSError):  # ENXIO: no reader, and no waiting for one
        worklogs.open_for_append(att / "rank-1.log")
    with pytest.raises(FailedPrecondition, match="cannot read"):
        worklogs.read_tail(tmp_path, "j", 1, 1, 100, [])
    secret = tmp_path / "worker-secret"
    secret.write_bytes(b"k" * 32)
    os.link(secret, att / "rank-0.log")
    with pytest.raises(OSError, match="not a plain file"):
        worklogs.open_for_append(att / "rank-0.log")
    with pytest.raises(FailedPrecondition, match="cannot read"):
        worklogs.read_tail(tmp_path, "j", 1, 0, 100, [])
    assert secret.read_bytes() == b"k" * 32
    fd = worklogs.open_for_append(att / "rank-2.log")  # a plain new log: blocking writes as before
    assert os.get_blocking(fd)
    os.close(fd)


def test_agent_files_are_private_and_a_failed_write_leaves_no_temporary(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """agent-state.json (every job on the node, its pids and GPUs) was 0644; on a full disk each
    failed fence renewal left an empty temporary file behind."""
    path = tmp_path / "agent-state.json"
    keeperfiles.write_atomic(path, {"jobs": []}, durable=True)
    assert path.stat().st_mode & 0o777 == 0o600

    def full(fd: int, data: bytes) -> int:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(OSError, match="No space left"):
        keeperfiles.write_atomic(tmp_path / "fence.json", {"deadline": 1.0}, durable=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["agent-state.json"]


def test_tenant_uids_give_each_unmapped_tenant_a_uid_of_its_own() -> None:
    """With one shared default user, one tenant's workers read, overwrote and killed another's.
    --tenant-uids derives a uid per tenant from its name: the same on every node, never shared
    silently."""
    rng = users.parse_uid_range("2000000000-2099999999")
    m = users.UserMap(default=users.WorkerUser("tessera-worker", 990, 990), tenants={
        "ops": users.WorkerUser("ops", 1500, 1500)}, uid_range=rng)
    a, b = m.for_tenant("team-a"), m.for_tenant("team-b")
    assert a.uid != b.uid and all(2000000000 <= u.uid <= 2099999999 for u in (a, b))
    assert (a.gid, a.groups, a.name) == (a.uid, (), "tenant-team-a")
    assert a.uid == users.derived_uid("team-a", rng) == m.for_tenant("team-a").uid  # stable
    assert users.derived_uid("team-a", rng) == 2000000000 + int.from_bytes(
        __import__("hashlib").sha256(b"team-a").digest()[:8], "big") % 100000000  # the documented rule
    assert m.for_tenant("ops").uid == 1500  # an explicit map wins
    assert m.for_tenant("").uid == 990  # no tenant: the default user
    assert users.UserMap(default=a, uid_range=None).for_tenant("team-b") == a  # off: shared, as before
    # Two tenants that meet on one uid: the second is refused, naming both.
    small = (5000, 5000 + users.MIN_UID_RANGE - 1)
    firsts: dict[int, str] = {}
    for i in range(100_000):
        name = f"t{i}"
        other = firsts.setdefault(users.derived_uid(name, small), name)
        if other != name:
            break
    m2 = users.UserMap(default=a, uid_range=small)
    m2.for_tenant(other)
    with pytest.raises(users.UidCollision, match=f"tenants '{other}' and '{name}' both derive uid"):
        m2.for_tenant(name)


@pytest.mark.parametrize(("text", "why"), [
    ("2000000000", "is not START-END"), ("a-b", "is not START-END"), ("0-70000", "must lie within"),
    ("5000-4000", "must lie within"), ("5000-6000", "fewer than 65,536"),
    ("2000000000-4294967295", "must lie within"),
])
def test_tenant_uid_ranges_that_cannot_work_are_refused(text: str, why: str) -> None:
    with pytest.raises(users.UserConfigError, match=why):
        users.build([], "nobody", is_root=True, tenant_uids=text)


def test_a_fence_renewal_on_a_full_file_system_overwrites_the_record_in_place(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A tenant that filled the file system made every renewal fail (a new file for each): every
    job on the node was fenced. Records have one size, so a renewal then overwrites in place; a
    record caught half written fails its check and is not believed."""
    path = tmp_path / keeperfiles.FENCE_FILE
    keeperfiles.write_fence(path, 100.0, 10.0)
    assert path.stat().st_size == keeperfiles.FENCE_RECORD
    real_open = os.open

    def full(p: object, flags: int, *a: object) -> int:
        if flags & os.O_CREAT:
            raise OSError(28, "No space left on device")
        return real_open(p, flags, *a)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "open", full)
    assert keeperfiles.write_fence(path, 105.0, 10.0) == 115.0
    monkeypatch.undo()
    assert keeperfiles.read_fence(path) == (115.0, 105.0)
    assert sorted(p.name for p in tmp_path.iterdir()) == [keeperfiles.FENCE_FILE]
    # Torn: the new deadline's digits with the old check.
    raw = path.read_bytes().replace(b'"deadline":115.0', b'"deadline":915.0')
    path.write_bytes(raw)
    assert keeperfiles.read_fence(path) is None
