#!/usr/bin/env bash
# `make wheel [WHEELS=DIR]`: a release wheel of the Python package into DIR (default target/wheels),
# printed as the last line. It installs with plain pip where there is no cargo, apt or root
# (`pip install cairn-*.whl`, numpy and tqdm from the index) and carries the `cairn` and
# `cairn-server` commands (python/cairn.data/scripts/: the server inside the extension, for C and
# Fortran programs that start a cluster). The build is maturin develop's (same interpreter, same
# target/), so after `make demo` or `make setup` it only packs.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-target/wheels}
if [ ! -x .venv/bin/maturin ]; then
  echo "maturin not found in .venv: run make demo or make setup first" >&2
  exit 1
fi
mkdir -p "$OUT"
rm -f "$OUT"/cairn-*.whl
.venv/bin/maturin build --release -q -i .venv/bin/python -o "$OUT" >&2
ls "$OUT"/cairn-*.whl
