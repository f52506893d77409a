"""The file engine's N→M path under mpirun: groups of ranks share a data file, rank 0 commits the
fragments gathered over MPI; aggregators and rank 0 SIGKILLed mid-step leave the last committed
step intact, and a restart goes on from it."""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import cairn

from .conftest import PY, check, mpirun

pytestmark = pytest.mark.mpi

# argv: path, aggregation, aggregators, steps, mode, [kill: rank phase step]
WRITER = textwrap.dedent("""
    import os, signal, sys, numpy as np, cairn
    from mpi4py import MPI
    from cairn import _mpi
    comm = MPI.COMM_WORLD
    path, agg, naggs, steps, mode = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    kill = sys.argv[6:]
    if kill and comm.rank == int(kill[0]):
        # Dies inside end_step of the given step, as the nth call of an exchange method returns:
        # a real crash at a chosen point of the protocol.
        phase, at_step, nth = kill[1], int(kill[2]), int(kill[3])
        real, calls = getattr(_mpi.Exchange, phase), [0]
        def dying(self, *a, _real=real):
            out = _real(self, *a)
            if STEP[0] == at_step:
                calls[0] += 1
                if calls[0] == nth:
                    os.kill(os.getpid(), signal.SIGKILL)
            return out
        setattr(_mpi.Exchange, phase, dying)
    STEP = [-1]
    n = 37 * comm.size   # rows: irregular per rank when ranks do not divide them evenly
    x0, x1 = comm.rank * n // comm.size, (comm.rank + 1) * n // comm.size
    with cairn.open("sim", mode, engine="file", path=path, comm=comm, aggregation=agg, aggregators=naggs) as f:
        if mode == "w":
            f.define("rho", dtype="f8", shape=(n, 5))
            f.define("walkers", dtype="i8", local=True)
        for s in range(f.next_step, steps):
            f.begin_step(s)
            STEP[0] = s
            i, j = np.ogrid[x0:x1, 0:5]
            f.put("rho", (i * 100 + j + s * 1e5).astype("f8"), offset=(x0, 0))
            f.put("walkers", np.arange((comm.rank + s) % 4 * 3, dtype="i8") + comm.rank)
            committed = f.end_step()
            assert committed == (comm.rank == 0 and agg != "none") or agg == "none", (comm.rank, committed)
    print("writer", comm.rank, "ok")
""")


def expect_steps(path: Path, nranks: int, steps: range) -> None:
    n = 37 * nranks
    with cairn.open("sim", "r", engine="file", path=str(path)) as f:
        assert f.steps() == list(steps)
        for s in steps:
            i, j = np.ogrid[0:n, 0:5]
            assert np.array_equal(f.get("rho", s), i * 100 + j + s * 1e5)
            # A box across two ranks' blocks (and so, with aggregation, across two groups' files).
            assert np.array_equal(f.get("rho", s, (30, 1), (n - 40, 3)), (i * 100 + j + s * 1e5)[30:n - 10, 1:4])
            for w in range(nranks):
                assert np.array_equal(f.get_local("walkers", s, w), np.arange((w + s) % 4 * 3, dtype="i8") + w)
            b = f.blocks("rho", s)
            assert sorted(x.writer for x in b) == list(range(nranks))
            assert min(x.min for x in b) == s * 1e5 and max(x.max for x in b) == (n - 1) * 100 + 4 + s * 1e5


def data_files(path: Path) -> list[str]:
    return sorted(p.name.split(".")[0] for p in (path / "sim" / "data").iterdir() if not p.name.startswith("."))


@pytest.mark.parametrize("aggregation", ["send", "offsets", "none"])
def test_six_ranks_two_aggregators_write_and_read_back(tmp_path, aggregation):
    check(mpirun(6, PY, "-c", WRITER, str(tmp_path), aggregation, "2", "4", "w"))
    expect_steps(tmp_path, 6, range(4))
    if aggregation == "none":
        assert data_files(tmp_path) == [f"rank-{r:06}" for r in range(6)]
        return
    # Two groups (ranks 0-2 and 3-5): one data file each, and no per-rank fragment files ever.
    assert data_files(tmp_path) == ["rank-000000", "rank-000003"]
    assert not list((tmp_path / "sim" / "pending").iterdir())
    # One close mark stands for all ranks, and it ends streams at once.
    assert [p.name for p in (tmp_path / "sim" / "closed").iterdir()] == ["rank-000000.json"]
    with cairn.open("sim", "r", engine="file", path=str(tmp_path)) as f:
        t = time.monotonic()
        assert list(f.stream(timeout=60)) == [0, 1, 2, 3]
        assert time.monotonic() - t < 30


