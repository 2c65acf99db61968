"""The seed-data guard (tests/shared_data.py): missing data skips a test, or fails it when CI is set."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import shared_data
from tests.shared_data import require_shared_data


@pytest.fixture
def data(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "arena").mkdir()
    (tmp_path / "arena" / "trace_philly.csv").write_text("job_id\n")
    monkeypatch.setenv("TESSERA_DATA_DIR", str(tmp_path))
    return tmp_path


def test_present_data_is_returned_with_or_without_ci(data: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    assert require_shared_data("arena/trace_philly.csv") == data / "arena" / "trace_philly.csv"
    monkeypatch.setenv("CI", "true")
    assert require_shared_data(Path("arena")) == data / "arena"
    absolute = data / "arena" / "trace_philly.csv"
    assert require_shared_data(absolute) == absolute


@pytest.mark.parametrize("ci", [None, "", "0", "false"])
def test_missing_data_skips_without_ci(data: Path, monkeypatch: pytest.MonkeyPatch, ci: str | None) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match="seed data not found: .*morphling"):
        require_shared_data("morphling")


@pytest.mark.parametrize("ci", ["true", "1", "yes"])
def test_missing_data_fails_under_ci(data: Path, monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.fail.Exception, match="seed data not found: .*morphling.*CI is set"):
        require_shared_data("morphling")
    with pytest.raises(pytest.fail.Exception):
        require_shared_data(data / "espresso" / "gpu_config.json")


def test_default_data_dir_is_the_nearest_shared_folder_above_the_repository(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("TESSERA_DATA_DIR", raising=False)
    repo = tmp_path / "project" / "wt" / "repo"
    repo.mkdir(parents=True)
    monkeypatch.setattr(shared_data, "REPO", repo)
    if not any((p / "shared" / "data").is_dir() for p in [tmp_path, *tmp_path.parents]):
        assert shared_data.data_dir() == tmp_path / "project" / "wt" / "shared" / "data"  # none: beside the clone
    (tmp_path / "project" / "shared" / "data").mkdir(parents=True)
    assert shared_data.data_dir() == tmp_path / "project" / "shared" / "data"  # a worktree's project
    (tmp_path / "project" / "wt" / "shared" / "data").mkdir(parents=True)
    assert shared_data.data_dir() == tmp_path / "project" / "wt" / "shared" / "data"  # the nearest wins
