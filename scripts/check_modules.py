"""Fails on a Python module over 600 lines whose docstring does not say why it is one piece.

A long module is allowed when its docstring carries the words "one piece" and the reason (a state
machine that reads best whole, a table): the check cannot judge the reason, but it makes the
decision a written one. Generated protobuf code is not ours to split and is skipped.

KNOWN lists the modules over the limit when the rule came in, each waiting for the change that
splits or justifies it. An entry that no longer needs to be there (split, justified or gone) is an
error too, so the list can only shrink.

Usage: python scripts/check_modules.py [ROOT]   (ROOT defaults to the repository)
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

MAX_LINES = 600
JUSTIFICATION = "one piece"
# Folders that are not the project's own source: environments, build trees, caches, VCS metadata.
SKIP_DIRS = frozenset({".venv", "venv", "build", "dist", "demo-state", "node_modules", "__pycache__"})
GENERATED_SUFFIXES = ("_pb2.py", "_pb2_grpc.py")

# Path (relative, POSIX) -> what removes it (issue 12).
KNOWN: dict[str, str] = {}


def python_files(root: Path) -> Iterator[Path]:
    """Every first-party .py file under root, generated code and non-source folders left out."""
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part in SKIP_DIRS or part.startswith(".") or part.endswith(".egg-info") for part in rel.parts[:-1]):
            continue
        if path.name.endswith(GENERATED_SUFFIXES):
            continue
        yield path


def line_count(text: str) -> int:
    return len(text.splitlines())


def is_justified(text: str) -> bool:
    """True when the module docstring says why the module is one piece."""
    try:
        doc = ast.get_docstring(ast.parse(text))
    except SyntaxError:
        return False
    return doc is not None and JUSTIFICATION in " ".join(doc.lower().split())


def problems(root: Path, known: dict[str, str]) -> list[str]:
    """One line per violation: a new long module, or a KNOWN entry that is no longer needed."""
    out: list[str] = []
    needing: set[str] = set()
    for path in python_files(root):
        rel = path.relative_to(root).as_posix()
        text = path.read_text(encoding="utf-8")
        lines = line_count(text)
        if lines <= MAX_LINES or is_justified(text):
            continue
        needing.add(rel)
        if rel not in known:
            out.append(f"{rel}: {lines} lines (over {MAX_LINES}): split it, or say in its docstring why it "
                       f"is {JUSTIFICATION}")
    for rel in sorted(set(known) - needing):
        out.append(f"{rel}: listed in KNOWN of scripts/check_modules.py but no longer over {MAX_LINES} lines "
                   f"without a why-{JUSTIFICATION} docstring: remove the entry")
    return out


def main(argv: list[str], known: dict[str, str] = KNOWN) -> int:
    root = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent.parent
    found = problems(root, known)
    for line in found:
        print(line, file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
