"""Restart as complete as SCR's (issue 56): a handle opened with mode "a" reads the committed
steps it continues (both engines, on fewer ranks than wrote, from the drain after every server
was SIGKILLed), and `from_step` goes back to an older step on every level (staging memory, its
drained copies, the file engine's indexes), also from the shell (`cairn rm --from-step`)."""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

import cairn
from cairn import cluster

from .conftest import PY, ROOT, check, mpirun
from .test_drain import N, _field, _kill_all, _write
from .test_drain_seams import failpoint_cluster, needs_failpoints
from .test_staging import wait_for


def _state(step: int) -> np.ndarray:
    """Per-step local state (particles), ragged by writer."""
    return np.arange(5 + step, dtype="i8") * (step + 1)


def _write_file(path: Path, name: str, steps: range, nranks: int = 2) -> None:
    ws = [cairn.open(name, "w", engine="file", path=path, rank=r, nranks=nranks, session="first") for r in range(nranks)]
    for w in ws:
        w.define("t", "f8", (N, 32))
        w.define("p", "i8", local=True)
    rows = N // nranks
    for s in steps:
        for r, w in enumerate(ws):
            with w.step(s):
                w.put("t", _field(s)[r * rows:(r + 1) * rows], offset=(r * rows, 0))
                w.put("p", _state(s) + r)
    for w in ws:
        w.close()


def test_a_file_restart_reads_its_state_through_the_append_handle_on_fewer_ranks(tmp_path):
    _write_file(tmp_path, "sim", range(3))
    # The crashed run had 2 ranks; the restart has 1 and reads everything through its handle.
    with cairn.open("sim", "a", engine="file", path=tmp_path, session="restart") as f:
        assert f.next_step == 3 and f.steps() == [0, 1, 2]
        last = f.next_step - 1
        np.testing.assert_array_equal(f.get("t", step=last), _field(2))
        np.testing.assert_array_equal(f["t"][last, 0:4], _field(2)[0:4])
        np.testing.assert_array_equal(f.get_local("p", last, writer=1), _state(2) + 1)
        assert set(f.variables()) == {"t", "p"} and len(f.blocks("t", last)) == 2
        with f.step(f.next_step):
            f.put("t", _field(3), offset=(0, 0))
            f.put("p", _state(3))
        # What this handle just committed is readable through it too.
        assert f.steps() == [0, 1, 2, 3]
        np.testing.assert_array_equal(f.get("t", step=3), _field(3))


def test_a_staging_restart_after_every_server_was_killed_reads_from_the_drain_through_its_handle(tmp_path):
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "a.json", servers=3, memory="64MiB", redundancy=1, drain=drain)
    try:
        ws = _write(c.file, "sim", range(3))
        assert ws[0].wait_drained(step=2, timeout=60)
    finally:
        _kill_all(c)
    c2 = cluster.start(tmp_path / "b.json", servers=3, memory="64MiB", redundancy=1, drain=drain)
    try:
        # One rank (the crashed run had two) reads its state from the drain, then goes on.
        with cairn.open("sim", "a", engine="staging", cluster=c2.file, session="restart") as f:
            assert f.next_step == 3 and f.steps() == [0, 1, 2]
            np.testing.assert_array_equal(f.get("t", step=f.next_step - 1), _field(2))
            assert {b.level for b in f.blocks("t", 2)} == {"disk"}
            with f.step(f.next_step):
                f.put("t", _field(3), offset=(0, 0))
            np.testing.assert_array_equal(f.get("t", step=3), _field(3))
            assert f.steps() == [0, 1, 2, 3]
    finally:
        c2.stop()


