#!/usr/bin/env bash
# The recipe measurements of bench/estimator_gpu_recipes.py on a lent GPU machine, in one command.
# docs/estimator-gpu.md says how to run it and what it writes.
#
#   scripts/device_recipes.sh pack   # HERE, before the device call: packs the Python packages the
#                                    # device image lacks (torchtitan and its needs, torchao) from
#                                    # .venv into .devsite/site.tar.gz (ignored by git; carry it)
#   scripts/device_recipes.sh check  # HERE: the packed packages import from the tarball alone
#   scripts/device_recipes.sh [run]  # ON THE DEVICE (the device tool's command): unpacks them,
#                                    # lays the tessera import tree, runs the bench into $OUT
#   scripts/device_recipes.sh host   # ON THE DEVICE: the same, then bench/host_overhead.py
#
# Why a tarball: the device machine reaches no package registry, its image has torch, transformers
# and peft but not torchtitan or torchao (/work/.library/device/KINDS.md, "Python packages already
# there"), and the carried tree may hold 64 MiB in all. The packed packages are pure Python where it
# matters (torchao's compiled extensions are left out: they were built for this venv's torch, and
# Float8 training does not use them), so the venv's Python 3.11 copies run on the image's 3.12.
set -uo pipefail
cd "$(dirname "$0")/.."
# What the bench's imports reach beyond the device image's packages (found by running every case with
# the image's missing packages blocked; torchtitan.trainer and its datasets stack are never imported).
PACK=(torchtitan torchao tyro docstring_parser typeguard spmd_types dill)
TARBALL=.devsite/site.tar.gz

pack() {
  local site
  site=$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  local items=()
  for pkg in "${PACK[@]}"; do
    [ -e "$site/$pkg" ] || { echo "device_recipes: $pkg is not installed in .venv (scripts/setup.sh)" >&2; exit 1; }
    items+=("$pkg")
    for meta in "$site/$pkg"-*.dist-info "$site/${pkg//_/-}"-*.dist-info; do
      [ -e "$meta" ] && [[ " ${items[*]} " != *" $(basename "$meta") "* ]] && items+=("$(basename "$meta")")
    done
  done
  mkdir -p .devsite
  tar -C "$site" -czf "$TARBALL" --exclude=__pycache__ --exclude='*.so' --exclude='*/tests' "${items[@]}"
  echo "$TARBALL: $(du -k "$TARBALL" | cut -f1) KiB (${items[*]})"
}

check() {
  # Import what the bench imports with the tarball's copies ahead of everything else.
  local tmp
  tmp=$(mktemp -d)
  tar -xzf "$TARBALL" -C "$tmp"
  PYTHONPATH="$tmp" .venv/bin/python - "$tmp" <<'EOF'
import importlib.abc
import sys

tmp = sys.argv[1]
# Packages this venv has and the device image lacks, which the bench must not need.
ABSENT = {"datasets", "multiprocess", "torchdata", "torch_checkpointing", "wandb"}


class Absent(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in ABSENT:
            raise ImportError(f"{name} is not on the device image")


sys.meta_path.insert(0, Absent())
import torchao.float8  # noqa: E402
import torchtitan  # noqa: E402
import torchtitan.components.loss  # noqa: E402,F401
import torchtitan.components.optimizer  # noqa: E402,F401
import torchtitan.components.quantization  # noqa: E402,F401
import torchtitan.distributed.activation_checkpoint  # noqa: E402,F401
import torchtitan.models.llama3  # noqa: E402,F401
import torchtitan.models.llama3.sharding  # noqa: E402,F401

for m in (torchtitan, torchao):
    assert m.__file__.startswith(tmp), f"{m.__name__} came from {m.__file__}, not the tarball"
print("device_recipes: torchtitan and torchao import from the tarball, without the packages the image lacks")
EOF
  local rc=$?
  rm -rf "$tmp"
  return $rc
}

setup() {
  # The tarball's packages and the tessera tree on PYTHONPATH, offline Hugging Face, versions.txt.
  out=${OUT:-bench/results}
  local site=/tmp/tessera-devsite
  mkdir -p "$out" "$site"
  if [ -f "$TARBALL" ]; then
    tar -xzf "$TARBALL" -C "$site"
  else
    echo "device_recipes: no $TARBALL (run 'scripts/device_recipes.sh pack' here and carry .devsite):" \
         "the torchtitan cases will fail, the transformers ones run" >&2
  fi
  local tree
  tree=$(scripts/pkgtree.sh)
  export PYTHONPATH="$site:$PWD/$tree${PYTHONPATH:+:$PYTHONPATH}"
  export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 PYTHONUNBUFFERED=1
  export TORCHINDUCTOR_CACHE_DIR=/tmp/tessera-inductor
  py=${PYTHON:-python3}
  nvidia-smi >"$out/nvidia-smi.txt" 2>&1 || true
  "$py" - <<'EOF2' 2>&1 | tee "$out/versions.txt"
import importlib
for name in ("torch", "transformers", "peft", "torchtitan", "torchao", "triton"):
    try:
        m = importlib.import_module(name)
        print(name, getattr(m, "__version__", "?"), m.__file__)
    except Exception as exc:  # noqa: BLE001
        print(name, "IMPORT FAILED:", type(exc).__name__, exc)
EOF2
}

run() {
  setup
  "$py" bench/estimator_gpu_recipes.py --out "$out/estimator_gpu_recipes.json" \
    --budget-s "${BUDGET_S:-330}" --case-timeout-s "${CASE_TIMEOUT_S:-200}" "$@" 2>&1 \
    | tee "$out/estimator_gpu_recipes.log"
  return "${PIPESTATUS[0]}"
}

host() {
  # bench/host_overhead.py: the host's launch time per recipe (docs/estimator-gpu.md, "The host floor")
  setup
  "$py" bench/host_overhead.py --out "$out/host_overhead.json" --budget-s "${BUDGET_S:-180}" "$@" 2>&1 \
    | tee "$out/host_overhead.log"
  return "${PIPESTATUS[0]}"
}

case "${1:-run}" in
  pack) pack ;;
  check) check ;;
  run) shift || true; run "$@" ;;
  host) shift; host "$@" ;;
  *) echo "usage: $0 [pack|check|run [bench args...]|host [host_overhead args...]]" >&2; exit 2 ;;
esac
