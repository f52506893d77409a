"""Sub-transactions (D²T, issue 18): every put of a step is one; puts that cannot be stored are
reported together by ``StepError`` (a ``CapacityError`` itself when all found servers full; variables and servers), the step stays invisible, and the
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

from .conftest import ROOT, check, file_config


@pytest.fixture
def small(tmp_path):
    # 2 servers of 4 MiB, one copy of everything: a 3 MiB variable cannot fit beside 6 MiB.
    c = cluster.start(tmp_path / "cluster.json", servers=2, memory="4MiB", redundancy=0)
    try:
        yield dict(engine="staging", cluster=str(c.file), object_size=1 << 20)
    finally:
        c.stop()


def _vars(w):
    w.define("fill", "u1", (6 << 20,))
    w.define("a", "f8", (128,))
    w.define("b", "u1", (3 << 20,))
    w.define("c", "f8", (128,))


def test_full_servers_fail_one_variable_which_is_retried_alone(small):
    w = cairn.open("sub", "w", **small)
    _vars(w)
    with w.step(0):
        w.put("fill", np.ones(6 << 20, "u1"))
    r = cairn.open("sub", "r", **small)
    w.begin_step(1)
    w.put("a", np.arange(128.0))
    w.put("b", np.full(3 << 20, 7, "u1"))  # does not fit: kept as a failure, the block goes on
    w.put("c", -np.arange(128.0))
    with pytest.raises(cairn.CapacityError) as e:
        w.end_step()
    assert list(e.value.failed) == ["b"] and e.value.failed["b"], e.value.failed
    assert set(e.value.failed["b"]) <= {row["id"] for row in cluster.status(small["cluster"])}
    assert type(e.value) is cairn.CapacityError and e.value.step == 1, "a full server's error, as itself"
    assert "'b'" in str(e.value) and "full" in str(e.value)
    assert r.steps() == [0], "a step with a failed put is not visible"
    with pytest.raises(cairn.CapacityError):
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
        w.put("fill", np.ones(6 << 20, "u1"))
    with pytest.raises(cairn.CapacityError) as e:
        with w.step(1):
            w.put("a", np.arange(128.0))
            w.put("b", np.full(3 << 20, 7, "u1"))
            w.put("fill", np.ones(6 << 20, "u1"))
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


C_RETRY = textwrap.dedent(r"""
    #include <cairn.h>
    #include <signal.h>
    #include <stdio.h>
    #include <stdlib.h>
    #include <string.h>
    #include <sys/resource.h>
    #define CHECK(x) do { enum cairn_status s_ = (x); if (s_ != CAIRN_OK) { \
        fprintf(stderr, "%s: %s\n", #x, cairn_last_error()); return 1; } } while (0)
    int main(int argc, char **argv) {
        static double a[128];
        static unsigned char b[1 << 20];
        uint64_t na[1] = {128}, nb[1] = {1 << 20}, zero[1] = {0};
        struct cairn_file *w;
        struct rlimit lim;
        for (int i = 0; i < 128; i++) a[i] = i;
        memset(b, 7, sizeof b);
        signal(SIGXFSZ, SIG_IGN);
        getrlimit(RLIMIT_FSIZE, &lim);
        rlim_t soft = lim.rlim_cur;
        CHECK(cairn_open("sub", "w", argv[1], 0, 1, &w));
        CHECK(cairn_define(w, "a", "f8", 1, na));
        CHECK(cairn_define(w, "b", "u1", 1, nb));
        CHECK(cairn_begin_step(w, 0));
        CHECK(cairn_put(w, "a", a, 1, zero, na));
        lim.rlim_cur = 64 << 10;
        setrlimit(RLIMIT_FSIZE, &lim);
        if (cairn_put(w, "b", b, 1, zero, nb) == CAIRN_OK) return 2;
        if (cairn_end_step(w) != CAIRN_ERR_CONFLICT) return 3;
        printf("refused: %s\n", cairn_last_error());
        lim.rlim_cur = soft;
        setrlimit(RLIMIT_FSIZE, &lim);
        CHECK(cairn_put(w, "b", b, 1, zero, nb));
        CHECK(cairn_end_step(w));
        CHECK(cairn_begin_step(w, 1));
        CHECK(cairn_put(w, "a", a, 1, zero, na));
        CHECK(cairn_abort_step(w));
        CHECK(cairn_close(w));
        return 0;
    }
""")


def test_c_end_step_refuses_a_step_with_a_failed_put_until_it_is_put_again(tmp_path):
    lib = ROOT / "target" / "release"
    (tmp_path / "retry.c").write_text(C_RETRY)
    exe = tmp_path / "retry"
    check(subprocess.run(["cc", str(tmp_path / "retry.c"), "-I", str(ROOT / "crates/cairn-capi/include"), "-L", str(lib),
                          "-lcairn", f"-Wl,-rpath,{lib}", "-o", str(exe)], capture_output=True, text=True))
    cfg = file_config(tmp_path)
    out = check(subprocess.run([str(exe), str(cfg)], capture_output=True, text=True, timeout=60))
    assert "refused: step 0 is not committed" in out and "of b could not be stored" in out, out
    with cairn.open("sub", "r", config=str(cfg)) as r:
        assert r.steps() == [0], "step 1 was aborted"
        assert np.array_equal(r.get("a", 0), np.arange(128.0)) and (r.get("b", 0) == 7).all()


def test_small_puts_are_coalesced_and_a_batch_that_does_not_fit_fails_its_puts(small):
    # Blocks up to 64 KiB are copied and sent together (at the step's end, or every 1024
    # blocks): the caller may reuse its buffer at once, and a batch the servers cannot hold
    # fails each of its puts, which end_step reports like any other failed put.
    w = cairn.open("coal", "w", **small)
    w.define("fill", "u1", (5 << 20,))
    w.define("s", "f8", (1500, 64))
    buf = np.empty(64)
    held = lambda: sum(s["objects"] for s in cluster.status(small["cluster"]))  # noqa: E731
    with w.step(0):
        for i in range(1500):
            buf[:] = i
            w.put("s", buf.reshape(1, 64), offset=(i, 0))
        assert held() == 1024, "one batch went out at the 1024th block; the rest wait for the step's end"
    assert held() == 1500
    r = cairn.open("coal", "r", **small)
    assert np.array_equal(r.get("s", 0), np.repeat(np.arange(1500.0), 64).reshape(1500, 64))
    blocks = r.blocks("s", 0)
    assert len(blocks) == 1500 and {b.count for b in blocks} == {(1, 64)} and {b.max for b in blocks} == set(range(1500))
    with w.step(1):
        w.put("fill", np.ones(5 << 20, "u1"))
    w.begin_step(2)
    for i in range(60):  # 60 x 64 KiB = 3.75 MiB, more than the ~2.2 MiB left, as one batch
        w.put("fill", np.full(1 << 16, 3, "u1"), offset=(i << 16,))
    with pytest.raises(cairn.CapacityError) as e:
        w.end_step()
    assert list(e.value.failed) == ["fill"] and type(e.value) is cairn.CapacityError and e.value.step == 2, e.value
    assert r.steps() == [0, 1]
    r.release(0)
    r.release(1)
    with pytest.raises(cairn.CapacityError):
        w.end_step()  # the failed puts stand until they are put again
    for i in range(60):
        w.put("fill", np.full(1 << 16, 3, "u1"), offset=(i << 16,))
    assert w.end_step() is True
    assert r.steps() == [2] and (r.get("fill", 2, (0,), (60 << 16,)) == 3).all()
    w.close()
