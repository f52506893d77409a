"""Dimension names and attributes, lazy indexing, and restarts that keep definitions, on both engines."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import cairn
from cairn.variable import normalize


def write_field(cfg, name="ds", steps=3, shape=(4, 6, 5)):
    """A dataset with dims and attributes: ``p[s] = arange + 1000 s``."""
    with cairn.open(name, "w", config=cfg, rank=0, nranks=1) as f:
        f.attrs["title"] = "test run"
        f.define("p", "f8", shape, dims=("z", "y", "x"), attrs={"units": "K", "scale": np.float32(0.5),
                                                                  "levels": np.arange(3)})
        f.define("w", "i4", local=True, attrs={"kind": "walkers"})
        for s in range(steps):
            with f.step(s):
                if s == 0:
                    f.attrs["nsteps"] = np.int64(steps)
                f.put("p", field(s, shape), offset=(0,) * len(shape))
                f.put("w", np.arange(s + 1, dtype="i4"))
    return field


def field(s, shape=(4, 6, 5)):
    return np.arange(np.prod(shape), dtype="f8").reshape(shape) + 1000 * s


def test_dims_and_attributes_round_trip(cfg):
    write_field(cfg)
    with cairn.open("ds", "r", config=cfg) as r:
        assert r.attrs == {"title": "test run", "nsteps": 3}
        v = r.variables()
        assert v["p"].dims == ("z", "y", "x")
        assert v["p"].attrs == {"units": "K", "scale": 0.5, "levels": [0, 1, 2]}
        assert v["w"].dims is None and v["w"].attrs == {"kind": "walkers"}


def test_attributes_are_checked_with_clear_errors(cfg):
    with cairn.open("ds", "w", config=cfg, rank=0, nranks=1) as f:
        with pytest.raises(cairn.InvalidArgumentError, match="3 dimensions but 2"):
            f.define("p", "f8", (2, 3, 4), dims=("y", "x"))
        with pytest.raises(cairn.InvalidArgumentError, match="must differ"):
            f.define("p", "f8", (2, 3), dims=("x", "x"))
        with pytest.raises(cairn.InvalidArgumentError, match="attribute 'f' of variable 'p'.*cannot be stored"):
            f.define("p", "f8", (2, 3), attrs={"f": object()})
        with pytest.raises(cairn.InvalidArgumentError, match="more than 65536"):
            f.attrs["blob"] = "x" * 70000
        with pytest.raises(cairn.InvalidArgumentError, match="finite"):
            f.attrs["nan"] = float("nan")
        assert dict(f.attrs) == {}
        f.define("p", "f8", (2, 3), dims=("y", "x"), attrs={"units": "m"})
        with pytest.raises(cairn.ConflictError, match="dims \\(y, x\\).*cannot redefine.*dims \\(a, b\\)"):
            f.define("p", "f8", (2, 3), dims=("a", "b"), attrs={"units": "m"})


def test_append_keeps_definitions_and_attributes_and_says_where_to_resume(cfg):
    write_field(cfg, steps=2)
    with cairn.open("ds", "a", config=cfg, rank=0, nranks=1) as f:
        assert f.next_step == 2
        assert f.attrs["title"] == "test run"
        with f.step(f.next_step):
            f.put("p", field(2), offset=(0, 0, 0))
    with cairn.open("ds", "r", config=cfg) as r:
        assert r.steps() == [0, 1, 2]
        assert r.attrs["title"] == "test run" and r.variables()["p"].dims == ("z", "y", "x")
        assert np.array_equal(r["p"][2], field(2))


def test_lazy_variable_describes_itself_and_reads_steps(cfg):
    write_field(cfg)
    with cairn.open("ds", "r", config=cfg) as r:
        p = r["p"]
        assert (p.shape, p.dtype, p.dims, p.attrs["units"], p.steps) == ((4, 6, 5), np.dtype("f8"), ("z", "y", "x"), "K", [0, 1, 2])
        assert np.array_equal(p[-1], field(2))
        assert np.array_equal(p[1, 0:3, :, 4], field(1)[0:3, :, 4])
        assert np.array_equal(p[0, ..., ::-2], field(0)[..., ::-2])
        with pytest.raises(cairn.NotFoundError):
            r["nope"]
        with pytest.raises(cairn.NotFoundError, match="step 7 is not committed"):
            p[7]
        with pytest.raises(IndexError):
            p[0, 4]
        with pytest.raises(cairn.InvalidArgumentError, match="step index"):
            p[0:2]


def index_part(n):
    """One basic index of a dimension of size ``n``: an integer or a slice, negatives included."""
    bound = st.one_of(st.none(), st.integers(-n - 2, n + 2))
    step = st.one_of(st.none(), st.integers(-3, 3).filter(lambda s: s != 0))
    return st.one_of(st.integers(-n, n - 1), st.builds(slice, bound, bound, step))


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_lazy_indexing_equals_numpy_indexing(tmp_path_factory, data):
    ndim = data.draw(st.integers(1, 4))
    shape = tuple(data.draw(st.lists(st.integers(1, 6), min_size=ndim, max_size=ndim)))
    full = np.random.default_rng(1).normal(size=shape)
    d = tmp_path_factory.mktemp("lazy")
    with cairn.open("ds", "w", path=d, rank=0, nranks=1) as f:
        f.define("x", "f8", shape)
        with f.step(0):
            f.put("x", full, offset=(0,) * ndim)
    key = tuple(data.draw(index_part(n)) for n in shape[:data.draw(st.integers(0, ndim))])
    if data.draw(st.booleans()) and len(key) < ndim:
        key = key + (Ellipsis,)
    with cairn.open("ds", "r", path=d) as r:
        got = r["x"][(0, *key)]
    want = full[key]
    assert got.shape == want.shape and np.array_equal(got, want)
    norm = normalize(key, shape)
    assert normalize(tuple(norm), shape) == norm  # normalized keys pass through unchanged


xr = pytest.importorskip("xarray")


def write_blocks(cfg, name="ds", steps=3):
    """``p`` (4 x 6 x 5) written as 2 x 2 blocks along z, y by one writer, with dims and attributes."""
    with cairn.open(name, "w", config=cfg, rank=0, nranks=1) as f:
        f.attrs["title"] = "blocks"
        f.define("p", "f8", (4, 6, 5), dims=("z", "y", "x"), attrs={"units": "K"})
        f.define("q", "i4", (6,), dims=("y",))
        f.define("w", "i4", local=True)
        for s in range(steps):
            with f.step(s):
                a = field(s)
                for z in (0, 2):
                    for y in (0, 3):
                        f.put("p", a[z:z + 2, y:y + 3], offset=(z, y, 0))
                f.put("q", np.arange(6, dtype="i4") * s, offset=(0,))
                f.put("w", np.arange(2, dtype="i4"))


def open_xr(cfg, **kw):
    """``xr.open_dataset`` of dataset ``ds`` of ``cfg``: by path for files, by name and cluster
    for staging. The backend class is passed as the engine, so this works before ``maturin
    develop`` registers the ``cairn`` entry point."""
    from cairn.xarray_backend import CairnBackendEntrypoint

    text = cfg.read_text()
    if 'engine = "staging"' in text:
        cluster = text.split('cluster = "')[1].split('"')[0]
        return xr.open_dataset("ds", engine=CairnBackendEntrypoint, backend_kwargs={"cluster": cluster}, **kw)
    return xr.open_dataset(cfg.parent / "ds", engine=CairnBackendEntrypoint, **kw)


def expected(steps=3):
    return np.stack([field(s) for s in range(steps)])


def test_xarray_opens_eagerly_lazily_and_with_dask(cfg):
    write_blocks(cfg)
    with open_xr(cfg) as ds:
        assert ds.attrs == {"title": "blocks"}
        assert ds["p"].dims == ("step", "z", "y", "x") and ds["p"].attrs == {"units": "K"}
        assert list(ds["step"].values) == [0, 1, 2] and "w" not in ds
        assert not ds["p"].variable._in_memory
        assert float(ds["p"].isel(step=-1, z=3, y=slice(None, None, -2), x=0)[0]) == field(2)[3, 5, 0]
        assert np.array_equal(ds["p"].values, expected())
        assert np.array_equal(ds["q"].values, np.outer(range(3), np.arange(6)))
    with open_xr(cfg, chunks={}) as ds:
        assert ds["p"].chunks == ((1, 1, 1), (2, 2), (3, 3), (5,))
        assert np.array_equal(ds["p"].compute().values, expected())
    with cairn.open("ds", "r", config=cfg) as r:
        d = r.to_dask("p")
        assert d.chunks == ((1, 1, 1), (2, 2), (3, 3), (5,))
        assert np.array_equal(d[1:, :, ::2].compute(), expected()[1:, :, ::2])
        with pytest.raises(cairn.InvalidArgumentError, match="local variable"):
            r.to_dask("w")


def test_engine_cairn_through_the_declared_entry_point(file_cfg):
    """The entry point pyproject.toml declares, installed as a package's metadata would be (as
    `maturin develop` or pip does), lets xarray find ``engine="cairn"``; a fresh process, since
    xarray caches the backends it found."""
    import os
    import subprocess

    from .conftest import PY, ROOT

    tomllib = pytest.importorskip("tomllib")
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["entry-points"]["xarray.backends"]["cairn"]
    assert target == "cairn.xarray_backend:CairnBackendEntrypoint"
    write_blocks(file_cfg)
    site = file_cfg.parent / "site"
    info = site / "cairn_entry_point-0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: cairn-entry-point\nVersion: 0\n")
    (info / "entry_points.txt").write_text(f"[xarray.backends]\ncairn = {target}\n")
    probe = "import sys, xarray as xr; print(float(xr.open_dataset(sys.argv[1], engine='cairn')['p'][-1, 3, 5, 4]))"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), *filter(None, [os.environ.get("PYTHONPATH")])])}
    r = subprocess.run([PY, "-c", probe, str(file_cfg.parent / "ds")], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    assert float(r.stdout) == field(2)[3, 5, 4]


def test_release_works_on_both_engines(cfg):
    write_field(cfg)
    with cairn.open("ds", "r", config=cfg) as r:
        r.release(1)
        assert r.steps() == [0, 2]
        # The staging servers remember it was released (issue 40); the file engine has no record.
        with pytest.raises(cairn.NotFoundError, match="step 1 (is not committed|of 'ds' was committed and then released)"):
            r.get("p", 1)
        with pytest.raises(cairn.NotFoundError):
            r.release(1)
        assert np.array_equal(r["p"][-1], field(2))


def test_local_variables_with_dims_take_blocks_of_that_many_dimensions(cfg):
    with cairn.open("ds", "w", config=cfg, rank=0, nranks=1) as f:
        f.define("walkers", "f8", local=True, dims=("walker", "xyz"))
        with f.step(0):
            with pytest.raises(cairn.InvalidArgumentError, match="has 1 dimensions.*names 2 \\(walker, xyz\\)"):
                f.put("walkers", np.zeros(3))
            f.put("walkers", np.zeros((3, 3)))
    with cairn.open("ds", "r", config=cfg) as r:
        assert r.variables()["walkers"].dims == ("walker", "xyz") and r.get_local("walkers", 0, 0).shape == (3, 3)


def test_lazy_indexing_reads_only_the_bounding_box(file_cfg):
    write_field(file_cfg)
    with cairn.open("ds", "r", config=file_cfg) as r:
        boxes = []
        get = r.get
        r.get = lambda name, step, offset, count: boxes.append((step, offset, count)) or get(name, step, offset, count)
        assert np.array_equal(r["p"][1, 1:3, ::2, -1], field(1)[1:3, ::2, -1])
        assert np.array_equal(r["p"][-1, 3, 5:0:-2], field(2)[3, 5:0:-2])
        assert r["p"][0, 2:2].shape == (0, 6, 5)
    assert boxes == [(1, [1, 0, 4], [2, 5, 1]), (2, [3, 1, 0], [1, 5, 5])]
