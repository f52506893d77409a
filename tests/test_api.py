"""The Python API on the file engine, one process: round trips, errors, configuration."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cairn


def write(cfg, name="ds", nranks=1, rank=0, **kw):
    return cairn.open(name, "w", config=cfg, rank=rank, nranks=nranks, **kw)


@pytest.mark.parametrize("dtype", ["u1", "u2", "u4", "u8", "i1", "i2", "i4", "i8", "f4", "f8", "c8", "c16"])
def test_every_dtype_round_trips(cfg, dtype):
    a = (np.arange(60).reshape(3, 4, 5) * 3).astype(dtype)
    with write(cfg) as f:
        f.define("v", dtype, a.shape)
        with f.step(0):
            f.put("v", a, offset=(0, 0, 0))
    with cairn.open("ds", "r", config=cfg) as f:
        got = f.get("v", 0)
        assert got.dtype == a.dtype and np.array_equal(got, a)
        (b,) = f.blocks("v", 0)
        if dtype.startswith("c"):
            assert b.min is None
        else:
            assert (b.min, b.max) == (a.min(), a.max())


def test_fortran_order_big_endian_and_views_are_written_as_their_values(cfg):
    base = np.arange(200.0).reshape(10, 20)
    with write(cfg) as f:
        f.define("p", "f8", (10, 20))
        with f.step(0):
            f.put("p", np.asfortranarray(base[:5]), offset=(0, 0))
            f.put("p", base[5:].astype(">f8"), offset=(5, 0))
    with cairn.open("ds", "r", config=cfg) as f:
        assert np.array_equal(f.get("p", 0), base)


@settings(max_examples=25, deadline=None)
@given(data=st.data(), ndim=st.integers(1, 5))
def test_any_box_matches_numpy_slicing(tmp_path_factory, data, ndim):
    shape = tuple(data.draw(st.lists(st.integers(1, 7), min_size=ndim, max_size=ndim)))
    full = np.random.default_rng(0).normal(size=shape)
    nw = data.draw(st.integers(1, 4))
    cuts = sorted(data.draw(st.lists(st.integers(0, shape[0]), min_size=nw - 1, max_size=nw - 1)))
    bounds = list(zip([0, *cuts], [*cuts, shape[0]]))
    d = tmp_path_factory.mktemp("h")
    writers = [cairn.open("ds", "w", rank=r, nranks=nw, path=d, session="s") for r in range(nw)]
    for r, w in enumerate(writers):
        w.define("x", "f8", shape)
        with w.step(0):
            lo, hi = bounds[r]
            if hi > lo:
                w.put("x", full[lo:hi], offset=(lo,) + (0,) * (ndim - 1))
        w.close()
    off = [data.draw(st.integers(0, n - 1)) for n in shape]
    cnt = [data.draw(st.integers(1, n - o)) for n, o in zip(shape, off)]
    with cairn.open("ds", "r", path=d) as f:
        got = f.get("x", 0, off, cnt)
    assert np.array_equal(got, full[tuple(slice(o, o + c) for o, c in zip(off, cnt))])


def test_local_variables_are_ragged_per_writer(cfg):
    for r in range(3):
        with write(cfg, nranks=3, rank=r, session="s") as f:
            f.define("walkers", "f8", local=True)
            with f.step(7):
                f.put("walkers", np.full((r + 1, 3), float(r)))
    with cairn.open("ds", "r", config=cfg) as f:
        assert f.variables()["walkers"].local
        for r in range(3):
            assert np.array_equal(f.get_local("walkers", 7, writer=r), np.full((r + 1, 3), float(r)))
        with pytest.raises(cairn.NotFoundError, match="writer 5"):
            f.get_local("walkers", 7, writer=5)


def test_errors_name_the_problem(cfg):
    with write(cfg) as f:
        f.define("p", "f8", (4, 4))
        with pytest.raises(cairn.ConflictError, match="outside a step"):
            f.put("p", np.zeros((2, 2)), offset=(0, 0))
        with f.step(0):
            with pytest.raises(KeyError, match="unknown variable 'q'"):
                f.put("q", np.zeros(2))
            with pytest.raises(ValueError, match="dtype mismatch"):
                f.put("p", np.zeros((2, 2), "f4"), offset=(0, 0))
            with pytest.raises(cairn.InvalidArgumentError, match="outside the global shape"):
                f.put("p", np.zeros((2, 2)), offset=(3, 0))
            with pytest.raises(cairn.InvalidArgumentError, match="3 dimensions but the variable has 2"):
                f.put("p", np.zeros((1, 2, 2)), offset=(0, 0, 0))
            f.put("p", np.ones((4, 4)), offset=(0, 0))
            with pytest.raises(cairn.ConflictError, match="overlaps"):
                f.put("p", np.ones((1, 1)), offset=(3, 3))
        with pytest.raises(cairn.ConflictError, match="redefine"):
            f.define("p", "i4", (4, 4))
    with cairn.open("ds", "r", config=cfg) as f:
        assert np.array_equal(f.get("p", 0), np.ones((4, 4)))
        with pytest.raises(cairn.NotFoundError, match="step 3 is not committed"):
            f.get("p", 3)
    # Mode "w" opens a dataset with steps (claimers share a destination), but a committed step
    # is never written again.
    with write(cfg) as f, pytest.raises(cairn.AlreadyExistsError, match="already committed"):
        with f.step(0):
            pass
    with pytest.raises(cairn.InvalidArgumentError, match="rank 4 of 4"):
        write(cfg, rank=4, nranks=4)


def test_overlapping_blocks_from_two_writers_keep_the_step_hidden(cfg):
    ws = [write(cfg, nranks=2, rank=r, session="s") for r in range(2)]
    for w in ws:
        w.define("p", "f8", (10,))
        w._inner.begin_step(0)
    ws[0].put("p", np.zeros(6), offset=(0,))
    ws[1].put("p", np.zeros(6), offset=(4,))
    ws[0]._inner.end_step()
    with pytest.raises(cairn.ConflictError, match="overlap"):
        ws[1]._inner.end_step()
    with cairn.open("ds", "r", config=cfg) as f:
        assert f.steps() == []


def test_exception_inside_a_step_abandons_it(cfg):
    with write(cfg) as f:
        f.define("p", "f8", (2,))
        with f.step(0):
            f.put("p", np.zeros(2), offset=(0,))
        with pytest.raises(RuntimeError):
            with f.step(1):
                f.put("p", np.ones(2), offset=(0,))
                raise RuntimeError("simulation blew up")
    with cairn.open("ds", "r", config=cfg) as f:
        assert f.steps() == [0]


def test_corrupt_data_is_reported_and_other_blocks_stay_readable(file_cfg, tmp_path):
    cfg = file_cfg
    for r in range(2):
        with write(cfg, nranks=2, rank=r, session="s") as f:
            f.define("p", "f8", (1000,))
            with f.step(0):
                f.put("p", np.arange(500.0) + 500 * r, offset=(500 * r,))
    (data,) = (tmp_path / "ds" / "data").glob("rank-000001.*.bin")  # one data file per rank and session
    raw = bytearray(data.read_bytes())
    raw[-10] ^= 0x01
    data.write_bytes(bytes(raw))
    with cairn.open("ds", "r", config=cfg) as f:
        with pytest.raises(cairn.CorruptError, match="checksum mismatch.*rank-000001"):
            f.get("p", 0)
        assert np.array_equal(f.get("p", 0, (0,), (500,)), np.arange(500.0))
    (tmp_path / "ds" / "steps" / "000000000000.json").write_text('{"format": 1, "st')
    with cairn.open("ds", "r", config=cfg) as f, pytest.raises(cairn.CorruptError, match="truncated"):
        f.get("p", 0)


def test_config_sources_and_errors(tmp_path, monkeypatch):
    (tmp_path / "env.toml").write_text(f'engine = "file"\n[file]\npath = "{tmp_path / "viaenv"}"\n')
    monkeypatch.setenv("CAIRN_CONFIG", str(tmp_path / "env.toml"))
    with cairn.open("ds", "w") as f:
        f.define("x", "i4", (1,))
        with f.step(0):
            f.put("x", np.array([5], "i4"), offset=(0,))
    assert (tmp_path / "viaenv" / "ds" / "steps").is_dir()
    with cairn.open("ds", "r", path=tmp_path / "viaenv", engine="file") as f:
        assert f.get("x", 0)[0] == 5
    (tmp_path / "bad.toml").write_text('engine = "flie"\n')
    with pytest.raises(cairn.ConfigError, match="flie"):
        cairn.open("ds", "r", config=tmp_path / "bad.toml")
    with pytest.raises(cairn.ConfigError, match="unknown config key 'pth'"):
        cairn.open("ds", "r", pth="x")
    with pytest.raises(cairn.ConfigError, match="cannot read config file"):
        cairn.open("ds", "r", config=tmp_path / "missing.toml")


@pytest.mark.parametrize("table, key", [("file", "chunk_size"), ("staging", "object_size")])
def test_zero_sizes_in_cairn_toml_are_refused(tmp_path, table, key):
    conf = tmp_path / "cairn.toml"
    conf.write_text(f'engine = "file"\n[{table}]\n{key} = 0\n')
    with pytest.raises(cairn.ConfigError, match=rf"{key} = 0: use .*positive"):
        cairn.open("ds", "w", config=conf, path=tmp_path)
    with pytest.raises(cairn.ConfigError, match=rf"override {key}=\"0\""):
        cairn.open("ds", "w", engine="file", path=tmp_path, **{key: 0})


@pytest.mark.parametrize("name", ["a\0b", "x" * 256, "é" * 128, "", ".", "..", "a/b"])
def test_bad_dataset_names_are_invalid_arguments(tmp_path, name):
    for mode in ("w", "r"):
        with pytest.raises(cairn.InvalidArgumentError, match=r"invalid dataset name .*1 to 255 bytes"):
            cairn.open(name, mode, engine="file", path=tmp_path)
    with cairn.open("x" * 255, "w", engine="file", path=tmp_path):
        pass


@pytest.mark.parametrize("bad", [-1, 1.5, "0", True, None, 2**64])
def test_steps_are_integers_from_zero(file_cfg, bad):
    with write(file_cfg, name="ok") as f:
        f.define("x", "f8", (2,))
        with f.step(np.int64(0)):
            f.put("x", np.ones(2), offset=(0,))
            f.trace("t", [1.0])
        with pytest.raises(cairn.InvalidArgumentError, match=f"invalid step {re.escape(repr(bad))}: steps are integers >= 0"):
            with f.step(bad):
                pass
    with cairn.open("ok", "r", config=file_cfg) as f:
        assert np.array_equal(f.get("x", np.uint8(0)), [1, 1])
        calls = [lambda: f.get_local("x", bad, 0), lambda: f.get_trace("t", bad, 0),
                 lambda: f.blocks("x", bad), lambda: f.wait_step(bad, 0), lambda: f.release(bad)]
        if bad is not None:
            calls += [lambda: next(f.stream(bad, timeout=0)), lambda: f.get("x", bad)]
        else:
            # get's step is optional for constants only: a per-step variable asks for one.
            with pytest.raises(cairn.InvalidArgumentError, match="'x' is written every step: give the step"):
                f.get("x", bad)
        for call in calls:
            with pytest.raises(cairn.InvalidArgumentError, match=f"invalid step {re.escape(repr(bad))}: steps are integers >= 0"):
                call()


def test_naming_a_cluster_means_the_staging_engine(tmp_path, monkeypatch):
    """``cluster=`` opens the staging engine whatever the configuration's engine (as the xarray
    backend's ``cluster`` does); ``engine="file"`` with ``cluster=`` is refused, not ignored."""
    from cairn import cluster

    monkeypatch.chdir(tmp_path)
    (tmp_path / "cairn.toml").write_text('engine = "file"\n')
    c = cluster.start(tmp_path / "c.json", servers=1, memory="64MiB", redundancy=0)
    try:
        with cairn.open("d", "w", cluster=c.file) as w:
            w.define("x", "f8", (4,))
            with w.step(0):
                w.put("x", np.arange(4.0))
        np.testing.assert_array_equal(cairn.open("d", "r", cluster=c.file).get("x", 0), np.arange(4.0))
        assert not (tmp_path / "d").exists(), "nothing went to the file engine's folder"
        with pytest.raises(cairn.InvalidArgumentError, match="cluster= names a staging cluster"):
            cairn.open("d", "r", engine="file", cluster=c.file)
    finally:
        c.stop()
