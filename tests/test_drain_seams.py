"""The drain's seams between runs and leaders (issue 51, items 1-3): a drained step is known by its
identity (the cluster's id and every staged object's crc32c), never by printed statistics; a
leader killed at any point of a step's drain leaves a drain the next leader finishes; block
statistics are exact on every path. Real server processes, real SIGKILLs."""

from __future__ import annotations

import math
import shutil
from collections.abc import Callable
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest

import cairn
from cairn import cluster

from .conftest import ROOT
from .test_drain import _kill_all
from .test_staging import wait_for

N = 64
FAILPOINT_SERVER = ROOT / "target" / "release" / "cairn-server-failpoints"
needs_failpoints = pytest.mark.skipif(not FAILPOINT_SERVER.exists(), reason="make setup builds target/release/cairn-server-failpoints")


def failpoint_cluster(tmp_path: Path, monkeypatch, point: str, servers: int, **opts) -> tuple[cluster.LocalCluster, Path]:
    """Fail-point servers draining to ``tmp_path/drain`` with ``point`` armed and a failure timeout
    of 1 s, and the marker the first server to reach the point creates as it dies."""
    monkeypatch.setenv("CAIRN_FAILPOINTS", point)
    c = cluster.start(tmp_path / "c.json", servers=servers, memory="64MiB", drain=tmp_path / "drain", failure_timeout="1s",
                      command=[str(FAILPOINT_SERVER)], **opts)
    return c, cluster.entries_dir(c.file) / f"failpoint-{point}"


