"""pip without root (issue 56): a wheel built once (`make wheel`, sharing target/ with the other
builds) installs into a fresh venv and runs there with no cargo on PATH and no checkout in sight:
the `cairn` command starts a cluster, the demo runs on the file engine and on a staging cluster
with its ranks as plain processes, and a C program finds the wheel's `cairn-server` on PATH."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import PY, ROOT, check

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

#: numpy and tqdm for the fresh venv, downloaded once: later runs install offline.
WHEELHOUSE = ROOT / "target" / "wheelhouse"


def _pip_install(venv: Path, wheels: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(venv / "bin" / "pip"), "install", "-q", "--no-index", "--find-links", str(wheels),
                           "--find-links", str(WHEELHOUSE), "cairn"], capture_output=True, text=True, timeout=300)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (not the checkout's) with the wheel and its two dependencies, nothing else."""
    tmp = tmp_path_factory.mktemp("wheel")
    wheels = tmp / "wheels"
    out = check(subprocess.run(["scripts/build_wheel.sh", str(wheels)], cwd=ROOT, capture_output=True, text=True, timeout=900,
                               env={**os.environ, "CARGO_TARGET_DIR": str(ROOT / "target")}))
    assert Path(out.split()[-1]).name.startswith("cairn-"), out
    venv = tmp / "venv"
    check(subprocess.run([PY, "-m", "venv", str(venv)], capture_output=True, text=True, timeout=120))
    if _pip_install(venv, wheels).returncode != 0:
        check(subprocess.run([PY, "-m", "pip", "download", "-q", "numpy", "tqdm", "-d", str(WHEELHOUSE)],
                             capture_output=True, text=True, timeout=300))
        check(_pip_install(venv, wheels))
    return venv


def _env(venv: Path) -> dict[str, str]:
    """The venv's bin and the system's, nothing of the checkout or of Rust's toolchain."""
    path = f"{venv / 'bin'}:/usr/bin:/bin"
    assert shutil.which("cargo", path=path) is None and shutil.which("maturin", path=path) is None
    return {"PATH": path, "HOME": os.environ.get("HOME", "/root"), "LANG": "C.UTF-8"}


def _run(venv: Path, *cmd: str, cwd: Path, timeout: float = 120) -> str:
    return check(subprocess.run(list(cmd), cwd=cwd, env=_env(venv), capture_output=True, text=True, timeout=timeout))


def test_the_wheel_installs_the_package_and_both_commands_outside_the_checkout(venv, tmp_path):
    where = _run(venv, "python", "-c", "import cairn, cairn._native; print(cairn._native.__file__)", cwd=tmp_path)
    assert where.startswith(str(venv)), where
    assert _run(venv, "cairn", "--version", cwd=tmp_path).startswith("cairn ")
    server = shutil.which("cairn-server", path=_env(venv)["PATH"])
    assert server == str(venv / "bin" / "cairn-server")
    assert Path(server).read_text().startswith(f"#!{venv}/bin/python"), "pip points the launcher at the venv's Python"


def test_cairn_cluster_start_status_stop_from_the_wheel(venv, tmp_path):
    f = tmp_path / "cluster.json"
    try:
        assert "cluster of 3 servers" in _run(venv, "cairn", "cluster", "start", "--servers", "3", "--memory", "256MiB",
                                              "--file", str(f), cwd=tmp_path)
        status = _run(venv, "cairn", "cluster", "status", "--file", str(f), cwd=tmp_path)
        assert "health: OK" in status and status.count(" up ") == 3, status
    finally:
        _run(venv, "cairn", "cluster", "stop", "--file", str(f), cwd=tmp_path)


def test_the_demo_runs_from_the_wheel_on_the_file_engine_as_plain_processes(venv, tmp_path):
    out = _run(venv, "python", "-m", "cairn.demo", "--launch", "processes", "--engine", "file", cwd=tmp_path)
    assert "ranks as plain processes" in out
    assert "write: 4 ranks, 10 steps of 128^3 f8" in out and "read:  3 ranks read y-slabs of every step: 168 MB" in out, out
    assert "steps   10 committed: 0..9" in out, out


def test_the_demo_defaults_to_plain_processes_without_mpi4py_on_a_staging_cluster(venv, tmp_path):
    """mpirun may be on PATH here (/usr/bin), but the fresh venv has no mpi4py."""
    out = _run(venv, "python", "-m", "cairn.demo", cwd=tmp_path)
    assert "ranks as plain processes" in out and 'engine = "staging"' in out, out
    assert "write: 4 ranks" in out and "read:  3 ranks" in out and "health: OK" in out, out


def test_a_c_program_starts_a_cluster_with_the_wheels_cairn_server(venv, tmp_path):
    """A C program of a pip install: cairn_cluster_start runs `cairn-server` from PATH, the
    wheel's launcher of the server inside the extension (no binary beside the program, no
    $CAIRN_SERVER)."""
    lib = ROOT / "target" / "release"
    if not (lib / "libcairn.so").exists() or shutil.which("cc") is None:
        pytest.skip("make setup builds target/release/libcairn.so (and needs a C compiler)")
    exe = tmp_path / "embedded"
    check(subprocess.run(["cc", str(ROOT / "examples/c/embedded.c"), "-I", str(ROOT / "crates/cairn-capi/include"), "-L", str(lib),
                          "-lcairn", f"-Wl,-rpath,{lib}", "-o", str(exe)], capture_output=True, text=True))
    assert shutil.which("cairn-server", path=_env(venv)["PATH"]) == str(venv / "bin" / "cairn-server"), "the only one it can run"
    run = tmp_path / "run"
    run.mkdir()
    out = _run(venv, str(exe), str(run), cwd=tmp_path)
    assert "verified a box, stopped the cluster" in out, out


def test_the_demo_asked_for_mpi_without_mpi4py_says_what_to_do(venv, tmp_path):
    p = subprocess.run(["python", "-m", "cairn.demo", "--launch", "mpi"], cwd=tmp_path, env=_env(venv), capture_output=True, text=True,
                       timeout=60)
    assert p.returncode == 1 and "--launch processes" in p.stderr and not p.stdout, p.stderr
