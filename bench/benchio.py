"""What every bench program does with its figures: write them as JSON under the results folder.

Bench programs run as scripts (`python bench/NAME.py`), so this folder is on sys.path and they
import this module by its bare name.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def write_result(out_dir: str | Path, name: str, result: Any, *, indent: int = 2, show: bool = True) -> Path:
    """Write `result` to OUT_DIR/NAME (the folder made if missing) and, with `show`, print the same
    JSON; return the file's path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / name
    text = json.dumps(result, indent=indent)
    path.write_text(text + "\n")
    if show:
        print(text)
    return path
