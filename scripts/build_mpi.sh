#!/usr/bin/env bash
# The MPI shims of cairn_open_mpi (crates/cairn-capi/mpi/cairn_mpi.c): one per MPI found,
# target/release/libcairn_mpi_openmpi.so (mpicc.openmpi) and libcairn_mpi_mpich.so (mpicc.mpich);
# libcairn loads the one matching the MPI of the program. Skipped, with a note, where none is.
set -euo pipefail
cd "$(dirname "$0")/.."
src=crates/cairn-capi/mpi/cairn_mpi.c
mkdir -p target/release
built=0
for flavour in openmpi mpich; do
  cc=$(command -v "mpicc.$flavour" || true)
  if [ -z "$cc" ] && command -v mpicc >/dev/null; then
    # An MPI installed without Debian's suffixes: mpicc's own flavour only.
    if [ "$flavour" = openmpi ] && mpicc -showme >/dev/null 2>&1; then cc=mpicc; fi
    if [ "$flavour" = mpich ] && ! mpicc -showme >/dev/null 2>&1 && mpicc -show >/dev/null 2>&1; then cc=mpicc; fi
  fi
  [ -n "$cc" ] || continue
  out=target/release/libcairn_mpi_$flavour.so
  built=1
  [ "$out" -nt "$src" ] && continue
  "$cc" -O2 -fPIC -shared -Wall -Werror "$src" -o "$out"
done
if [ "$built" = 0 ]; then
  echo "no mpicc found: cairn_open_mpi is not available (make setup installs Open MPI and MPICH)" >&2
fi
