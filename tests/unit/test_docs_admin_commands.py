"""The `tessctl admin token` and `tessctl admin pki` command lines the docs give parse with tessctl's
own parser: docs/systemd.md and docs/auth.md told operators to bootstrap the controller's tokens
file with a `token create` that lacked the required `--tenant`, which failed.

Only these two groups: the docs' other tessctl lines include synopses (`[--rank R]`) and
placeholders that tessctl's argument types refuse (`--stages TYPE[,TYPE]...`), so they are not
command lines to run. Checked: every such line in a fenced code block of docs/*.md and README.md,
and every inline `tessctl admin token ... --tokens-file ...` (prose gives the bootstrap command
inline; inline pki spans there are mostly mentions of a subcommand, not whole commands)."""

from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import pytest

from tessera.clients import tessctl

REPO = Path(__file__).resolve().parents[2]
DOCS = [*sorted((REPO / "docs").glob("*.md")), REPO / "README.md"]
FENCE = re.compile(r"^[ \t]*```.*?^[ \t]*```", re.DOTALL | re.MULTILINE)
COMMAND = re.compile(r"(?<![\w/.-])tessctl\s+admin\s+(?:token|pki)\b")
SHELL_BREAKS = ("|", "||", "&&", ";")


def _lines(text: str) -> list[tuple[int, str]]:
    """(line number, text) of each line of a fenced block (continuations joined), then of each
    inline code span outside them that is a whole token command."""
    out = []
    for m in FENCE.finditer(text):
        first = text.count("\n", 0, m.start()) + 1
        body = re.sub(r"\\\n[ \t]*", " ", m.group(0))
        out += [(first + i, line) for i, line in enumerate(body.splitlines()) if i]
    prose = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    for m in re.finditer(r"`([^`]+)`", prose):
        span = " ".join(m.group(1).split())
        if span.startswith("tessctl admin token ") and "--tokens-file" in span:
            out.append((prose.count("\n", 0, m.start()) + 1, span))
    return out


def admin_commands() -> list[tuple[str, list[str]]]:
    found = []
    for doc in DOCS:
        for number, line in _lines(doc.read_text()):
            for m in COMMAND.finditer(line):
                words = []
                for word in shlex.split(line[m.start() + len("tessctl"):], comments=True):
                    if word in SHELL_BREAKS or word.startswith((">", "2>")):
                        break
                    words.append(word)
                found.append((f"{doc.relative_to(REPO)}:{number}", words))
    return found


COMMANDS = admin_commands()


def test_the_docs_have_the_lines_this_checks() -> None:
    where = {w.split(":")[0] for w, _ in COMMANDS}
    assert {"docs/systemd.md", "docs/auth.md", "README.md"} <= where
    assert sum(words[:3] == ["admin", "token", "create"] for _, words in COMMANDS) >= 4


@pytest.mark.parametrize(("where", "words"), COMMANDS, ids=[w for w, _ in COMMANDS])
def test_a_documented_admin_command_parses(where: str, words: list[str]) -> None:
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            _, extra = tessctl.build_parser().parse_known_args(words)
    except SystemExit:
        pytest.fail(f"{where}: tessctl {' '.join(words)}: {err.getvalue().strip()}")
    assert extra == [], f"{where}: unrecognized {extra}"
