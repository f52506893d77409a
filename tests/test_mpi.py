"""Real processes: mpirun writer and reader ranks, a SIGKILLed writer, a reader polling mid-write."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import textwrap
from pathlib import Path

import numpy as np
import pytest

import cairn

from .conftest import PY, ROOT, check, file_config, mpirun, stopped_or_gone

pytestmark = pytest.mark.mpi

WRITER = textwrap.dedent("""
    import sys, numpy as np, cairn
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    cfg, steps = sys.argv[1], int(sys.argv[2])
    shape = (100, 30, 7)
    # 100 rows over the ranks: irregular when it does not divide.
    x0, x1 = comm.rank * 100 // comm.size, (comm.rank + 1) * 100 // comm.size
    with cairn.open("sim", "w", config=cfg, comm=comm) as f:
        f.define("rho", dtype="f8", shape=shape)
        f.define("walkers", dtype="i8", local=True)
        for s in range(steps):
            with f.step(s):
                i, j, k = np.ogrid[x0:x1, 0:30, 0:7]
                f.put("rho", (i * 1e4 + j * 1e2 + k + s * 1e6).astype("f8"), offset=(x0, 0, 0))
                f.put("walkers", np.arange((comm.rank + s) % 5 * 4, dtype="i8").reshape(-1, 2) + comm.rank)
""")

READER = textwrap.dedent("""
    import sys, numpy as np, cairn
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    cfg, steps, nw = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    rng = np.random.default_rng(comm.rank)
    with cairn.open("sim", "r", config=cfg) as f:
        assert f.steps() == list(range(steps)), f.steps()
        for s in f.steps():
            for _ in range(5):
                off = [int(rng.integers(0, n)) for n in (100, 30, 7)]
                cnt = [int(rng.integers(1, n - o + 1)) for n, o in zip((100, 30, 7), off)]
                a = f.get("rho", s, off, cnt)
                i, j, k = np.ogrid[off[0]:off[0]+cnt[0], off[1]:off[1]+cnt[1], off[2]:off[2]+cnt[2]]
                assert np.array_equal(a, i * 1e4 + j * 1e2 + k + s * 1e6), (s, off, cnt)
            for w in range(nw):
                want = np.arange((w + s) % 5 * 4, dtype="i8").reshape(-1, 2) + w
                assert np.array_equal(f.get_local("walkers", s, w), want)
    print("reader", comm.rank, "ok")
""")


def test_four_mpi_writers_three_mpi_readers(tmp_path, cfg):
    (tmp_path / "w.py").write_text(WRITER)
    (tmp_path / "r.py").write_text(READER)
    check(mpirun(4, PY, str(tmp_path / "w.py"), str(cfg), "10"))
    out = check(mpirun(3, PY, str(tmp_path / "r.py"), str(cfg), "10", "4"))
    assert out.count("ok") == 3
    with cairn.open("sim", "r", config=cfg) as f:
        assert [b.count[0] for b in f.blocks("rho", 9)] == [25, 25, 25, 25]


KILLED = textwrap.dedent("""
    import os, signal, sys, numpy as np, cairn
    cfg, rank, nranks, mode, die_at = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
    f = cairn.open("sim", mode, config=cfg, rank=rank, nranks=nranks, session=mode)
    f.define("u", dtype="f8", shape=(nranks * 10,))
    for s in range(5):
        if mode == "a" and s < die_at:
            continue
        f._inner.begin_step(s)
        f.put("u", np.full(10, s + 0.5 * (mode == "a")), offset=(rank * 10,))
        if s == die_at and rank == 0 and mode == "w":
            os.kill(os.getpid(), signal.SIGKILL)   # a real crash, mid-step, after putting data
        f._inner.end_step()
    f.close()
""")


def test_writer_killed_mid_step_leaves_earlier_steps_and_hides_that_step(tmp_path, cfg):
    script = tmp_path / "k.py"
    script.write_text(KILLED)
    procs = [subprocess.Popen([PY, str(script), str(cfg), str(r), "3", "w", "3"]) for r in range(3)]
    codes = [p.wait(timeout=60) for p in procs]
    assert codes[0] == -signal.SIGKILL and codes[1:] == [0, 0]
    with cairn.open("sim", "r", config=cfg) as f:
        assert f.steps() == [0, 1, 2]
        for s in range(3):
            assert np.array_equal(f.get("u", s), np.full(30, float(s)))
        with pytest.raises(cairn.NotFoundError):
            f.get("u", 3)
    # Restart in append mode from the crashed step. Rank 0 runs first and alone: the crashed run's
    # step-3 and step-4 fragments of ranks 1 and 2 are still there, but belong to the old session,
    # so nothing may commit until ranks 1 and 2 of the new session end those steps.
    restart = [PY, str(script), str(cfg), "RANK", "3", "a", "3"]
    assert subprocess.run([x.replace("RANK", "0") for x in restart], timeout=60).returncode == 0
    with cairn.open("sim", "r", config=cfg) as f:
        assert f.steps() == [0, 1, 2]
    procs = [subprocess.Popen([x.replace("RANK", str(r)) for x in restart]) for r in (1, 2)]
    assert [p.wait(timeout=60) for p in procs] == [0, 0]
    with cairn.open("sim", "r", config=cfg) as f:
        assert f.steps() == [0, 1, 2, 3, 4]
        assert np.array_equal(f.get("u", 3), np.full(30, 3.5))
        assert np.array_equal(f.get("u", 1), np.full(30, 1.0))


POLLER = textwrap.dedent("""
    import sys, time, numpy as np, cairn
    cfg, steps = sys.argv[1], int(sys.argv[2])
    seen, polls = set(), 0
    deadline = time.time() + 120
    while len(seen) < steps and time.time() < deadline:
        try:
            f = cairn.open("sim", "r", config=cfg)
        except cairn.NotFoundError:
            continue
        for s in f.steps():
            polls += 1
            a = f.get("rho", s)                     # the whole step: fails if any block is missing
            i, j, k = np.ogrid[0:100, 0:30, 0:7]
            assert np.array_equal(a, i * 1e4 + j * 1e2 + k + s * 1e6), s
            seen.add(s)
    print("polls", polls, "steps", len(seen))
