"""`make install PREFIX=DIR` (issue 44, first part): C and Fortran programs build against the
installed libraries with pkg-config and with CMake's find_package(Cairn), and run without
LD_LIBRARY_PATH; Python reads what the Fortran module wrote, its dimensions reversed."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import PY, ROOT, check, mpirun


@pytest.fixture(scope="module")
def prefix(tmp_path_factory: pytest.TempPathFactory) -> Path:
    where = tmp_path_factory.mktemp("prefix")
    check(subprocess.run(["make", "-s", "install", f"PREFIX={where}"], cwd=ROOT, capture_output=True, text=True, timeout=900))
    return where


def _run_embedded(exe: Path, prefix: Path, tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("LD_LIBRARY_PATH", "CAIRN_SERVER")}
    env["PATH"] = f"{prefix / 'bin'}:{env.get('PATH', '')}"  # the installed cairn-server
    run = tmp_path / "run"
    run.mkdir()
    out = check(subprocess.run([str(exe), str(run)], capture_output=True, text=True, timeout=120, env=env))
    assert "verified a box, stopped the cluster" in out


def test_install_lays_out_the_library_header_server_and_package_files(prefix):
    for f in ("lib/libcairn.so", "include/cairn.h", "bin/cairn-server", "lib/pkgconfig/cairn.pc",
              "lib/cmake/Cairn/CairnConfig.cmake", "lib/cmake/Cairn/CairnConfigVersion.cmake"):
        assert (prefix / f).exists(), f
    # A versioned library behind the soname programs record, and cairn_open_mpi's shims beside it.
    assert os.readlink(prefix / "lib/libcairn.so") == "libcairn.so.0"
    assert "Library soname: [libcairn.so.0]" in check(subprocess.run(["readelf", "-d", str(prefix / "lib/libcairn.so")],
                                                                      capture_output=True, text=True))
    if shutil.which("mpicc"):
        assert (prefix / "lib/libcairn_mpi_openmpi.so").exists()


def test_install_puts_a_cairn_command_that_runs_the_installed_package(prefix, tmp_path):
    """Issue 56: DIR/bin/cairn runs the package under DIR (not this checkout's) with the Python
    named by $CAIRN_PYTHON (default python3 on PATH), and says what to install when that Python
    lacks numpy or tqdm."""
    cairn = str(prefix / "bin" / "cairn")
    env = {**os.environ, "CAIRN_PYTHON": PY}
    # PYTHONVERBOSE: Python names the file of every module it imports.
    p = subprocess.run([cairn, "--help"], capture_output=True, text=True, timeout=60, cwd=tmp_path, env={**env, "PYTHONVERBOSE": "1"})
    assert p.returncode == 0 and "cluster" in p.stdout, p.stderr[-2000:]
    assert f"{prefix}/lib/python" in p.stderr and f"{ROOT}/python/cairn" not in p.stderr
    f = tmp_path / "cluster.json"
    try:
        check(subprocess.run([cairn, "cluster", "start", "--servers", "3", "--memory", "256MiB", "--file", str(f)],
                             capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env))
        assert "health: OK" in check(subprocess.run([cairn, "cluster", "status", "--file", str(f)], capture_output=True, text=True,
                                                    timeout=60, cwd=tmp_path, env=env))
    finally:
        check(subprocess.run([cairn, "cluster", "stop", "--file", str(f)], capture_output=True, text=True, timeout=60, cwd=tmp_path,
                             env=env))
    bare = tmp_path / "bare"
    check(subprocess.run([PY, "-m", "venv", "--without-pip", str(bare)], capture_output=True, text=True, timeout=60))
    p = subprocess.run([cairn, "--version"], capture_output=True, text=True, timeout=60, env={**env, "CAIRN_PYTHON": str(bare / "bin/python")})
    assert p.returncode == 1 and "lacks numpy and tqdm" in p.stderr and "pip install numpy tqdm" in p.stderr, p.stderr


def test_a_c_program_builds_with_pkg_config_and_runs_without_ld_library_path(prefix, tmp_path):
    if shutil.which("pkg-config") is None:
        pytest.skip("pkg-config is not installed (make setup installs it)")
    env = {**os.environ, "PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig")}
    flags = check(subprocess.run(["pkg-config", "--cflags", "--libs", "cairn"], capture_output=True, text=True, env=env)).split()
    assert f"-I{prefix}/include" in flags and "-lcairn" in flags
    exe = tmp_path / "embedded"
    check(subprocess.run(["cc", str(ROOT / "examples/c/embedded.c"), *flags, "-o", str(exe)], capture_output=True, text=True))
    _run_embedded(exe, prefix, tmp_path)


def test_the_c_examples_build_with_cmake_find_package(prefix, tmp_path):
    if shutil.which("cmake") is None:
        pytest.skip("cmake is not installed (make setup installs it)")
    build = tmp_path / "build"
    check(subprocess.run(["cmake", "-S", str(ROOT / "examples/c"), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}"],
                         capture_output=True, text=True, timeout=300))
    check(subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True, timeout=300))
    assert (build / "write3d").exists() or shutil.which("mpicc") is None, "the MPI example builds where MPI is"
    _run_embedded(build / "embedded", prefix, tmp_path)


def _fortran(prefix: Path, tmp_path: Path, exe: Path) -> None:
    """Runs the Fortran example on a file-engine dataset; Python reads what it wrote."""
    import numpy as np

    import cairn

    cfg = tmp_path / "cairn.toml"
    cfg.write_text(f'engine = "file"\n[file]\npath = "{tmp_path}"\n')
    out = check(subprocess.run([str(exe), str(cfg)], capture_output=True, text=True, timeout=60,
                               env={k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}))
    assert "Fortran: wrote 2 steps of T(6, 4, 3), read a box back" in out
    r = cairn.open("fortran3d", "r", engine="file", path=tmp_path)
    a = r.get("T", 1)
    assert a.shape == (3, 4, 6) and r.variables()["T"].dims == ("z", "y", "x"), "Fortran order, reversed"
    k, j, i = np.meshgrid(range(3), range(4), range(6), indexing="ij")
    np.testing.assert_array_equal(a, 1e6 + i + 100 * j + 10000 * k)


def _fortran_build(prefix: Path, tmp_path: Path, fc: str, source: Path) -> Path:
    """`source` built with `fc` and the installed module's pkg-config flags."""
    env = {**os.environ, "PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig")}
    flags = check(subprocess.run(["pkg-config", "--cflags", "--libs", "cairn-fortran"], capture_output=True, text=True,
                                 env=env)).split()
    exe = tmp_path / source.stem
    check(subprocess.run([fc, str(source), *flags, "-o", str(exe)], capture_output=True, text=True))
    return exe


