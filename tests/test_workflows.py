"""D²T workflows (issue 18), on real staging servers and on the file engine: claims of committed
steps shared by claimer processes, consume-and-produce as one transaction, and a writer's close
ending streams."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import cairn
from cairn import cluster


@pytest.fixture(params=["staging", "file"])
def opts(request, tmp_path):
    """Where the datasets live: a 3-server staging cluster, or a file engine directory."""
    if request.param == "file":
        yield dict(engine="file", path=str(tmp_path / "data"))
        return
    c = cluster.start(tmp_path / "cluster.json", servers=3, memory="256MiB", meta=3)
    try:
        yield dict(engine="staging", cluster=str(c.file), timeout=20.0)
    finally:
        c.stop()


def _field(step: int) -> np.ndarray:
    return np.arange(8 * 16, dtype="f8").reshape(8, 16) + 1000 * step


def _write(opts: dict, steps: range, close: bool = True) -> None:
    w = cairn.open("sim", "w", **opts)
    w.define("p", "f8", (8, 16))
    for s in steps:
        with w.step(s):
            w.put("p", _field(s))
    if close:
        w.close()


CLAIMER = textwrap.dedent("""
    import json, sys, time, cairn
    opts, how = json.loads(sys.argv[1]), sys.argv[2]
    with cairn.open("sim", "r", **opts) as src, cairn.open("stats", "w", rank=0, nranks=1, **opts) as dst:
        dst.define("mean", dtype="f8", local=True)
        for step in src.claims(lease=1.5):
            a = src.get("p", step)
            print("claimed", step, flush=True)
            if how == "hold":
                time.sleep(3600)          # SIGKILLed here, holding the claim
            with dst.step(step, consume=src):
                dst.put("mean", a.mean(axis=0))
                if how == "inside":
                    print("inside", step, flush=True)
                    time.sleep(3600)      # SIGKILLed here, inside the consuming step
            print("committed", step, flush=True)
            time.sleep(0.02)
    print("done", flush=True)