def test_from_step_discards_memory_and_drained_copies_and_the_rewritten_steps_drain(tmp_path):
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "a.json", servers=3, memory="64MiB", redundancy=1, drain=drain)
    try:
        ws = _write(c.file, "sim", range(6))
        assert ws[0].wait_drained(step=5, timeout=60)
        for w in ws:
            w.close()
        reader = cairn.open("sim", "r", engine="staging", cluster=c.file)
        assert reader.get("t", 4) is not None
        # Step 3 on was bad: back to it, on both levels.
        f = cairn.open("sim", "a", engine="staging", cluster=c.file, session="again", from_step=3)
        assert f.next_step == 3 and f.steps() == [0, 1, 2]
        assert cairn.open("sim", "r", engine="file", path=drain).steps() == [0, 1, 2], "drained copies from 3 on are gone"
        with pytest.raises(cairn.NotFoundError) as e:
            reader.get("t", 4)
        assert e.value.code == "released" and "discarded" in str(e.value)
        # The rewritten steps carry other data, in memory and once drained.
        for s in (3, 4):
            with f.step(s):
                f.put("t", -_field(s), offset=(0, 0))
        assert f.wait_drained(step=4, timeout=60)
        np.testing.assert_array_equal(reader.get("t", 4), -_field(4))
        f.close()
    finally:
        _kill_all(c)
    disk = cairn.open("sim", "r", engine="file", path=drain)
    assert disk.steps() == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(disk.get("t", 2), _field(2))
    np.testing.assert_array_equal(disk.get("t", 4), -_field(4))


