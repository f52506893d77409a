"""Where two mechanisms meet (issue 63), with real server processes: reads of steps whose
stripes recovery encoded again, a cluster whose members were all replaced by spares, and the
connection after a refused reply."""

from __future__ import annotations

import os
import signal
import subprocess
import time

import numpy as np
import pytest

import cairn
from cairn import cluster

from .conftest import PY, check, mpirun
from .test_health import _codes, _pieces, _status, _when
from .test_staging import wait_for

SHAPE = (40, 36, 24)

# One of 4 writer processes (a 2 x 2 grid over z and y) streaming steps of a 40 x 36 x 24 field,
# each putting its 20 x 18 x 24 block as two 10 x 18 x 24 halves (34,560-byte objects).
WRITER = """
import sys, time, numpy as np, cairn
file, rank, first, last = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
z0, y0 = 20 * (rank // 2), 18 * (rank % 2)
mode = "w" if first == 0 else "a"
with cairn.open("f", mode, cluster=file, rank=rank, nranks=4, object_size=65536, timeout=60.0, session=f"run-{first}") as f:
    if first == 0:
        f.define("p", "f8", (40, 36, 24))
    for s in range(first, last):
        whole = np.arange(40 * 36 * 24, dtype="f8").reshape(40, 36, 24) + 1000 * s
        with f.step(s):
            for h in range(2):
                f.put("p", np.ascontiguousarray(whole[z0 + 10 * h:z0 + 10 * h + 10, y0:y0 + 18]), offset=(z0 + 10 * h, y0, 0))
        time.sleep(0.02)
"""


def _field(step: int) -> np.ndarray:
    return np.arange(np.prod(SHAPE), dtype="f8").reshape(SHAPE) + 1000 * step


def _write(file, first: int, last: int) -> None:
    procs = [subprocess.Popen([PY, "-c", WRITER, str(file), str(r), str(first), str(last)]) for r in range(4)]
    try:
        for p in procs:
            assert p.wait(timeout=120) == 0, f"a writer of steps {first}-{last - 1} failed"
    finally:
        for p in procs:
            p.kill()


def test_steps_read_exact_after_their_stripes_are_encoded_again_by_a_reader_that_cached_them(tmp_path):
    """5 servers, RS(4 + 1) at put. A reader reads steps 0-9 (caching their indexes and its
    view); the control-plane leader is SIGKILLed and recovery encodes every stripe again as
    RS(3 + 1) under the same keys. The same reader, its view never refreshed, then asks for
    shards by the old geometry: each read is exact (the servers answer `NotFound` or
    `stale_epoch`, never a piece of the new stripe), and so are steps written after."""
    c = cluster.start(tmp_path / "cluster.json", servers=5, meta=3, memory="256MiB", redundancy=1, scheme="erasure",
                      failure_timeout="1s", recovery="aggressive")
    try:
        _write(c.file, 0, 10)
        r = cairn.open("f", "r", cluster=str(c.file), timeout=30.0)
        for s in range(10):
            assert np.array_equal(r.get("p", step=s), _field(s)), f"step {s} before the kill"
        before = _pieces(c.file)
        assert before and all(sorted(sh for sh, _ in p) == [1, 2, 3, 4, 5] for p in before.values()), before
        leader = next(row["id"] for row in cluster.status(c.file) if row["meta"] == "leader")
        c.procs[leader].send_signal(signal.SIGKILL)
        wait_for(lambda: _when(_pieces(c.file), lambda p: set(p) == set(before)
                               and all(sorted(sh for sh, _ in x) == [1, 2, 3, 4] for x in p.values())),
                 "every stripe encoded again as RS(3 + 1)", 60)
        for s in range(10):
            assert np.array_equal(r.get("p", step=s), _field(s)), f"step {s} read by its old geometry"
        assert r.blocks("p", 3), "the connection is in step after the refusals"
        _write(c.file, 10, 16)
        fresh = cairn.open("f", "r", cluster=str(c.file), timeout=30.0)
        for s in range(16):
            assert np.array_equal(fresh.get("p", step=s), _field(s)), f"step {s}, a new reader"
            assert np.array_equal(r.get("p", step=s), _field(s)), f"step {s}, the old reader"
        assert "lost" not in _codes(_status(c.file))
        r.close()
        fresh.close()
    finally:
        c.stop()


