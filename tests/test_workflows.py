"""D²T workflows on real staging servers (issue 18): claims of committed steps shared by
claimer processes, consume-and-produce as one transaction, and a writer's close ending streams."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

import cairn
from cairn import cluster


@pytest.fixture
def staging(tmp_path):
    c = cluster.start(tmp_path / "cluster.json", servers=3, memory="256MiB", meta=3)
    yield dict(engine="staging", cluster=str(c.file), timeout=20.0)
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
    import sys, time, cairn
    cluster, how = sys.argv[1], sys.argv[2]
    opts = dict(engine="staging", cluster=cluster, timeout=20.0)
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
            time.sleep(0.02)
    print("done", flush=True)
""")


def test_three_claimers_two_killed_consume_every_step_exactly_once(staging, tmp_path):
    """The issue's test: 3 claimer processes over 40 steps; one SIGKILLed while holding a claim,
    one SIGKILLed inside `dst.step(consume=)`. At the end every step is in `stats` exactly once
    with the right result, every source step is released, and the survivor ended by itself."""
    _write(staging, range(40))
    script = tmp_path / "claimer.py"
    script.write_text(CLAIMER)
    procs = {how: subprocess.Popen([sys.executable, str(script), staging["cluster"], how], stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for how in ("hold", "inside", "work")}
    try:
        for how, word in (("hold", "claimed"), ("inside", "inside")):
            line = ""
            while not line.startswith(word) and procs[how].poll() is None:
                line = procs[how].stdout.readline()
            assert line.startswith(word), (how, line, procs[how].stderr.read())
            procs[how].send_signal(signal.SIGKILL)
            procs[how].wait(timeout=10)
        out, err = procs["work"].communicate(timeout=120)
        assert procs["work"].returncode == 0, err[-3000:]
        assert out.strip().endswith("done"), out
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
            p.communicate(timeout=10)  # reaps it and closes its pipes
    with cairn.open("stats", "r", **staging) as r:
        assert r.steps() == list(range(40)), "every step once, none lost"
        for s in range(40):
            assert np.array_equal(r.get_local("mean", s, writer=0), _field(s).mean(axis=0)), s
    with cairn.open("sim", "r", **staging) as src:
        assert src.steps() == [], "every source step was consumed (released)"


def test_a_claimer_whose_lease_lapsed_cannot_consume_a_step_another_consumed(staging):
    _write(staging, range(2))
    src = cairn.open("sim", "r", **staging)
    # A claimer that stopped renewing (no heartbeat): its lease lapses and the step moves on.
    assert src._inner.claim("stalled", 0.3) == (0, False)
    time.sleep(0.4)
    it = src.claims(lease=5)
    assert next(it) == 0, "the lapsed lease's step goes to the next claimer"
    with cairn.open("stats", "w", rank=0, nranks=1, **staging) as dst:
        dst.define("mean", dtype="f8", local=True)
        with dst.step(0, consume=src):
            dst.put("mean", np.ones(3))
    with cairn.open("stats2", "w", rank=0, nranks=1, **staging) as late:
        late.define("mean", dtype="f8", local=True)
        with pytest.raises(cairn.ConflictError, match="no longer committed"):
            with late.step(0, consume=src):
                late.put("mean", np.zeros(3))
    with cairn.open("stats2", "r", **staging) as r:
        assert r.steps() == [], "the refused step is not visible"
    assert src.steps() == [1]
    assert next(it) == 1
    it.close()  # gives step 1 back
    assert src._inner.claim("other", 5.0) == (1, False)


def test_claims_end_when_the_writers_closed_and_streams_too(staging):
    _write(staging, range(3), close=False)
    src = cairn.open("sim", "r", **staging)
    t0 = time.monotonic()
    assert list(src.claims(lease=5, timeout=0.5)) == [0, 1, 2], "timeout: no more steps came"
    assert time.monotonic() - t0 < 5
    w = cairn.open("sim", "a", **staging)
    w.define("p", "f8", (8, 16))
    with w.step(3):
        w.put("p", _field(3))
    w.close()
    assert list(src.stream()) == [0, 1, 2, 3], "a stream with no timeout ends once the writers closed"
    got = []
    for s in src.claims(lease=5):
        got.append(s)
        with cairn.open("out", "w", rank=0, nranks=1, **staging) as dst:
            dst.define("x", dtype="f8", local=True)
            with dst.step(s, consume=src):
                dst.put("x", np.zeros(1))
    assert got == [0, 1, 2, 3] and src.steps() == []


def test_consume_checks_what_it_is_given(staging, tmp_path):
    _write(staging, range(1))
    src = cairn.open("sim", "r", **staging)
    with cairn.open("d", "w", rank=0, nranks=1, **staging) as dst:
        with pytest.raises(cairn.InvalidArgumentError, match="Reader"):
            with dst.step(0, consume="sim"):
                pass
    files = cairn.open("f", "w", engine="file", path=str(tmp_path))
    with pytest.raises(cairn.InvalidArgumentError, match="one staging cluster"):
        with files.step(0, consume=src):
            pass
    with pytest.raises(cairn.InvalidArgumentError, match="staging engine"):
        list(cairn.open("f", "r", engine="file", path=str(tmp_path)).claims())
    assert src.steps() == [0], "nothing consumed"
