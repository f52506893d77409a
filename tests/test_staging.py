"""Staging-only behaviour against real server processes: capacity, a server killed, the embedded
default cluster, waiting and streaming, the cluster CLI. (Everything the file engine does too is
in the shared suite, which runs on both engines.)"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import textwrap
import threading
import time

import numpy as np
import pytest

import cairn
from cairn import cluster

from .conftest import PY, status_total, stopped_or_gone


def wait_for(cond, what: str, timeout: float = 10.0) -> None:
    """Polls ``cond`` until it holds; fails naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.01)


@pytest.fixture
def small(tmp_path):
    # One copy of everything: these tests count bytes against the servers' limits.
    c = cluster.start(tmp_path / "cluster.json", servers=2, memory="4MiB", redundancy=0)
    yield c
    c.stop()


def test_full_servers_raise_capacity_error_stay_up_and_accept_after_release(small):
    w = cairn.open("cap", "w", engine="staging", cluster=small.file, object_size=1 << 20)
    w.define("x", "u1", (3 << 20,))
    for s in range(2):
        with w.step(s):
            w.put("x", np.full(3 << 20, s, "u1"), offset=(0,))
    with pytest.raises(cairn.CapacityError, match=r"server \d is full.*release old steps") as e:
        with w.step(2):
            w.put("x", np.full(3 << 20, 2, "u1"), offset=(0,))
    assert isinstance(e.value, MemoryError)
    r = cairn.open("cap", "r", engine="staging", cluster=small.file)
    assert r.steps() == [0, 1]
    r.release(0)
    with w.step(2):
        w.put("x", np.full(3 << 20, 2, "u1"), offset=(0,))
    assert r.steps() == [1, 2] and (r.get("x", 2) == 2).all()
    assert sum(s["memory_used"] for s in cluster.status(small.file)) == 6 << 20


def test_keep_last_frees_old_steps(small):
    with cairn.open("k", "w", engine="staging", cluster=small.file, keep_last=2) as w:
        w.define("x", "f8", (100_000,))
        for s in range(20):
            with w.step(s):
                w.put("x", np.full(100_000, float(s)), offset=(0,))
    r = cairn.open("k", "r", engine="staging", cluster=small.file)
    assert r.steps() == [18, 19]
    assert r.get("x", 19)[-1] == 19.0


def test_released_steps_are_not_found_at_once_and_a_stream_that_fell_behind_warns(small):
    # Issue 40, defect 6: a released step looked like one not committed yet (wait_step waited
    # its whole timeout, get said to wait for the writers).
    with cairn.open("rel", "w", engine="staging", cluster=small.file, keep_last=2) as w:
        w.define("x", "f8", (1000,))
        with w.step(0):
            w.put("x", np.zeros(1000), offset=(0,))
        r = cairn.open("rel", "r", engine="staging", cluster=small.file)
        stream = r.stream(timeout=5.0)
        assert next(stream) == 0
        for s in range(1, 5):
            with w.step(s):
                w.put("x", np.full(1000, float(s)), offset=(0,))
    started = time.monotonic()
    with pytest.raises(cairn.NotFoundError, match="released.*oldest kept step is 3"):
        r.wait_step(1, timeout=5)
    assert time.monotonic() - started < 2.0
    with pytest.raises(cairn.NotFoundError, match="released"):
        r.get("x", 1)
    assert r.wait_step(7, timeout=0.1) is False, "a step not written yet is still waited for"
    with pytest.warns(cairn.StepsMissedWarning) as caught:
        assert list(stream) == [3, 4]
    assert caught[0].message.steps == [1, 2]


