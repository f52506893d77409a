"""Shared helpers: running real MPI ranks and separate writer processes."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def mpirun(n: int, *cmd: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    exe = shutil.which("mpirun")
    if exe is None:
        pytest.skip("mpirun not installed (make setup installs Open MPI)")
    extra = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    return subprocess.run([exe, *extra, "-n", str(n), *cmd], env={**os.environ, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


def check(p: subprocess.CompletedProcess) -> str:
    assert p.returncode == 0, f"exit {p.returncode}\nstdout:\n{p.stdout}\nstderr:\n{p.stderr}"
    return p.stdout


@pytest.fixture
def cfg(tmp_path: Path) -> Path:
    """A cairn.toml selecting the file engine under tmp_path."""
    c = tmp_path / "cairn.toml"
    c.write_text(f'engine = "file"\n[file]\npath = "{tmp_path}"\nchunk_size = 4096\n')
    return c


PY = sys.executable
