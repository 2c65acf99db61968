"""`tessctl admin ...`: every command prints one JSON object with `-o json` (and so yaml and jsonpath),
and a bad flag value of `admin pki issue` is a usage error (exit 2) naming the flag (docs/cli.md)."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import yaml

from tessera.clients import tessctl


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    out = io.StringIO()
    try:
        rc = tessctl.main(argv, out=out)
    except SystemExit as exc:  # argparse's usage errors
        rc = int(exc.code or 0)
    return rc, out.getvalue(), capsys.readouterr().err


def _json(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[dict[str, object], str]:
    rc, out, err = _run(argv, capsys)
    assert rc == 0, err
    doc = json.loads(out)  # the whole of stdout is one JSON object
    assert isinstance(doc, dict)
    return doc, err


def _dated(cert: object) -> dict[str, object]:
    """A certificate's JSON without its "expires" (an RFC 3339 time in UTC: test_pki_ca_expiry.py)."""
    assert isinstance(cert, dict) and str(cert["expires"]).endswith("Z")
    return {k: v for k, v in cert.items() if k != "expires"}


def test_token_commands_print_one_json_object(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = str(tmp_path / "tokens.yaml")
    made, _ = _json(["admin", "token", "create", "--tokens-file", tokens, "--name", "ci", "--tenant", "t",
                     "--role", "user", "-o", "json"], capsys)
    assert list(made) == ["name", "tenant", "role", "token"]
    listed, _ = _json(["-o", "json", "admin", "token", "list", "--tokens-file", tokens], capsys)
    assert listed == {"tokens": [{"name": "ci", "tenant": "t", "role": "user"}]}
    # Before: two lines of text on stdout.
    gone, err = _json(["admin", "token", "revoke", "--tokens-file", tokens, "--name", "ci", "-o", "json"], capsys)
    assert gone == {"name": "ci", "tokens_file": tokens, "removed": True}
    assert "systemctl restart tessera-controller" in err  # the note, off stdout
    assert _run(["admin", "token", "list", "--tokens-file", tokens, "-o", "json"], capsys)[1] == '{\n  "tokens": []\n}\n'


def test_token_revoke_keeps_its_text_without_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    tokens = str(tmp_path / "tokens.yaml")
    _run(["admin", "token", "create", "--tokens-file", tokens, "--name", "ci", "--tenant", "t", "--role", "user"],
         capsys)
    rc, out, err = _run(["admin", "token", "revoke", "--tokens-file", tokens, "--name", "ci"], capsys)
    assert (rc, err) == (0, "")
    assert out.startswith(f"token 'ci' removed from {tokens}\n") and "LoadCredential=" in out


@pytest.mark.parametrize("where", ["before", "after"])
def test_pki_init_and_issue_print_one_json_object(where: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Before: `-o json` before the command printed the text; after it, it was refused."""
    pki = tmp_path / "pki"

    def argv(*cmd: str) -> list[str]:
        return ["-o", "json", *cmd] if where == "before" else [*cmd, "-o", "json"]

    made, err = _json(argv("admin", "pki", "init", "--dir", str(pki), "--days", "400"), capsys)
    assert made == {"ca": str(pki / "ca.pem"), "key": str(pki / "ca.key"), "days": 400} and err == ""
    issued, err = _json(argv("admin", "pki", "issue", "--dir", str(pki), "--node", "n1", "n2"), capsys)
    assert err == ""
    assert list(issued) == ["certificates", "ca_expires"]
    certs = issued["certificates"]
    assert isinstance(certs, list) and [c["identity"] for c in certs] == ["spiffe://tessera/node/n1",
                                                                          "spiffe://tessera/node/n2"]
    n1 = pki / "node-n1"
    assert _dated(certs[0]) == {"identity": "spiffe://tessera/node/n1", "dir": str(n1), "cert": str(n1 / "cert.pem"),
                                "key": str(n1 / "key.pem"), "ca": str(n1 / "ca.pem"), "cas_trusted": 1}
    assert str(certs[0]["expires"]) < str(issued["ca_expires"])  # RFC 3339 in UTC: ordered as text
    assert all(Path(c[k]).is_file() for c in certs for k in ("cert", "key", "ca"))


def test_pki_json_in_the_other_structured_formats(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pki = tmp_path / "pki"
    rc, out, _ = _run(["admin", "pki", "init", "--dir", str(pki), "-o", "jsonpath={.ca}"], capsys)
    assert (rc, out) == (0, f"{pki / 'ca.pem'}\n")
    rc, out, _ = _run(["admin", "pki", "issue", "--dir", str(pki), "--controller", "-o", "yaml"], capsys)
    assert rc == 0 and yaml.safe_load(out)["certificates"][0]["identity"] == "spiffe://tessera/controller"


def test_a_rotation_note_goes_to_stderr_with_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for ca in ("old", "new"):
        assert _run(["admin", "pki", "init", "--dir", str(tmp_path / ca)], capsys)[0] == 0
    out_dir = str(tmp_path / "ctl")
    assert _run(["admin", "pki", "issue", "--dir", str(tmp_path / "old"), "--controller", "--out", out_dir], capsys)[0] == 0
    doc, err = _json(["admin", "pki", "issue", "--dir", str(tmp_path / "new"), "--controller", "--out", out_dir,
                      "-o", "json"], capsys)
    certs = doc["certificates"]
    assert isinstance(certs, list)
    assert [_dated(c) for c in certs] == [{"identity": "spiffe://tessera/controller", "dir": out_dir,
                                          "cert": f"{out_dir}/cert.pem", "key": f"{out_dir}/key.pem",
                                          "ca": f"{out_dir}/ca.pem", "cas_trusted": 2}]
    assert err.startswith(f"tessctl: {out_dir}/ca.pem trusts 2 CAs")


@pytest.mark.parametrize(("extra", "why"), [
    (["--controller", "--host", "bad host"], "argument --host: 'bad host' is not a host name or an IP address"),
    (["--estimator", "--host", "x.id.tessera"],
     "argument --host: 'x.id.tessera' is in the reserved identity namespace (*.id.tessera)"),
    (["--node", "a", "b", "--out", "OUT"],
     "argument --out: one identity only, not 2 nodes; without --out each node gets DIR/node-ID"),
    (["--node", "Bad_Node"], "argument --node: 'Bad_Node' is not a node id ([a-z0-9][a-z0-9._-]{0,62})"),
    (["--controller", "--days", "0"], "argument --days: must be >= 1: '0'"),
], ids=["host", "reserved-host", "out-of-several", "node", "days"])
def test_a_bad_value_of_pki_issue_is_a_usage_error(extra: list[str], why: str, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Before: a bad --host and --out with several nodes exited 1, as a missing CA does."""
    pki = tmp_path / "pki"
    assert _run(["admin", "pki", "init", "--dir", str(pki)], capsys)[0] == 0
    argv = ["admin", "pki", "issue", "--dir", str(pki), *[str(tmp_path / "o") if a == "OUT" else a for a in extra]]
    assert _run(argv, capsys) == (2, "", f"tessctl: error: {why} (see 'tessctl admin pki issue --help')\n")
    assert sorted(p.name for p in pki.iterdir()) == ["ca.key", "ca.pem"]  # nothing issued


def test_what_the_files_decide_is_still_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Exit 1, not 2: the command line was right, the files were not (no CA there, a taken name)."""
    rc, out, err = _run(["admin", "pki", "issue", "--dir", str(tmp_path / "none"), "--controller", "--host", "h1"],
                        capsys)
    assert (rc, out) == (1, "") and "no such file (make a CA first" in err
    tokens = str(tmp_path / "tokens.yaml")
    create = ["admin", "token", "create", "--tokens-file", tokens, "--name", "a", "--tenant", "t", "--role", "user"]
    assert _run(create, capsys)[0] == 0
    assert _run(create, capsys)[0] == 1
