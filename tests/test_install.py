"""`make install PREFIX=DIR` (issue 44, first part): C programs build against the installed
library with pkg-config and with CMake's find_package(Cairn), and run without LD_LIBRARY_PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import ROOT, check


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