def test_every_rank_learns_that_a_step_it_ended_aborted(small):
    # Issue 40, defect 3: end_step returns False to the ranks that are not last, and they never
    # heard that the step aborted later.
    def writer(rank: int):
        return cairn.open("ab", "w", engine="staging", cluster=small.file, rank=rank, nranks=2, session="run")

    w0, w1 = writer(0), writer(1)
    for w in (w0, w1):
        w.define("x", "f8", (2, 100))
    w0.begin_step(0)
    w0.put("x", np.zeros((1, 100)), offset=(0, 0))
    assert w0.end_step() is False, "rank 1 has not ended it"
    with pytest.raises(RuntimeError):
        with w1.step(0):
            w1.put("x", np.ones((1, 100)), offset=(1, 0))
            raise RuntimeError("the simulation failed")
    with pytest.raises(cairn.StepError) as e:
        w0.wait_committed(0, timeout=5)
    assert e.value.aborted and e.value.step == 0 and "rank 1" in e.value.reason, e.value
    # Step 1 commits at rank 1's end; rank 0 can wait for it.
    w0.begin_step(1)
    w0.put("x", np.zeros((1, 100)), offset=(0, 0))
    assert w0.end_step() is False
    assert w0.wait_committed(1, timeout=0.2) is False, "still waiting for rank 1"
    with w1.step(1):
        w1.put("x", np.ones((1, 100)), offset=(1, 0))
    assert w0.wait_committed(1, timeout=5) is True
    # An abort after rank 0 ended the step is reported at rank 0's next call without waiting.
    w0.begin_step(2)
    w0.put("x", np.zeros((1, 100)), offset=(0, 0))
    assert w0.end_step() is False
    w1.begin_step(2)
    w1.abort_step()
    with pytest.raises(cairn.StepError, match="step 2 aborted") as e:
        w0.begin_step(3)
    assert e.value.aborted and e.value.step == 2
    w0.begin_step(3)
    w0.abort_step()
    w0.close()
    w1.close()
    assert cairn.open("ab", "r", engine="staging", cluster=small.file).steps() == [1]


def test_a_killed_server_gives_a_clear_error_not_a_hang(tmp_path):
    # One copy: lost with its server. One control-plane server, so that the other one's loss
    # leaves the step's index readable (two voters would lose their majority).
    c = cluster.start(tmp_path / "cluster.json", servers=2, memory="64MiB", redundancy=0, meta=1)
    try:
        with cairn.open("d", "w", engine="staging", cluster=c.file, object_size=4096) as w:
            w.define("x", "f8", (10_000,))
            with w.step(0):
                w.put("x", np.arange(10_000.0), offset=(0,))
        r = cairn.open("d", "r", engine="staging", cluster=c.file)
        victim = next(row["id"] for row in cluster.status(c.file) if row["meta"] == "none")
        c.procs[victim].send_signal(signal.SIGKILL)
        c.procs[victim].wait(timeout=10)
        # Gone but not declared down yet: unavailable, not lost (a restart may be on its way).
        with pytest.raises(cairn.UnavailableError, match=f"server {victim}") as e:
            r.get("x", 0)
        assert not isinstance(e.value, cairn.DataLossError)
        _declared_down(c.file, victim)
        with pytest.raises(cairn.DataLossError, match=f"server {victim}"):
            r.get("x", 0)
    finally:
        c.stop()


def test_embedded_cluster_starts_for_the_run_and_stops_at_exit(tmp_path):
    script = textwrap.dedent("""
        import numpy as np, cairn, json
        from cairn import cluster
        with cairn.open("e", "w", engine="staging") as f:
            f.define("x", "i8", (50,))
            with f.step(0):
                f.put("x", np.arange(50), offset=(0,))
        r = cairn.open("e", "r", engine="staging")
        assert (r.get("x", 0) == np.arange(50)).all()
        print(json.dumps([s["pid"] for s in cluster.servers_of(cluster._embedded.file)]))
    """)
    out = subprocess.run([PY, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    pids = json.loads(out.stdout.strip().splitlines()[-1])
    wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in pids), "the embedded servers exit with the program")
    assert stopped_or_gone(tmp_path / "cluster.json")


def test_wait_step_and_stream_follow_the_writer(tmp_path):
    c = cluster.start(tmp_path / "cluster.json", servers=2, memory="64MiB")
    try:
        r = cairn.open("s", "r", engine="staging", cluster=c.file)
        assert r.wait_step(0, timeout=0.1) is False

        def write() -> None:
            with cairn.open("s", "w", engine="staging", cluster=c.file) as w:
                w.define("x", "f8", (4,))
                for s in range(5):
                    time.sleep(0.05)
                    with w.step(s):
                        w.put("x", np.full(4, float(s)), offset=(0,))

        t = threading.Thread(target=write)
        t.start()
        seen = []
        for s in r.stream(timeout=30.0):  # the writer's pace does not matter: stop at its last step
            seen.append((s, float(r.get("x", s)[0])))
            if s == 4:
                break
        t.join()
        assert seen == [(s, float(s)) for s in range(5)]
    finally:
        c.stop()


