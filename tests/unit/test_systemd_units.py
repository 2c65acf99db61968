"""The systemd units in deploy/systemd: `systemd-analyze verify`, the required settings, env files.

`systemd-analyze verify` exits 0 on unknown keys and unparsable values (it only warns), so a unit
passes only when the verify output says nothing about it; a deliberately broken copy checks that the
check itself works. Under CI=true a missing systemd-analyze fails the test (CI installs the Debian
package `systemd`); elsewhere it is skipped.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

UNITS_DIR = Path(__file__).resolve().parents[2] / "deploy" / "systemd"
NAMES = ("tessera-controller", "tessera-agent", "tessera-estimator")
BIN_RE = re.compile(r"/usr/local/bin/(tessera-[a-z]+)")


def _systemd_analyze() -> str:
    found = shutil.which("systemd-analyze")
    if found:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail("systemd-analyze is missing: CI must install the Debian package 'systemd'")
    pytest.skip("systemd-analyze is not installed (apt-get install systemd)")


def _script(name: str) -> Path | None:
    path = Path(sys.executable).parent / name
    return path if path.exists() else None


def _units_with_existing_binaries(dest: Path) -> dict[str, Path]:
    """Copies of the units whose /usr/local/bin/tessera-* point at executables that exist here (the
    venv's console scripts, else the interpreter): verify rejects a unit whose binary is missing."""
    out = {}
    for name in NAMES:
        text = (UNITS_DIR / f"{name}.service").read_text()
        text = BIN_RE.sub(lambda m: str(_script(m.group(1)) or Path(sys.executable)), text)
        path = dest / f"{name}.service"
        path.write_text(text)
        out[name] = path
    return out


def _verify(analyze: str, unit: Path) -> list[str]:
    """Problems `systemd-analyze verify` reports about this unit (empty = clean)."""
    env = dict(os.environ, SYSTEMD_LOG_COLOR="0", SYSTEMD_PAGER="")
    proc = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, env=env, timeout=120,
                          check=False)
    lines = (proc.stdout + proc.stderr).splitlines()
    problems = [line for line in lines if unit.name in line]
    if proc.returncode != 0:
        problems.append(f"exit status {proc.returncode}: {' | '.join(lines)}")
    return problems


def _directives(name: str) -> dict[str, list[str]]:
    """Key -> values of a unit file (comments dropped; sections ignored: keys are unique enough)."""
    out: dict[str, list[str]] = {}
    for raw in (UNITS_DIR / f"{name}.service").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";", "[")):
            continue
        key, _, value = line.partition("=")
        out.setdefault(key.strip(), []).append(value.strip())
    return out


@pytest.mark.parametrize("name", NAMES)
def test_systemd_analyze_verify(name: str, tmp_path: Path) -> None:
    analyze = _systemd_analyze()
    unit = _units_with_existing_binaries(tmp_path)[name]
    assert _verify(analyze, unit) == []


def test_verify_check_catches_a_broken_unit(tmp_path: Path) -> None:
    analyze = _systemd_analyze()
    unit = _units_with_existing_binaries(tmp_path)["tessera-controller"]
    unit.write_text(unit.read_text().replace("Restart=on-failure", "Restart=sometimes\nWatchdgSec=30"))
    problems = _verify(analyze, unit)
    assert any("Watchdg" in p for p in problems), problems
    assert any("restart" in p.lower() for p in problems), problems
    missing = tmp_path / "missing.service"
    missing.write_text((UNITS_DIR / "tessera-agent.service").read_text())  # /usr/local/bin/... absent here
    if not Path("/usr/local/bin/tessera-agent").exists():
        assert _verify(analyze, missing), "a missing ExecStart binary must be reported"


@pytest.mark.parametrize("name", NAMES)
def test_required_settings(name: str) -> None:
    d = _directives(name)
    assert d["Type"] == ["notify"]
    assert d["NotifyAccess"] == ["main"]
    assert d["WatchdogSec"] == ["30"]
    assert d["Restart"] == ["on-failure"]
    assert d["RestartSec"] == ["2"]
    assert d["EnvironmentFile"] == [f"-/etc/tessera/{name}.env"]
    assert d["StateDirectory"] == [f"tessera/{name.removeprefix('tessera-')}"]
    assert d["NoNewPrivileges"] == ["yes"]
    (exec_start,) = d["ExecStart"]
    assert exec_start.startswith(f"/usr/local/bin/{name} ")
    assert "--listen ${TESSERA_LISTEN}" in exec_start
    # TLS from the certificate in /etc/tessera/tls/<who>/, handed over by systemd (docs/security.md).
    assert "--tls-dir ${TESSERA_TLS_DIR}" in exec_start and "--insecure" not in exec_start
    who = {"tessera-controller": "controller", "tessera-estimator": "estimator", "tessera-agent": "node"}[name]
    assert d["LoadCredential"][:3] == [f"{f}:/etc/tessera/tls/{who}/{f}" for f in ("ca.pem", "cert.pem", "key.pem")]
    assert "TESSERA_TLS_DIR=%d" in d["Environment"]