def test_the_fortran_module_builds_with_pkg_config_and_python_reads_its_arrays_reversed(prefix, tmp_path):
    fc = shutil.which("mpifort") if shutil.which("gfortran") else None
    if fc is None or not (prefix / "lib/pkgconfig/cairn-fortran.pc").exists():
        pytest.skip("gfortran is not installed (make setup installs it)")
    _fortran(prefix, tmp_path, _fortran_build(prefix, tmp_path, fc, ROOT / "examples/fortran/write3d.f90"))


def test_fortran_define_refuses_shapes_past_64_bits(prefix, tmp_path):
    """Issue 52, item 5, through the Fortran module: a shape of 2**62 x 2**62 elements, and one
    of 2**62 f8 elements (2**65 bytes), are refused with CAIRN_ERR_INVALID_ARGUMENT (6) and a
    message naming the shape."""
    fc = shutil.which("gfortran")
    if fc is None or not (prefix / "lib/pkgconfig/cairn-fortran.pc").exists():
        pytest.skip("gfortran is not installed (make setup installs it)")
    exe = _fortran_build(prefix, tmp_path, fc, ROOT / "tests/fortran/define_overflow.f90")
    cfg = tmp_path / "cairn.toml"
    cfg.write_text(f'engine = "file"\n[file]\npath = "{tmp_path}"\n')
    out = check(subprocess.run([str(exe), str(cfg)], capture_output=True, text=True, timeout=60))
    lines = dict(line.split(": ierr ", 1) for line in out.splitlines() if ": ierr " in line)
    for what in ("elements", "bytes"):
        assert lines[what].startswith("6: ") and "shape" in lines[what], out
    assert "fortran define: ok" in out, out


def test_the_fortran_example_builds_with_cmake_find_package(prefix, tmp_path):
    if shutil.which("cmake") is None or shutil.which("gfortran") is None:
        pytest.skip("cmake or gfortran is not installed (make setup installs them)")
    build = tmp_path / "build"
    check(subprocess.run(["cmake", "-S", str(ROOT / "examples/fortran"), "-B", str(build), f"-DCMAKE_PREFIX_PATH={prefix}"],
                         capture_output=True, text=True, timeout=300))
    check(subprocess.run(["cmake", "--build", str(build)], capture_output=True, text=True, timeout=300))
    _fortran(prefix, tmp_path, build / "write3d")
    assert (build / "mpi3d").exists() or shutil.which("mpifort") is None, "the MPI example builds where MPI is"


