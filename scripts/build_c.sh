#!/usr/bin/env bash
# What `cargo build -p cairn-capi` leaves to do for C and Fortran programs: the soname link
# (libcairn.so.<major>, which programs linked with -lcairn load), the MPI shims of
# cairn_open_mpi and the Fortran module.
set -euo pipefail
cd "$(dirname "$0")/.."
major=$(sed -n 's/^version = "\([0-9]*\)\..*"/\1/p' Cargo.toml | head -1)
ln -sf libcairn.so "target/release/libcairn.so.$major"
scripts/build_mpi.sh
scripts/build_fortran.sh
