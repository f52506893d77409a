"""Same-node puts and gets through the servers' shared segments, one copy each way (issue 55).
A writer copies each large object into a segment the server leases and keeps its mapping for
the next lease of that segment; a reader of the segment's user reads a whole copy out of a
read-only mapping of it, whose descriptor the server passes over the Unix socket once, and
checks what it copies against the committed crc32c. What can go wrong around a mapping: the
object's step is released and its segment recycled for another object, the server dies, a new
writer session, the writer (who still maps its segments) scribbling on an object after commit."""

from __future__ import annotations

import mmap
import os
import signal
from pathlib import Path

import numpy as np
import pytest

import cairn
from cairn import cluster

from .conftest import status_total

SHAPE = (4, 1 << 17)  # 4 MiB of float64: four 1 MiB objects, each a slab of 32768 columns
OBJ = SHAPE[1] * 8


def _opts(c, **kw) -> dict:
    return dict(engine="staging", cluster=c.file, object_size=OBJ, shared_min=1 << 20, **kw)


def _mapped_gets(c) -> int:
    return status_total(c.file, "mapped_gets")


def _segment_mappings(perms: str = "r--s") -> set[str]:
    """The server segments this process maps (`memfd:cairn-object`) with `perms` (read-only:
    a reader's, `rw-s`: a writer's), by inode."""
    out = set()
    for line in Path("/proc/self/maps").read_text().splitlines():
        f = line.split()
        if len(f) >= 6 and "cairn-object" in f[5] and f[1] == perms:
            out.add(f[4])
    return out


def _field(s: int) -> np.ndarray:
    return np.random.default_rng(s).random(SHAPE)


def test_a_reader_keeps_its_mappings_while_segments_are_recycled_for_later_steps(tmp_path: Path) -> None:
    """keep_last=2 over 12 steps: each step is read back exactly as its writer put it, by the
    natural get and by get(out=), out of mappings (the server counts them); released steps' segments
    go to later steps, so the reader's mappings stay as few as the segments in rotation, not one
    per object read; a released step reads as not found, never as the bytes now in its segment."""
    c = cluster.start(tmp_path / "cluster.json", servers=1, memory="256MiB", prefault="0")
    try:
        w = cairn.open("m", "w", keep_last=2, **_opts(c))
        w.define("p", "f8", SHAPE)
        r = cairn.open("m", "r", **_opts(c))
        out = np.empty(SHAPE)
        for s in range(12):
            with w.step(s):
                w.put("p", _field(s))
            before = _mapped_gets(c)
            assert np.array_equal(r.get("p", s), _field(s)), f"step {s}"
            r.get("p", s, out=out)
            assert np.array_equal(out, _field(s)), f"step {s} into out="
            assert np.array_equal(r.get("p", s, offset=(1, 30000), count=(2, 5000)), _field(s)[1:3, 30000:35000]), f"a box of step {s}"
            assert _mapped_gets(c) - before == 4 + 4 + 2, "every whole copy was read out of a mapping"
        maps = _segment_mappings()
        # The kept steps (2 × 4 objects), plus what the pool holds for the next one.
        assert 4 <= len(maps) <= 20, f"{len(maps)} segments mapped for 48 objects read"
        with pytest.raises(cairn.NotFoundError):
            r.get("p", 0)
        r.close()
        w.close()
    finally:
        c.stop()


def test_a_writer_keeps_its_mappings_across_steps_and_a_new_session_reuses_the_segments(tmp_path: Path) -> None:
    """keep_last=2: the writer's 12 steps go into segments the server recycles, and the writer
    maps each once (its mappings stay as few as the segments in rotation); a second session
    (a new connection, whose mappings start empty) is leased the first one's segments, maps them
    anew, and both sessions' steps read back exactly."""
    c = cluster.start(tmp_path / "cluster.json", servers=1, memory="256MiB", prefault="0")
    try:
        w = cairn.open("m", "w", keep_last=2, **_opts(c))
        w.define("p", "f8", SHAPE)
        for s in range(12):
            with w.step(s):
                w.put("p", _field(s))
        first = _segment_mappings("rw-s")
        assert 4 <= len(first) <= 16, f"{len(first)} segments mapped for 48 objects put"
        assert status_total(c.file, "shared_bytes") == 2 * 4 * OBJ, "the two kept steps are held in segments"
        w.close()
        assert not _segment_mappings("rw-s"), "a closed session unmaps"
        w = cairn.open("m", "a", keep_last=2, **_opts(c))
        for s in range(12, 16):
            with w.step(s):
                w.put("p", _field(s))
        again = _segment_mappings("rw-s")
        assert again and len(again) <= 16, again
        assert again & first, "the new session was leased segments of the first"
        with cairn.open("m", "r", **_opts(c)) as r:
            for s in r.steps():
                assert np.array_equal(r.get("p", s), _field(s)), f"step {s}"
        w.close()
    finally:
        c.stop()


