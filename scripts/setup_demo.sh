#!/usr/bin/env bash
# `make demo`'s set-up: only what the demo needs. A virtualenv with maturin, numpy and tqdm (and
# mpi4py where an MPI's mpicc is, for MPI ranks; without it the demo's ranks are plain processes),
# then the release build of the extension. No apt, no test or benchmark tools, no C library:
# `make setup` (run by `make test` and `make bench`) adds those. Idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust (https://rustup.rs) first, or pip install a wheel built elsewhere (make wheel)" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
pkgs=("maturin>=1.7,<2" numpy tqdm)
if command -v mpicc >/dev/null; then
  pkgs+=(mpi4py)
fi
.venv/bin/pip install -q "${pkgs[@]}"
# The same build as `make setup`'s (one feature set, one target/), so `make test` after it reuses it.
.venv/bin/maturin develop --release -q
echo "demo setup done: .venv ready with cairn (make setup adds the test tools, libcairn and the Fortran module)"
