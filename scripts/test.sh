#!/usr/bin/env bash
# The test command: sets up (scripts/setup.sh), checks the committed generated protobuf code, lints
# (ruff; mypy --strict on the pure core), and runs
# the whole suite (unit, integration, e2e, chaos; slow tests included). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
PYTHON=.venv/bin/python scripts/gen_protos.sh --check
.venv/bin/ruff check .
.venv/bin/mypy --strict controller/core estimator tessera_common
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
