#!/usr/bin/env bash
# The base install, as a user gets it: a fresh virtual environment in a temporary directory,
# `pip install .` from this checkout WITHOUT extras (no torch, no dev tools), then, from outside the
# checkout: every console script answers --help, the README's estimator example prints its table,
# the folder names of the checkout are not importable, the wheel installs the top-level name
# `tessera` only, and torch was not pulled in. CI runs it (scripts/test.sh); the test suite cannot
# see these failures because it always runs on the `.[dev]` install. One line per check; exit 1 on
# the first failure, with the command's output. PYTHON picks the interpreter (default python3).
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
PY=${PYTHON:-python3}
tmp=$(mktemp -d "${TMPDIR:-/tmp}/tessera-install.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
log="$tmp/out.log"
start=$SECONDS

ok() { echo "check_install: ok: $*"; }
fail() {
  echo "check_install: FAILED: $*" >&2
  if [ -s "$log" ]; then sed 's/^/  | /' "$log" | tail -n 40 >&2; fi
  exit 1
}
# run DESCRIPTION COMMAND...: runs the command in the temporary directory (so nothing of the
# checkout is on sys.path) with its output in $log; fails the check on a non-zero exit.
run() {
  local what=$1
  shift
  (cd "$tmp" && "$@") >"$log" 2>&1 || fail "$what (exit $?)"
}

# Build from a copy of the working tree's files (tracked, or new and not ignored): an in-tree build
# would reuse build/lib, where a module since moved or deleted still lies and would ship in the wheel.
src="$tmp/src"
mkdir "$src"
(cd "$repo" && git ls-files -z --cached --others --exclude-standard \
  | while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done \
  | tar -c --null -T - -f -) | tar -x -C "$src"

"$PY" -m venv "$tmp/venv"
venv="$tmp/venv"
run "pip install . (no extras)" "$venv/bin/python" -m pip install -q --disable-pip-version-check "$src"
ok "pip install . without extras ($((SECONDS - start)) s)"

if "$venv/bin/python" -m pip list --disable-pip-version-check --format=freeze 2>/dev/null | grep -qi '^torch=='; then
  fail "torch was installed by the base install (it belongs to the trainer extra only)"
fi
ok "torch not installed"

for script in tessera-controller tessera-agent tessera-estimator tessctl tessera-sim; do
  [ -x "$venv/bin/$script" ] || fail "console script $script not installed"
  run "$script --help" "$venv/bin/$script" --help
  grep -q "usage:" "$log" || fail "$script --help printed no usage"
  ok "$script --help"
done

# tessctl simulate runs the simulator as a child process: it must find it in the same install.
run "tessctl simulate --help" "$venv/bin/tessctl" simulate --help
grep -q "usage: tessctl simulate" "$log" || fail "tessctl simulate --help printed no usage"
ok "tessctl simulate --help"

# The README's first estimator command, on the repository's example job.
run "tessctl estimate memory" "$venv/bin/tessctl" estimate memory -f "$repo/examples/jobs/tiny.yaml" --gpu a100-80gb
grep -Eq '^CATEGORY +BYTES +GB +GIB$' "$log" && grep -Eq '^total +[0-9]+ ' "$log" \
  || fail "tessctl estimate memory printed no memory table"
ok "tessctl estimate memory -f examples/jobs/tiny.yaml --gpu a100-80gb prints its table"

# The README's own example (its job file and command), with the total the README prints.
run "the README's tessctl estimate memory example" "$venv/bin/tessctl" estimate memory \
  -f "$repo/examples/estimate/llama3-8b-fsdp.yaml" --gpu h100-80gb --plan dp=8,micro_batch=1
grep -Eq '^total +44259907584 ' "$log" || fail "the README's example printed another total than the README's"
ok "the README's llama3.1-8b FSDP example prints the README's total (44259907584 B)"

# The folders of the checkout install under tessera.*: their own names must not be importable.
for name in controller nodeagent estimator clients common tessera_common; do
  if (cd "$tmp" && "$venv/bin/python" -c "import $name") >"$log" 2>&1; then
    fail "'import $name' works outside the checkout (a top-level package leaked into site-packages)"
  fi
done
ok "import controller (nodeagent, estimator, clients, common, tessera_common) fails outside the checkout"
run "import tessera.*" "$venv/bin/python" -c \
  "import tessera.controller, tessera.nodeagent, tessera.estimator, tessera.clients, tessera.common, tessera.v1"
ok "import tessera.controller, .nodeagent, .estimator, .clients, .common, .v1"

# What the distribution put in site-packages: its top_level.txt and the first component of every
# file of its RECORD (console scripts and the dist-info itself aside) must both be `tessera` alone.
run "read the installed distribution" "$venv/bin/python" - <<'EOF'
import sys
from importlib import metadata

dist = metadata.distribution("tessera")
top_level = sorted((dist.read_text("top_level.txt") or "").split())
files = dist.files or []
roots = sorted({f.parts[0] for f in files if f.parts[0] != ".." and not f.parts[0].endswith((".dist-info", ".pth"))})
print(f"top_level.txt: {' '.join(top_level)}; files under: {' '.join(roots)}")
sys.exit(0 if top_level == ["tessera"] and roots == ["tessera"] else 1)
EOF
ok "the distribution's top-level names are tessera only ($(cat "$log"))"

# The SDK is typed (PEP 561), and the operators' habits work from the base install: the client's own
# version (no controller) and a completion script (shtab is a base dependency).
run "the py.typed marker" "$venv/bin/python" -c \
  "import pathlib, tessera.clients as c; assert (pathlib.Path(c.__file__).parent / 'py.typed').is_file()"
ok "tessera/clients/py.typed is installed"
run "tessctl version --client" "$venv/bin/tessctl" version --client
grep -q "^Client: tessctl " "$log" || fail "tessctl version --client printed no client line"
run "tessctl completion bash" "$venv/bin/tessctl" completion bash
grep -q "tessctl" "$log" || fail "tessctl completion bash printed no script"
ok "tessctl version --client, tessctl completion bash"

# Data files the code reads at run time: the dashboard's page assets and the simulator's clusters.
run "the package data" "$venv/bin/python" -c "
import pathlib, tessera.controller as c
root = pathlib.Path(c.__file__).parent
assert (root / 'dashboard/static/app.js').is_file() and (root / 'dashboard/static/style.css').is_file()
assert (root / 'sim/clusters/morphling-64.json').is_file()"
ok "the dashboard's static files and the simulator's cluster files are installed"

echo "check_install: all checks passed in $((SECONDS - start)) s"