""")


def test_three_claimers_two_killed_consume_every_step_exactly_once(opts, tmp_path):
    """The issue's test: 3 claimer processes over 40 steps; one SIGKILLed while holding a claim,
    one SIGKILLed inside `dst.step(consume=)`. At the end every step is in `stats` exactly once
    with the right result, every source step is released, no step was committed twice, and the
    survivor ended by itself."""
    _write(opts, range(40))
    script = tmp_path / "claimer.py"
    script.write_text(CLAIMER)
    procs = {how: subprocess.Popen([sys.executable, str(script), json.dumps(opts), how], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for how in ("hold", "inside", "work")}
    outs: dict[str, str] = {}
    try:
        for how, word in (("hold", "claimed"), ("inside", "inside")):
            line = outs[how] = ""
            while not line.startswith(word) and procs[how].poll() is None:
                line = procs[how].stdout.readline()
                outs[how] += line
            assert line.startswith(word), (how, line, procs[how].stderr.read())
            procs[how].send_signal(signal.SIGKILL)
            procs[how].wait(timeout=10)
        outs["work"], err = procs["work"].communicate(timeout=120)
        assert procs["work"].returncode == 0, err[-3000:]
        assert outs["work"].strip().endswith("done"), outs["work"]
    finally:
        for how, p in procs.items():
            if p.poll() is None:
                p.kill()
            if how != "work" or how not in outs:
                outs[how] = outs.get(how, "") + p.communicate(timeout=10)[0]  # reaps it and closes its pipes
    committed = [int(line.split()[1]) for out in outs.values() for line in out.splitlines() if line.startswith("committed")]
    assert sorted(committed) == list(range(40)), "each step committed by exactly one claimer"
    with cairn.open("stats", "r", **opts) as r:
        assert r.steps() == list(range(40)), "every step once, none lost"
        for s in range(40):
            assert np.array_equal(r.get_local("mean", s, writer=0), _field(s).mean(axis=0)), s
    with cairn.open("sim", "r", **opts) as src:
        assert src.steps() == [], "every source step was consumed (released)"


def test_a_claimer_whose_lease_lapsed_cannot_consume_a_step_another_consumed(opts):
    _write(opts, range(2))
    src = cairn.open("sim", "r", **opts)
    # A claimer that stopped renewing (no heartbeat): its lease lapses and the step moves on.
    assert src._inner.claim("stalled", 0.3) == (0, False)
    time.sleep(0.4)
    it = src.claims(lease=5)
    assert next(it) == 0, "the lapsed lease's step goes to the next claimer"
    with cairn.open("stats", "w", rank=0, nranks=1, **opts) as dst:
        dst.define("mean", dtype="f8", local=True)
        with dst.step(0, consume=src):
            dst.put("mean", np.ones(3))
    with cairn.open("stats2", "w", rank=0, nranks=1, **opts) as late:
        late.define("mean", dtype="f8", local=True)
        with pytest.raises(cairn.ConflictError, match="no longer committed"):
            with late.step(0, consume=src):
                late.put("mean", np.zeros(3))
    with cairn.open("stats2", "r", **opts) as r:
        assert r.steps() == [], "the refused step is not visible"
    assert src.steps() == [1]
    assert next(it) == 1
    it.close()  # gives step 1 back
    assert src._inner.claim("other", 5.0) == (1, False)


def test_claims_end_when_the_writers_closed_and_streams_too(opts):
    _write(opts, range(3), close=False)
    src = cairn.open("sim", "r", **opts)
    t0 = time.monotonic()
    assert list(src.claims(lease=5, timeout=0.5)) == [0, 1, 2], "timeout: no more steps came"
    assert time.monotonic() - t0 < 5
    w = cairn.open("sim", "a", **opts)
    w.define("p", "f8", (8, 16))
    with w.step(3):
        w.put("p", _field(3))
    w.close()
    assert list(src.stream()) == [0, 1, 2, 3], "a stream with no timeout ends once the writers closed"
    got = []
    for s in src.claims(lease=5):
        got.append(s)
        with cairn.open("out", "w", rank=0, nranks=1, **opts) as dst:
            dst.define("x", dtype="f8", local=True)
            with dst.step(s, consume=src):
                dst.put("x", np.zeros(1))
    assert got == [0, 1, 2, 3] and src.steps() == []


def test_a_destination_step_commits_once_and_a_refused_one_keeps_its_source(opts):
    """Two claimers racing into one destination step (from two sources): the second commit is
    refused and its source step stays, untouched."""
    _write(opts, range(1))
    w = cairn.open("sim2", "w", **opts)
    w.define("p", "f8", (8, 16))
    with w.step(0):
        w.put("p", _field(0))
    w.close()
    src, src2 = cairn.open("sim", "r", **opts), cairn.open("sim2", "r", **opts)
    late = cairn.open("stats", "w", rank=0, nranks=1, **opts)
    late.define("mean", dtype="f8", local=True)
    late._inner.begin_step(0)  # began before the other commits
    late._inner.consume(["sim2"])
    late.put("mean", np.zeros(3))
    with cairn.open("stats", "w", rank=0, nranks=1, **opts) as first:
        first.define("mean", dtype="f8", local=True)
        with first.step(0, consume=src):
            first.put("mean", np.ones(3))
    with pytest.raises(cairn.AlreadyExistsError, match="step 0"):
        late._inner.end_step()
    late._inner.abort_step()
    late.close()
    with cairn.open("stats", "r", **opts) as r:
        assert r.steps() == [0] and np.array_equal(r.get_local("mean", 0, writer=0), np.ones(3))
    assert src.steps() == [] and src2.steps() == [0], "only the committed transaction released its source"
    assert np.array_equal(src2.get("p", 0), _field(0))


def test_the_last_rank_carries_the_consume_of_several_sources(opts):
    """A 2-rank destination: rank 0 names the sources (a list), rank 1 ends last and its end of
    step commits the step and releases it in both sources at once."""
    for name in ("sim", "sim2"):
        w = cairn.open(name, "w", **opts)
        w.define("p", "f8", (8, 16))
        with w.step(0):
            w.put("p", _field(0))
        w.close()
    src, src2 = cairn.open("sim", "r", **opts), cairn.open("sim2", "r", **opts)
    ranks = [cairn.open("stats", "w", rank=r, nranks=2, session="two", **opts) for r in range(2)]
    for r, w in enumerate(ranks):
        w.define("mean", dtype="f8", local=True)
        w.begin_step(0, consume=[src, src2] if r == 0 else None)
        w.put("mean", np.full(4, float(r)))
    assert ranks[0].end_step() is False, "rank 1 has not ended the step yet"
    assert src.steps() == [0] and src2.steps() == [0]
    assert ranks[1].end_step() is True
    assert src.steps() == [] and src2.steps() == []
    with cairn.open("stats", "r", **opts) as r:
        assert r.steps() == [0] and np.array_equal(r.get_local("mean", 0, writer=1), np.ones(4))
    for w in ranks:
        w.close()


def test_consume_checks_what_it_is_given(tmp_path):
    c = cluster.start(tmp_path / "cluster.json", servers=1, memory="64MiB")
    try:
        staging = dict(engine="staging", cluster=str(c.file), timeout=20.0)
        _write(staging, range(1))
        src = cairn.open("sim", "r", **staging)
        with cairn.open("d", "w", rank=0, nranks=1, **staging) as dst:
            with pytest.raises(cairn.InvalidArgumentError, match="Reader"):
                with dst.step(0, consume="sim"):
                    pass
        files = cairn.open("f", "w", engine="file", path=str(tmp_path))
        with pytest.raises(cairn.InvalidArgumentError, match="one staging cluster or one file engine path"):
            with files.step(0, consume=src):
                pass
        other = cairn.open("f", "r", engine="file", path=str(tmp_path))
        elsewhere = cairn.open("g", "w", engine="file", path=str(tmp_path / "elsewhere"))
        with pytest.raises(cairn.InvalidArgumentError, match="one file engine path"):
            with elsewhere.step(0, consume=other):
                pass
        assert src.steps() == [0], "nothing consumed"
    finally:
        c.stop()


KILLED_CLAIMER = textwrap.dedent("""
    import sys, cairn
    opts = dict(engine="file", path=sys.argv[1])
    with cairn.open("sim", "r", **opts) as src, \\
         cairn.open("stats", "w", rank=0, nranks=1, session="killed", **opts) as dst:
        dst.define("mean", dtype="f8", local=True)
        for step in src.claims(lease=1):
            with dst.step(step, consume=src):
                dst.put("mean", src.get("p", step).mean(axis=0))
            break
