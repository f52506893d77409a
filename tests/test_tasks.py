"""cairn.tasks: the same suite on both stores (a real 2-server staging cluster, a real
redis-server) and both modes; executors; the memo; commit markers, resume and retry rounds."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as hs

from cairn import tasks
from cairn.exceptions import CapacityError, ConfigError, CorruptError, UnavailableError
from cairn.tasks.runtime import TaskError


@pytest.fixture(scope="module", params=["staging", "redis"])
def store(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp(request.param)
    s = tasks.local(request.param, d, memory="64MiB")
    try:
        yield s
    finally:
        s.close()
        tasks.stop_local(request.param, d)


@pytest.fixture
def ns(request: pytest.FixtureRequest) -> str:
    """A key prefix of this test's own."""
    return request.node.name.replace("[", "_").replace("]", "") + "/"


@pytest.fixture(scope="module")
def pool():
    with tasks.make_executor("process", 2) as ex:
        yield ex


def square(x: int) -> int:
    return x * x


def fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("three")
    return x


def die_on_two(x: int) -> int:
    if x == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def test_values_sets_and_delete(store, ns):
    store.put_many([(ns + "a", b"1"), (ns + "b", b""), (ns + "c", bytes(range(256)) * 100)])
    assert store.get_many([ns + "a", ns + "b", ns + "c", ns + "none"]) == [b"1", b"", bytes(range(256)) * 100, None]
    store.put(ns + "a", b"2")
    assert store.get(ns + "a") == b"2"
    store.add_many([(ns + "s", b"zz"), (ns + "s", b"aa"), (ns + "s", b"zz"), (ns + "t", b"x")])
    assert store.members_many([ns + "s", ns + "t", ns + "none"]) == [[b"aa", b"zz"], [b"x"], []]
    many = [(f"{ns}k/{i}", os.urandom(64)) for i in range(3000)]
    store.put_many(many)
    assert store.get_many([k for k, _ in many]) == [v for _, v in many]
    assert store.delete_many([f"{ns}k/{i}" for i in range(0, 3000, 2)] + [ns + "none", ns + "k/0"]) == 1500
    assert store.get(ns + "k/2") is None and store.get(ns + "k/3") is not None
    assert store.delete(ns + "k/") == 1500
    assert store.get(ns + "k/7") is None and store.get(ns + "a") == b"2"
    assert store.delete_many([ns + "s"]) == 1 and store.members_many([ns + "s"]) == [[]]
    assert store.delete(ns) == 4 and store.delete_many([]) == 0


def test_compare_and_set_claims_once_on_every_store(store, ns):
    other = tasks.open_store(store.url)
    assert store.cas(ns + "claim", None, b"w1") == (True, 1)
    assert other.cas(ns + "claim", None, b"w2") == (False, 1)  # the second claimer loses
    assert other.cas_get(ns + "claim") == (1, b"w1")
    assert store.cas(ns + "claim", 1, b"w1 renewed") == (True, 2)
    assert other.cas(ns + "claim", 1, None) == (False, 2)  # a stale version cannot release it
    assert other.cas(ns + "claim", 2, None) == (True, 0)
    assert store.cas_get(ns + "claim") is None and store.get(ns + "claim") is None
    other.close()


def test_reopened_by_url(store, ns):
    store.put(ns + "x", b"hello")
    other = tasks.open_store(store.url)
    assert other.get(ns + "x") == b"hello"
    other.close()


def test_staging_full_memory_is_a_clear_error(tmp_path):
    s = tasks.local("staging", tmp_path, memory="1MiB")
    try:
        with pytest.raises(CapacityError, match="full|exceeds"):
            s.put_many([(f"k{i}", bytes(200_000)) for i in range(20)])
        got = s.get_many([f"k{i}" for i in range(20)])
        assert None in got and all(v in (None, bytes(200_000)) for v in got), "values are stored whole or not at all"
        assert s.delete("k") == sum(v is not None for v in got)
        s.put("ok", b"still serving")
        assert s.get("ok") == b"still serving"
    finally:
        tasks.stop_local("staging", tmp_path)


def test_dead_stores_give_clear_errors(tmp_path):
    with pytest.raises(UnavailableError, match="not reachable.*redis-server"):
        tasks.open_store("redis://127.0.0.1:1")
    with pytest.raises(UnavailableError, match="no Cairn cluster file"):
        tasks.open_store(str(tmp_path / "nope.json"))
    for kind in ("staging", "redis"):
        s = tasks.local(kind, tmp_path / kind)
        s.put("k", b"v")
        tasks.stop_local(kind, tmp_path / kind)
        with pytest.raises(UnavailableError, match="up|running|reach"):
            s.get_many(["k"])
    with pytest.raises(ConfigError, match="unknown store"):
        tasks.local("mongo", tmp_path)


def test_local_store_is_reused(tmp_path):
    a = tasks.local("redis", tmp_path)
    try:
        a.put("k", b"v")
        b = tasks.local("redis", tmp_path)
        assert b.url == a.url and b.get("k") == b"v"
    finally:
        tasks.stop_local("redis", tmp_path)


