#!/usr/bin/env bash
# `make install PREFIX=DIR`: the C library, its header, the staging server, and the files that let
# builds find them: DIR/lib/pkgconfig/cairn.pc (pkg-config) and DIR/lib/cmake/Cairn/ (CMake's
# find_package(Cairn): targets Cairn::cairn and, where gfortran built it, Cairn::cairn_fortran),
# and the ADIOS2 plugin engine DIR/lib/libcairn_adios2.so. Programs linked against the installed library find it
# at run time through an rpath the .pc and the CMake target add; the embedded cluster finds
# DIR/bin/cairn-server beside the program or on PATH (or set $CAIRN_SERVER). DIR/bin/cairn is the
# `cairn` command: the Python package, installed from this checkout's wheel under
# DIR/lib/pythonX.Y/site-packages, run by the Python 3 on PATH (or $CAIRN_PYTHON) with its numpy and tqdm.
set -euo pipefail
cd "$(dirname "$0")/.."
PREFIX=${1:?usage: scripts/install.sh PREFIX}
mkdir -p "$PREFIX"
PREFIX=$(cd "$PREFIX" && pwd)
if [ ! -x .venv/bin/python ]; then
  echo "make install needs .venv (maturin, pip) for the cairn command: run make demo or make setup first" >&2
  exit 1
fi
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
# The package first: pip also writes bin/cairn and bin/cairn-server, which the wrapper and the
# standalone server below replace (pip's would run this checkout's venv, not the installed files).
# --ignore-installed: else pip uninstalls the venv's own (editable) cairn before installing here.
WHEEL=$(scripts/build_wheel.sh | tail -1)
.venv/bin/python -m pip install -q --prefix "$PREFIX" --no-deps --no-index --ignore-installed "$WHEEL"
SITE=$(.venv/bin/python -c 'import sys; print("lib/python%d.%d/site-packages" % sys.version_info[:2])')
if [ ! -e "$PREFIX/$SITE/cairn/__init__.py" ]; then
  echo "pip put the cairn package elsewhere than $PREFIX/$SITE: the bin/cairn wrapper would not find it" >&2
  exit 1
fi
install -m 755 target/release/cairn-server "$PREFIX/bin/cairn-server"
rm -f "$PREFIX/bin/cairn"
sed "s|@SITE@|$SITE|g" > "$PREFIX/bin/cairn" <<'WRAPPER'
#!/bin/sh
# `cairn`, installed by `make install`: the Cairn package of this prefix (@SITE@) run by the
# Python 3.9+ on PATH, or $CAIRN_PYTHON; that Python provides numpy and tqdm.
prefix=$(cd "$(dirname "$(readlink -f "$0")")/.." && pwd)
py=${CAIRN_PYTHON:-python3}
if ! command -v "$py" >/dev/null; then
  echo "cairn: $py not found: put a Python 3.9+ with numpy and tqdm on PATH, or set CAIRN_PYTHON to one" >&2
  exit 1
fi
PYTHONPATH="$prefix/@SITE@${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONPATH
exec "$py" -c '
import importlib.util, runpy, sys
del sys.path[0]  # the working directory (python -c puts it first): only the installed package is cairn
if sys.version_info < (3, 9):
    sys.exit("cairn: %s is Python %d.%d; the package needs 3.9+: set CAIRN_PYTHON to a newer one" % (sys.executable, *sys.version_info[:2]))
missing = " and ".join(m for m in ("numpy", "tqdm") if importlib.util.find_spec(m) is None)
if missing:
    sys.exit("cairn: %s lacks %s, which the installed package needs: %s -m pip install numpy tqdm, "
             "or set CAIRN_PYTHON to a Python that has them" % (sys.executable, missing, sys.executable))
runpy.run_module("cairn", run_name="__main__", alter_sys=True)
' "$@"
WRAPPER
chmod 755 "$PREFIX/bin/cairn"
sed -e "s|@PREFIX@|$PREFIX|g" -e "s|@VERSION@|$VERSION|g" cmake/cairn.pc.in > "$PREFIX/lib/pkgconfig/cairn.pc"
sed -e "s|@VERSION@|$VERSION|g" cmake/CairnConfigVersion.cmake.in > "$PREFIX/lib/cmake/Cairn/CairnConfigVersion.cmake"
install -m 644 cmake/CairnConfig.cmake "$PREFIX/lib/cmake/Cairn/CairnConfig.cmake"
if [ -e target/fortran/libcairn_fortran.so ]; then
  install -m 755 target/fortran/libcairn_fortran.so "$PREFIX/lib/libcairn_fortran.so"
  install -m 644 target/fortran/cairn.mod "$PREFIX/include/cairn.mod"
  sed -e "s|@PREFIX@|$PREFIX|g" -e "s|@VERSION@|$VERSION|g" cmake/cairn-fortran.pc.in > "$PREFIX/lib/pkgconfig/cairn-fortran.pc"
fi
# The ADIOS2 plugin engine, where an ADIOS2 to build it against is ($ADIOS2_DIR, else the venv's
# wheel): DIR/lib/libcairn_adios2.so, which finds libcairn.so beside it (rpath $ORIGIN; the
# ADIOS2 libraries are the program's own).
if .venv/bin/python -m cairn adios2-plugin --build >/dev/null; then
  cmake --install adios2/build --prefix "$PREFIX" >/dev/null
else
  echo "make install: the ADIOS2 plugin was not built (see the error above); the rest is installed" >&2
fi
echo "installed Cairn $VERSION into $PREFIX: lib/libcairn.so, include/cairn.h, bin/cairn-server, bin/cairn ($SITE), lib/pkgconfig/cairn.pc, lib/cmake/Cairn"
