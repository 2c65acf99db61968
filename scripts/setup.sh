#!/usr/bin/env bash
# Sets up everything Tessera needs on a fresh Debian/Ubuntu machine: system packages (systemd-analyze
# for the unit checks), a virtual environment in .venv, the project with its dev extras
# (torch==2.13.0 CPU for the trainer, pytest, hypothesis, grpcio-tools; the trace extra: torchtitan,
# transformers, peft, torchao for the traced mode on real model code), iproute2 and iptables for the
# chaos tests, etcd-server for the etcd store and failover tests, and DeepSpeed for the launcher test.
# Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
# System packages, root only, each installed when its command is missing: systemd (systemd-analyze,
# for the unit checks), iproute2 and iptables (ip netns, veth, DROP rules: the network-partition chaos
# test), etcd-server (the `etcd` binary, started by the etcd store and leader failover tests; the
# controller itself needs one only with --store etcd), chromium (the dashboard's browser tests and
# screenshots, driven by Playwright without its own browser download).
missing=()
command -v systemd-analyze >/dev/null 2>&1 || missing+=(systemd)
command -v ip >/dev/null 2>&1 || missing+=(iproute2)
command -v iptables >/dev/null 2>&1 || missing+=(iptables)
command -v etcd >/dev/null 2>&1 || missing+=(etcd-server)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  else
    echo "setup: missing ${missing[*]} and not root: the tests that need them fail under CI" >&2
  fi
fi
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
.venv/bin/python -m pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -m pip install -q -e '.[dev]' 2>&1 | grep -v "^WARNING: Location" || true
# DeepSpeed, for the deepspeed launcher's end-to-end test (tests/e2e/test_launchers_e2e.py).
# Its setup.py imports torch: built against the torch installed above, not in an isolated build
# environment (which would fetch a multi-GB CUDA torch). No ops are compiled (DS_BUILD_OPS unset).
.venv/bin/python -m pip install -q --no-build-isolation 'deepspeed==0.19.8' 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import torch, grpc, tessera.v1.controller_pb2, deepspeed.launcher.launch, transformers, peft, torchao, torchtitan.models.llama3" >/dev/null 2>&1 || {
  echo "setup: the project's packages did not install (torch, grpc, generated protos, deepspeed, the trace extra)" >&2; exit 1; }