def _values(step: int, reverse: bool = False) -> np.ndarray:
    """A field whose reverse has the same blocks, min, max and mean in each half (2 writers)."""
    v = np.linspace(0.0, 1.0, N * 32).reshape(N, 32) + step
    half = [v[: N // 2], v[N // 2:]]
    if reverse:
        half = [h[::-1, ::-1] for h in half]
    return np.concatenate(half)


def _writers(file: Path, name: str, mode: str = "w", session: str = "s", **opts) -> list[cairn.Writer]:
    ws = [cairn.open(name, mode, engine="staging", cluster=file, rank=r, nranks=2, session=session, object_size=8192, **opts)
          for r in range(2)]
    if mode == "w":
        for w in ws:
            w.define("t", "f8", (N, 32))
    return ws


def _put(ws: list[cairn.Writer], step: int, data: np.ndarray, meanwhile: Callable[[], object] = lambda: None) -> None:
    """Every rank writes its half of ``step``; ``meanwhile`` runs once all began it (a step on
    disk before it begins is refused at begin_step: a planted one must come later)."""
    for r, w in enumerate(ws):
        w.begin_step(step)
        w.put("t", data[r * N // 2:(r + 1) * N // 2], offset=(r * N // 2, 0))
    meanwhile()
    for w in ws:
        w.end_step()


def test_a_new_run_in_mode_w_over_another_runs_drained_steps_is_refused_at_open_on_every_rank(tmp_path):
    drain = tmp_path / "drain"
    a = cluster.start(tmp_path / "a.json", servers=3, memory="64MiB", drain=drain)
    try:
        ws = _writers(a.file, "d")
        for s in range(5):
            _put(ws, s, _values(s))
        assert ws[0].wait_drained(step=4, timeout=60)
    finally:
        _kill_all(a)
    b = cluster.start(tmp_path / "b.json", servers=3, memory="64MiB", drain=drain)
    try:
        for rank in range(2):
            with pytest.raises(cairn.AlreadyExistsError) as e:
                cairn.open("d", "w", engine="staging", cluster=b.file, rank=rank, nranks=2, session="b")
            assert e.value.code == "foreign_drain"
            msg = str(e.value)
            assert 'mode "a"' in msg and f"cairn rm d --cluster {b.file} --all" in msg and "steps 0 to 4" in msg, msg
        # Nothing of B was committed: continuing A's run with mode "a" opens after A's steps.
        ws = _writers(b.file, "d", mode="a", session="b2")
        assert ws[0].next_step == 5
        _put(ws, 5, _values(5, reverse=True))
        assert ws[0].wait_drained(step=5, timeout=60)
        # A dataset this cluster drained itself opens in mode "w" again (a second writer).
        again = cairn.open("d2", "w", engine="staging", cluster=b.file, session="x")
        again.define("t", "f8", (4,))
        with again.step(0):
            again.put("t", np.arange(4.0))
        assert again.wait_drained(step=0, timeout=60)
        cairn.open("d2", "w", engine="staging", cluster=b.file, session="y").close()
    finally:
        _kill_all(b)
    cluster.stop(b.file, timeout=5.0)  # crashed, then marked stopped: its readers read the drain
    r = cairn.open("d", "r", engine="staging", cluster=b.file)
    assert r.steps() == [0, 1, 2, 3, 4, 5]
    np.testing.assert_array_equal(r.get("t", step=2), _values(2))
    np.testing.assert_array_equal(r.get("t", step=5), _values(5, reverse=True))


def test_a_step_another_run_planted_is_never_taken_and_never_served_as_this_clusters(tmp_path):
    """The drain meets another run's step 1 (same blocks, same statistics, other bytes): it raises
    foreign_drain instead of taking it, and once every server is gone the reader serves this
    cluster's step 0 but not the planted step 1 (once its file is marked stopped: before, the
    reader raises UnavailableError)."""
    other = tmp_path / "other"
    a = cluster.start(tmp_path / "a.json", servers=1, memory="64MiB", redundancy=0, drain=other)
    try:
        ws = _writers(a.file, "d", session="a")
        for s in range(2):
            _put(ws, s, _values(s))
        assert ws[0].wait_drained(step=1, timeout=60)
    finally:
        _kill_all(a)
    drain = tmp_path / "drain"
    b = cluster.start(tmp_path / "b.json", servers=3, memory="64MiB", drain=drain)
    try:
        ws = _writers(b.file, "d", session="b")
        _put(ws, 0, _values(0, reverse=True))
        assert ws[0].wait_drained(step=0, timeout=60)
        # Plant run A's step 1 (its index and data file) while B writes its own step 1.
        def plant() -> None:
            shutil.copy(other / "d" / "steps" / f"{1:012}.json", drain / "d" / "steps" / f"{1:012}.json")
            for f in (other / "d" / "data").glob("drain-000000000001.*"):
                shutil.copy(f, drain / "d" / "data" / f.name)

        _put(ws, 1, _values(1, reverse=True), meanwhile=plant)
        with pytest.raises(cairn.AlreadyExistsError) as e:
            ws[0].wait_drained(step=1, timeout=60)
        assert e.value.code == "foreign_drain" and "another run" in str(e.value), str(e.value)
        a_blocks = cairn.open("d", "r", engine="file", path=other).blocks("t", 1)
        b_blocks = cairn.open("d", "r", engine="staging", cluster=b.file).blocks("t", 1)
        assert [(x.min, x.max) for x in a_blocks] == [(x.min, x.max) for x in b_blocks], "statistics cannot tell them apart"
        r = cairn.open("d", "r", engine="staging", cluster=b.file)
        np.testing.assert_array_equal(r.get("t", step=1), _values(1, reverse=True))
    finally:
        _kill_all(b)
    cluster.stop(b.file, timeout=5.0)
    r = cairn.open("d", "r", engine="staging", cluster=b.file)
    assert r.steps() == [0], "the planted step is not listed as this cluster's"
    np.testing.assert_array_equal(r.get("t", step=0), _values(0, reverse=True))
    # Another cluster's step at or past this run's first step (the owner record's): refused by name.
    with pytest.raises(cairn.AlreadyExistsError, match="step 1") as e:
        r.get("t", step=1)
    assert e.value.code == "foreign_drain"


def test_one_datasets_drain_error_never_stops_another_datasets(tmp_path):
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "c.json", servers=3, memory="64MiB", drain=drain)
    try:
        stuck = _writers(c.file, "aaa", session="s1")
        # Another run's step 0 of "aaa" appears after the open (a folder shared by mistake).
        _put(stuck, 0, _values(0))
        assert stuck[0].wait_drained(step=0, timeout=60)
        planted = drain / "aaa" / "steps" / f"{1:012}.json"
        _put(stuck, 1, _values(1), meanwhile=lambda: shutil.copy(drain / "aaa" / "steps" / f"{0:012}.json", planted))
        free = _writers(c.file, "bbb", session="s2")
        for s in range(3):
            _put(free, s, _values(s))
        assert free[0].wait_drained(step=2, timeout=60), "bbb drains past aaa's failure"
        with pytest.raises(cairn.AlreadyExistsError):
            stuck[0].wait_drained(step=1, timeout=30)
        st = cluster.drain_status(c.file)
        assert st is not None and st["steps"]["bbb"] == 2 and "aaa" in st["errors"] and "bbb" not in st["errors"]
    finally:
        _kill_all(c)


@needs_failpoints
@pytest.mark.parametrize("point", ["drain.before_data", "drain.part_written", "drain.before_commit", "drain.after_index_tmp", "drain.after_link",
                                   "drain.before_record"])
def test_a_server_killed_at_any_point_of_a_drain_leaves_a_drain_the_others_finish(tmp_path, monkeypatch, point):
    drain = tmp_path / "drain"
    c, marker = failpoint_cluster(tmp_path, monkeypatch, point, servers=3)
    try:
        ws = _writers(c.file, "d", timeout=30)
        _put(ws, 0, _values(0))
        wait_for(lambda: marker.exists() and any(p.poll() is not None for p in c.procs), f"a server to die at {point}", 30)
        dead = [p for p in c.procs if p.poll() is not None]
        assert len(dead) == 1, "the first server to reach the fail point, and only it, died"
        for s in range(1, 4):
            _put(ws, s, _values(s))
        assert ws[0].wait_drained(step=3, timeout=90), "the next leader drains every step"
        st = cluster.drain_status(c.file)
        assert st is not None and st["error"] is None and st["steps"] == {"d": 3}
    finally:
        _kill_all(c)
    f = cairn.open("d", "r", engine="file", path=drain)
    assert f.steps() == [0, 1, 2, 3]
    for s in range(4):
        np.testing.assert_array_equal(f.get("t", s), _values(s))


def _ulp(x: float) -> float:
    return math.ulp(x) if x != 0 else math.ulp(0.0)


def test_block_statistics_are_exact_on_every_path(tmp_path):
    """min and max are the elements numpy finds, bit for bit, in staging, in the drained copy
    and in the file engine; the mean is within 1 ulp of the exact mean."""
    drain = tmp_path / "drain"
    rng = np.random.default_rng(51)
    data = {s: rng.random((N, 32)) * 10.0 ** rng.integers(-3, 4) for s in range(12)}
    c = cluster.start(tmp_path / "c.json", servers=3, memory="64MiB", drain=drain)
    try:
        ws = _writers(c.file, "d")
        fw = cairn.open("d", "w", engine="file", path=tmp_path / "file")
        fw.define("t", "f8", (N, 32))
        for s, v in data.items():
            _put(ws, s, v)
            with fw.step(s):
                fw.put("t", v)
        assert ws[0].wait_drained(step=11, timeout=60)
        staged = cairn.open("d", "r", engine="staging", cluster=c.file)
        drained = cairn.open("d", "r", engine="file", path=drain)
        for s, v in data.items():
            halves = [v[: N // 2], v[N // 2:]]
            for b, d, h in zip(staged.blocks("t", s), drained.blocks("t", s), halves):
                assert (b.min, b.max) == (float(h.min()), float(h.max())), (s, b.min, h.min(), b.max, h.max())
                assert (b.min, b.max, b.mean) == (d.min, d.max, d.mean), "the drained copy has the same bits"
                exact = float(sum(Fraction(x) for x in h.ravel()) / h.size)
                assert abs(b.mean - exact) <= _ulp(exact), (b.mean, exact)
            whole = cairn.open("d", "r", engine="file", path=tmp_path / "file").blocks("t", s)[0]
            assert (whole.min, whole.max) == (float(v.min()), float(v.max()))
            exact = float(sum(Fraction(x) for x in v.ravel()) / v.size)
            assert abs(whole.mean - exact) <= _ulp(exact)
    finally:
        _kill_all(c)


def test_after_cluster_stop_the_drained_steps_stay_in_reach_through_the_stopped_file(tmp_path):
    from .test_drain import _status
    from .conftest import PY
    import subprocess

    file, drain = tmp_path / "c.json", tmp_path / "drain"
    c = cluster.start(file, servers=3, memory="64MiB", drain=drain, drain_every=2)
    ws = _writers(file, "d")
    for s in range(5):
        _put(ws, s, _values(s))
    stop = subprocess.run([PY, "-m", "cairn", "cluster", "stop", "--cluster", str(file)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT)
    assert stop.returncode == 0 and "stopped 3 servers" in stop.stdout, stop.stdout + stop.stderr
    doc = __import__("json").loads(file.read_text())
    stopped = {"state": "stopped", "drain": {"path": str(drain), "every": 2}, "id": doc.get("id")}
    assert doc == stopped and len(doc["id"]) == 16, "the id names which drained steps are the cluster's"

    logs = sorted(p.name for p in cluster.entries_dir(file).iterdir())
    assert logs == ["server-0.log", "server-1.log", "server-2.log"], logs
    # The drained steps (0, 2, 4: every second step) read through the stopped file.
    r = cairn.open("d", "r", cluster=file, engine="staging")
    assert r.steps() == [0, 2, 4]
    np.testing.assert_array_equal(r.get("t", step=4), _values(4))
    with pytest.raises(cairn.NotFoundError, match=r"is stopped: only the steps it drained .*every 2 steps"):
        r.get("t", step=3)
    assert _status(file) == stopped
    again = subprocess.run([PY, "-m", "cairn", "cluster", "stop", "--cluster", str(file)], capture_output=True, text=True,
                           timeout=60, cwd=ROOT)
    assert again.returncode == 0 and "stopped already" in again.stdout
    with pytest.raises(cairn.UnavailableError, match="is stopped"):
        cairn.open("d", "a", cluster=file, engine="staging")
    # A new cluster starts over the stopped file and continues after the drained steps.
    c = cluster.start(file, servers=3, memory="64MiB", drain=drain, drain_every=2)
    try:
        ws = _writers(file, "d", mode="a", session="again")
        assert ws[0].next_step == 5
    finally:
        c.stop()
