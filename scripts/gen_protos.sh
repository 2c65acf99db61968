#!/usr/bin/env bash
# Regenerates the committed gRPC/protobuf code beside the .proto files.
# With --check, regenerates into a temporary tree and fails on any difference.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
out=protos
if [[ "${1:-}" == "--check" ]]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
fi
"$PY" -m grpc_tools.protoc -Iprotos \
  --python_out="$out" --pyi_out="$out" --grpc_python_out="$out" \
  protos/tessera/v1/*.proto
if [[ "${1:-}" == "--check" ]]; then
  status=0
  for f in "$out"/tessera/v1/*.py "$out"/tessera/v1/*.pyi; do
    rel=${f#"$out"/}
    if ! diff -u "protos/$rel" "$f"; then
      echo "stale generated file: protos/$rel (run scripts/gen_protos.sh)" >&2
      status=1
    fi
  done
  exit $status
fi
