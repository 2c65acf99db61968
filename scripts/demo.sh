#!/usr/bin/env bash
# The main job: set up (scripts/setup.sh), then run a local cluster on loopback (a controller and
# three agents with declared A100/A40/A10 GPUs), submit the example jobs, and watch them train on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python scripts/demo.py "$@"
