"""Multi-level checkpoints (issue 42): a staging cluster drains every committed step to disk in
the background; a restart reads whichever level still has the step. Real server processes,
real SIGKILLs, the drained copy read by the `file` engine as it is."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import cairn
from cairn import cluster

from .conftest import PY, ROOT
from .test_staging import wait_for

N = 64  # rows of the field; each of 2 writers puts half


def _field(step: int) -> np.ndarray:
    return (np.arange(N * 32, dtype="f8").reshape(N, 32) * 0.5 + 1000 * step)


def _write(file: Path, name: str, steps: range, mode: str = "w", **opts) -> list[cairn.Writer]:
    """Steps of a 2-writer decomposition (rows split between rank 0 and rank 1)."""
    ws = [cairn.open(name, mode, engine="staging", cluster=file, rank=r, nranks=2, session=f"s-{mode}-{steps.start}",
                     object_size=8192, **opts) for r in range(2)]
    if mode == "w":
        for w in ws:
            w.define("t", "f8", (N, 32))
    for s in steps:
        for r, w in enumerate(ws):
            with w.step(s):
                w.put("t", _field(s)[r * N // 2:(r + 1) * N // 2], offset=(r * N // 2, 0))
    return ws


def _kill_all(c: cluster.LocalCluster) -> None:
    for p in c.procs:
        p.kill()
    for p in c.procs:
        p.wait(10)


def _status(file: Path) -> dict:
    out = subprocess.run([PY, "-m", "cairn", "cluster", "status", "--file", str(file), "--json"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_drained_steps_outlive_every_server_and_a_new_cluster_continues_after_them(tmp_path, capfd):
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "a.json", servers=3, memory="64MiB", redundancy=1, drain=drain)
    try:
        ws = _write(c.file, "sim", range(4))
        assert ws[0].wait_drained(timeout=60) and ws[1].wait_drained(step=2, timeout=60)
        st = _status(c.file)["drain"]
        assert st["path"] == str(drain) and st["steps"] == {"sim": 3} and st["pending_bytes"] == 0 and st["error"] is None
        assert json.loads(c.file.read_text())["drain"]["path"] == str(drain), "the cluster file records the drain"
    finally:
        _kill_all(c)
    # Through the file engine, as it is: same steps, values, writers, boxes and statistics.
    f = cairn.open("sim", "r", engine="file", path=drain)
    assert f.steps() == [0, 1, 2, 3]
    for s in range(4):
        np.testing.assert_array_equal(f.get("t", s), _field(s))
        blocks = f.blocks("t", s)
        assert [(b.writer, b.offset, b.count) for b in blocks] == [(0, (0, 0), (N // 2, 32)), (1, (N // 2, 0), (N // 2, 32))]
        assert blocks[1].max == _field(s)[N // 2:].max() and all(b.level == "disk" for b in blocks)
    # Through the staging config: no server answers, and the cluster was not stopped (crashed,
    # hung or cut off): the reader says so and where the drain is, within the timeout + 3 s.
    started = time.monotonic()
    r = cairn.open("sim", "r", engine="staging", cluster=c.file, timeout=2.0)
    with pytest.raises(cairn.UnavailableError, match=f"no server of the cluster in {c.file} answered") as e:
        r.steps()
    assert f'path="{drain}"' in str(e.value) and "cairn cluster stop" in str(e.value)
    assert time.monotonic() - started < 2.0 + 3.0, "within the timeout + 3 s"
    assert capfd.readouterr().err == "", "nothing on stderr, which a notebook never shows"
    # Marked stopped: the same handle reads the drain.
    cluster.stop(c.file, timeout=5.0)
    assert r.steps() == [0, 1, 2, 3]
    np.testing.assert_array_equal(r.get("t", 2), _field(2))
    assert all(b.level == "disk" for b in r.blocks("t", 3))
    # A new allocation: a new cluster draining to the same place continues after step 3.
    c2 = cluster.start(tmp_path / "b.json", servers=3, memory="64MiB", redundancy=1, drain=drain)
    try:
        ws = [cairn.open("sim", "a", engine="staging", cluster=c2.file, rank=r, nranks=2, session="restart") for r in range(2)]
        assert [w.next_step for w in ws] == [4, 4]
        for r, w in enumerate(ws):
            with w.step(4):
                w.put("t", _field(4)[r * N // 2:(r + 1) * N // 2], offset=(r * N // 2, 0))
        r = cairn.open("sim", "r", engine="staging", cluster=c2.file)
        assert r.steps() == [0, 1, 2, 3, 4]
        assert {b.level for b in r.blocks("t", 1)} == {"disk"} and {b.level for b in r.blocks("t", 4)} == {"memory"}
        np.testing.assert_array_equal(r.get("t", 1), _field(1))
        np.testing.assert_array_equal(r.get("t", 4), _field(4))
        assert ws[0].wait_drained(timeout=60)
        assert cairn.open("sim", "r", engine="file", path=drain).steps() == [0, 1, 2, 3, 4]
    finally:
        c2.stop()


def test_a_leader_killed_mid_drain_leaves_no_step_torn_or_missing(tmp_path):
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "c.json", servers=3, memory="256MiB", redundancy=1, drain=drain, failure_timeout="1s")
    try:
        big = 64 << 10  # rows of 32 f8: 16 MiB per step, so the drain is under way when the leader dies
        w = cairn.open("big", "w", engine="staging", cluster=c.file, object_size=1 << 20, timeout=30.0)
        w.define("t", "f8", (big, 32))
        leader = _status(c.file)["leader"]
        for s in range(3):
            with w.step(s):
                w.put("t", np.full((big, 32), float(s)))
        c.procs[leader].kill()
        on_disk = len(list((drain / "big" / "steps").glob("*.json"))) if (drain / "big" / "steps").exists() else 0
        assert on_disk < 3, "the leader died with steps still to drain"
        for s in range(3, 6):
            with w.step(s):
                w.put("t", np.full((big, 32), float(s)))
        assert w.wait_drained(timeout=120), "the next leader drains what the killed one left"
        f = cairn.open("big", "r", engine="file", path=drain)
        assert f.steps() == list(range(6))
        for s in range(6):
            a = f.get("t", s)
            assert a.shape == (big, 32) and (a == s).all(), f"step {s} torn"
        leftovers = [p for p in (drain / "big" / "steps").iterdir() if not p.name.endswith(".json")]
        assert leftovers == []
    finally:
        c.stop()


def test_keep_last_with_a_slow_drain_holds_the_writer_instead_of_failing_it(tmp_path):
    # Room for about two steps (2 MiB each, two copies) on three 6 MiB servers: keep_last=1 may
    # release only drained steps, so the writer runs ahead of the drain and must wait for it.
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "k.json", servers=3, memory="6MiB", redundancy=1, drain=drain)
    try:
        w = cairn.open("k", "w", engine="staging", cluster=c.file, object_size=256 << 10, keep_last=1, timeout=30.0)
        w.define("t", "f8", (256 << 10,))
        for s in range(12):
            with w.step(s):
                w.put("t", np.full(256 << 10, float(s)))
        assert w.wait_drained(timeout=60)
        f = cairn.open("k", "r", engine="file", path=drain)
        assert f.steps() == list(range(12)), "every step reached the disk"
        assert all((f.get("t", s) == s).all() for s in range(12))
        r = cairn.open("k", "r", engine="staging", cluster=c.file)
        assert r.steps() == list(range(12)), "memory keeps the newest; older ones read from disk"
        assert {b.level for b in r.blocks("t", 11)} == {"memory"} and {b.level for b in r.blocks("t", 0)} == {"disk"}
    finally:
        c.stop()


def test_keep_last_holds_a_writer_while_the_drain_is_stuck_and_lets_it_go_when_the_drain_moves(tmp_path):
    # The drain cannot write (a full disk) while the writer fills the servers: keep_last may not
    # release what the drain owes, so the writer waits for room, without an error, until the disk
    # gets room (here 3 s later, from another thread), the drain catches up and steps are released.
    import threading

    with _small_disk(tmp_path / "slow", "1m") as drain:
        c = cluster.start(tmp_path / "h.json", servers=3, memory="8MiB", redundancy=1, drain=drain)
        try:
            w = cairn.open("h", "w", engine="staging", cluster=c.file, object_size=1 << 20, keep_last=1, timeout=60.0)
            w.define("t", "f8", (1 << 18,))  # 2 MiB a step, 4 MiB with its copies: the servers hold 5
            room = threading.Timer(3.0, lambda: subprocess.run(["mount", "-o", "remount,size=256m", str(drain)], check=True))
            started = time.monotonic()
            room.start()
            for s in range(12):
                with w.step(s):
                    w.put("t", np.full(1 << 18, float(s)))
            waited = time.monotonic() - started
            room.join()
            assert waited >= 2.5, f"the writer was never held ({waited:.1f} s)"
            assert w.wait_drained(timeout=60)
            f = cairn.open("h", "r", engine="file", path=drain)
            assert f.steps() == list(range(12)) and all((f.get("t", s) == s).all() for s in range(12))
        finally:
            c.stop()


def test_drain_every_auto_takes_the_young_daly_interval(tmp_path):
    # MTBF 1 h: with a drain of a few ms a step, Young/Daly's interval sqrt(2 C MTBF) is seconds,
    # many steps of 20 ms: most steps stay in memory only.
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "auto.json", servers=2, memory="64MiB", redundancy=1, drain=drain, drain_every="auto",
                      drain_mtbf="1h")
    try:
        w = cairn.open("a", "w", engine="staging", cluster=c.file)
        w.define("t", "f8", (1 << 12,))
        for s in range(40):
            with w.step(s):
                w.put("t", np.full(1 << 12, float(s)))
            time.sleep(0.02)
        st = _status(c.file)["drain"]
        assert st["interval_s"] is not None and st["interval_s"] > 0.1, st
        assert st["every"] >= 2, st
        assert w.wait_drained(timeout=60)
        drained = cairn.open("a", "r", engine="file", path=drain).steps()
        assert 0 in drained and len(drained) < 40, drained
    finally:
        c.stop()


def test_drain_every_drains_the_cadences_steps_only(tmp_path):
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "e.json", servers=2, memory="64MiB", redundancy=1, drain=drain, drain_every=3)
    try:
        w = cairn.open("e", "w", engine="staging", cluster=c.file)
        w.define("t", "f8", (16,))
        for s in range(7):
            with w.step(s):
                w.put("t", np.full(16, float(s)))
        assert w.wait_drained(timeout=60)
        assert cairn.open("e", "r", engine="file", path=drain).steps() == [0, 3, 6]
        assert _status(c.file)["drain"]["every"] == 3
    finally:
        c.stop()


@contextlib.contextmanager
def _small_disk(path: Path, size: str) -> Iterator[Path]:
    """A tmpfs of ``size`` at ``path`` (a disk that fills up), unmounted afterwards."""
    path.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None or subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True).returncode != 0:
        pytest.skip("needs root to mount a small tmpfs")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


def test_a_full_disk_is_a_named_error_loses_nothing_and_the_drain_resumes_when_room_comes(tmp_path):
    with _small_disk(tmp_path / "small", "1m") as drain:
        c = cluster.start(tmp_path / "f.json", servers=2, memory="64MiB", redundancy=1, drain=drain)
        try:
            w = cairn.open("full", "w", engine="staging", cluster=c.file, object_size=1 << 20)
            w.define("t", "f8", (1 << 18,))  # 2 MiB a step: no step fits in 1 MiB
            for s in range(2):
                with w.step(s):
                    w.put("t", np.full(1 << 18, float(s)))
            with pytest.raises(cairn.CapacityError, match="disk is full"):
                w.wait_drained(timeout=30)
            st = _status(c.file)["drain"]
            assert "disk is full" in st["error"] and st["pending_bytes"] == 2 * (2 << 20)
            r = cairn.open("full", "r", engine="staging", cluster=c.file)
            assert all((r.get("t", s) == s).all() for s in range(2)), "nothing in memory was dropped"
            with pytest.raises(cairn.ConflictError, match="not on disk yet"):
                r.release(0)  # its only copy: refused while the drain owes it
            subprocess.run(["mount", "-o", "remount,size=64m", str(drain)], check=True)
            assert w.wait_drained(timeout=60), "the drain resumes once there is room"
            f = cairn.open("full", "r", engine="file", path=drain)
            assert f.steps() == [0, 1] and all((f.get("t", s) == s).all() for s in range(2))
            assert _status(c.file)["drain"]["error"] is None
        finally:
            c.stop()


def test_cluster_stop_drains_first_and_a_cluster_without_a_drain_says_so(tmp_path):
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "s.json", servers=2, memory="64MiB", redundancy=1, drain=drain)
    w = cairn.open("s", "w", engine="staging", cluster=c.file)
    w.define("t", "f8", (1 << 16,))
    for s in range(5):
        with w.step(s):
            w.put("t", np.full(1 << 16, float(s)))
    out = subprocess.run([PY, "-m", "cairn", "cluster", "stop", "--file", str(c.file)], capture_output=True, text=True,
                         timeout=120, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert cairn.open("s", "r", engine="file", path=drain).steps() == list(range(5))
    plain = cluster.start(tmp_path / "p.json", servers=2, memory="64MiB")
    try:
        w = cairn.open("p", "w", engine="staging", cluster=plain.file)
        with pytest.raises(cairn.ConfigError, match="drains nothing"):
            w.wait_drained(timeout=1)
        assert _status(plain.file)["drain"] is None
    finally:
        plain.stop()


def test_a_writer_running_ahead_into_full_servers_leaves_room_for_the_step_the_others_owe(tmp_path):
    # Rank 0 runs many steps ahead of rank 1, into servers that hold about a dozen of its blocks:
    # without room kept for the oldest step, it would fill them with steps that cannot commit
    # before step 0, which rank 1 could then never put (both waiting for room the other holds).
    import threading

    c = cluster.start(tmp_path / "w.json", servers=2, memory="8MiB", redundancy=0)
    try:
        n, steps = 1 << 16, 40  # 512 KiB a block: the servers hold 28 of them (less the room kept)
        ws = [cairn.open("run", "w", engine="staging", cluster=c.file, rank=r, nranks=2, session="ahead", keep_last=1,
                         timeout=30.0) for r in range(2)]
        for w in ws:
            w.define("t", "f8", (2 * n,))
        errors: list[BaseException] = []

        def write(r: int) -> None:
            try:
                for s in range(steps):
                    with ws[r].step(s):
                        ws[r].put("t", np.full(n, float(s)), offset=(r * n,))
            except BaseException as e:  # noqa: BLE001 - reported by the test
                errors.append(e)

        ahead = threading.Thread(target=write, args=(0,))
        ahead.start()
        # Rank 0 is blocked once the servers are full of its steps.
        wait_for(lambda: sum(r["memory_used"] or 0 for r in cluster.status(c.file)) >= 13 << 20, "rank 0 to fill the servers", 30)
        write(1)
        ahead.join(60)
        assert not ahead.is_alive() and errors == []
        r = cairn.open("run", "r", engine="staging", cluster=c.file)
        assert r.steps() == [steps - 1] and (r.get("t", steps - 1) == steps - 1).all()
    finally:
        c.stop()
