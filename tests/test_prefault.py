"""Prefaulted memory (issue 45): from start-up each server makes `[staging] prefault` bytes of
shared segments ready in the background (`cairn cluster start --prefault SIZE`), reported by
`cairn cluster status --json`; same-node puts take them (any user's first lease: `taken_bytes`),
the server makes more, and what is read back is what was put."""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time

import numpy as np

import cairn
from cairn import cluster

from .conftest import PY, check

MiB = 1 << 20


def _prefault(file) -> list[dict[str, int]]:
    out = check(subprocess.run([PY, "-m", "cairn", "cluster", "status", "--cluster", str(file), "--json"],
                               capture_output=True, text=True, timeout=60))
    return [s["prefault"] for s in json.loads(out)["servers"]]


def _collapses() -> bool:
    """Whether this kernel makes shared memory huge on MADV_COLLAPSE (as segment.rs's test asks)."""
    release = tuple(int(x) for x in os.uname().release.split("-")[0].split(".")[:2])
    try:
        with open("/sys/kernel/mm/transparent_hugepage/shmem_enabled") as f:
            denied = "[deny]" in f.read()
    except OSError:
        return False
    return release >= (6, 1) and not denied


def _until(file, cond, within: float = 60.0) -> list[dict[str, int]]:
    """The servers' prefault rows once `cond` holds for them (re-read as the servers work)."""
    deadline = time.monotonic() + within
    while True:
        rows = _prefault(file)
        if cond(rows) or time.monotonic() > deadline:
            return rows
        time.sleep(0.1)


def test_servers_make_shared_memory_ready_and_same_node_puts_use_it(tmp_path):
    file = tmp_path / "cluster.json"
    check(subprocess.run([PY, "-m", "cairn", "cluster", "start", "--cluster", str(file), "--servers", "2", "--memory", "256MiB",
                          "--prefault", "64MiB"], capture_output=True, text=True, timeout=120))
    try:
        ready = lambda rows: all(r["ready_bytes"] == r["target_bytes"] == 64 * MiB for r in rows)  # noqa: E731
        rows = _until(file, ready)
        assert ready(rows), rows
        # Made of huge pages where the kernel collapses shared memory (Linux >= 6.1, not denied).
        assert all(0 <= r["huge_bytes"] <= r["ready_bytes"] for r in rows), rows
        if _collapses():
            assert all(r["huge_bytes"] > 0 for r in rows), f"MADV_COLLAPSE works here, yet no segment is huge: {rows}"
        a = np.random.default_rng(1).random(4 * MiB)  # 32 MiB: two 16 MiB objects per server
        with cairn.open("pf", "w", engine="staging", cluster=str(file), redundancy=0) as f:
            f.define("x", "f8", a.shape)
            with f.step(0):
                f.put("x", a)
        taken = _prefault(file)
        assert sum(r["taken_bytes"] for r in taken) == 32 * MiB, f"the put took segments made ahead: {taken}"
        rows = _until(file, ready)
        assert ready(rows), f"made again: {rows}"
        np.testing.assert_array_equal(cairn.open("pf", "r", engine="staging", cluster=str(file)).get("x", 0), a)
    finally:
        subprocess.run([PY, "-m", "cairn", "cluster", "stop", "--cluster", str(file)], capture_output=True, timeout=60)


def test_prefault_zero_makes_nothing_ahead(tmp_path):
    c = cluster.start(tmp_path / "cluster.json", servers=1, memory="64MiB", prefault=0)
    try:
        assert _prefault(c.file) == [{"ready_bytes": 0, "target_bytes": 0, "taken_bytes": 0, "huge_bytes": 0}]
    finally:
        c.stop()


def test_the_default_is_the_memory_up_to_a_gibibyte(tmp_path):
    c = cluster.start(tmp_path / "cluster.json", servers=1, memory="48MiB")
    try:
        # Made only while an eighth of the memory stays free: 42 MiB of the 48 aimed for.
        rows = _until(c.file, lambda rows: rows[0]["ready_bytes"] >= 32 * MiB)
        assert rows[0]["target_bytes"] == 48 * MiB and 32 * MiB <= rows[0]["ready_bytes"] <= 42 * MiB, rows
    finally:
        c.stop()


def test_only_two_leases_worth_is_made_while_the_server_moves_bytes(tmp_path):
    """Issue 55: a fresh server makes twice its largest lease at once (2 × 16 MiB at first); the
    rest of its 256 MiB only while it moves no object bytes (SCHED_IDLE, paced), so an
    application writing beside a fresh cluster keeps the CPU; once it stops, the rest follows."""
    c = cluster.start(tmp_path / "cluster.json", servers=1, memory="1GiB", prefault="256MiB")
    try:
        rows = _until(c.file, lambda rows: rows[0]["ready_bytes"] >= 32 * MiB, within=30)
        assert rows[0]["ready_bytes"] >= 32 * MiB, rows
        stop, writing, seen = threading.Event(), threading.Event(), []

        def busy() -> None:
            a = np.random.default_rng(2).random(MiB // 8)  # 1 MiB a step
            with cairn.open("busy", "w", engine="staging", cluster=str(c.file), redundancy=0, keep_last=2) as f:
                f.define("x", "f8", a.shape)
                step = 0
                while not stop.is_set():
                    with f.step(step):
                        f.put("x", a)
                    step += 1
                    writing.set()

        t = threading.Thread(target=busy)
        t.start()
        try:
            assert writing.wait(30), "the writer did not commit a step"
            start = _prefault(c.file)[0]["ready_bytes"]
            deadline = time.monotonic() + 4
            while time.monotonic() < deadline:
                seen.append(_prefault(c.file)[0]["ready_bytes"])
        finally:
            stop.set()
            t.join(60)
        # At most one segment (16 MiB) finished as the writing began, beyond two leases' worth.
        assert max(seen) <= max(start, 32 * MiB) + 16 * MiB, f"made more while busy: from {start}: {seen}"
        rows = _until(c.file, lambda rows: rows[0]["ready_bytes"] >= 224 * MiB, within=60)
        assert rows[0]["ready_bytes"] >= 224 * MiB, f"the rest once idle: {rows}"
    finally:
        c.stop()