def test_new_clients_reach_a_cluster_whose_members_were_all_replaced_by_spares(tmp_path):
    """3 servers and 3 spares: each original member is SIGKILLed in turn, once a spare holds
    the slot of the one before and recovery is done. New writers and readers (whose first view,
    from the cluster file, names only dead servers) find the cluster through the spares."""
    c = cluster.start(tmp_path / "cluster.json", servers=3, spares=3, meta=3, memory="128MiB", redundancy=1,
                      scheme="replicate", failure_timeout="1s", recovery="aggressive")
    opts = dict(cluster=str(c.file), timeout=20.0)
    try:
        with cairn.open("g", "w", **opts) as w:
            w.define("p", "f8", (32, 32))
            with w.step(0):
                w.put("p", np.full((32, 32), 7.0))
        for victim in (0, 1, 2):
            c.procs[victim].send_signal(signal.SIGKILL)
            wait_for(lambda: victim not in (cluster.view(c.file, timeout=1.0) or {"slots": [victim]})["slots"]
                     and _when(_status(c.file), lambda d: d["recovery"]["degraded_objects"] == 0
                               and d["recovery"]["pending_objects"] == 0) is not None,
                     f"a spare holds server {victim}'s slot and recovery is done", 30)
        t0 = time.monotonic()
        with cairn.open("g", "a", **opts) as w:
            with w.step(1):
                w.put("p", np.full((32, 32), 8.0))
        r = cairn.open("g", "r", **opts)
        assert r.steps() == [0, 1]
        assert np.array_equal(r.get("p", step=0), np.full((32, 32), 7.0))
        assert np.array_equal(r.get("p", step=1), np.full((32, 32), 8.0))
        assert time.monotonic() - t0 < 15
        r.close()
    finally:
        c.stop()


def _cli(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "cairn", *args], capture_output=True, text=True, timeout=timeout)


def test_the_last_checkpoint_reaches_disk_whatever_the_cadence(tmp_path):
    """--drain-every 5, steps 0-19 committed: a writer's wait_drained (no step) asks the drain for
    the newest, 19, off the cadence and waits for it; `cairn cluster drain` drains the newest
    step of every dataset and says which; after `cluster stop` step 19 reads from disk."""
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "c.json", servers=2, memory="64MiB", redundancy=1, drain=drain, drain_every=5)
    try:
        w = cairn.open("ck", "w", cluster=str(c.file))
        w.define("t", "f8", (16,))
        for s in range(20):
            with w.step(s):
                w.put("t", np.full(16, float(s)))
        assert w.wait_drained(timeout=30)
        assert cairn.open("ck", "r", engine="file", path=drain).steps() == [0, 5, 10, 15, 19]
        with w.step(20):
            w.put("t", np.full(16, 20.0))
        w.close()
        other = cairn.open("other", "w", cluster=str(c.file))
        other.define("t", "f8", (4,))
        for s in range(3):
            with other.step(s):
                other.put("t", np.zeros(4))
        other.close()
        out = _cli("cluster", "drain", "--file", str(c.file))
        assert out.returncode == 0, out.stderr
        assert "dataset ck: newest step 20 on disk" in out.stdout and "dataset other: newest step 2 on disk" in out.stdout, out.stdout
        out = _cli("cluster", "stop", "--file", str(c.file))
        assert out.returncode == 0, out.stderr
        r = cairn.open("ck", "r", cluster=str(c.file))
        assert r.steps()[-1] == 20 and np.array_equal(r.get("t", step=20), np.full(16, 20.0))
    finally:
        c.stop()


def test_asking_for_a_drain_of_an_older_step_off_the_cadence_is_refused_by_name(tmp_path):
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "c.json", servers=2, memory="64MiB", redundancy=1, drain=drain, drain_every=5)
    try:
        with cairn.open("ck", "w", cluster=str(c.file)) as w:
            w.define("t", "f8", (4,))
            for s in range(12):
                with w.step(s):
                    w.put("t", np.zeros(4))
            assert w.wait_drained(step=11, timeout=30)
            with pytest.raises(cairn.ConflictError, match="step 7 .* older than its newest drained step 11"):
                w.wait_drained(step=7, timeout=5)
    finally:
        c.stop()


HALT_RANK = """
import sys, cairn, numpy as np
rank, kw = int(sys.argv[1]), eval(sys.argv[2])
with cairn.open("h", "w", rank=rank, nranks=3, **kw) as f:
    f.define("t", "f8", (3,))
    step = 0
    while not f.halt_requested():
        with f.step(step):
            f.put("t", np.full(1, float(step)), offset=(rank,))
        step += 1
        if step == 200:
            raise SystemExit("never halted")
print(step)
"""