@pytest.mark.parametrize("engine", ["process", "dask"])
def test_executors_report_failures_per_item(engine):
    with tasks.make_executor(engine, 2) as ex:
        assert ex.map(square, [1, 2, 3]) == [1, 4, 9]
        out = ex.map(fail_on_three, [1, 3, 5])
        assert out[0] == 1 and out[2] == 5 and isinstance(out[1], ValueError)
    with pytest.raises(ConfigError, match="unknown engine"):
        tasks.make_executor("ray", 2)


def test_process_pool_survives_a_killed_worker():
    with tasks.make_executor("process", 2) as ex:
        out = ex.map(die_on_two, [1, 2, 3])
        assert any(isinstance(r, BaseException) for r in out)
        assert ex.map(square, [4]) == [16], "a broken pool is replaced"


@pytest.mark.parametrize("mode", tasks.MODES)
def test_map_retries_missing_results_in_rounds(store, ns, pool, mode):
    run = tasks.TaskRun(store, ns + "r", mode, pool, inject_faults=True)
    out, info = run.map(square, list(range(10)), step=0, phase=0)
    assert out == [x * x for x in range(10)]
    assert (info.tasks, info.rounds, info.failed, info.executed) == (10, 2, 3, 10), info
    bad = tasks.TaskRun(store, ns + "r2", mode, pool, max_rounds=2)
    with pytest.raises(TaskError, match="1 tasks .* still failed after 2 rounds.*three"):
        bad.map(fail_on_three, [1, 3], step=0, phase=0)


def test_database_mode_rereads_finished_results(store, ns, pool):
    run = tasks.TaskRun(store, ns + "r", "database", pool)
    out, info = run.map(square, [1, 2, 3], step=4, phase=1)
    assert info.executed == 3 and info.recovered == []
    # A restarted driver maps the same inputs: finished results are re-read, not recomputed.
    again = tasks.TaskRun(store, ns + "r", "database", pool)
    out2, info2 = again.map(square, [1, 2, 3], step=4, phase=1)
    assert out2 == out and info2.recovered == [0, 1, 2] and info2.executed == 0
    # A changed input makes that result stale: only it runs again.
    out3, info3 = again.map(square, [1, 5, 3], step=4, phase=1)
    assert out3 == [1, 25, 9] and info3.recovered == [0, 2] and info3.executed == 1


@pytest.mark.parametrize("mode", tasks.MODES)
def test_commit_marker_resume_and_params(store, ns, pool, mode):
    run = tasks.TaskRun(store, ns + "r", mode, pool)
    run.check_params({"nx": 8})
    with pytest.raises(ConfigError, match="other parameters.*'nx': \\(8, 9\\)"):
        run.check_params({"nx": 9})
    assert run.resume_point(5) == 0
    w = np.arange(12.0).reshape(3, 4)
    run.commit(0, {"w": w})
    run.commit(1, {"w": w + 1})
    if mode == "runtime":
        assert run.resume_point(5) == 0, "runtime mode keeps state in the driver only"
        return
    assert run.resume_point(5) == 2 and run.resume_point(2) == 2
    np.testing.assert_array_equal(run.load(1)["w"], w + 1)
    # State without its marker (a crash between the two) is not a committed step.
    store.put(f"{ns}r/state/2/w", (w + 2).tobytes())
    assert run.resume_point(5) == 2
    store.put(f"{ns}r/state/1/w", b"\0" * w.nbytes)
    with pytest.raises(CorruptError, match="damaged"):
        run.load(1)


@pytest.mark.parametrize("mode", tasks.MODES)
def test_commit_drops_the_steps_task_keys(store, ns, pool, mode):
    run = tasks.TaskRun(store, ns + "r", "database", pool)
    run.map(square, [1, 2], step=0, phase=0)
    assert store.get(f"{ns}r/result/0/0/1") is not None
    run.commit(0, {"w": np.zeros(2)})
    assert store.get(f"{ns}r/result/0/0/1") is None and store.get(f"{ns}r/task/0/0/0") is None
    # A rerun after a crash in step 1 finds the killed attempt's keys and drops them at commit,
    # with the state of the step before.
    run.map(square, [1, 2, 3], step=1, phase=2)
    again = tasks.TaskRun(store, ns + "r", "database", pool)
    assert again.resume_point(3) == 1 and again.load(0)["w"].shape == (2,)
    _, info = again.map(square, [1, 2, 3], step=1, phase=2)
    assert info.recovered == [0, 1, 2] and info.executed == 0
    again.commit(1, {"w": np.ones(2)})
    assert store.get_many([f"{ns}r/result/1/2/{i}" for i in range(3)] + [f"{ns}r/task/1/2/0", f"{ns}r/state/0/w"]) == [None] * 5
    assert store.get(f"{ns}r/state/1/w") is not None


