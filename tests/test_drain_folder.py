"""Drain folders others cannot plant (issue 52, item 6): below the drain folder the servers
(possibly root) open every directory and file from the folder's descriptor with no symlink on
the way, and only entries of their own uid. A planted symlink or another user's directory stops
that dataset's drain with ``unsafe_path`` (in the status and at ``wait_drained``), writes
nothing where it points, and the drain resumes once the entry is fixed. Real servers."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
import pytest

import cairn
from cairn import cluster

from .test_drain import _kill_all
from .test_drain_seams import _put, _values, _writers


def _refused(file: Path, ws: list[cairn.Writer], step: int, what: str) -> None:
    with pytest.raises(cairn.ConfigError) as e:
        ws[0].wait_drained(step=step, timeout=60)
    assert e.value.code == "unsafe_path" and what in str(e.value), str(e.value)
    st = cluster.drain_status(file)
    assert st is not None and st["error_reason"] == "unsafe_path" and what in st["errors"]["d"], st


@pytest.mark.parametrize("planted", ["d", "d/steps", "d/data"])
def test_a_symlink_below_the_drain_folder_stops_the_drain_and_nothing_is_written_where_it_points(tmp_path, planted):
    drain, elsewhere = tmp_path / "drain", tmp_path / "elsewhere"
    elsewhere.mkdir()
    c = cluster.start(tmp_path / "c.json", servers=2, memory="64MiB", redundancy=1, drain=drain)
    try:
        link = drain / planted
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(elsewhere)
        if planted == "d":
            # The writer's open records the dataset's owner there first: refused by name at open.
            with pytest.raises(cairn.ConfigError, match=f"{link} is a symlink") as e:
                _writers(c.file, "d")
            assert e.value.code == "unsafe_path" and list(elsewhere.iterdir()) == []
            link.unlink()
            link.mkdir()
            ws = _writers(c.file, "d")
            _put(ws, 0, _values(0))
            assert ws[0].wait_drained(step=0, timeout=60)
            return
        ws = _writers(c.file, "d")
        _put(ws, 0, _values(0))
        _refused(c.file, ws, 0, f"{link} is a symlink")
        assert list(elsewhere.iterdir()) == [], "nothing written through the link"
        # Fixed (the link replaced by a directory of the server's user): the drain resumes.
        link.unlink()
        link.mkdir()
        assert ws[0].wait_drained(step=0, timeout=60)
        np.testing.assert_array_equal(cairn.open("d", "r", engine="file", path=drain).get("t", step=0), _values(0))
    finally:
        _kill_all(c)


def test_a_planted_step_index_symlink_is_never_read_through(tmp_path):
    """A symlink where the step's index would be (to a file the server's user may read, that an
    attacker may not): the drain neither reads nor replaces it."""
    drain = tmp_path / "drain"
    secret = tmp_path / "secret"
    secret.write_text("root only\n")
    c = cluster.start(tmp_path / "c.json", servers=2, memory="64MiB", redundancy=1, drain=drain)
    try:
        ws = _writers(c.file, "d")
        _put(ws, 0, _values(0))
        assert ws[0].wait_drained(step=0, timeout=60)
        index = drain / "d" / "steps" / f"{1:012}.json"
        _put(ws, 1, _values(1), meanwhile=lambda: index.symlink_to(secret))
        _refused(c.file, ws, 1, f"{index} is a symlink")
        assert index.is_symlink() and secret.read_text() == "root only\n"
    finally:
        _kill_all(c)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to make a directory of another uid")
def test_a_directory_of_another_user_stops_the_drain(tmp_path):
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "c.json", servers=2, memory="64MiB", redundancy=1, drain=drain)
    try:
        # A writer of another dataset opens first; then its folder is given to another user.
        ws = _writers(c.file, "d")
        shutil.rmtree(drain / "d")
        (drain / "d").mkdir(parents=True)
        shutil.chown(drain / "d", 65534, 65534)
        _put(ws, 0, _values(0))
        _refused(c.file, ws, 0, "owned by uid 65534")
        assert not (drain / "d" / "steps").exists()
        # A new writer's open is refused by name there too (it records the dataset's owner).
        with pytest.raises(cairn.ConfigError, match="owned by uid 65534"):
            _writers(c.file, "d", session="second")
        shutil.chown(drain / "d", 0, 0)
        assert ws[0].wait_drained(step=0, timeout=60)
    finally:
        _kill_all(c)
