"""Compressed containers of the `file` engine: one line of config, codecs chosen per variable
element type, transparent reads, `cairn ls` showing the ratio, damage reported by name."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cairn

from .conftest import file_config


def _cfg(tmp_path, compression: str):
    return file_config(tmp_path, compression=compression)


def smooth(shape: tuple[int, ...], dtype: str = "f8") -> np.ndarray:
    n = int(np.prod(shape))
    x = np.linspace(0, 8, n)
    return (np.sin(x) * 100 + 0.001 * np.cos(37 * x)).astype(dtype).reshape(shape)


FIELDS = {
    "rho": ("f8", smooth((40, 30, 20))),
    "t": ("f4", smooth((40, 30, 20), "f4")),
    "ids": ("i8", np.arange(24000, dtype="i8").reshape(40, 30, 20)),
    "mask": ("u1", (np.arange(24000) % 3 == 0).astype("u1").reshape(40, 30, 20)),
    "psi": ("c16", (smooth((40, 30, 20)) + 1j * smooth((40, 30, 20))).astype("c16")),
}


def write_fields(cfg, ranks: int = 2, step: int = 0, mode: str = "w") -> None:
    for r in range(ranks):
        with cairn.open("ds", mode, config=cfg, rank=r, nranks=ranks, session="s") as f:
            for name, (dt, a) in FIELDS.items():
                f.define(name, dt, a.shape)
            with f.step(step):
                lo, hi = 20 * r, 20 * (r + 1)
                for name, (_, a) in FIELDS.items():
                    f.put(name, a[lo:hi], offset=(lo, 0, 0))


def test_aware_compression_is_transparent_and_chosen_by_type(tmp_path):
    cfg = _cfg(tmp_path, "aware")
    write_fields(cfg)
    with cairn.open("ds", "r", config=cfg) as f:
        for name, (_, a) in FIELDS.items():
            np.testing.assert_array_equal(f.get(name, 0), a)
            np.testing.assert_array_equal(f.get(name, 0, (5, 3, 2), (30, 20, 10)), a[5:35, 3:23, 2:12])
        blocks = {name: f.blocks(name, 0) for name in FIELDS}
    assert all(b.codec.startswith("pco:f8le") for b in blocks["rho"])
    assert all(b.codec.startswith("pco:f4le") for b in blocks["t"])
    assert all(b.codec.startswith("pco:c16le") for b in blocks["psi"])  # coded as its float parts
    assert all(b.codec.startswith("zstd") for b in blocks["mask"])  # bytes are symbols, not numbers
    for name in ("rho", "ids", "mask"):
        assert sum(b.stored for b in blocks[name]) * 2 < sum(b.nbytes for b in blocks[name]), name
    # Statistics are of the values, not the stored bytes.
    assert blocks["rho"][0].min == pytest.approx(float(FIELDS["rho"][1][:20].min()))


def test_steps_with_and_without_compression_mix(tmp_path):
    write_fields(_cfg(tmp_path, "none"), step=0)
    cfg = _cfg(tmp_path, "zstd:5")
    write_fields(cfg, step=1, mode="a")
    with cairn.open("ds", "r", config=cfg) as f:
        assert f.blocks("rho", 0)[0].codec is None and f.blocks("rho", 1)[0].codec == "zstd:5"
        for s in (0, 1):
            np.testing.assert_array_equal(f.get("ids", s), FIELDS["ids"][1])


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_any_box_of_a_compressed_field_matches_numpy(tmp_path_factory, data):
    tmp = tmp_path_factory.mktemp("box")
    cfg = _cfg(tmp, data.draw(st.sampled_from(["aware", "gzip:1", "zstd"])))
    a = smooth((13, 7, 5))
    with cairn.open("ds", "w", config=cfg) as f:
        f.define("x", "f8", a.shape)
        with f.step(0):
            f.put("x", a[:6], offset=(0, 0, 0))
            f.put("x", a[6:], offset=(6, 0, 0))
    off = [data.draw(st.integers(0, n - 1)) for n in a.shape]
    cnt = [data.draw(st.integers(1, n - o)) for n, o in zip(a.shape, off)]
    with cairn.open("ds", "r", config=cfg) as f:
        got = f.get("x", 0, off, cnt)
    np.testing.assert_array_equal(got, a[tuple(slice(o, o + c) for o, c in zip(off, cnt))])


def test_ls_shows_the_ratio(tmp_path):
    cfg = _cfg(tmp_path, "aware")
    write_fields(cfg)
    out = subprocess.run([sys.executable, "-m", "cairn.cli", "ls", str(tmp_path / "ds")], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    row = next(line for line in out.stdout.splitlines() if line.startswith("ids "))
    assert float(row.split()[-2]) > 2 and row.split()[-1] == "pco", row
    total = next(line for line in out.stdout.splitlines() if line.startswith("total"))
    assert float(total.split()[-1]) > 1.5


def test_bad_compression_and_damaged_blocks_are_named(tmp_path):
    with pytest.raises(cairn.ConfigError, match=r'compression = "lz9".*aware'):
        with cairn.open("ds", "w", config=_cfg(tmp_path, "lz9")):
            pass
    with pytest.raises(cairn.ConfigError, match="compression"):
        cairn.open("ds", "w", engine="file", path=str(tmp_path), compression="zstd:99")
    cfg = _cfg(tmp_path, "aware")
    write_fields(cfg, ranks=1)
    (data,) = (tmp_path / "ds" / "data").glob("rank-000000.*.bin")
    with cairn.open("ds", "r", config=cfg) as f:
        b = f.blocks("rho", 0)[0]
    raw = bytearray(data.read_bytes())
    raw[300] ^= 0xFF  # inside the first block written (rho)
    data.write_bytes(bytes(raw))
    with cairn.open("ds", "r", config=cfg) as f:
        with pytest.raises(cairn.CorruptError, match="compressed block of 'rho' by writer 0"):
            f.get("rho", 0)
        np.testing.assert_array_equal(f.get("ids", 0, (0, 0, 0), (20, 30, 20)), FIELDS["ids"][1][:20])
    assert b.stored < b.nbytes