def test_default_groups_are_one_per_node(tmp_path):
    # One machine: one group, one data file for all four ranks.
    check(mpirun(4, PY, "-c", WRITER, str(tmp_path), "send", "0", "3", "w"))
    expect_steps(tmp_path, 4, range(3))
    assert data_files(tmp_path) == ["rank-000000"]


@pytest.mark.parametrize("aggregation,victim,phase,nth", [
    ("send", 3, "recv", 4),      # an aggregator, once its 2 members' fragments and blocks arrived, before writing
    ("send", 3, "send", 1),      # an aggregator, after writing, as its fragments go up the tree
    ("offsets", 3, "recv", 1),   # an aggregator, between its members' fragments
    ("offsets", 4, "reserve", 1),  # a member mid-put: room reserved in the group's file, blocks not written
    ("send", 0, "recv", 5),      # rank 0, holding every fragment (2 members, 1 child), before the commit
    ("send", 4, "send", 1),      # a member, once its blocks are sent
], ids=["aggregator-received", "aggregator-sent-up", "aggregator-offsets", "member-mid-put", "rank0-before-commit", "member"])
def test_sigkill_mid_step_keeps_last_committed_step_and_restart_goes_on(tmp_path, aggregation, victim, phase, nth):
    r = mpirun(6, PY, "-c", WRITER, str(tmp_path), aggregation, "2", "6", "w", str(victim), phase, "2", str(nth), timeout=60)
    assert r.returncode != 0, r.stdout + r.stderr
    with cairn.open("sim", "r", engine="file", path=str(tmp_path)) as f:
        got = f.steps()
    # Steps before the crash are committed and whole; the crashed step is whole or not visible
    # (once every block is on its way, rank 0 may commit it before the job is torn down).
    assert got in ([0, 1], [0, 1, 2]), got
    if phase in ("recv", "reserve"):
        assert got == [0, 1], got
    expect_steps(tmp_path, 6, range(len(got)))
    # A restart on another process count carries on from the last committed step.
    check(mpirun(4, PY, "-c", WRITER.replace("37 * comm.size", "37 * 6"), str(tmp_path), aggregation, "2", "6", "a"))
    with cairn.open("sim", "r", engine="file", path=str(tmp_path)) as f:
        assert f.steps() == list(range(6))
        i, j = np.ogrid[0:222, 0:5]
        for s in range(6):
            assert np.array_equal(f.get("rho", s), i * 100 + j + s * 1e5)


def test_errors_reach_every_rank(tmp_path):
    # Two ranks put overlapping boxes: rank 0's merge refuses the step, and every rank raises.
    script = textwrap.dedent("""
        import sys, numpy as np, cairn
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        with cairn.open("sim", "w", engine="file", path=sys.argv[1], comm=comm, aggregators=2) as f:
            f.define("u", dtype="f8", shape=(8,))
            f.begin_step(0)
            f.put("u", np.ones(4), offset=(min(comm.rank, 2) * 2,))
            try:
                f.end_step()
                said = "committed"
            except cairn.ConflictError as e:
                said = f"refused {comm.rank} {'overlap' in str(e)}"
                f.abort_step()
            said = comm.gather(said)
            if comm.rank == 0:
                print(";".join(said))
            f.begin_step(1)
            f.put("u", np.full(2, float(comm.rank)), offset=(comm.rank * 2,))
            f.end_step()
    """)
    out = check(mpirun(4, PY, "-c", script, str(tmp_path)))
    assert out.strip() == ";".join(f"refused {r} True" for r in range(4)), out
    with cairn.open("sim", "r", engine="file", path=str(tmp_path)) as f:
        assert f.steps() == [1]
        assert np.array_equal(f.get("u", 1), np.repeat(np.arange(4.0), 2))


def test_a_put_one_rank_cannot_store_fails_the_step_on_every_rank(tmp_path):
    # Rank 1 may not grow files past 64 KiB (RLIMIT_FSIZE): its put into the group's file fails.
    # That must not leave it out of the collective end of the step: every rank raises, aborts,
    # and the next step (the limit lifted) commits everywhere.
    script = textwrap.dedent("""
        import resource, signal, sys, numpy as np, cairn
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)   # a write past the limit fails with EFBIG
        with cairn.open("sim", "w", engine="file", path=sys.argv[1], comm=comm, aggregators=1) as f:
            f.define("u", dtype="f8", shape=(4, 65536))
            if comm.rank == 1:
                resource.setrlimit(resource.RLIMIT_FSIZE, (65536, resource.RLIM_INFINITY))
            f.begin_step(0)
            f.put("u", np.full((1, 65536), float(comm.rank)), offset=(comm.rank, 0))
            try:
                f.end_step()
                said = "committed"
            except cairn.CairnError as e:
                said = f"{type(e).__name__}"
                f.abort_step()
            if comm.rank == 1:
                resource.setrlimit(resource.RLIMIT_FSIZE, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
            said = comm.gather(said)
            f.begin_step(1)
            f.put("u", np.full((1, 65536), float(comm.rank)), offset=(comm.rank, 0))
            f.end_step()
            if comm.rank == 0:
                print(";".join(said))
    """)
    out = check(mpirun(4, PY, "-c", script, str(tmp_path))).strip()
    assert len(set(out.split(";"))) == 1 and "committed" not in out, out
    with cairn.open("sim", "r", engine="file", path=str(tmp_path)) as f:
        assert f.steps() == [1]
        assert np.array_equal(f.get("u", 1), np.repeat(np.arange(4.0), 65536).reshape(4, 65536))