def _python_dataset(where: Path) -> None:
    """What tests/../mpi3d.f90 reads back: P[z, y, x] = 1000 z + 10 y + x, N = 7 * index."""
    import numpy as np

    import cairn

    with cairn.open("frompy", "w", engine="file", path=where) as f:
        f.define("P", "f8", (5, 4, 3))
        f.define("N", "i8", (4,))
        with f.step(0):
            z, y, x = np.ogrid[0:5, 0:4, 0:3]
            f.put("P", (1000 * z + 10 * y + x).astype("f8"))
            f.put("N", np.arange(4, dtype="i8") * 7)


@pytest.mark.parametrize("mpi", ["openmpi", "mpich"])
def test_four_fortran_ranks_write_with_comm_and_read_what_python_wrote(prefix, tmp_path, mpi):
    import numpy as np

    import cairn

    # Open MPI is the default mpifort/mpirun; MPICH's are installed beside it (make setup).
    fc, run = ("mpifort", None) if mpi == "openmpi" else ("mpifort.mpich", "mpiexec.mpich")
    if shutil.which(fc) is None or (run and shutil.which(run) is None) or not (prefix / "lib/pkgconfig/cairn-fortran.pc").exists():
        pytest.skip(f"{fc} or gfortran is not installed (make setup installs them)")
    env = {**os.environ, "PKG_CONFIG_PATH": str(prefix / "lib" / "pkgconfig")}
    flags = check(subprocess.run(["pkg-config", "--cflags", "--libs", "cairn-fortran"], capture_output=True, text=True,
                                 env=env)).split()
    exe = tmp_path / "mpi3d"
    check(subprocess.run([fc, str(ROOT / "examples/fortran/mpi3d.f90"), *flags, "-o", str(exe)], capture_output=True, text=True))
    data = tmp_path / "data"
    _python_dataset(data)
    cfg = tmp_path / "cairn.toml"
    cfg.write_text(f'engine = "file"\n[file]\npath = "{data}"\n')
    if run is None:
        out = check(mpirun(4, str(exe), str(cfg), "frompy", env={"LD_LIBRARY_PATH": ""}))
    else:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_")) and k != "LD_LIBRARY_PATH"}
        out = check(subprocess.run([run, "-n", "4", str(exe), str(cfg), "frompy"], capture_output=True, text=True, timeout=120, env=env))
    assert "4 ranks wrote T with comm=, read Python's P and N" in out
    # comm= aggregated: one data file for the four ranks of this node.
    assert [p.name.split(".")[0] for p in (data / "mpi3d" / "data").iterdir()] == ["rank-000000"]
    r = cairn.open("mpi3d", "r", engine="file", path=data)
    assert r.variables()["T"].dims == ("z", "y", "x")
    k, j, i = np.ogrid[0:12, 0:4, 0:5]
    for s in (0, 1):
        a = r.get("T", s)
        assert a.shape == (12, 4, 5), "Fortran (nx, ny, nz) reads as (nz, ny, nx)"
        np.testing.assert_array_equal(a, s * 1e6 + i + 100 * j + 10000 * k)


def test_fortran_attributes_and_toml_text_settings_reach_ncdump_and_a_restart_reads_through_its_handle(prefix, tmp_path):
    """Issue 56: Fortran's `cairn_define(attrs=)` and `cairn_set_attr` (text, real(8),
    integer(4), integer(8); var "" for the dataset) appear in `ncdump -h` of the export; the
    settings are TOML text; the restart reads through its "a" handle."""
    fc = shutil.which("gfortran")
    if fc is None or not (prefix / "lib/pkgconfig/cairn-fortran.pc").exists() or shutil.which("ncdump") is None:
        pytest.skip("gfortran or ncdump is not installed (make setup installs them)")
    exe = _fortran_build(prefix, tmp_path, fc, ROOT / "tests/fortran/restart_attrs.f90")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "SLURM_"))}
    out = check(subprocess.run([str(exe), str(tmp_path)], capture_output=True, text=True, timeout=60, env=env))
    assert "fortran restart: resumed at 2, halt F" in out
    nc = tmp_path / "ftemp.nc"
    check(subprocess.run([PY, "-m", "cairn", "export", str(tmp_path / "ftemp"), "-o", str(nc)], capture_output=True, text=True,
                         timeout=120, cwd=ROOT))
    head = check(subprocess.run(["ncdump", "-h", str(nc)], capture_output=True, text=True))
    for line in ('T:units = "K"', 'T:long_name = "air \\"temperature\\""', "T:valid_max = 350.5", ':title = "Fortran run"',
                 ":version = 3", ":seed = 12345678901"):
        assert line in head, f"{line} not in\n{head}"
    halt = tmp_path / "halt"
    halt.touch()
    out = check(subprocess.run([str(exe), str(tmp_path / "again")], capture_output=True, text=True, timeout=60,
                               env={**env, "CAIRN_HALT_FILE": str(halt)}))
    assert "halt T" in out
