"""Queues no departed reader can jam, streams that never raise for another's release, and a name
that `cairn rm` makes new again (issue 51, items 4-6). Real server and reader processes, real
SIGKILL and SIGSTOP."""

from __future__ import annotations

import signal
import subprocess
import textwrap
import time

import numpy as np
import pytest

import cairn
from cairn import cluster

from .conftest import PY, ROOT

# A reader process: streams with release, reads and checks each step, prints it; stops reading
# after `last` steps (then closes normally) unless -1; warnings of missed steps are printed.
READER = textwrap.dedent("""
    import sys, time, warnings, cairn
    cl, lease, last = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
    def show(message, *a, **k):
        if isinstance(message, cairn.StepsMissedWarning):
            print("missed", *message.steps, flush=True)
    warnings.showwarning = show
    warnings.simplefilter("always")
    r = cairn.open("q", "r", engine="staging", cluster=cl, timeout=lease)
    steps = r.stream(timeout=20, release=True)
    print("ready", flush=True)
    for n, s in enumerate(steps):
        try:
            a = r.get("x", s)
        except cairn.NotFoundError as e:
            # Back from a SIGSTOP on a loaded machine, the step yielded may have been released
            # before this read (the reader's lease had lapsed): missed too, never read wrong.
            assert e.code == "released", e
            print("missed", s, flush=True)
            continue
        assert (a == s).all(), s
        print(s, flush=True)
        if n + 1 == last:
            break
    print("done", flush=True)
""")


@pytest.fixture
def cl(tmp_path):
    c = cluster.start(tmp_path / "cluster.json", servers=1, memory="256MiB", prefault=0)
    yield str(c.file)
    c.stop()


def _reader(cl: str, lease: float = 2.0, last: int = -1) -> subprocess.Popen:
    p = subprocess.Popen([PY, "-c", READER, cl, str(lease), str(last)], stdout=subprocess.PIPE, text=True)
    assert p.stdout is not None and p.stdout.readline().strip() == "ready"
    return p


def _step(f, s: int) -> float:
    """Writes step s; the seconds its begin waited."""
    t = time.monotonic()
    f.begin_step(s)
    waited = time.monotonic() - t
    f.put("x", np.full(1000, s, "f8"))
    f.end_step()
    return waited


def _writer(cl: str, timeout: float = 4.0, **opts):
    f = cairn.open("q", "w", engine="staging", cluster=cl, timeout=timeout, **opts)
    f.define("x", "f8", (1000,))
    f.define_queue(limit=2, policy="block")
    return f


@pytest.mark.parametrize("fault", [signal.SIGKILL, signal.SIGSTOP])
def test_a_reader_that_dies_or_hangs_costs_a_blocked_writer_its_lease_once(cl, fault):
    f = _writer(cl, timeout=4.0)
    reader = _reader(cl, lease=2.0)
    try:
        for s in range(4):
            _step(f, s)
            assert reader.stdout.readline().strip() == str(s)
        reader.send_signal(fault)
        waits = [_step(f, s) for s in range(4, 12)]
        # The dead or hung reader holds steps until its lease (2 s) lapses: one wait of at most
        # max(timeout, lease + 1 s), then the queue releases the oldest as discard_oldest.
        assert max(waits) < 4.0 + 1.0, waits
        assert sum(w > 0.5 for w in waits) <= 1, f"at most one long wait: {waits}"
        assert len(cairn.open("q", "r", engine="staging", cluster=cl).steps()) <= 3
        if fault == signal.SIGSTOP:
            # It comes back: registered again at the oldest kept step, told what it missed.
            reader.send_signal(signal.SIGCONT)
            for s in range(12, 14):
                _step(f, s)
            f.close()
            out, _ = reader.communicate(timeout=60)
            lines = out.split("\n")
            missed = [line for line in lines if line.startswith("missed")]
            assert missed, out
            gone = sorted(int(x) for m in missed for x in m.split()[1:])
            assert gone and gone[0] == 4 and all(4 <= g < 12 for g in gone), out
            read = [int(x) for x in lines if x.strip().isdigit()]
            assert read == sorted(read) and read[-1] == 13 and not set(read) & set(gone), out
    finally:
        reader.kill()
        reader.wait(10)
        reader.stdout.close()


def test_readers_that_read_a_few_steps_and_close_never_jam_the_writer(cl):
    f = _writer(cl, timeout=4.0)
    readers = [_reader(cl, lease=5.0, last=n) for n in (1, 2, 3, 2)]
    waits = [_step(f, s) for s in range(10)]
    f.close()
    for r in readers:
        out, _ = r.communicate(timeout=60)
        assert r.returncode == 0 and out.split()[-1] == "done", out
    assert max(waits) < 3.0, f"readers that closed hold nothing: {waits}"
    left = cairn.open("q", "r", engine="staging", cluster=cl).steps()
    assert 0 not in left and 1 not in left and len(left) <= 3, left


def test_many_readers_started_together_never_die_of_a_step_another_released(cl):
    f = cairn.open("q", "w", engine="staging", cluster=cl, keep_last=1, timeout=10)
    f.define("x", "f8", (1000,))
    _step(f, 0)
    procs = [subprocess.Popen([PY, "-c", READER, cl, "5", "-1"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(6)]
    for p in procs:
        assert p.stdout.readline().strip() == "ready"
    for s in range(1, 6):
        _step(f, s)
    f.close()
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        read = [int(x) for x in out.split() if x.isdigit()]
        assert read == sorted(read) and read[-1] == 5, out


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PY, "-m", "cairn", *args], capture_output=True, text=True, timeout=60, cwd=ROOT)


def test_after_rm_a_name_behaves_as_one_never_used_and_rm_waits_for_a_begun_step(cl):
    f = _writer(cl, timeout=2.0)
    reader = _reader(cl, lease=30.0)
    for s in range(2):
        _step(f, s)
    f.close()
    # Two ranks: one ended step 5, the other not yet: rm is refused, naming why.
    ws = [cairn.open("q", "w", engine="staging", cluster=cl, rank=r, nranks=2, session="x") for r in range(2)]
    for w in ws:
        w.define("x", "f8", (1000,))
    ws[0].begin_step(5)
    ws[0].put("x", np.full(1000, 5.0)[:500], offset=(0,))
    assert ws[0].end_step() is False
    out = _cli("rm", "q", "--cluster", cl)
    assert out.returncode != 0 and "begun and not ended" in out.stderr, out.stderr
    ws[1].begin_step(5)
    ws[1].put("x", np.full(1000, 5.0)[500:], offset=(500,))
    ws[1].end_step()
    out = _cli("rm", "q", "--cluster", cl)
    assert out.returncode == 0, out.stderr
    assert "removed dataset q from the cluster" in out.stdout, out.stdout
    reader.kill()
    reader.wait(10)
    reader.stdout.close()
    # New again: no steps, no queue, no reader registration held over, no released steps.
    r = cairn.open("q", "r", engine="staging", cluster=cl)
    assert r.steps() == []
    new = cairn.open("q", "w", engine="staging", cluster=cl, timeout=2.0)
    new.define("x", "f8", (1000,))
    for s in range(4):
        assert _step(new, s) < 1.0, "no queue survives rm"
    fresh = _reader(cl, lease=2.0, last=2)
    new.close()
    out, _ = fresh.communicate(timeout=30)
    assert out.split()[:2] == ["0", "1"], out