def test_from_step_is_refused_while_a_step_is_begun_and_not_ended(tmp_path):
    c = cluster.start(tmp_path / "a.json", servers=2, memory="64MiB", redundancy=0)
    try:
        ws = _write(c.file, "sim", range(2))
        # Rank 0 ends step 2; rank 1 has not yet.
        ws[0].begin_step(2)
        ws[0].put("t", _field(2)[:N // 2], offset=(0, 0))
        assert ws[0].end_step() is False
        with pytest.raises(cairn.ConflictError, match=r"step 2 of 'sim' is begun and not ended"):
            cairn.open("sim", "a", engine="staging", cluster=c.file, session="x", from_step=1)
        assert cairn.open("sim", "r", engine="staging", cluster=c.file).steps() == [0, 1], "nothing was discarded"
        with pytest.raises(cairn.InvalidArgumentError, match="mode 'a'"):
            cairn.open("sim", "w", engine="staging", cluster=c.file, from_step=1)
    finally:
        c.stop()


def _rm(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "cairn", "rm", *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


def test_rm_from_step_goes_back_on_both_engines_from_the_shell(tmp_path):
    _write_file(tmp_path, "sim", range(5))
    out = _rm(str(tmp_path / "sim"), "--from-step", "2")
    assert out.returncode == 0, out.stderr
    assert "discarded the steps of sim from 2 on (3 committed steps); it continues at step 2, the newest kept is 1" in out.stdout
    with cairn.open("sim", "a", engine="file", path=tmp_path, session="r2") as f:
        assert f.next_step == 2 and f.steps() == [0, 1]
        with f.step(2):
            f.put("t", -_field(2), offset=(0, 0))
            f.put("p", _state(2))
    np.testing.assert_array_equal(cairn.open("sim", "r", engine="file", path=tmp_path).get("t", 2), -_field(2))

    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "c.json", servers=2, memory="64MiB", redundancy=0, drain=drain)
    try:
        ws = _write(c.file, "st", range(4))
        assert ws[0].wait_drained(step=3, timeout=60)
        out = _rm("st", "--from-step", "1", "--cluster", str(c.file))
        assert out.returncode == 0, out.stderr
        assert "discarded the steps of st from 1 on in the cluster and its drain" in out.stdout
        assert cairn.open("st", "r", engine="staging", cluster=c.file).steps() == [0]
        assert cairn.open("st", "r", engine="file", path=drain).steps() == [0]
        bad = _rm("st", "--from-step", "-1", "--cluster", str(c.file))
        assert bad.returncode != 0 and "step" in bad.stderr and "Traceback" not in bad.stderr
    finally:
        c.stop()


@pytest.mark.parametrize("victim", ["leader", "holder"])
def test_a_hung_server_costs_a_discard_only_its_deadlines(tmp_path, victim):
    """A SIGSTOPped leader (the discard's coordinator) or holder of the discarded steps' objects:
    the discard goes through the others within the deadlines, and the resumed server serves the
    rewritten steps. (Detection is held off: this is about each call's own deadline.)"""
    deadline = 3.0
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "a.json", servers=3, memory="64MiB", redundancy=1, drain=drain, peer_timeout=0.5,
                      failure_timeout="60s")
    try:
        ws = _write(c.file, "sim", range(6))
        assert ws[0].wait_drained(step=5, timeout=60)
        for w in ws:
            w.close()
        leader = next(row["leader"] for row in cluster.status(c.file) if row.get("leader") is not None)
        hung = leader if victim == "leader" else (leader + 1) % 3
        c.procs[hung].send_signal(signal.SIGSTOP)
        try:
            t = time.monotonic()
            f = cairn.open("sim", "a", engine="staging", cluster=c.file, session="again", from_step=3, timeout=deadline)
            took = time.monotonic() - t
            assert took < 3 * deadline + 10, took
            assert f.next_step == 3 and f.steps() == [0, 1, 2]
            assert cairn.open("sim", "r", engine="file", path=drain).steps() == [0, 1, 2]
        finally:
            c.procs[hung].send_signal(signal.SIGCONT)
        for s in (3, 4):
            with f.step(s):
                f.put("t", -_field(s), offset=(0, 0))
        assert f.wait_drained(step=4, timeout=60)
        f.close()
        r = cairn.open("sim", "r", engine="staging", cluster=c.file)
        assert r.steps() == [0, 1, 2, 3, 4]
        np.testing.assert_array_equal(r.get("t", 4), -_field(4))
        logs = "".join(p.read_text(errors="replace") for p in cluster.entries_dir(c.file).glob("server-*.log"))
        assert "discarded steps of sim from 3 on (3 committed)" in logs
    finally:
        _kill_all(c)


@needs_failpoints
def test_a_leader_killed_between_a_discard_and_its_drained_copies_leaves_them_to_the_next(tmp_path, monkeypatch):
    """The discard is a log command, then the leader's removal of the drained copies: killed in
    between (and its client gone too, so nobody retries), the next leader removes them, and the
    rewritten steps drain as this cluster's, not refused as another run's."""
    drain = tmp_path / "drain"
    c, marker = failpoint_cluster(tmp_path, monkeypatch, "discard.before_copies", servers=3, redundancy=1)
    try:
        ws = _write(c.file, "sim", range(6))
        assert ws[0].wait_drained(step=5, timeout=60)
        for w in ws:
            w.close()
        rm = subprocess.Popen([PY, "-m", "cairn", "rm", "sim", "--from-step", "3", "--cluster", str(c.file)], cwd=ROOT,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(marker.exists, "the leader to reach the fail point", 30)
        rm.kill()
        rm.wait(10)
        assert sum(p.poll() is not None for p in c.procs) == 1, "the leader died after the discard's command"
        wait_for(lambda: cairn.open("sim", "r", engine="file", path=drain).steps() == [0, 1, 2],
                 "the next leader to remove the drained copies of steps 3 to 5", 60)
        logs = "".join(p.read_text(errors="replace") for p in cluster.entries_dir(c.file).glob("server-*.log"))
        assert "removed 3 drained copies of discarded steps of sim" in logs
        f = cairn.open("sim", "a", engine="staging", cluster=c.file, session="again")
        assert f.next_step == 3
        for s in (3, 4):
            with f.step(s):
                f.put("t", -_field(s), offset=(0, 0))
        assert f.wait_drained(step=4, timeout=60), "the rewritten steps drain"
        f.close()
    finally:
        _kill_all(c)
    disk = cairn.open("sim", "r", engine="file", path=drain)
    assert disk.steps() == [0, 1, 2, 3, 4]
    np.testing.assert_array_equal(disk.get("t", 4), -_field(4))


def test_ranks_started_apart_agree_on_from_step_and_a_stopped_cluster_discards_on_its_drain(tmp_path):
    import threading

    _write_file(tmp_path, "sim", range(5))
    # Rank 1 opens first: it waits until rank 0 discarded, so both resume at step 2.
    opened: dict[int, cairn.Writer] = {}

    def rank(r: int) -> None:
        opened[r] = cairn.open("sim", "a", engine="file", path=tmp_path, rank=r, nranks=2, session="back", from_step=2)

    late = threading.Thread(target=rank, args=(1,))
    late.start()
    late.join(0.5)
    assert late.is_alive(), "rank 1 waits for rank 0's discard"
    rank(0)
    late.join(30)
    assert [opened[r].next_step for r in (0, 1)] == [2, 2]
    for r in (0, 1):
        with opened[r].step(2):
            opened[r].put("t", -_field(2)[r * N // 2:(r + 1) * N // 2], offset=(r * N // 2, 0))
            opened[r].put("p", _state(2))
    for r in (0, 1):
        opened[r].close()
    np.testing.assert_array_equal(cairn.open("sim", "r", engine="file", path=tmp_path).get("t", 2), -_field(2))

    # A stopped cluster keeps only its drain: the discard goes there.
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "s.json", servers=2, memory="64MiB", redundancy=0, drain=drain)
    ws = _write(c.file, "st", range(3))
    assert ws[0].wait_drained(step=2, timeout=60)
    for w in ws:
        w.close()
    c.stop()
    out = _rm("st", "--from-step", "1", "--cluster", str(c.file))
    assert out.returncode == 0, out.stderr
    assert cairn.open("st", "r", engine="file", path=drain).steps() == [0]


# argv: path, mode, first step, last step (exclusive), from_step (-1: none), engine, cluster file
RANKS = textwrap.dedent("""
    import sys, numpy as np, cairn
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    path, mode, first, last, back, engine, cl = sys.argv[1:8]
    first, last, back = int(first), int(last), int(back)
    where = dict(path=path) if engine == "file" else dict(cluster=cl)
    opts = dict(from_step=back) if back >= 0 else {}
    n = 8 * comm.size
    with cairn.open("sim", mode, engine=engine, comm=comm, session=f"{mode}{back}", **where, **opts) as f:
        if mode == "w":
            f.define("t", "f8", (n,))
        assert f.next_step == (first if mode == "a" else 0), (comm.rank, f.next_step)
        assert all(s < first for s in f.steps()), (comm.rank, f.steps())
        sign = -1.0 if mode == "a" else 1.0
        for s in range(first, last):
            with f.step(s):
                f.put("t", sign * (np.arange(8.0) + 8 * comm.rank + 100 * s), offset=(8 * comm.rank,))
""")


@pytest.mark.mpi
@pytest.mark.parametrize("engine", ["file", "staging"])
def test_from_step_with_comm_rank_0_discards_and_every_rank_resumes_there(tmp_path, engine):
    (tmp_path / "ranks.py").write_text(RANKS)
    c = cluster.start(tmp_path / "c.json", servers=2, memory="64MiB", redundancy=0) if engine == "staging" else None
    try:
        cl = str(c.file) if c else "-"
        check(mpirun(3, PY, str(tmp_path / "ranks.py"), str(tmp_path), "w", "0", "5", "-1", engine, cl))
        check(mpirun(3, PY, str(tmp_path / "ranks.py"), str(tmp_path), "a", "2", "4", "2", engine, cl))
        f = cairn.open("sim", "r", engine=engine, **({"path": tmp_path} if engine == "file" else {"cluster": c.file}))
        assert f.steps() == [0, 1, 2, 3]
        np.testing.assert_array_equal(f.get("t", 1), np.arange(24.0) + 100)
        np.testing.assert_array_equal(f.get("t", 3), -(np.arange(24.0) + 300))
    finally:
        if c:
            c.stop()
