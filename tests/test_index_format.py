"""Step index format versions of the file engine: a dataset written by a build that wrote
format 1 (JSON indexes, ``tests/data/index-v1``) reads exactly, and new steps are written as
format 2 (binary, see docs/format.md) and read the same."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

import cairn

FIXTURE = Path(__file__).resolve().parent / "data" / "index-v1"
V2_MAGIC = b"CAIRNIX2"


def write_fixture(path: Path) -> None:
    """Dataset ``ds`` under ``path``: 2 ranks, steps 0 and 1, a global and a local variable, dataset
    and variable attributes, 256-byte checksum chunks (several crcs per block). It made
    ``tests/data/index-v1`` with a build that wrote format 1."""
    for r in range(2):
        with cairn.open("ds", "w", engine="file", path=path, chunk_size=256, rank=r, nranks=2, session="fixture") as f:
            f.define("p", "f8", (2, 40), dims=("y", "x"), attrs={"units": "K", "scale": [1, 2.5]})
            f.define("w", "i4", local=True, attrs={"long_name": "walkers"})
            f.attrs["title"] = "index format fixture"
            f.attrs["ranks"] = 2
            for s in range(2):
                with f.step(s):
                    f.put("p", expected_p(s)[r : r + 1], offset=(r, 0))
                    f.put("w", expected_w(s, r))


def expected_p(step: int) -> np.ndarray:
    return np.arange(80.0).reshape(2, 40) * 0.5 + 100 * step


def expected_w(step: int, rank: int) -> np.ndarray:
    return (np.arange(3 + 5 * rank, dtype="i4") - 2) * (step + 1)


def check_dataset(path: Path) -> None:
    with cairn.open("ds", "r", engine="file", path=path) as f:
        assert f.steps() == [0, 1]
        v = f.variables()
        assert (v["p"].dtype, v["p"].shape, v["p"].local, v["p"].dims) == (np.dtype("f8"), (2, 40), False, ("y", "x"))
        assert v["p"].attrs == {"units": "K", "scale": [1, 2.5]}
        assert (v["w"].dtype, v["w"].local, v["w"].attrs) == (np.dtype("i4"), True, {"long_name": "walkers"})
        assert f.attrs == {"title": "index format fixture", "ranks": 2}
        for s in range(2):
            assert np.array_equal(f.get("p", s), expected_p(s))
            assert np.array_equal(f.get("p", s, (0, 30), (2, 5)), expected_p(s)[:, 30:35])
            for r in range(2):
                assert np.array_equal(f.get_local("w", s, r), expected_w(s, r))
            blocks = sorted(f.blocks("p", s), key=lambda b: b.writer)
            assert [(b.writer, b.offset, b.count) for b in blocks] == [(0, (0, 0), (1, 40)), (1, (1, 0), (1, 40))]
            for b in blocks:
                row = expected_p(s)[b.writer]
                assert (b.min, b.max, b.mean, b.nbytes) == (row.min(), row.max(), row.mean(), 320)
            w = sorted(f.blocks("w", s), key=lambda b: b.writer)
            assert [(b.min, b.max) for b in w] == [(expected_w(s, r).min(), expected_w(s, r).max()) for r in range(2)]


def test_a_format_1_dataset_reads_exactly(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "ds")
    (tmp_path / "ds" / "pending").mkdir(exist_ok=True)
    assert all(p.read_bytes().startswith(b"{") for p in (tmp_path / "ds" / "steps").iterdir())
    check_dataset(tmp_path)


def test_new_steps_are_written_in_format_2_and_read_the_same(tmp_path):
    write_fixture(tmp_path)
    steps = sorted((tmp_path / "ds" / "steps").iterdir())
    assert [p.name for p in steps] == ["000000000000.json", "000000000001.json"]
    assert all(p.read_bytes().startswith(V2_MAGIC) for p in steps)
    check_dataset(tmp_path)


def test_a_format_1_dataset_takes_format_2_steps(tmp_path):
    shutil.copytree(FIXTURE, tmp_path / "ds")
    (tmp_path / "ds" / "pending").mkdir(exist_ok=True)
    with cairn.open("ds", "a", engine="file", path=tmp_path) as f:
        with f.step(2):
            f.put("p", expected_p(2), offset=(0, 0))
            f.put("w", expected_w(2, 0))
    assert (tmp_path / "ds" / "steps" / "000000000002.json").read_bytes().startswith(V2_MAGIC)
    with cairn.open("ds", "r", engine="file", path=tmp_path) as f:
        assert f.steps() == [0, 1, 2]
        assert np.array_equal(f.get("p", 2), expected_p(2))
        assert np.array_equal(f.get("p", 0), expected_p(0))
        assert f.variables()["p"].attrs == {"units": "K", "scale": [1, 2.5]}


@pytest.mark.parametrize("cut", [0, 7, 12, 40, -5, -1])
def test_a_truncated_format_2_index_is_corrupt_naming_the_file(tmp_path, cut):
    write_fixture(tmp_path)
    p = tmp_path / "ds" / "steps" / "000000000001.json"
    p.write_bytes(p.read_bytes()[:cut])
    with cairn.open("ds", "r", engine="file", path=tmp_path) as f, pytest.raises(cairn.CorruptError, match="000000000001.json"):
        f.get("p", 1)
