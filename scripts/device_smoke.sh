#!/usr/bin/env bash
# scripts/gpu_smoke.py on a lent GPU machine, in one command (docs/inventory.md).
#
#   scripts/device_smoke.sh pack   # HERE, before the device call: downloads the wheels the device
#                                  # image lacks or has too old (grpcio >= 1.85.1 for the generated
#                                  # code, structlog, ...) for its Python 3.12 into .devsite/wheels312
#                                  # (ignored by git; carry .devsite)
#   scripts/device_smoke.sh [run] [gpu_smoke args...]   # ON THE DEVICE (the device tool's command),
#                                  # e.g. `run --scenario preempt` (a guaranteed job preempts a
#                                  # best-effort one, which resumes: docs/inventory.md)
#   scripts/device_smoke.sh isolation [--out FILE]   # ON THE DEVICE: scripts/device_isolation_check.py
#                                  # (device cgroups against the real driver, NCCL through the sealed
#                                  # rendezvous store; docs/agent.md "GPU isolation")
#   scripts/device_smoke.sh bench NAME [args...]   # ON THE DEVICE: bench/NAME.py in the same
#                                  # environment, e.g. `bench estimator_gpu --out $OUT/estimator_gpu.json`
#
# Why each step: the device reaches no package registry; run as root, the agent runs its workers
# as `nobody` (docs/agent.md), whose probe and workers start with a bare environment (no
# PYTHONPATH), so the wheels and the tessera tree go first on the interpreter's own path through a
# .pth file, and the checkout is made readable by other users.
set -uo pipefail
cd "$(dirname "$0")/.."
WHEELS=.devsite/wheels312
PKGS=(grpcio==1.85.3 protobuf==7.36.2 structlog aetcd cryptography cffi grpcio-health-checking==1.85.1
      grpcio-reflection==1.85.1 shtab)

pack() {
  mkdir -p "$WHEELS"
  .venv/bin/pip download -q --only-binary=:all: --python-version 3.12 --no-deps -d "$WHEELS" \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_28_x86_64 \
    "${PKGS[@]}" && ls "$WHEELS"
}

setup() {
  local site=/tmp/tessera-devsite tree pth
  python3 -m pip install -q --no-index --no-deps --upgrade --target "$site" "$WHEELS"/*.whl >/dev/null || {
    echo "device_smoke: no wheels in $WHEELS (run 'scripts/device_smoke.sh pack' here and carry .devsite)" >&2
    return 1
  }
  tree=$PWD/$(scripts/pkgtree.sh)
  pth=$(python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')/tessera-devsite.pth
  printf "import sys; sys.path[:0] = ['%s', '%s']\n" "$site" "$tree" > "$pth"
  chmod -R o+rX "$site" "$PWD"
  local d=$PWD
  while [ "$d" != / ]; do chmod o+x "$d"; d=$(dirname "$d"); done
}

run() {
  local out=${OUT:-bench/results}
  mkdir -p "$out"
  setup || return 1
  nvidia-smi -L >"$out/nvidia-smi.txt" 2>&1 || true
  python3 scripts/nvml_facts.py >"$out/nvml_facts.json" 2>&1 || true  # what the probe leaves out, and why
  python3 scripts/gpu_smoke.py "$@" 2>&1 | tee "$out/gpu_smoke.txt"
  return "${PIPESTATUS[0]}"
}

isolation() {
  setup || return 1
  PYTHONUNBUFFERED=1 python3 scripts/device_isolation_check.py "$@"
}

bench() {
  local out=${OUT:-bench/results} name=${1:?bench needs a name under bench/}
  shift
  mkdir -p "$out"
  setup || return 1
  PYTHONUNBUFFERED=1 python3 "bench/$name.py" "$@" 2>&1 | tee "$out/$name.log"
  return "${PIPESTATUS[0]}"
}

case "${1:-run}" in
  pack) pack ;;
  run) shift || true; run "$@" ;;
  isolation) shift; isolation "$@" ;;
  bench) shift; bench "$@" ;;
  *) echo "usage: $0 [pack|run [gpu_smoke args...]|isolation [--out FILE]|bench NAME [args...]]" >&2; exit 2 ;;
esac