def test_cluster_cli_start_status_objects_stop(tmp_path):
    run = lambda *a: subprocess.run([PY, "-m", "cairn", *a], cwd=tmp_path, capture_output=True, text=True, timeout=60)  # noqa: E731
    topo = tmp_path / "topo.json"
    topo.write_text(json.dumps({"server": [{"id": i, "node": f"n{i // 2}", "rack": f"r{i % 2}"} for i in range(4)]}))
    out = run("cluster", "start", "--servers", "3", "--spares", "1", "--topology", str(topo), "--memory", "32MiB")
    assert out.returncode == 0 and "3 servers (+1 spares) up" in out.stdout, out.stderr
    with cairn.open("cli", "w", engine="staging", cluster=tmp_path / "cluster.json", object_size=2048) as w:
        w.define("x", "f4", (64, 64))
        with w.step(0):
            w.put("x", np.ones((64, 64), "f4"), offset=(0, 0))
    st = run("cluster", "status", "--objects")
    assert st.returncode == 0, st.stderr
    assert " spare " in st.stdout and "committed" in st.stdout and "32.0" in st.stdout
    held = {line.split()[0] for line in st.stdout.splitlines() if " cli " in line}
    assert held == {"0", "1", "2"}  # spread over the active servers, none on the spare
    assert run("cluster", "start").returncode != 0  # refuses to start over a running cluster
    assert run("cluster", "stop").returncode == 0
    assert stopped_or_gone(tmp_path / "cluster.json")
    st = run("cluster", "status")
    assert st.returncode == 0 and st.stdout.startswith("stopped"), st.stdout + st.stderr
    assert run("cluster", "stop").returncode == 0, "stopping a stopped cluster is fine"


def test_bad_frames_and_wrong_secret_are_refused_by_a_real_server(small):
    import socket
    import struct

    host, port = json.loads(small.file.read_text())["servers"][0]["addr"].rsplit(":", 1)

    def exchange(data: bytes) -> bytes:
        with socket.create_connection((host, int(port)), timeout=5) as s:
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
            out = b""
            while chunk := s.recv(4096):
                out += chunk
            return out

    assert b"challenge" in exchange(b"")  # the server speaks first
    assert b"magic" in exchange(b"\x00" * 64)
    hello = json.dumps({"op": "hello", "mac": "0" * 64, "client": "intruder"}).encode()
    assert b"wrong cluster secret" in exchange(b"CRN3" + struct.pack("<IQ", len(hello), 0) + hello)
    assert b"exceeds" in exchange(b"CRN3" + struct.pack("<IQ", len(hello), 1 << 62) + hello)
    assert b"header length" in exchange(b"CRN3" + struct.pack("<IQ", 0xFFFFFFFF, 0))
    assert b"outside 1 to 4096" in exchange(b"CRN3" + struct.pack("<IQ", 64 << 20, 0))  # a first frame is small
    # A client of another protocol version hears both versions named, not a parse error.
    old = exchange(b"CRN2" + struct.pack("<IQ", len(hello), 0) + hello)
    assert b"protocol version 2, this end version 3" in old, old
    assert all(s["memory_used"] == 0 for s in cluster.status(small.file))  # still up, nothing held


def test_a_trace_flush_into_full_servers_keeps_the_held_steps_for_a_retry(small):
    w = cairn.open("tr", "w", engine="staging", cluster=small.file, object_size=1 << 20, trace_flush=100)
    w.define("x", "u1", (5 << 20,))
    with w.step(0):
        w.put("x", np.zeros(5 << 20, "u1"), offset=(0,))
    w.flush_traces()
    with w.step(1):
        w.trace("e", np.full(3 << 20, 1, "u1"))  # held: with step 0's 5 MiB this does not fit in 8 MiB
    with pytest.raises(cairn.CapacityError):
        with w.step(2):
            w.trace("e", np.full(10, 2, "u1"))
            w.flush_traces()
    r = cairn.open("tr", "r", engine="staging", cluster=small.file)
    assert r.steps() == [0]  # step 2 aborted, step 1 still held: nothing half-visible
    r.release(0)
    w.close()  # the retry publishes step 1 with its records
    assert r.steps() == [1]
    assert np.array_equal(r.get_trace("e", 1, 0), np.full(3 << 20, 1, "u1"))


