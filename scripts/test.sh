#!/usr/bin/env bash
# The test command: sets up (scripts/setup.sh), checks the committed generated protobuf code, lints
# (ruff; mypy --strict on the pure core, mypy on the shells; the import contracts of pyproject.toml;
# module sizes), checks the base install (scripts/check_install.sh), and runs the whole suite (unit,
# integration, e2e, chaos; slow tests included). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
PYTHON=.venv/bin/python scripts/gen_protos.sh --check
.venv/bin/ruff check .
# mypy reads files, not the editable install's import hook: it checks the tessera.* tree of symlinks.
MYPYPATH=$(scripts/pkgtree.sh) .venv/bin/mypy --strict -p tessera.controller.core -p tessera.estimator -p tessera.common
# The shells (daemons, clients, trainer) too: every def typed and checked; not --strict, whose
# Any-returns come from grpc's and torch's untyped APIs there.
MYPYPATH=build/pkgtree .venv/bin/mypy --disallow-untyped-defs --check-untyped-defs \
  -p tessera.controller -p tessera.nodeagent -p tessera.clients
# The layers: the import contracts in pyproject.toml (import-linter reads files too: the same tree), and
# no module over 600 lines without a docstring that says why it is one piece.
PYTHONPATH=$(scripts/pkgtree.sh) .venv/bin/lint-imports --no-cache
.venv/bin/python scripts/check_modules.py
# The base install (no extras) in a fresh venv: the console scripts, the README's estimator example,
# the top-level names of the wheel. The suite below cannot see these: it runs on the .[dev] install.
scripts/check_install.sh
exec .venv/bin/python -m pytest -q -p no:cacheprovider "$@"
