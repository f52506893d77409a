#!/usr/bin/env bash
# `make install PREFIX=DIR`: the C library, its header, the staging server, and the files that let
# builds find them: DIR/lib/pkgconfig/cairn.pc (pkg-config) and DIR/lib/cmake/Cairn/ (CMake's
# find_package(Cairn): targets Cairn::cairn and, where gfortran built it, Cairn::cairn_fortran). Programs linked against the installed library find it
# at run time through an rpath the .pc and the CMake target add; the embedded cluster finds
# DIR/bin/cairn-server beside the program or on PATH (or set $CAIRN_SERVER).
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${1:?usage: scripts/install.sh PREFIX}
mkdir -p "$PREFIX"
PREFIX=$(cd "$PREFIX" && pwd)
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
cargo build --release -q -p cairn-capi -p cairn-server
scripts/build_c.sh
install -d "$PREFIX/lib" "$PREFIX/include" "$PREFIX/bin" "$PREFIX/lib/pkgconfig" "$PREFIX/lib/cmake/Cairn"
MAJOR=${VERSION%%.*}
# The real file, the soname link programs load and the link they are built with.
install -m 755 target/release/libcairn.so "$PREFIX/lib/libcairn.so.$VERSION"
ln -sf "libcairn.so.$VERSION" "$PREFIX/lib/libcairn.so.$MAJOR"
ln -sf "libcairn.so.$MAJOR" "$PREFIX/lib/libcairn.so"
for shim in target/release/libcairn_mpi_*.so; do  # cairn_open_mpi's, one per MPI
  [ -e "$shim" ] && install -m 755 "$shim" "$PREFIX/lib/"
done
install -m 644 crates/cairn-capi/include/cairn.h "$PREFIX/include/cairn.h"
install -m 755 target/release/cairn-server "$PREFIX/bin/cairn-server"
sed -e "s|@PREFIX@|$PREFIX|g" -e "s|@VERSION@|$VERSION|g" cmake/cairn.pc.in > "$PREFIX/lib/pkgconfig/cairn.pc"
sed -e "s|@VERSION@|$VERSION|g" cmake/CairnConfigVersion.cmake.in > "$PREFIX/lib/cmake/Cairn/CairnConfigVersion.cmake"
install -m 644 cmake/CairnConfig.cmake "$PREFIX/lib/cmake/Cairn/CairnConfig.cmake"
if [ -e target/fortran/libcairn_fortran.so ]; then
  install -m 755 target/fortran/libcairn_fortran.so "$PREFIX/lib/libcairn_fortran.so"
  install -m 644 target/fortran/cairn.mod "$PREFIX/include/cairn.mod"
  sed -e "s|@PREFIX@|$PREFIX|g" -e "s|@VERSION@|$VERSION|g" cmake/cairn-fortran.pc.in > "$PREFIX/lib/pkgconfig/cairn-fortran.pc"
fi
echo "installed Cairn $VERSION into $PREFIX: lib/libcairn.so, include/cairn.h, bin/cairn-server, lib/pkgconfig/cairn.pc, lib/cmake/Cairn"
