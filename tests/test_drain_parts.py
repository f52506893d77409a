"""The drain in the data plane (issue 53): every server writes the blocks it holds into its own
data file of the step (one file per server per step), the leader commits the index once every
part is on disk; a part's server that dies has its part written by another from the copies
left; an object whose only holder died fails that step's drain for good with DataLossError.
Real server processes, real SIGKILLs."""

from __future__ import annotations

import re
import time
from pathlib import Path

import numpy as np
import pytest

import cairn
from cairn import cluster

from .test_drain import _kill_all
from .test_drain_seams import failpoint_cluster, needs_failpoints
from .test_staging import wait_for

WRITERS = 4
N = 64


def _field(step: int) -> np.ndarray:
    return np.arange(N * WRITERS * 16, dtype="f8").reshape(N * WRITERS, 16) + 1000 * step


def _write(file: Path, steps: range, redundancy: int | None = None, **opts) -> list[cairn.Writer]:
    ws = [cairn.open("d", "w", engine="staging", cluster=file, rank=r, nranks=WRITERS, session="s", object_size=4096, **opts)
          for r in range(WRITERS)]
    for w in ws:
        w.define("t", "f8", (N * WRITERS, 16), redundancy=redundancy)
    for s in steps:
        for r, w in enumerate(ws):
            with w.step(s):
                w.put("t", _field(s)[r * N:(r + 1) * N], offset=(r * N, 0))
    return ws


def _drainers(drain: Path, step: int) -> list[int]:
    """The servers whose data files hold blocks of `step`, one entry per file."""
    return [int(re.search(r"\.s(\d{6})\.", f.name).group(1)) for f in (drain / "d" / "data").glob(f"drain-{step:012}.*")]


def test_every_server_drains_what_it_holds_into_its_own_file(tmp_path):
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "c.json", servers=4, memory="64MiB", redundancy=1, drain=drain)
    try:
        ws = _write(c.file, range(3))
        assert ws[0].wait_drained(step=2, timeout=60)
        for s in range(3):
            servers = _drainers(drain, s)
            assert len(servers) == len(set(servers)) >= 3, f"step {s}: one file per server, most servers writing: {servers}"
    finally:
        _kill_all(c)
    f = cairn.open("d", "r", engine="file", path=drain)
    for s in range(3):
        np.testing.assert_array_equal(f.get("t", s), _field(s))


@needs_failpoints
def test_a_part_whose_server_dies_is_written_by_another_from_the_copies_left(tmp_path, monkeypatch):
    drain = tmp_path / "drain"
    c, marker = failpoint_cluster(tmp_path, monkeypatch, "drain.part_written", servers=4, redundancy=1)
    try:
        ws = _write(c.file, range(2), timeout=30)
        wait_for(lambda: marker.exists() and any(p.poll() is not None for p in c.procs), "a part's server to die", 30)
        assert ws[0].wait_drained(step=1, timeout=90)
    finally:
        _kill_all(c)
    f = cairn.open("d", "r", engine="file", path=drain)
    assert f.steps() == [0, 1]
    for s in range(2):
        np.testing.assert_array_equal(f.get("t", s), _field(s))


@needs_failpoints
def test_an_object_whose_only_holder_died_fails_the_steps_drain_for_good(tmp_path, monkeypatch):
    """Redundancy 0: the first server to write a part dies before its data file (with the only
    copy of its blocks); once it is declared down the drain of that step fails with
    DataLossError naming the object, shown in status, and is not tried again."""
    c, _ = failpoint_cluster(tmp_path, monkeypatch, "drain.before_data", servers=4, redundancy=0)
    try:
        ws = _write(c.file, range(1), timeout=30, redundancy=0)
        deadline = time.monotonic() + 60
        while True:
            try:
                ws[0].wait_drained(step=0, timeout=10)
            except cairn.DataLossError as e:
                assert "object 0x" in str(e) and "never drained" in str(e), str(e)
                break
            except cairn.UnavailableError:
                pass  # tried while the dead holder was not declared down yet: hung is not lost
            assert time.monotonic() < deadline, "the drain of the lost step failed for good within a minute"
        with pytest.raises(cairn.DataLossError):
            ws[0].wait_drained(step=0, timeout=5)  # a wait begun after the failure hears of it too
        st = cluster.drain_status(c.file)
        assert st is not None and st["error_kind"] == "data_loss" and "d" in st["errors"], st
        attempts = st["attempts"]
        time.sleep(3)  # retries would come every second
        assert cluster.drain_status(c.file)["attempts"] == attempts, "a lost object is not tried again"
    finally:
        _kill_all(c)
