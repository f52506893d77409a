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


def file_config(tmp_path: Path, **file_keys: str) -> Path:
    """A cairn.toml selecting the file engine under tmp_path, with extra ``[file]`` string keys."""
    c = tmp_path / "cairn.toml"
    extra = "".join(f'{k} = "{v}"\n' for k, v in file_keys.items())
    c.write_text(f'engine = "file"\n[file]\npath = "{tmp_path}"\nchunk_size = 4096\n{extra}')
    return c


@pytest.fixture
def file_cfg(tmp_path: Path) -> Path:
    """A cairn.toml selecting the file engine under tmp_path."""
    return file_config(tmp_path)


#: Every engine and staging transport: the conformance suite (every test taking `cfg`) runs on each.
ALL_TRANSPORTS = ["file", "staging", "staging-attach", "staging-socket", "staging-tcp"]


def engine_config(param: str, tmp_path: Path):
    """A cairn.toml for `param` (one of ALL_TRANSPORTS): the file engine under tmp_path, or a real
    2-server staging cluster (separate processes) with small objects so blocks split, reached by
    same-node shared segments (the default), the server's same-node copies, its Unix socket, or
    TCP."""
    if param == "file":
        yield file_config(tmp_path)
        return
    from cairn import cluster

    transport = param.partition("-")[2] or "auto"
    c = cluster.start(tmp_path / "cluster.json", servers=2, memory="256MiB")
    conf = tmp_path / "cairn.toml"
    # shared_min 1: every same-node ("auto") object goes into a leased shared segment, so the
    # suite covers that path; "attach" covers the server's copies.
    conf.write_text(
        f'engine = "staging"\n[staging]\ncluster = "{c.file}"\nobject_size = 65536\ntransport = "{transport}"\nshared_min = 1\n'
    )
    try:
        yield conf
    finally:
        c.stop()


@pytest.fixture(params=ALL_TRANSPORTS)
def cfg(request: pytest.FixtureRequest, tmp_path: Path):
    """A cairn.toml for each engine and transport (see engine_config); the same tests run on all."""
    yield from engine_config(request.param, tmp_path)


PY = sys.executable


def status_total(file, field: str) -> int:
    """A counter of the servers' status (``same_node_bytes``, ``shared_bytes``, ``mapped_gets`` ...)
    summed over the cluster in ``file``."""
    from cairn import cluster

    return sum(row.get(field) or 0 for row in cluster.status(file))


def stopped_or_gone(file) -> bool:
    """Whether no cluster runs with ``file``: it is gone, or `cairn cluster stop` marked it stopped."""
    import json as _json
    from pathlib import Path as _Path

    p = _Path(file)
    return not p.exists() or _json.loads(p.read_text()).get("state") == "stopped"
