"""An encrypted CA key (`tessctl admin pki init --passphrase-file FILE | --encrypt`, `pki issue
--passphrase-file FILE`; clients/capassphrase.py, common/pki.py)."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

from tessera.clients import tessctl
from tessera.common.pki import CertificateAuthority, PkiError, is_encrypted


def _run(*argv: str) -> tuple[int, str]:
    out = io.StringIO()
    return tessctl.main(list(argv), out=out), out.getvalue()


def _secret(tmp_path: Path, text: str, mode: int = 0o600) -> str:
    p = tmp_path / f"pass-{len(list(tmp_path.iterdir()))}"
    p.write_text(text + "\n")
    os.chmod(p, mode)
    return str(p)


def test_an_encrypted_ca_signs_only_with_its_passphrase(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pki = tmp_path / "pki"
    good = _secret(tmp_path, "correct horse battery")
    assert _run("admin", "pki", "init", "--dir", str(pki), "--passphrase-file", good)[0] == 0
    assert is_encrypted(pki) and b"ENCRYPTED PRIVATE KEY" in (pki / "ca.key").read_bytes()
    # Without it (no terminal to ask at, as under pytest), and with a wrong one: refused, nothing written.
    rc, _ = _run("admin", "pki", "issue", "--dir", str(pki), "--controller")
    assert rc == 1 and "ca.key is encrypted: no terminal to ask at; give --passphrase-file FILE" \
        in capsys.readouterr().err
    rc, _ = _run("admin", "pki", "issue", "--dir", str(pki), "--controller", "--passphrase-file",
                 _secret(tmp_path, "wrong horse battery"))
    assert rc == 1 and "ca.key: wrong passphrase" in capsys.readouterr().err
    assert not (pki / "controller").exists()
    rc, _ = _run("admin", "pki", "issue", "--dir", str(pki), "--controller", "--passphrase-file", good)
    assert rc == 0 and (pki / "controller" / "cert.pem").is_file()
    # The issued key is the daemon's, unencrypted (it starts unattended).
    assert b"ENCRYPTED" not in (pki / "controller" / "key.pem").read_bytes()


def test_bad_passphrases_are_refused_before_anything_is_written(tmp_path: Path,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    pki = tmp_path / "pki"
    rc, _ = _run("admin", "pki", "init", "--dir", str(pki), "--passphrase-file", _secret(tmp_path, "short"))
    assert rc == 1 and "at least 8 characters; nothing was written" in capsys.readouterr().err
    rc, _ = _run("admin", "pki", "init", "--dir", str(pki), "--passphrase-file", _secret(tmp_path, ""))
    assert rc == 1 and "its first line is empty" in capsys.readouterr().err
    rc, _ = _run("admin", "pki", "init", "--dir", str(pki), "--passphrase-file", str(tmp_path / "none"))
    assert rc == 1 and "No such file or directory" in capsys.readouterr().err
    rc, _ = _run("admin", "pki", "init", "--dir", str(pki), "--encrypt")  # no terminal under pytest
    assert rc == 1 and "no terminal to ask at; give --passphrase-file FILE" in capsys.readouterr().err
    assert not (pki / "ca.key").exists()
    with pytest.raises(SystemExit) as exc:
        _run("admin", "pki", "init", "--dir", str(pki), "--encrypt", "--passphrase-file", "x")
    assert exc.value.code == 2


def test_a_passphrase_file_others_may_read_is_warned_about(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = _secret(tmp_path, "correct horse battery", 0o644)
    assert _run("admin", "pki", "init", "--dir", str(tmp_path / "pki"), "--passphrase-file", path)[0] == 0
    assert f"passphrase file {path}: others may read it (mode 0644); chmod 600" in capsys.readouterr().err


def test_the_library_loads_an_unencrypted_ca_as_before(tmp_path: Path) -> None:
    CertificateAuthority.init(tmp_path)
    assert not is_encrypted(tmp_path)
    CertificateAuthority.load(tmp_path)
    CertificateAuthority.load(tmp_path, b"ignored for an unencrypted key")
    with pytest.raises(PkiError, match="not a PEM private key"):
        (tmp_path / "ca.key").write_text("junk")
        CertificateAuthority.load(tmp_path)


def test_the_library_says_an_encrypted_key_needs_its_passphrase(tmp_path: Path) -> None:
    CertificateAuthority.init(tmp_path, passphrase=b"correct horse battery")
    with pytest.raises(PkiError, match="the CA key is encrypted: give its passphrase"):
        CertificateAuthority.load(tmp_path)
    with pytest.raises(PkiError, match="wrong passphrase"):
        CertificateAuthority.load(tmp_path, b"nope nope nope")
    CertificateAuthority.load(tmp_path, b"correct horse battery")