""")


def test_polling_reader_never_sees_a_partial_step(tmp_path, cfg):
    (tmp_path / "w.py").write_text(WRITER)
    (tmp_path / "p.py").write_text(POLLER)
    poller = subprocess.Popen([PY, str(tmp_path / "p.py"), str(cfg), "30"], stdout=subprocess.PIPE, text=True)
    check(mpirun(4, PY, str(tmp_path / "w.py"), str(cfg), "30"))
    out, _ = poller.communicate(timeout=120)
    assert poller.returncode == 0
    polls = int(out.split()[1])
    assert "steps 30" in out and polls >= 30


def _mpicc(exe: Path, compiler: str = "mpicc") -> None:
    lib = ROOT / "target" / "release"
    check(subprocess.run([compiler, str(ROOT / "examples/c/write3d.c"), "-I", str(ROOT / "crates/cairn-capi/include"),
                          "-L", str(lib), "-lcairn", f"-Wl,-rpath,{lib}", "-o", str(exe)], capture_output=True, text=True))


def test_c_example_writes_with_mpicc_and_python_reads_with_three_ranks(tmp_path, cfg):
    exe = tmp_path / "write3d"
    _mpicc(exe)
    env = {"CAIRN_CONFIG": str(cfg)}
    assert "C reader verified" in check(mpirun(4, str(exe), "field3d", "4", env=env))
    out = check(mpirun(3, PY, str(ROOT / "examples/python/read3d.py"), "field3d", env=env))
    assert "3 ranks verified 4 steps" in out
    if "file" in cfg.read_text():
        # cairn_open_mpi aggregates as Python's comm= does: the four ranks of this node, one data file.
        assert [p.name.split(".")[0] for p in (tmp_path / "field3d" / "data").iterdir()] == ["rank-000000"]


def test_c_ranks_built_with_mpich_aggregate_through_its_shim(tmp_path):
    """cairn_open_mpi with the other MPI: the same libcairn loads libcairn_mpi_mpich.so."""
    mpicc, mpiexec = shutil.which("mpicc.mpich"), shutil.which("mpiexec.mpich")
    if mpicc is None or mpiexec is None:
        pytest.skip("MPICH is not installed (make setup installs it beside Open MPI)")
    exe = tmp_path / "write3d"
    _mpicc(exe, mpicc)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OMPI_", "PMIX_"))}
    env["CAIRN_CONFIG"] = str(file_config(tmp_path))
    out = check(subprocess.run([mpiexec, "-n", "4", str(exe), "field3d", "3"], capture_output=True, text=True, timeout=120, env=env))
    assert "4 ranks wrote 3 steps" in out
    assert [p.name.split(".")[0] for p in (tmp_path / "field3d" / "data").iterdir()] == ["rank-000000"]
    f = cairn.open("field3d", "r", engine="file", path=tmp_path)
    i, j, k = np.ogrid[0:101, 0:64, 0:48]
    np.testing.assert_array_equal(f.get("temperature", 2), 2e6 + (i * 64 + j) * 48 + k)


def test_c_program_starts_and_stops_its_own_cluster(tmp_path):
    exe = tmp_path / "embedded"
    lib = ROOT / "target" / "release"
    check(subprocess.run(["cc", str(ROOT / "examples/c/embedded.c"), "-I", str(ROOT / "crates/cairn-capi/include"),
                          "-L", str(lib), "-lcairn", f"-Wl,-rpath,{lib}", "-o", str(exe)], capture_output=True, text=True))
    out = check(subprocess.run([str(exe), str(tmp_path)], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "CAIRN_SERVER": str(lib / "cairn-server")}))
    assert "verified a box, stopped the cluster" in out
    assert stopped_or_gone(tmp_path / "cluster.json")
