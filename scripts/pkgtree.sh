#!/usr/bin/env bash
# Lays the installed package layout (tessera.controller, tessera.estimator, ...) as a tree of symlinks
# in build/pkgtree, for the tools that read files rather than import: mypy and import-linter cannot
# follow setuptools' package-dir mapping of an editable install. Prints the tree's path.
set -euo pipefail
cd "$(dirname "$0")/.."
tree=build/pkgtree/tessera
rm -rf build/pkgtree
mkdir -p "$tree"
ln -s ../../../protos/tessera/__init__.py "$tree/__init__.py"
ln -s ../../../protos/tessera/v1 "$tree/v1"
for pkg in common controller nodeagent estimator clients; do
  ln -s "../../../$pkg" "$tree/$pkg"
done
echo build/pkgtree