@pytest.mark.parametrize("name", NAMES)
def test_every_address_defaults_to_loopback(name: str) -> None:
    """Finding 1 of issue 13: the units listened on 0.0.0.0; now nothing is served off the host
    until an env file says so."""
    listens = {v.partition("=")[0]: v.partition("=")[2] for v in _directives(name)["Environment"]
               if v.partition("=")[0] in ("TESSERA_LISTEN", "TESSERA_AGENT_LISTEN")}
    assert listens and all(v.startswith("127.0.0.1:") for v in listens.values()), listens
    for raw in (UNITS_DIR / f"{name}.env").read_text().splitlines():
        assert "0.0.0.0:" not in raw.partition("#")[0], raw


def test_controller_and_estimator_are_sandboxed() -> None:
    for name in ("tessera-controller", "tessera-estimator"):
        d = _directives(name)
        assert d["DynamicUser"] == ["yes"]
        assert d["ProtectSystem"] == ["strict"]
        assert d["ProtectHome"] == ["yes"]
        assert d["PrivateTmp"] == ["yes"]
        assert d["PrivateDevices"] == ["yes"]
        assert d["RestrictAddressFamilies"] == ["AF_UNIX AF_INET AF_INET6"]
        assert d["CapabilityBoundingSet"] == [""]
    assert "--state-dir /var/lib/tessera/controller" in _directives("tessera-controller")["ExecStart"][0]


def test_only_the_agent_goes_without_protect_clock_and_says_why() -> None:
    for name in ("tessera-controller", "tessera-estimator"):  # no GPU there: the device rule costs nothing
        assert _directives(name)["ProtectClock"] == ["yes"], name
    text = (UNITS_DIR / "tessera-agent.service").read_text()
    assert "No ProtectClock" in text and "systemd/systemd#25075" in text
    agent_section = (UNITS_DIR.parents[1] / "docs" / "systemd.md").read_text().partition("## The agent")[2]
    assert "**no** `ProtectClock`" in agent_section and "`ProtectClock=yes`" not in agent_section


def test_the_controller_unit_requires_its_tokens_and_reloads_on_sighup() -> None:
    """An operator audit: the stock unit ran without --tokens, so every caller on the controller's
    host (a training worker of a node with an agent included) was an anonymous admin."""
    d = _directives("tessera-controller")
    assert "tokens.yaml:/etc/tessera/tokens.yaml" in d["LoadCredential"]
    assert " --tokens %d/tokens.yaml " in d["ExecStart"][0] and "--allow-anonymous" not in d["ExecStart"][0]
    assert d["ExecReload"] == ["/bin/kill -HUP $MAINPID"]


def test_agent_keeps_gpus_and_workers() -> None:
    d = _directives("tessera-agent")
    assert d["KillMode"] == ["process"]  # workers survive an agent restart and are re-adopted
    # ProtectClock implies DeviceAllow=char-rtc r, which (DevicePolicy=auto) limits the device cgroup
    # to the listed devices on systemd without systemd/systemd#25075: /dev/nvidia* hidden (an audit).
    for key in ("PrivateDevices", "DevicePolicy", "DeviceAllow", "ProtectClock", "RestrictAddressFamilies",
                "PrivateTmp", "DynamicUser", "MemoryDenyWriteExecute"):
        assert key not in d, f"{key} would break GPU workers"
    exec_start = d["ExecStart"][0]
    assert ("--controller ${TESSERA_CONTROLLER} --node-id ${TESSERA_NODE_ID} --tls-dir ${TESSERA_TLS_DIR} "
            "--work-dir /var/lib/tessera/agent") in exec_start
    assert d["LimitMEMLOCK"] == ["infinity"]


@pytest.mark.parametrize("name", NAMES)
def test_every_variable_has_a_default_and_env_files_match(name: str) -> None:
    d = _directives(name)
    used = set(re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)\}?", d["ExecStart"][0]))
    defaults = {v.partition("=")[0] for v in d.get("Environment", [])}
    assert used <= defaults, f"no Environment= default for {used - defaults}"
    env_file = UNITS_DIR / f"{name}.env"
    assigned = set()
    for raw in env_file.read_text().splitlines():
        line = raw.strip()
        if line and not line.startswith("#"):
            key, sep, _ = line.partition("=")
            assert sep and re.fullmatch(r"[A-Z_][A-Z0-9_]*", key), f"{env_file.name}: bad line {raw!r}"
            assigned.add(key)
    assert assigned <= used, f"{env_file.name} sets variables the unit does not use: {assigned - used}"


@pytest.mark.parametrize("name", NAMES)
def test_exec_start_flags_exist(name: str) -> None:
    """Every flag the unit passes is one the daemon's --help lists (when the daemon is installed)."""
    script = _script(name)
    if script is None:
        pytest.skip(f"{name} is not installed as a console script in this environment")
    proc = subprocess.run([str(script), "--help"], capture_output=True, text=True, timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    flags = re.findall(r"(--[a-z][a-z-]*)", _directives(name)["ExecStart"][0])
    assert flags
    for flag in flags:
        assert flag in proc.stdout, f"{name} --help does not list {flag}"