""")


def _kill_at(path, target, calls: str) -> None:
    """Runs a claimer that strace SIGKILLs as it enters one of ``calls`` on file ``target``."""
    r = subprocess.run(["strace", "-f", "-qq", "-o", os.devnull, "-P", str(target), "-e", f"inject={calls}:signal=KILL",
                        sys.executable, "-c", KILLED_CLAIMER, str(path)], capture_output=True, text=True, timeout=60)
    assert r.returncode == -signal.SIGKILL, (target, r.returncode, r.stderr[-2000:])


def _strace_works() -> bool:
    return shutil.which("strace") is not None and subprocess.run(["strace", "-qq", "-o", os.devnull, "true"]).returncode == 0


@pytest.mark.skipif(not _strace_works(), reason="needs strace allowed to trace (it delivers the SIGKILL at a chosen system call)")
def test_file_consume_is_one_transaction_whatever_system_call_a_sigkill_hits(tmp_path):
    """A claimer SIGKILLed as it enters each step of the file engine's consume transaction:
    readers see step 0 in the source or in the destination, never both or neither, and the
    next claimer completes or undoes the dead one's transaction so every step lands once."""
    def fresh(point: str) -> dict:
        opts = dict(engine="file", path=str(tmp_path / point))
        _write(opts, range(2))
        return opts

    # The transaction's id depends on the destination and the session only: learn it from a
    # transaction killed at its commit, whose taken source step is named after it.
    probe = fresh("probe")
    _kill_at(probe["path"], tmp_path / "probe/stats/steps/000000000000.json", "link,linkat")
    (txn,) = [p.name.split(".")[1] for p in (tmp_path / "probe/sim/taken").glob("*.json")]
    points = {  # point: (system calls, file, step 0 visible in the source after the kill)
        "journal": ("link,linkat", f"stats/pending/txn-000000000000.{txn}.json", True),
        "take": ("rename,renameat,renameat2", "sim/steps/000000000000.json", True),
        "commit": ("link,linkat", "stats/steps/000000000000.json", True),
        "cleanup": ("unlink,unlinkat", f"sim/taken/000000000000.{txn}.json", False),
    }
    for point, (calls, target, in_source) in points.items():
        opts = fresh(point)
        _kill_at(opts["path"], tmp_path / point / target, calls)
        src, stats = cairn.open("sim", "r", **opts), cairn.open("stats", "r", **opts)
        assert (0 in src.steps(), stats.steps()) == (in_source, [] if in_source else [0]), point
        if in_source:
            assert np.array_equal(src.get("p", 0), _field(0)), "a step in flight reads as before"
        with cairn.open("stats", "w", rank=0, nranks=1, **opts) as dst:  # completes the dead transaction
            dst.define("mean", dtype="f8", local=True)
            for s in src.claims(lease=5):
                with dst.step(s, consume=src):
                    dst.put("mean", src.get("p", s).mean(axis=0))
        assert stats.steps() == [0, 1] and src.steps() == [], point
        for s in (0, 1):
            assert np.array_equal(stats.get_local("mean", s, writer=0), _field(s).mean(axis=0)), (point, s)
        left = [p.name for p in (tmp_path / point).glob("*/*/*") if "taken" in str(p) or p.name.startswith("txn-")]
        assert left == [], (point, left)