def test_a_replicated_variable_survives_a_sigkilled_server(tmp_path):
    """``define(..., redundancy=1)``: each object has a copy on another server, so SIGKILL of
    any one server (here a non-meta one) loses no byte of any committed step."""
    # Recovery crawls (1 KiB/s): the copies the first failure took are not back on the spare
    # when the second failure is declared, so that one goes beyond the level.
    c = cluster.start(tmp_path / "cluster.json", servers=4, spares=1, memory="64MiB", meta=3, scheme="replicate",
                      recovery_rate="1KiB")
    try:
        opts = dict(engine="staging", cluster=c.file, object_size=4096, timeout=2.0)
        data = {s: np.random.default_rng(s).random((64, 64)) for s in range(3)}
        slots = cluster.view(c.file)["slots"]
        with cairn.open("r1", "w", **opts) as w:
            w.define("p", "f8", (64, 64), redundancy=1)
            for s, a in data.items():
                with w.step(s):
                    w.put("p", a)
        out = subprocess.run([PY, "-m", "cairn", "cluster", "status", "--file", str(c.file), "--json"],
                             capture_output=True, text=True, timeout=60)
        doc = json.loads(out.stdout)
        objects, replicas = (sum(s[k] or 0 for s in doc["servers"]) for k in ("objects", "replicas"))
        assert replicas * 2 == objects > 0 and abs(doc["efficiency"] - 0.5) < 0.01, doc
        status = {r["id"]: r for r in cluster.status(c.file)}
        victim = next(i for i, r in status.items() if r["meta"] == "none" and r["state"] == "up")
        assert status[victim]["objects"] > 0
        c.procs[victim].send_signal(signal.SIGKILL)
        c.procs[victim].wait(timeout=10)
        r = cairn.open("r1", "r", **opts)
        assert [(b.redundancy, b.state) for b in r.blocks("p", 0)] == [(1, "replicated")]
        # Recorded as down (a spare takes its slot), its copies make the blocks degraded.
        out = subprocess.run([PY, "-m", "cairn", "cluster", "replace", str(victim), "--file", str(c.file)],
                             capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and f"server {victim} is down" in out.stdout, out.stderr
        assert [(b.redundancy, b.state) for b in r.blocks("p", 0)] == [(1, "degraded")]
        for s, a in data.items():
            assert np.array_equal(r.get("p", s), a)
            assert np.array_equal(r.get("p", s, offset=(10, 20), count=(30, 5)), a[10:40, 20:25])
        with pytest.raises(cairn.InvalidArgumentError, match="redundancy"):
            cairn.open("bad", "w", **opts).define("q", "f8", (4,), redundancy=-1)
        # A second failure, of the server after it on the ring (not the leader), is more than
        # the level: the objects whose two copies were on those two are lost, by name; the
        # other boxes still read.
        after = slots[(slots.index(victim) + 1) % len(slots)]
        before = slots[slots.index(victim) - 1]
        second = after if status[after]["meta"] != "leader" else before
        c.procs[second].send_signal(signal.SIGKILL)
        c.procs[second].wait(timeout=10)
        _declared_down(c.file, second)
        lost = 0
        for s, a in data.items():
            for row in range(0, 64, 8):  # each object is 8 rows of the 64x64 block
                try:
                    assert np.array_equal(r.get("p", s, offset=(row, 0), count=(8, 64)), a[row:row + 8])
                except cairn.DataLossError as e:
                    lost += 1
                    assert f"'p' step {s}" in str(e) and f"server {victim}" in str(e), e
        assert lost > 0
    finally:
        c.stop()


def _declared_down(file, sid: int) -> None:
    """Waits until the control plane declared server ``sid`` down: only then is what only it
    held lost (before, a read of it is unavailable)."""
    wait_for(lambda: sid in (cluster.view(file, timeout=1.0) or {}).get("down", []), f"server {sid} declared down", 30)


def _field(step: int) -> np.ndarray:
    return np.random.default_rng(step).random((64, 64))


@pytest.mark.parametrize("level", [1, 2])
def test_corec_loses_no_committed_byte_to_r_sigkills_while_writing_and_reading(tmp_path, level):
    """CoREC with ``redundancy = r``: older steps are erasure coded in the background (cold),
    the newest replicated; SIGKILL of r servers while a writer writes and a reader reads loses
    no committed byte, encoded objects included (decoded from the surviving shards); one more
    failure gives ``DataLossError`` naming what is gone, never wrong bytes."""
    c = cluster.start(tmp_path / "cluster.json", servers=6, memory="128MiB", meta=3, redundancy=level,
                      rs_data=3, min_efficiency=0.3, hot_steps=1)
    try:
        opts = dict(engine="staging", cluster=c.file, object_size=4096, timeout=2.0)
        w = cairn.open("sim", "w", **opts)
        w.define("p", "f8", (64, 64))  # the cluster's default level
        for s in range(4):
            with w.step(s):
                w.put("p", _field(s))
        r = cairn.open("sim", "r", **opts)
        assert {b.redundancy for b in r.blocks("p", 0)} == {level}
        wait_for(lambda: all(b.state == "encoded" for s in (0, 1, 2) for b in r.blocks("p", s)), "steps 0-2 encoded", 30)
        assert [b.state for b in r.blocks("p", 3)] == ["replicated"]
        doc = json.loads(subprocess.run([PY, "-m", "cairn", "cluster", "status", "--file", str(c.file), "--json"],
                                        capture_output=True, text=True, timeout=60).stdout)
        assert sum(s["shards"] or 0 for s in doc["servers"]) > 0 and doc["efficiency"] > 1 / (level + 1), doc
        # A writer keeps writing and a reader keeps reading while r servers (not running the
        # control plane) are SIGKILLed; writes that need a dead server may fail, reads of
        # committed steps may not.
        victims = [row["id"] for row in cluster.status(c.file) if row["meta"] == "none"][:level + 1]
        assert len(victims) == level + 1
        stop, problems = threading.Event(), []

        def writer() -> None:
            s = 4
            while not stop.is_set() and s < 40:
                try:
                    with w.step(s):
                        w.put("p", _field(s))
                except cairn.UnavailableError:
                    pass
                s += 1

        def reader() -> None:
            while not stop.is_set():
                for s in r.steps():
                    try:
                        if not np.array_equal(r.get("p", s), _field(s)):
                            problems.append(f"step {s} read wrong bytes")
                    except cairn.NotFoundError:
                        pass  # released meanwhile
                    except cairn.CairnError as e:
                        problems.append(f"step {s}: {e!r}")

        threads = [threading.Thread(target=writer), threading.Thread(target=reader)]
        for t in threads:
            t.start()
        try:
            for v in victims[:level]:
                c.procs[v].send_signal(signal.SIGKILL)
                c.procs[v].wait(timeout=10)
        finally:
            stop.set()
            for t in threads:
                t.join(timeout=120)
        assert not problems, problems[:5]
        committed = r.steps()
        assert set(range(4)) <= set(committed)
        for s in committed:
            assert np.array_equal(r.get("p", s), _field(s)), s
        # One failure more than the level: boxes with pieces on every dead server are lost by
        # name; every box reads exactly or raises DataLossError.
        c.procs[victims[level]].send_signal(signal.SIGKILL)
        c.procs[victims[level]].wait(timeout=10)
        _declared_down(c.file, victims[level])
        lost = 0
        for s in (0, 1, 2):
            for row in range(0, 64, 8):  # each object is 8 rows
                try:
                    assert np.array_equal(r.get("p", s, offset=(row, 0), count=(8, 64)), _field(s)[row:row + 8])
                except cairn.DataLossError as e:
                    lost += 1
                    assert f"'p' step {s}" in str(e) and "is lost" in str(e), e
        assert lost > 0
    finally:
        c.stop()


def _same_node_bytes(c) -> int:
    return status_total(c.file, "same_node_bytes")


def _mapped_gets(c) -> int:
    return status_total(c.file, "mapped_gets")


def _shared_bytes(c) -> int:
    return status_total(c.file, "shared_bytes")


def test_servers_on_this_host_copy_object_bytes_straight_from_and_to_the_client(tmp_path):
    """transport "auto" (the default): puts of objects move their bytes on the same node
    (counted by the servers): objects of at least shared_min bytes are written into shared
    segments the servers keep, smaller ones copied by the servers ("attach" copies all), with the
    same results as the Unix socket and TCP, which move none that way. With "auto", gets of whole
    copies in shared segments are read out of read-only mappings of them (issue 55); the rest come
    as payloads (a server never writes a client's memory)."""
    c = cluster.start(tmp_path / "cluster.json", servers=2, memory="256MiB")
    try:
        a = np.random.default_rng(0).random((300, 200))
        for transport in ("auto", "attach", "socket", "tcp"):
            before, shared, mapped = _same_node_bytes(c), _shared_bytes(c), _mapped_gets(c)
            opts = dict(engine="staging", cluster=c.file, object_size=32 << 10, transport=transport, shared_min=16 << 10)
            with cairn.open(transport, "w", **opts) as w:
                w.define("p", "f8", a.shape)
                with w.step(0):
                    w.put("p", a[:150], offset=(0, 0))
                    w.put("p", np.asfortranarray(a[150:]), offset=(150, 0))
            with cairn.open(transport, "r", **opts) as r:
                assert np.array_equal(r.get("p", 0), a)
                assert np.array_equal(r.get("p", 0, offset=(7, 3), count=(250, 101)), a[7:257, 3:104])
            moved, kept = _same_node_bytes(c) - before, _shared_bytes(c) - shared
            assert (_mapped_gets(c) > mapped) == (transport == "auto"), transport
            if transport in ("auto", "attach"):
                # Two copies of each object put (level 1); the reads came mapped or as payloads.
                assert moved == 2 * a.nbytes, moved
            else:
                assert moved == 0, (transport, moved)
            # Objects of 16-32 KiB: in shared segments with "auto" (both copies), else none.
            assert kept == (2 * a.nbytes if transport == "auto" else 0), (transport, kept)
        with pytest.raises(cairn.ConfigError, match='transport = "shm"'):
            cairn.open("x", "w", engine="staging", cluster=c.file, transport="shm")
    finally:
        c.stop()


def test_a_writer_sigkilled_amid_same_node_copies_leaves_only_whole_committed_steps(tmp_path):
    """A writer putting 48 MiB steps (16 MiB objects, written into shared segments the servers
    lease) is SIGKILLed at a random moment: every committed step reads back exactly, the step it was
    writing never shows, and the servers go on serving."""
    c = cluster.start(tmp_path / "cluster.json", servers=2, memory="1GiB", redundancy=0)
    script = textwrap.dedent(f"""
        import numpy as np, cairn
        with cairn.open("big", "w", engine="staging", cluster={str(c.file)!r}, keep_last=2) as w:
            w.define("p", "f8", (3, 1 << 21))
            for s in range(10_000):
                with w.step(s):
                    w.put("p", np.full((3, 1 << 21), float(s)), offset=(0, 0))
    """)
    try:
        p = subprocess.Popen([PY, "-c", script])
        r = cairn.open("big", "r", engine="staging", cluster=c.file)
        wait_for(lambda: len(r.steps()) > 0 and r.steps()[-1] >= 3, "the writer commits a few steps", 60)
        time.sleep(np.random.default_rng().uniform(0, 0.2))  # a random moment of its put loop
        p.send_signal(signal.SIGKILL)
        p.wait(timeout=10)
        assert _same_node_bytes(c) > 0 and _shared_bytes(c) > 0
        steps = r.steps()
        # Segments it leased and had not put went back with its connections: the servers hold
        # the committed steps (at most keep_last + 1) and at most one unfinished step's puts.
        step_bytes = 3 * 8 << 21
        wait_for(lambda: sum(row["memory_used"] for row in cluster.status(c.file)) <= 4 * step_bytes, "leases given back")
        for s in steps:
            assert np.array_equal(r.get("p", s), np.full((3, 1 << 21), float(s))), f"step {s}"
        assert not [x for x in r.pending() if x[0] > steps[-1] + 1], r.pending()
        with cairn.open("after", "w", engine="staging", cluster=c.file) as w:
            w.define("q", "f8", (4,))
            with w.step(0):
                w.put("q", np.ones(4), offset=(0,))
        assert cairn.open("after", "r", engine="staging", cluster=c.file).get("q", 0).tolist() == [1.0] * 4
    finally:
        c.stop()


def test_a_step_not_committed_names_the_kept_ones_in_words(small):
    # Issue 67: messages are for people, so no Rust range syntax ("0..=1").
    with cairn.open("words", "w", engine="staging", cluster=small.file) as w:
        w.define("x", "f8", (4,))
        for s in range(2):
            with w.step(s):
                w.put("x", np.zeros(4), offset=(0,))
    r = cairn.open("words", "r", engine="staging", cluster=small.file)
    with pytest.raises(cairn.NotFoundError) as e:
        r.get("x", 5)
    assert "committed: 2 steps, 0 to 1" in str(e.value) and "..=" not in str(e.value), e.value
