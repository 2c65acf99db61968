"""The committed generated code is what protoc makes from the committed .proto files."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_generated_code_matches_protos() -> None:
    cp = subprocess.run(["bash", str(REPO / "scripts/gen_protos.sh"), "--check"], capture_output=True, text=True,
                        env={"PYTHON": sys.executable, "PATH": "/usr/bin:/bin"}, check=False)
    assert cp.returncode == 0, cp.stdout + cp.stderr
