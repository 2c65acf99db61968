"""The passphrase of an encrypted CA key (`tessctl admin pki init|issue --passphrase-file FILE`,
`pki init --encrypt`; docs/security.md, "Making the PKI").

From a file (its first line; a file others may read gets a warning, as a token file does), or typed
at a terminal, never on the command line (where `ps` and shell history would keep it). Wrong or
missing, `pki issue` says so before anything is written (common/pki.py `load`)."""

from __future__ import annotations

import getpass
import os
import stat
import sys
from pathlib import Path

from tessera.common.pki import PkiError, is_encrypted

MIN_CHARS = 8  # a new CA's passphrase (a short one is guessed offline from a copy of ca.key)


def from_file(path: str) -> bytes:
    p = Path(path)
    try:
        st = p.stat()
        if not stat.S_ISREG(st.st_mode):
            raise PkiError(f"--passphrase-file: {path} is not a regular file")
        text = p.read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        raise PkiError(f"--passphrase-file: {path}: {getattr(exc, 'strerror', None) or exc}") from None
    if st.st_mode & 0o077:
        print(f"tessctl: warning: passphrase file {path}: others may read it (mode {stat.S_IMODE(st.st_mode):04o}); "
              f"chmod 600 {path}", file=sys.stderr)
    if not text or not text[0]:
        raise PkiError(f"--passphrase-file: {path}: its first line is empty")
    return text[0].encode()


def _ask(prompt: str, what: str = "the CA key's passphrase") -> bytes:
    if not (sys.stdin.isatty() and os.isatty(sys.stderr.fileno())):
        raise PkiError(f"{what}: no terminal to ask at; give --passphrase-file FILE")
    return getpass.getpass(prompt).encode()


def for_init(passphrase_file: str | None, encrypt: bool) -> bytes | None:
    """A new CA's passphrase (None: ca.key unencrypted), at least MIN_CHARS characters; typed twice."""
    if passphrase_file:
        pw = from_file(passphrase_file)
    elif encrypt:
        pw = _ask("New CA key passphrase: ")
        if _ask("The same again: ") != pw:
            raise PkiError("the two passphrases differ; nothing was written")
    else:
        return None
    if len(pw.decode()) < MIN_CHARS:
        raise PkiError(f"the CA key's passphrase: at least {MIN_CHARS} characters; nothing was written")
    return pw


def for_issue(directory: str, passphrase_file: str | None) -> bytes | None:
    """The passphrase to open DIR/ca.key with: from the file, or asked when the key is encrypted."""
    if passphrase_file:
        return from_file(passphrase_file)
    key = Path(directory) / "ca.key"
    return _ask(f"Passphrase of {key}: ", f"{key} is encrypted") if is_encrypted(directory) else None