def test_a_reader_whose_server_dies_reads_the_other_copies(tmp_path: Path) -> None:
    """Two servers, level 1: the reader maps both servers' segments; one server is SIGKILLed and
    every step still reads exactly (from the other's copies, mapped too)."""
    c = cluster.start(tmp_path / "cluster.json", servers=2, memory="256MiB", meta=1, prefault="0", redundancy=1)
    try:
        w = cairn.open("m", "w", **_opts(c))
        w.define("p", "f8", SHAPE)
        for s in range(3):
            with w.step(s):
                w.put("p", _field(s))
        r = cairn.open("m", "r", timeout=10.0, **_opts(c))
        for s in range(3):
            assert np.array_equal(r.get("p", s), _field(s))
        assert _segment_mappings()
        c.procs[1].send_signal(signal.SIGKILL)
        c.procs[1].wait(timeout=10)
        for s in range(3):
            assert np.array_equal(r.get("p", s), _field(s)), f"step {s} after its server died"
        r.close()
        w.close()
    finally:
        c.stop()


def _scribble(pid: int, first: bytes) -> None:
    """What a writer that still maps its segment can do after commit: changes one byte of the
    object whose bytes start with `first`, in the server's segment."""
    for fd in os.listdir(f"/proc/{pid}/fd"):
        path = f"/proc/{pid}/fd/{fd}"
        try:
            if "cairn-object" not in os.readlink(path):
                continue
            f = os.open(path, os.O_RDWR)
        except OSError:
            continue
        try:
            size = os.fstat(f).st_size
            if size < len(first):
                continue
            with mmap.mmap(f, size) as m:
                if m[: len(first)] == first:
                    m[size // 2] ^= 0xFF
                    return
        finally:
            os.close(f)
    raise AssertionError("no segment holds the object")


def test_a_writer_that_scribbles_on_its_segment_after_commit_is_caught_before_a_byte_leaves(tmp_path: Path) -> None:
    """An object changed in its segment after commit: a same-node reader's copy out of its
    mapping fails its committed crc32c (the reader then asks for a payload), the server refuses
    to send it as a payload (same node or TCP, whole or a box), and the objects not touched still
    read."""
    c = cluster.start(tmp_path / "cluster.json", servers=1, memory="256MiB", prefault="0")
    try:
        a = _field(0)
        with cairn.open("m", "w", **_opts(c)) as w:
            w.define("p", "f8", SHAPE)
            with w.step(0):
                w.put("p", a)
        _scribble(c.procs[0].pid, a[0, 65536:65544].tobytes())  # object 2: columns 65536-98303
        with cairn.open("m", "r", **_opts(c)) as r:
            before = _mapped_gets(c)
            with pytest.raises(cairn.CorruptError, match="changed in its shared segment"):
                r.get("p", 0)
            assert _mapped_gets(c) > before, "read out of a mapping first"
            assert np.array_equal(r.get("p", 0, offset=(0, 0), count=(4, 65536)), a[:, :65536]), "the other objects read"
        with cairn.open("m", "r", **_opts(c, transport="tcp")) as r:
            with pytest.raises(cairn.CorruptError, match=rf"changed in its shared segment.*process {os.getpid()} \(uid {os.getuid()}\)"):
                r.get("p", 0, offset=(2, 70000), count=(1, 10))
            with pytest.raises(cairn.CorruptError, match="changed in its shared segment"):
                r.get("p", 0)
    finally:
        c.stop()
