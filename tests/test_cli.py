"""The `cairn` command line."""

from __future__ import annotations

import subprocess

import numpy as np

import cairn
from cairn.cli import main

from .conftest import PY


def make(tmp_path):
    with cairn.open("ds", "w", path=tmp_path) as f:
        f.define("p", "f4", (6, 5))
        f.define("w", "i2", local=True)
        for s in range(2):
            with f.step(s):
                f.put("p", np.arange(30, dtype="f4").reshape(6, 5) + s, offset=(0, 0))
                f.put("w", np.arange(3, dtype="i2"))
    return str(tmp_path / "ds")


def test_ls_shows_variables_steps_blocks_and_stats(tmp_path, capsys):
    assert main(["ls", make(tmp_path), "--blocks"]) == 0
    out = capsys.readouterr().out
    assert "2 committed: 0..1" in out and "6x5" in out and "local" in out
    assert "30" in out and "14.5" in out  # step 1 max and step 0 mean


def test_get_box_to_npy_and_errors(tmp_path, capsys):
    path = make(tmp_path)
    npy = tmp_path / "box.npy"
    assert main(["get", path, "p", "--step", "1", "--box", "2:4,1:", "-o", str(npy)]) == 0
    assert np.array_equal(np.load(npy), np.arange(30, dtype="f4").reshape(6, 5)[2:4, 1:] + 1)
    assert main(["get", path, "p", "--step", "0", "--box", "0:9,:"]) == 1
    assert "outside 0..6" in capsys.readouterr().err
    assert main(["get", path, "p", "--step", "5"]) == 1
    assert "not committed" in capsys.readouterr().err


def test_version_from_the_installed_command():
    out = subprocess.run([PY, "-m", "cairn", "--version"], capture_output=True, text=True, check=True).stdout
    assert out.strip() == f"cairn {cairn.__version__}"
