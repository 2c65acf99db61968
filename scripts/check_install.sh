#!/usr/bin/env bash
# The base install as a user gets it, which the dev venv cannot show (it has every extra): builds the
# wheel from a clean copy of the tree, installs it WITHOUT extras into a fresh venv, and, from outside
# the checkout, checks that
#   - the wheel's only top-level package is `tessera` (no `controller`, `clients`, ... in site-packages);
#   - every console script answers --help;
#   - the README's estimator example prints its table, and the same figures;
#   - the folders' own names (controller, clients, ...) do not import;
#   - torch was not pulled in (it is in the trainer extra only).
# CI runs it (.ci/run). It needs the package index, or a pip cache, for the base dependencies.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
PY=${PYTHON:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "check_install: $*" >&2; exit 1; }

# A copy, so that nothing of the working tree's own build/ (setuptools reuses stale build/lib files)
# or editable install reaches the wheel.
mkdir "$tmp/src"
tar -cf - --exclude=./.git --exclude=./.venv --exclude=./build --exclude='*.egg-info' \
  --exclude=__pycache__ --exclude=./demo-state --exclude=./bench/results . | tar -xf - -C "$tmp/src"

"$PY" -m venv "$tmp/venv"
bin=$tmp/venv/bin
"$bin/python" -m pip install -q --upgrade pip
"$bin/python" -m pip wheel -q --no-deps -w "$tmp/dist" "$tmp/src"
whl=$(echo "$tmp"/dist/tessera-*.whl)
[ -f "$whl" ] || fail "no wheel built"
tops=$("$bin/python" - "$whl" <<'EOF'
import sys, zipfile
names = {name.split("/")[0] for name in zipfile.ZipFile(sys.argv[1]).namelist()}
print(" ".join(sorted(n for n in names if not n.endswith((".dist-info", ".data")))))
EOF
)
[ "$tops" = tessera ] || fail "the wheel's top-level names are '$tops', not 'tessera' alone"
"$bin/python" -m pip install -q "$whl"

# Outside the checkout: only the install is importable.
cd "$tmp"
for script in tessera-controller tessera-agent tessera-estimator tessera-sim tessctl; do
  "$bin/$script" --help >/dev/null || fail "$script --help failed in a base install"
done

out=$("$bin/tessctl" estimate memory -f "$repo/examples/jobs/tiny.yaml" --gpu a100-80gb) \
  || fail "tessctl estimate memory (examples/jobs/tiny.yaml) failed in a base install"
grep -q '^CATEGORY  *BYTES' <<<"$out" || fail "tessctl estimate memory printed no table: $out"

# The README's example (its llama.yaml and command), with the total the README prints.
printf 'name: llama\nmodel: llama2-7b\nglobal_batch_size: 64\niterations: 1000\n' >llama.yaml
out=$("$bin/tessctl" estimate memory -f llama.yaml --gpu a100-80gb \
  --plan dp=2,tp=4,micro_batch=1,sharding=zero1,checkpointing=selective) \
  || fail "the README's tessctl estimate memory example failed in a base install"
grep -q '^total  *29814816768 ' <<<"$out" || fail "the README's example printed another total: $out"

for name in controller nodeagent estimator clients common tessera_common; do
  if "$bin/python" -c "import $name" 2>/dev/null; then
    fail "'import $name' works in a base install: a folder's own name leaked into site-packages"
  fi
done
if "$bin/python" -c "import torch" 2>/dev/null; then
  fail "the base install pulled in torch"
fi
echo "check_install: the base install works (wheel top level: tessera)"
