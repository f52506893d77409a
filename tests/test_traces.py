"""Fine-grained traces: per-writer records buffered for ``trace_flush`` steps, on both engines."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

import cairn

from .conftest import PY, check, mpirun

WRITER = textwrap.dedent("""
    import sys, numpy as np, cairn
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    cfg, steps, flush = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    sys.path.insert(0, sys.argv[4])
    from trace_data import walkers
    with cairn.open("qmc", "w", config=cfg, comm=comm, trace_flush=flush) as f:
        f.define("weight", dtype="f8", shape=(comm.size,))
        for s in range(steps):
            with f.step(s):
                f.put("weight", np.array([s + comm.rank / 10]), offset=(comm.rank,))
                energy, pos = walkers(comm.rank, s)
                if len(energy):
                    f.trace("energy", energy[:1])    # appended in two calls: one record set
                    f.trace("energy", energy[1:])
                    f.trace("pos", pos)
""")

DATA = textwrap.dedent("""
    import numpy as np
    def walkers(rank, step):
        # A different number of walkers per rank and step; some rank-steps trace none.
        n = (rank * 5 + step * 3) % 7
        rng = np.random.default_rng(rank * 1000 + step)
        return rng.normal(size=n), rng.normal(size=(n, 3)).astype("f4")
""")


@pytest.mark.mpi
@pytest.mark.parametrize("flush", [1, 4])
def test_four_ranks_trace_different_sizes_and_read_back_exactly(tmp_path, cfg, flush):
    (tmp_path / "w.py").write_text(WRITER)
    (tmp_path / "trace_data.py").write_text(DATA)
    check(mpirun(4, PY, str(tmp_path / "w.py"), str(cfg), "10", str(flush), str(tmp_path)))
    ns: dict = {}
    exec(DATA, ns)
    with cairn.open("qmc", "r", config=cfg) as f:
        assert f.steps() == list(range(10))
        assert f.variables()["pos"].local and f.variables()["energy"].dtype == np.float64
        for s in range(10):
            for w in range(4):
                energy, pos = ns["walkers"](w, s)
                got_e, got_p = f.get_trace("energy", s, w), f.get_trace("pos", s, w)
                assert got_e.dtype == np.float64 and got_p.dtype == np.float32
                assert np.array_equal(got_e, energy), (s, w)
                # An empty trace keeps the record shape other writers used that step.
                assert got_p.shape == pos.shape and np.array_equal(got_p, pos), (s, w)


def test_steps_with_buffered_traces_commit_at_the_flush(cfg):
    w = cairn.open("t", "w", config=cfg, trace_flush=3)
    r = cairn.open("t", "r", config=cfg)
    seen = []
    for s in range(5):
        with w.step(s):
            w.trace("e", np.full(s + 1, float(s)))
        seen.append(r.steps())
        if s < 2:
            assert w.traced_bytes == sum(8 * (k + 1) for k in range(s + 1))
    assert seen == [[], [], [0, 1, 2], [0, 1, 2], [0, 1, 2]]
    # An aborted step loses its own records only; the held step 3 stays held.
    with pytest.raises(RuntimeError):
        with w.step(5):
            w.trace("e", np.ones(100))
            raise RuntimeError("simulated failure inside the step")
    assert w.traced_bytes == 8 * (4 + 5)
    w.flush_traces()
    assert r.steps() == [0, 1, 2, 3, 4]
    with w.step(6):
        w.trace("e", 6.0)
    w.close()
    assert r.steps() == [0, 1, 2, 3, 4, 6]
    assert np.array_equal(r.get_trace("e", 4, 0), np.full(5, 4.0))
    assert np.array_equal(r.get_trace("e", 6, 0), [6.0])


def test_bad_traces_are_refused_with_clear_errors(file_cfg):
    with cairn.open("t", "w", config=file_cfg) as f:
        f.define("u", "f8", shape=(4,))
        with pytest.raises(cairn.ConflictError, match="outside a step"):
            f.trace("e", [1.0])
        with f.step(0):
            with pytest.raises(cairn.InvalidArgumentError, match="global array"):
                f.trace("u", [1.0])
            f.trace("e", np.zeros((2, 3)))
            with pytest.raises(cairn.InvalidArgumentError, match="dtype mismatch"):
                f.trace("e", np.zeros((2, 3), dtype="i4"))
            with pytest.raises(cairn.InvalidArgumentError, match=r"same shape after the first axis"):
                f.trace("e", np.zeros((2, 4)))
            f.put("u", np.zeros(4), offset=(0,))
    with cairn.open("t", "r", config=file_cfg) as f:
        assert f.get_trace("e", 0, 0).shape == (2, 3)
        assert f.get_trace("e", 0, 7).shape == (0, 3)
        with pytest.raises(cairn.NotFoundError, match="unknown variable 'nope'"):
            f.get_trace("nope", 0, 0)
        with pytest.raises(cairn.InvalidArgumentError, match="not a trace"):
            f.get_trace("u", 0, 0)
    with pytest.raises(cairn.ConfigError, match="trace_flush"):
        cairn.open("t2", "w", config=file_cfg, trace_flush=0)


KILLED = textwrap.dedent("""
    import os, signal, sys, numpy as np, cairn
    cfg, mode = sys.argv[1], sys.argv[2]
    f = cairn.open("k", mode, config=cfg, trace_flush=5, session=mode)
    for s in range(5 if mode == "a" else 0, 12 if mode == "a" else 8):
        with f.step(s):
            f.trace("e", np.full(s % 4, float(s)))
        if mode == "w" and s == 7:
            os.kill(os.getpid(), signal.SIGKILL)   # steps 5..7 are ended but wait for the flush at 9
    f.close()
""")


def test_a_crash_loses_only_the_unflushed_steps_and_a_restart_rewrites_them(tmp_path, cfg):
    import subprocess

    (tmp_path / "k.py").write_text(KILLED)
    p = subprocess.run([PY, str(tmp_path / "k.py"), str(cfg), "w"], capture_output=True, text=True, timeout=120)
    assert p.returncode == -9, p.stderr
    with cairn.open("k", "r", config=cfg) as r:
        assert r.steps() == [0, 1, 2, 3, 4]  # committed at the flush after step 4; 5..7 never half-visible
        assert np.array_equal(r.get_trace("e", 3, 0), [3.0, 3.0, 3.0])
    check_run = subprocess.run([PY, str(tmp_path / "k.py"), str(cfg), "a"], capture_output=True, text=True, timeout=120)
    assert check_run.returncode == 0, check_run.stderr
    with cairn.open("k", "r", config=cfg) as r:
        assert r.steps() == list(range(12))
        for s in range(12):
            assert np.array_equal(r.get_trace("e", s, 0), np.full(s % 4, float(s))), s
