#!/usr/bin/env bash
# The Fortran module `cairn` (fortran/cairn.f90 over the C API): target/fortran/cairn.mod and
# libcairn_fortran.so, built with the system gfortran (a .mod file is compiler-specific). Skipped,
# with a note, where gfortran is missing.
set -euo pipefail
cd "$(dirname "$0")/.."
if ! command -v gfortran >/dev/null; then
  echo "gfortran not found: the Fortran module is not built (make setup installs gfortran)" >&2
  exit 0
fi
mkdir -p target/fortran
if [ target/fortran/libcairn_fortran.so -nt fortran/cairn.f90 ] && [ target/fortran/libcairn_fortran.so -nt target/release/libcairn.so ]; then
  exit 0
fi
gfortran -O2 -fPIC -shared fortran/cairn.f90 -J target/fortran -o target/fortran/libcairn_fortran.so \
  -L target/release -lcairn -Wl,-rpath,'$ORIGIN'
