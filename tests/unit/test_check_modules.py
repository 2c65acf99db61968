"""scripts/check_modules.py: the module-size rule, on literal trees in a temporary folder."""

from __future__ import annotations

from pathlib import Path

from scripts.check_modules import MAX_LINES, main, problems


def write(root: Path, rel: str, text: str) -> None:
    path = root / rel
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


def body(lines: int) -> str:
    return "".join(f"x{i} = {i}\n" for i in range(lines))


def test_a_module_at_the_limit_passes_and_one_line_more_fails(tmp_path: Path) -> None:
    write(tmp_path, "pkg/ok.py", body(MAX_LINES))
    write(tmp_path, "pkg/long.py", body(MAX_LINES + 1))
    found = problems(tmp_path, {})
    assert len(found) == 1
    assert found[0].startswith(f"pkg/long.py: {MAX_LINES + 1} lines")


def test_a_docstring_that_says_why_it_is_one_piece_allows_a_long_module(tmp_path: Path) -> None:
    doc = '"""The round\'s state machine.\n\nOne piece: its transitions read\nbest side by side."""\n'
    write(tmp_path, "pkg/machine.py", doc + body(MAX_LINES))
    # The words must be in the module docstring, not anywhere in the file.
    write(tmp_path, "pkg/other.py", '"""Helpers."""\n# one piece\n' + body(MAX_LINES))
    assert [p.split(":")[0] for p in problems(tmp_path, {})] == ["pkg/other.py"]


def test_generated_code_and_environments_are_skipped(tmp_path: Path) -> None:
    write(tmp_path, "protos/x/v1/agent_pb2.py", body(MAX_LINES + 50))
    write(tmp_path, "protos/x/v1/agent_pb2_grpc.py", body(MAX_LINES + 50))
    write(tmp_path, ".venv/lib/site.py", body(MAX_LINES + 50))
    write(tmp_path, "build/pkgtree/mod.py", body(MAX_LINES + 50))
    assert problems(tmp_path, {}) == []


def test_a_known_module_passes_while_long_and_its_entry_fails_once_it_is_not(tmp_path: Path) -> None:
    write(tmp_path, "pkg/engine.py", body(MAX_LINES + 10))
    known = {"pkg/engine.py": "the split"}
    assert problems(tmp_path, known) == []
    write(tmp_path, "pkg/engine.py", body(MAX_LINES - 10))
    found = problems(tmp_path, known)
    assert len(found) == 1 and "remove the entry" in found[0]
    # An entry for a file that is gone is stale too.
    assert len(problems(tmp_path, {"pkg/gone.py": "moved"})) == 1


def test_main_exits_nonzero_on_a_violation(tmp_path: Path) -> None:
    write(tmp_path, "pkg/ok.py", body(10))
    assert main(["check_modules.py", str(tmp_path)], known={}) == 0
    write(tmp_path, "pkg/long.py", body(MAX_LINES + 1))
    assert main(["check_modules.py", str(tmp_path)], known={}) == 1
