"""Backpressure between writers and streaming readers (issue 45), with real server processes and
reader processes: `define_queue(limit, "block")` holds a writer back until readers iterating
`stream(release=True)` pass steps (`keep_last` waits for them too), so a slow reader sees every
step; `discard_oldest` never blocks and a late reader is told what it missed; a full queue with
no reader is a CapacityError naming it; a reader that dies stops holding steps after its lease."""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time
import warnings

import numpy as np
import pytest

import cairn
from cairn import cluster

from .conftest import PY

READER = textwrap.dedent("""
    import sys, time, cairn
    cl, delay, die_after, timeout = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    r = cairn.open("q", "r", engine="staging", cluster=cl, timeout=float(timeout))
    steps = r.stream(timeout=30, release=True)  # registered from here
    print("ready", flush=True)
    for s in steps:
        a = r.get("x", s)
        assert (a == s).all(), s
        print(s, flush=True)
        if s == die_after:
            time.sleep(3600)  # killed here, holding its registration
        time.sleep(delay)
    print("done", flush=True)
""")


@pytest.fixture
def cl(tmp_path):
    c = cluster.start(tmp_path / "cluster.json", servers=1, memory="256MiB", prefault=0)
    yield str(c.file)
    c.stop()


def _reader(cl: str, delay: float = 0.0, die_after: int = -1, timeout: float = 10.0) -> subprocess.Popen:
    """A reader process streaming with release, once it is registered."""
    p = subprocess.Popen([PY, "-c", READER, cl, str(delay), str(die_after), str(timeout)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def _write(f, steps) -> list[int]:
    """Writes `steps` (step s: 1000 values s); the writer's view of the kept steps after each."""
    r = cairn.open("q", "r", engine="staging", cluster=f._where[1])
    kept = []
    for s in steps:
        with f.step(s):
            f.put("x", np.full(1000, s, "f8"))
        kept.append(len(r.steps()))
    return kept


def test_a_slow_reader_under_a_blocking_queue_sees_every_step_even_with_keep_last(cl):
    f = cairn.open("q", "w", engine="staging", cluster=cl, keep_last=1)
    f.define("x", "f8", (1000,))
    f.define_queue(limit=2, policy="block")
    reader = _reader(cl, delay=0.2)
    t = time.monotonic()
    kept = _write(f, range(10))
    took = time.monotonic() - t
    f.close()
    out, _ = reader.communicate(timeout=60)
    assert reader.returncode == 0
    assert out.split() == [str(s) for s in range(10)] + ["done"], "every step, in order"
    assert max(kept) <= 2, f"never more than the queue's limit kept: {kept}"
    assert took > 7 * 0.2, "the writer waited for the reader"


def test_discard_oldest_never_blocks_and_a_late_reader_is_told_which_steps_it_missed(cl):
    f = cairn.open("q", "w", engine="staging", cluster=cl, queue_limit=2, queue_policy="discard_oldest", timeout=2)
    f.define("x", "f8", (1000,))
    t = time.monotonic()
    assert max(_write(f, range(10))) <= 2
    assert time.monotonic() - t < 10, "no wait for readers"
    f.close()
    r = cairn.open("q", "r", engine="staging", cluster=cl)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        assert list(r.stream(start=0, timeout=5, release=True)) == [8, 9]
    missed = [x.message for x in w if isinstance(x.message, cairn.StepsMissedWarning)]
    assert missed and missed[0].steps == list(range(8))


def test_a_full_blocking_queue_with_no_reader_is_a_capacity_error_naming_it(cl):
    f = cairn.open("q", "w", engine="staging", cluster=cl, timeout=1)
    f.define("x", "f8", (1000,))
    f.define_queue(1)
    _write(f, [0])
    t = time.monotonic()
    with pytest.raises(cairn.CapacityError, match=r"queue of 'q' is full.*define_queue\(limit=1") as e:
        f.begin_step(1)
    assert 0.9 < time.monotonic() - t < 10
    assert type(e.value) is cairn.CapacityError and e.value.step == 1, "the step that waited"
    with pytest.raises(cairn.InvalidArgumentError, match="policy"):
        f.define_queue(2, "drop")
    f.define_queue(0)  # no limit: the step begins at once
    _write(f, [1])
    f.close()


def test_a_reader_killed_mid_stream_stops_holding_steps_after_its_lease(cl):
    # keep_last releases what a registered reader no longer holds.
    f = cairn.open("q", "w", engine="staging", cluster=cl, timeout=20, keep_last=1)
    f.define("x", "f8", (1000,))
    f.define_queue(2)
    reader = _reader(cl, die_after=0, timeout=1.0)
    try:
        _write(f, [0, 1])
        assert reader.stdout.readline().strip() == "0"
        reader.send_signal(signal.SIGKILL)
        reader.wait(timeout=10)
        t = time.monotonic()
        _write(f, [2, 3])  # waits until the dead reader's registration lapses (1 s), then proceeds
        assert time.monotonic() - t < 15
    finally:
        reader.kill()
        reader.stdout.close()
        f.close()
