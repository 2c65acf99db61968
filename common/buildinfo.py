"""What this install of Tessera is: version, git commit, Python, gRPC and protobuf versions.

One answer for `tessctl version`, every daemon's tessera.v1.Info/GetVersion and the
`tessera_build_info` metric (docs/observability.md).

The git commit, when known, comes from (first found):
1. $TESSERA_GIT_COMMIT, for packagers that build outside a git tree (a container image's build
   argument, a distribution package);
2. the install's PEP 610 record (`direct_url.json`): `pip install git+URL@REF` stores the commit;
3. an editable install's source folder, when it is a git work tree (`pip install -e .` from a
   clone, as scripts/setup.sh does): `git rev-parse HEAD` there, bounded by a 2 s timeout.
Otherwise "" ("unknown" where shown): a wheel built from an sdist carries no commit.
"""

from __future__ import annotations

import functools
import json
import os
import platform
import subprocess
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

from tessera.v1 import info_pb2

DIST = "tessera"
UNKNOWN_VERSION = "0.0.0+unknown"
COMMIT_ENV = "TESSERA_GIT_COMMIT"
_HEX = frozenset("0123456789abcdef")


@dataclass(frozen=True)
class BuildInfo:
    version: str
    git_commit: str
    python_version: str
    grpc_version: str
    protobuf_version: str


def _dist_version(name: str) -> str:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return ""


def _is_commit(text: str) -> bool:
    return 7 <= len(text) <= 64 and set(text) <= _HEX


def _direct_url() -> dict[str, object]:
    # Every distribution of the name on the path, not the first only: a source tree on sys.path
    # (pytest's pythonpath ".") holds a tessera.egg-info without the install's record.
    for dist in metadata.distributions(name=DIST):
        text = dist.read_text("direct_url.json")
        if not text:
            continue
        try:
            value = json.loads(text)
        except ValueError:
            continue
        if isinstance(value, dict):
            return value
    return {}


def _git_head(folder: Path) -> str:
    if not (folder / ".git").exists():
        return ""
    try:
        done = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=2.0, check=False)
    except (OSError, subprocess.SubprocessError):  # no git binary, or it hung
        return ""
    head = done.stdout.strip().lower()
    return head if done.returncode == 0 and _is_commit(head) else ""


def git_commit() -> str:
    """The commit this install was built from, or "" when nothing says (see the module doc)."""
    env = os.environ.get(COMMIT_ENV, "").strip().lower()
    if _is_commit(env):
        return env
    direct = _direct_url()
    vcs = direct.get("vcs_info")
    if isinstance(vcs, dict):
        commit = str(vcs.get("commit_id", "")).lower()
        if _is_commit(commit):
            return commit
    dir_info, url = direct.get("dir_info"), str(direct.get("url", ""))
    if isinstance(dir_info, dict) and dir_info.get("editable") and url.startswith("file:"):
        return _git_head(Path(unquote(urlparse(url).path)))
    return ""


@functools.cache
def build_info() -> BuildInfo:
    """This process's build (computed once: the install does not change under a running process)."""
    import google.protobuf
    import grpc

    return BuildInfo(
        version=_dist_version(DIST) or UNKNOWN_VERSION,
        git_commit=git_commit(),
        python_version=platform.python_version(),
        grpc_version=str(getattr(grpc, "__version__", "")) or _dist_version("grpcio"),
        protobuf_version=str(getattr(google.protobuf, "__version__", "")) or _dist_version("protobuf"),
    )


def version_info(component: str, start_time: float = 0.0) -> info_pb2.VersionInfo:
    """This build as tessera.v1.Info answers it, for `component` ("tessera-controller", "tessctl")."""
    b = build_info()
    return info_pb2.VersionInfo(component=component, version=b.version, git_commit=b.git_commit,
                                python_version=b.python_version, grpc_version=b.grpc_version,
                                protobuf_version=b.protobuf_version, start_time=start_time)


def version_line() -> str:
    """A daemon's --version: "0.1.0 (commit 1a2b3c4d5e6f)", or the version alone when the commit is
    unknown: the version has not changed between builds, the commit tells them apart."""
    info = build_info()
    return f"{info.version} (commit {info.git_commit[:12]})" if info.git_commit else info.version
