"""Sub-transactions (D²T, issue 18): every put of a step is one; puts that cannot be stored are
reported together by ``StepError`` (variables and servers), the step stays invisible, and the
application retries those puts or aborts the step. Real failures: full staging servers, and a
file-size limit the kernel enforces on the file engine's writer."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import cairn
from cairn import cluster


@pytest.fixture
def small(tmp_path):
    # 2 servers of 4 MiB, one copy of everything: a 3 MiB variable cannot fit beside 5 MiB.
    c = cluster.start(tmp_path / "cluster.json", servers=2, memory="4MiB", redundancy=0)
    try:
        yield dict(engine="staging", cluster=str(c.file), object_size=1 << 20)
    finally:
        c.stop()


def _vars(w):
    w.define("fill", "u1", (5 << 20,))
    w.define("a", "f8", (128,))
    w.define("b", "u1", (3 << 20,))
    w.define("c", "f8", (128,))


def test_full_servers_fail_one_variable_which_is_retried_alone(small):
    w = cairn.open("sub", "w", **small)
    _vars(w)
    with w.step(0):
        w.put("fill", np.ones(5 << 20, "u1"))
    r = cairn.open("sub", "r", **small)
    w.begin_step(1)
    w.put("a", np.arange(128.0))
    w.put("b", np.full(3 << 20, 7, "u1"))  # does not fit: kept as a failure, the block goes on
    w.put("c", -np.arange(128.0))
    with pytest.raises(cairn.StepError) as e:
        w.end_step()
    assert list(e.value.failed) == ["b"] and e.value.failed["b"], e.value.failed
    assert set(e.value.failed["b"]) <= {row["id"] for row in cluster.status(small["cluster"])}
    assert isinstance(e.value, cairn.CapacityError) and isinstance(e.value, cairn.CairnError)
    assert "'b'" in str(e.value) and "full" in str(e.value)
    assert r.steps() == [0], "a step with a failed put is not visible"
    with pytest.raises(cairn.StepError):
        w.end_step()  # still refused: 'b' was not put again
    r.release(0)
    w.put("b", np.full(3 << 20, 7, "u1"))  # the retry of the failed sub-transaction
    assert w.end_step() is True
    assert r.steps() == [1]
    assert np.array_equal(r.get("a", 1), np.arange(128.0)) and np.array_equal(r.get("c", 1), -np.arange(128.0))
    assert (r.get("b", 1) == 7).all()
    w.close()


def test_a_with_block_reports_every_failed_variable_and_aborts_the_step(small):
    w = cairn.open("sub", "w", **small)
    _vars(w)
    with w.step(0):
        w.put("fill", np.ones(5 << 20, "u1"))
    with pytest.raises(cairn.StepError) as e:
        with w.step(1):
            w.put("a", np.arange(128.0))
            w.put("b", np.full(3 << 20, 7, "u1"))
            w.put("fill", np.ones(5 << 20, "u1"))
    assert sorted(e.value.failed) == ["b", "fill"]
    r = cairn.open("sub", "r", **small)
    assert r.steps() == [0]
    with w.step(1):  # aborted: the step can be written again
        w.put("a", np.arange(128.0))
    assert r.steps() == [0, 1] and r.variables().keys() >= {"a"}
    w.close()


FSIZE = textwrap.dedent("""
    import json, resource, signal, sys
    import numpy as np, cairn
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the write fails with EFBIG instead
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    w = cairn.open("sub", "w", engine="file", path=sys.argv[1])
    w.define("a", "f8", (128,))
    w.define("b", "u1", (1 << 20,))
    w.begin_step(0)
    w.put("a", np.arange(128.0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, hard))  # the disk "fills up"
    w.put("b", np.full(1 << 20, 7, "u1"))
    try:
        w.end_step()
    except cairn.StepError as e:
        print(json.dumps({"failed": e.failed, "unavailable": isinstance(e, cairn.UnavailableError),
                          "visible": cairn.open("sub", "r", engine="file", path=sys.argv[1]).steps()}))
    resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    w.put("b", np.full(1 << 20, 7, "u1"))
    print(json.dumps({"committed": w.end_step()}))
    w.close()
""")


def test_a_write_the_file_system_refuses_is_a_failed_put_retried_once_there_is_room(tmp_path):
    out = subprocess.run([sys.executable, "-c", FSIZE, str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-3000:]
    report, done = (json.loads(line) for line in out.stdout.splitlines())
    assert report == {"failed": {"b": []}, "unavailable": True, "visible": []}
    assert done == {"committed": True}
    with cairn.open("sub", "r", engine="file", path=str(tmp_path)) as r:
        assert r.steps() == [0]
        assert np.array_equal(r.get("a", 0), np.arange(128.0)) and (r.get("b", 0) == 7).all()