def test_memo_buckets_nearest_and_epochs(store, ns):
    memo = tasks.Memo(store, ns + "m", digits=2, dim=2)
    assert memo.key(np.array([-0.001, 0.5])) == memo.key(np.array([0.001, 0.5])) == ns + "m/0:50", "-0.00 and 0.00 share a bucket"
    assert memo.keys(np.array([[np.nan, 0.5], [1e300, 0]]))[0] != memo.keys(np.array([[np.nan, 0.5], [1e300, 0]]))[1]
    pts = np.array([[0.101, 0.2], [0.102, 0.2], [0.104, 0.2], [0.9, 0.9]])
    memo.add(pts[:2], np.array([[1.0], [2.0]]), epoch=0)
    memo.add(pts[2:], np.array([[3.0], [4.0]]), epoch=5)
    q = np.array([[0.1035, 0.2], [0.9, 0.9], [0.9, 0.91], [0.5, 0.5]])
    lk = memo.lookup(q)
    d, rows = lk.nearest(2)
    np.testing.assert_allclose(d[0], [0.0005, 0.0015])
    np.testing.assert_array_equal(lk.values[rows[0], 0], [3.0, 2.0])
    assert d[3, 0] == np.inf and rows[3, 0] == -1, "an empty bucket"
    d, rows = lk.nearest(2, keep=lk.epochs < 5)
    np.testing.assert_array_equal(lk.values[rows[0], 0], [2.0, 1.0]), "samples of epoch 5 are invisible before it"
    assert rows[1, 0] == -1 and rows[1, 1] == -1, "the bucket of (0.9, 0.9) has no sample before epoch 5"
    exact = lk.exact()
    assert lk.values[exact[1], 0] == 4.0 and exact[0] == -1 and exact[2] == -1 and exact[3] == -1
    assert (lk.exact(keep=lk.epochs == 0) == -1).all() and lk.exact(keep=lk.epochs == 5)[1] == exact[1]
    with pytest.raises(ValueError, match="need points"):
        memo.add(np.zeros((2, 3)), np.zeros((2, 1)))


@settings(max_examples=40, deadline=None)
@given(hs.lists(hs.tuples(hs.floats(-1, 1), hs.floats(-1, 1)), min_size=1, max_size=40),
       hs.lists(hs.tuples(hs.floats(-1, 1), hs.floats(-1, 1)), min_size=1, max_size=12), hs.integers(1, 4))
def test_lookup_nearest_and_exact_match_brute_force_per_bucket(points, queries, k):
    pts, qs = np.array(points), np.array(queries + points[:3])
    # Buckets of a coarse grid; samples in stored order within each.
    key = lambda p: tuple(np.floor(p * 2).astype(int))  # noqa: E731
    groups: dict = {}
    for i, p in enumerate(pts):
        groups.setdefault(key(p), []).append(i)
    order = [i for g in groups.values() for i in g]
    start = {g: sum(len(v) for v in list(groups.values())[:j]) for j, g in enumerate(groups)}
    lo = np.array([start.get(key(q), 0) for q in qs])
    hi = np.array([start[key(q)] + len(groups[key(q)]) if key(q) in groups else 0 for q in qs])
    lo = np.where(hi > 0, lo, 0)
    lk = tasks.Lookup(qs, pts[order], np.arange(len(order), dtype=float)[:, None], np.zeros(len(order), np.int64), lo, hi)
    d, rows = lk.nearest(k)
    exact = lk.exact()
    for i, q in enumerate(qs):
        mine = np.arange(lo[i], hi[i])
        brute = np.abs(lk.points[mine] - q).sum(axis=1)
        want = mine[np.argsort(brute, kind="stable")[:k]]
        np.testing.assert_array_equal(rows[i, :len(want)], want)
        assert (rows[i, len(want):] == -1).all()
        same = mine[(lk.points[mine] == q).all(axis=1)]
        assert exact[i] == (same[0] if len(same) else -1)


def test_unique_rows():
    a = np.array([[1.0, -0.0], [0.5, 2.0], [1.0, 0.0], [0.5, 2.0]])
    u, inv = tasks.unique_rows(a)
    assert len(u) == 2 and (u[inv] == a).all()


def test_taskrun_rejects_bad_arguments(store, pool):
    with pytest.raises(ConfigError, match="unknown mode"):
        tasks.TaskRun(store, "x", "cloud", pool)
    with pytest.raises(ConfigError, match="needs an executor"):
        tasks.TaskRun(store, "x", "database", None)


def test_stores_hold_keys_in_separate_servers(tmp_path: Path):
    """Staging spreads keys over its servers (each key on the server its hash places it on)."""
    from cairn import cluster

    s = tasks.local("staging", tmp_path)
    try:
        s.put_many([(f"k{i}", b"v" * 1000) for i in range(100)])
        used = [srv["memory_used"] for srv in cluster.status(s.url)]
        assert len(used) == 3 and all(u > 10_000 for u in used), used
    finally:
        tasks.stop_local("staging", tmp_path)