@pytest.mark.parametrize("engine", ["file", "staging"])
def test_every_rank_of_a_writer_halts_at_the_same_step(tmp_path, engine):
    """3 writer processes without a communicator; the halt file appears while they run. Each asks
    its writer every step: all stop at the same step, none waits for the others in the next."""
    halt = tmp_path / "halt"
    c = None
    if engine == "staging":
        c = cluster.start(tmp_path / "c.json", servers=2, memory="64MiB", redundancy=1)
        kw = {"cluster": str(c.file), "timeout": 20.0}
    else:
        kw = {"engine": "file", "path": str(tmp_path / "out")}
    env = {**os.environ, "CAIRN_HALT_FILE": str(halt), "CAIRN_SESSION": "run-1"}
    try:
        procs = [subprocess.Popen([PY, "-c", HALT_RANK, str(r), repr(kw)], env=env, stdout=subprocess.PIPE, text=True)
                 for r in range(3)]
        time.sleep(0.5)
        halt.touch()
        outs = [p.communicate(timeout=60)[0].strip() for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        assert len(set(outs)) == 1, f"ranks stopped at different steps: {outs}"
    finally:
        if c is not None:
            c.stop()


def test_an_unparsable_halt_variable_is_a_config_error(monkeypatch):
    monkeypatch.setenv("CAIRN_HALT_SECONDS", "5min")
    monkeypatch.setenv("SLURM_JOB_END_TIME", "2000000000")
    with pytest.raises(cairn.ConfigError, match='CAIRN_HALT_SECONDS="5min"'):
        cairn.halt_requested()


RIVAL = """
import sys, cairn, numpy as np
file, start = sys.argv[1], float(sys.argv[2])
import time
time.sleep(max(0.0, start - time.time()))
for i in range(20):
    try:
        with cairn.open(f"n{i}", "w", cluster=file, timeout=20.0) as f:
            f.define("t", "f8", (4,))
            with f.step(0):
                f.put("t", np.zeros(4))
        print(f"n{i} won", flush=True)
    except cairn.AlreadyExistsError as e:
        assert e.code == "foreign_drain", e
        print(f"n{i} refused", flush=True)
"""


def test_two_runs_opening_one_name_at_once_on_one_drain_folder_exactly_one_wins(tmp_path):
    drain = tmp_path / "drain"
    a = cluster.start(tmp_path / "a.json", servers=1, memory="64MiB", redundancy=0, drain=drain)
    b = cluster.start(tmp_path / "b.json", servers=1, memory="64MiB", redundancy=0, drain=drain)
    try:
        start = time.time() + 1.0
        procs = [subprocess.Popen([PY, "-c", RIVAL, str(c.file), str(start)], stdout=subprocess.PIPE, text=True) for c in (a, b)]
        outs = [p.communicate(timeout=120)[0].split("\n") for p in procs]
        assert all(p.returncode == 0 for p in procs), outs
        for i in range(20):
            won = [f"n{i} won" in out for out in outs]
            assert won.count(True) == 1, f"n{i}: {outs}"
        # The loser's reader never takes the winner's drained steps for its own.
        loser = a if "n0 refused" in outs[0] else b
        winner_steps = cairn.open("n0", "r", engine="file", path=drain).steps()
        assert winner_steps == [0] or winner_steps == [], winner_steps
        for p in loser.procs:
            p.send_signal(signal.SIGKILL)
        with pytest.raises(cairn.CairnError):
            r = cairn.open("n0", "r", cluster=str(loser.file), timeout=5.0)
            r.get("t", step=0)
    finally:
        a.stop()
        b.stop()


def test_a_new_cluster_continues_a_stopped_ones_dataset_and_reads_its_history(tmp_path):
    drain = tmp_path / "drain"
    a = cluster.start(tmp_path / "a.json", servers=1, memory="64MiB", redundancy=0, drain=drain)
    with cairn.open("x", "w", cluster=str(a.file)) as f:
        f.define("t", "f8", (4,))
        for s in range(3):
            with f.step(s):
                f.put("t", np.full(4, float(s)))
    b = cluster.start(tmp_path / "b.json", servers=1, memory="64MiB", redundancy=0, drain=drain)
    try:
        with pytest.raises(cairn.AlreadyExistsError, match="cluster"):
            cairn.open("x", "a", cluster=str(b.file))  # a still runs: its run, not this one's
        a.stop()
        with cairn.open("x", "a", cluster=str(b.file)) as f:
            assert f.next_step == 3
            with f.step(3):
                f.put("t", np.full(4, 3.0))
        r = cairn.open("x", "r", cluster=str(b.file))
        assert r.steps() == [0, 1, 2, 3]
        assert all(np.array_equal(r.get("t", step=s), np.full(4, float(s))) for s in range(4))
    finally:
        b.stop()


def test_from_step_beyond_the_newest_is_refused_naming_it(tmp_path):
    out = tmp_path / "out"
    with cairn.open("d", "w", engine="file", path=str(out)) as f:
        f.define("t", "f8", (2,))
        for s in range(5):
            with f.step(s):
                f.put("t", np.zeros(2))
    with pytest.raises(cairn.InvalidArgumentError, match="up to 4"):
        cairn.open("d", "a", engine="file", path=str(out), from_step=99)
    p = _cli("rm", str(out / "d"), "--from-step", "99")
    assert p.returncode != 0 and "up to 4" in p.stderr, p.stderr
    assert cairn.open("d", "r", engine="file", path=str(out)).steps() == [0, 1, 2, 3, 4]


def test_a_put_to_a_server_declared_down_is_abandoned_at_the_declaration(tmp_path):
    """A SIGSTOPped server (neither dead nor answering) holds a put until the control plane
    declares it down (failure timeout 1 s), not for the 30 s deadline; the step commits by the
    new view and reads back exact."""
    c = cluster.start(tmp_path / "c.json", servers=4, meta=3, memory="128MiB", redundancy=1, scheme="replicate",
                      failure_timeout="1s")
    try:
        w = cairn.open("s", "w", cluster=str(c.file), object_size=4096, timeout=30.0)
        w.define("p", "f8", (64, 64))
        with w.step(0):
            w.put("p", np.zeros((64, 64)))
        victim = next(row["id"] for row in cluster.status(c.file) if row["meta"] == "none")
        c.procs[victim].send_signal(signal.SIGSTOP)
        t0 = time.monotonic()
        with w.step(1):
            w.put("p", np.ones((64, 64)))
        took = time.monotonic() - t0
        assert took < 15, f"the step took {took:.1f} s with a server declared down after ~2 s"
        assert np.array_equal(cairn.open("s", "r", cluster=str(c.file), timeout=30.0).get("p", step=1), np.ones((64, 64)))
        c.procs[victim].send_signal(signal.SIGCONT)
        w.close()
    finally:
        c.stop()


HALT_MPI = """
import sys, time, numpy as np, cairn
from mpi4py import MPI
comm = MPI.COMM_WORLD
with cairn.open("h", "w", engine="file", path=sys.argv[1], comm=comm) as f:
    f.define("t", "f8", (comm.size,))
    step = 0
    while not f.halt_requested():
        with f.step(step):
            f.put("t", np.full(1, float(step)), offset=(comm.rank,))
        step += 1
        time.sleep(0.005 * (comm.rank + 1))  # ranks ask at different moments
        if step == 5000:
            raise SystemExit("never halted")
open(f"{sys.argv[1]}.stop.{comm.rank}", "w").write(str(step))  # not stdout: the ranks' lines interleave
"""


@pytest.mark.mpi
def test_ranks_sharing_a_communicator_halt_at_the_same_step(tmp_path):
    """3 MPI ranks, file engine, comm=: the halt file appears while they run; the collective
    answer (an allreduce) stops every rank before the same step, and none is left waiting."""
    halt = tmp_path / "halt"
    script = tmp_path / "halt_mpi.py"
    script.write_text(HALT_MPI)
    import threading
    threading.Timer(2.0, halt.touch).start()
    p = mpirun(3, PY, str(script), str(tmp_path / "out"), env={"CAIRN_HALT_FILE": str(halt)}, timeout=120)
    check(p)
    stops = [(tmp_path / f"out.stop.{r}").read_text() for r in range(3)]
    assert len(set(stops)) == 1, f"ranks stopped before different steps: {stops}"


def test_c_ranks_opened_with_their_communicator_halt_at_the_same_step(tmp_path):
    """The same with C: 3 ranks opened by cairn_open_mpi ask cairn_halt_requested_all (an
    allreduce over the communicator) every step; every rank stops before the same step."""
    from .conftest import ROOT, file_config

    exe, lib, halt = tmp_path / "halt_mpi", ROOT / "target" / "release", tmp_path / "halt"
    check(subprocess.run(["mpicc", str(ROOT / "tests/c/halt_mpi.c"), "-I", str(ROOT / "crates/cairn-capi/include"), "-L", str(lib),
                          "-lcairn", f"-Wl,-rpath,{lib}", "-o", str(exe)], capture_output=True, text=True))
    import threading
    threading.Timer(2.0, halt.touch).start()
    env = {"CAIRN_HALT_FILE": str(halt), "CAIRN_CONFIG": str(file_config(tmp_path))}
    check(mpirun(3, str(exe), str(tmp_path / "out"), env=env, timeout=120))
    stops = [(tmp_path / f"out.stop.{r}").read_text() for r in range(3)]
    assert len(set(stops)) == 1 and int(stops[0]) > 0, f"ranks stopped before different steps: {stops}"
    f = cairn.open("h", "r", engine="file", path=tmp_path)
    assert f.steps() == list(range(int(stops[0]))), "every step before the halt committed by all ranks"


def test_a_reader_reads_a_step_discarded_and_written_again_as_written_again(tmp_path):
    """A reader read step 2 from its drained copy; the step is discarded (from_step), written
    again, drained and released: the same reader gets the new bytes (its cached index of the
    old copy is read again: a new index file), not the old ones."""
    c = cluster.start(tmp_path / "c.json", servers=2, memory="64MiB", redundancy=1, drain=tmp_path / "drain")
    try:
        opts = dict(cluster=str(c.file), timeout=5.0)
        w = cairn.open("x", "w", **opts)
        w.define("u", "f8", (8,))
        for s in range(4):
            with w.step(s):
                w.put("u", np.full(8, float(s)))
        assert w.wait_drained(step=3, timeout=10)
        w.close()
        r = cairn.open("x", "r", **opts)
        r.release(2)
        assert r.get("u", step=2)[0] == 2.0 and {b.level for b in r.blocks("u", 2)} == {"disk"}
        w = cairn.open("x", "a", from_step=2, session="again", **opts)
        with w.step(2):
            w.put("u", np.full(8, 20.0))
        assert w.wait_drained(step=2, timeout=10)
        w.close()
        cairn.open("x", "r", **opts).release(2)
        assert r.get("u", step=2)[0] == 20.0
    finally:
        c.stop()


def test_a_pipeline_stopped_and_started_again_goes_on_after_its_consumed_steps(tmp_path):
    """A producer writes work steps, a claimer consumes each into an output dataset as soon as it
    is committed, and the cluster drains every step. The planned stop (drain, then stop) must
    leave the consumed work steps on disk too: a new cluster's producer, continuing with "a",
    goes on after them instead of producing them again for a second consume (whose output step
    the run before drained already: its drain would fail for good). A step on disk is never
    written again."""
    drain = tmp_path / "drain"
    kw = dict(servers=3, memory="64MiB", meta=3, redundancy=1, drain=drain)
    file = tmp_path / "c.json"
    c = cluster.start(file, **kw)
    try:
        work = cairn.open("work", "w", cluster=str(file))
        work.define("w", "f8", (8,))
        src = cairn.open("work", "r", cluster=str(file))
        out = cairn.open("out", "w", cluster=str(file))
        out.define("m", "f8", (1,))
        for s in range(4):
            with work.step(s):
                work.put("w", np.full(8, float(s)))
            assert next(src.claims(lease=10.0, timeout=10.0)) == s
            with out.step(s, consume=src):
                out.put("m", np.array([float(s)]))
        assert next(src.claims(lease=10.0, timeout=0.5), None) is None, "every work step consumed"
        work.close()
        out.close()
        st = cluster.drain(file, timeout=30.0)
        assert st is not None and st["pending_bytes"] == 0
    finally:
        c.stop()
    on_disk = cairn.open("work", "r", engine="file", path=str(drain))
    assert on_disk.steps() == [0, 1, 2, 3], "consumed steps are drained before they are freed"
    assert np.array_equal(on_disk.get("w", step=3), np.full(8, 3.0))
    c = cluster.start(file, **kw)
    try:
        with cairn.open("work", "a", cluster=str(file)) as w:
            assert w.next_step == 4
            with pytest.raises(cairn.AlreadyExistsError, match="step 3 of 'work' is already committed"):
                w.begin_step(3)
        with cairn.open("out", "a", cluster=str(file)) as o:
            with pytest.raises(cairn.AlreadyExistsError, match="on disk"):
                o.begin_step(2)
            with o.step(4):
                o.put("m", np.array([4.0]))
        assert cluster.drain(file, timeout=30.0)["error"] is None
        r = cairn.open("out", "r", cluster=str(file))
        assert r.steps() == [0, 1, 2, 3, 4]
        assert [float(r.get("m", step=s)[0]) for s in range(5)] == [0.0, 1.0, 2.0, 3.0, 4.0]
    finally:
        c.stop()