def test_a_rank_that_cannot_open_makes_every_rank_fail_not_wait(tmp_path):
    # Rank 2 reports a failed open at the ranks' agreement (as a rank whose data file is locked
    # by another writer, or whose disk is full, does): every rank raises instead of waiting in
    # MPI for a rank that left.
    script = textwrap.dedent("""
        import sys, cairn
        from cairn import _mpi
        from mpi4py import MPI
        comm = MPI.COMM_WORLD
        if comm.rank == 2:
            real = _mpi.Exchange.start
            _mpi.Exchange.start = lambda self, at, ok: real(self, at, False)
        try:
            cairn.open("sim", "w", engine="file", path=sys.argv[1], comm=comm, aggregators=2)
            said = "opened"
        except cairn.UnavailableError as e:
            said = "could not open" in str(e) and "unavailable"
        said = comm.gather(said)
        if comm.rank == 0:
            print(";".join(map(str, said)))
    """)
    out = check(mpirun(4, PY, "-c", script, str(tmp_path), timeout=60)).strip()
    assert out == ";".join(["unavailable"] * 4), out


# argv: path, aggregation, steps, silent rank (traces nothing; -1: none)
TRACER = textwrap.dedent("""
    import sys, numpy as np, cairn
    from mpi4py import MPI
    from cairn import _mpi
    comm = MPI.COMM_WORLD
    path, agg, steps, silent = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    sends = [0]
    real = _mpi.Exchange.send
    def counted(self, *a):
        sends[0] += 1
        return real(self, *a)
    _mpi.Exchange.send = counted
    with cairn.open("tr", "w", engine="file", path=path, comm=comm, aggregation=agg, aggregators=2, trace_flush=5) as f:
        f.define("x", dtype="f8", shape=(comm.size, 4))
        f.define("e", dtype="f8", local=True)
        for s in range(steps):
            with f.step(s):
                f.put("x", np.full((1, 4), s + comm.rank / 10), offset=(comm.rank, 0))
                if comm.rank != silent:
                    f.trace("e", np.arange(3 + comm.rank, dtype="f8") + 100 * s)
    with open(f"{path}/sends-{comm.rank}", "w") as out:  # not stdout: mpirun interleaves ranks' lines
        out.write(str(sends[0]))
""")


def expect_traced(path: Path, steps: int, silent: int) -> None:
    """Every step of TRACER's run whole: each rank's row and trace records (none from ``silent``)."""
    with cairn.open("tr", "r", engine="file", path=str(path)) as f:
        assert f.steps() == list(range(steps))
        for s in range(steps):
            np.testing.assert_array_equal(f.get("x", s)[:, 0], s + np.arange(4) / 10)
            for w in range(4):
                want = np.arange(3 + w, dtype="f8") + 100 * s if w != silent else np.empty(0)
                np.testing.assert_array_equal(f.get_trace("e", s, w), want)


@pytest.mark.parametrize("aggregation", ["send", "offsets"])
def test_a_trace_flush_ends_its_held_steps_in_one_exchange(tmp_path, aggregation):
    """Ranks 0-1 and 2-3 are the groups; rank 1 is a member. With trace_flush 5 it ends 4 held
    steps and the flush step at each flush: one batch message for the 4 (plus, with `send`, a data
    message per step), not one exchange per step."""
    check(mpirun(4, PY, "-c", TRACER, str(tmp_path), aggregation, "20", "-1"))
    sends = {r: int((tmp_path / f"sends-{r}").read_text()) for r in range(4)}
    per_flush = 2 if aggregation == "offsets" else 2 + 5
    assert sends[1] == 4 * per_flush, sends
    expect_traced(tmp_path, 20, silent=-1)


@pytest.mark.parametrize("aggregation", ["send", "offsets"])
def test_a_rank_that_traces_nothing_ends_each_step_while_the_others_hold_theirs(tmp_path, aggregation):
    """Rank 3 holds no step (it has no records) and ends each at once; the others hold 4 per
    flush. Each exchange commits the steps every rank sent, and every step commits whole."""
    check(mpirun(4, PY, "-c", TRACER, str(tmp_path), aggregation, "12", "3"))
    expect_traced(tmp_path, 12, silent=3)
