"""Data netCDF and xarray users can trust (issue 43): CF attributes in the variable's type, the
xarray backend's CF decoding, and exports checked by the tools people run on them: ncdump,
h5dump, the IOOS compliance-checker, xarray and zarr-python."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import cairn

from .conftest import ROOT


def _tool(name: str, pip: bool = False) -> str:
    """The path of tool ``name``. One pip installs into the venv (``pip``: scripts/setup.sh's list)
    is never skipped, nor any under CI: make setup installs them all, so a missing one fails."""
    path = shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))
    if path is None:
        if pip or os.environ.get("CI"):
            pytest.fail(f"{name} is not installed: make setup (scripts/setup.sh) installs it")
        pytest.skip(f"{name} is not installed (make setup installs it)")
    return path


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cairn", *args], capture_output=True, text=True, timeout=120, cwd=ROOT)


@pytest.fixture(params=["time named", "time by its axis"])
def cf_run(tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    """A dataset with the common netCDF patterns: a constant coordinate, an f4 variable with a
    _FillValue, a packed integer (scale_factor/add_offset), and a per-step time variable, with
    its own ``standard_name`` or, as a simulation writes it, with only its axis and units."""
    named = {"standard_name": "time"} if request.param == "time named" else {}
    w = cairn.open("run", "w", engine="file", path=tmp_path)
    w.attrs["title"] = "CF test"
    w.define("x", "f8", (3,), dims=("x",), constant=True, attrs={"units": "m", "axis": "X",
                                                                 "standard_name": "projection_x_coordinate"})
    w.define("temp", "f4", (4, 3), dims=("y", "x"), attrs={"units": "K", "_FillValue": -999.0, "long_name": "temperature",
                                                             "standard_name": "air_temperature"})
    w.define("pres", "i2", (4, 3), dims=("y", "x"), attrs={"units": "hPa", "scale_factor": 0.01, "add_offset": 1000.0,
                                                             "_FillValue": -32768, "standard_name": "air_pressure"})
    w.define("time", "f8", (), attrs={"units": "days since 2000-01-01", "axis": "T", **named, "calendar": "standard"})
    for s in range(3):
        with w.step(s):
            t = np.full((4, 3), 280 + s, "f4")
            t[0, 0] = -999.0
            w.put("temp", t)
            p = np.full((4, 3), 1234 + s, "i2")
            p[1, 1] = -32768
            w.put("pres", p)
            w.put("time", np.array(0.5 * s))
            if s == 0:
                w.put("x", np.array([0.0, 10.0, 20.0]))
    w.close()
    return tmp_path / "run"


def _exports(source: Path, tmp_path: Path):
    """Each format's export of ``source``, reopened by xarray."""
    for suffix in (".nc", ".h5", ".zarr"):
        out = tmp_path / f"{source.name}{suffix}"
        p = _cli("export", str(source), "-o", str(out))
        assert p.returncode == 0, p.stderr
        yield xr.open_zarr(out) if suffix == ".zarr" else xr.open_dataset(out)


def _same(a: xr.Dataset, b: xr.Dataset) -> None:
    assert sorted(a.variables) == sorted(b.variables) and sorted(a.coords) == sorted(b.coords)
    for v in a.variables:
        assert a[v].dims == b[v].dims, v
        np.testing.assert_array_equal(a[v].values, b[v].values, err_msg=v)


def test_the_backend_decodes_cf_as_the_netcdf_engine_does(cf_run):
    ds = xr.open_dataset(cf_run, engine="cairn")
    assert np.isnan(ds["temp"].values[0, 0, 0]) and ds["temp"].values[0, 0, 1] == 280
    assert np.isnan(ds["pres"].values[0, 1, 1]) and ds["pres"].values[1, 0, 0] == pytest.approx(1012.35)
    assert ds["time"].values[1] == np.datetime64("2000-01-01T12:00") and "time" in ds.coords
    assert ds["step"].dtype == np.int64 and ds["step"].attrs["long_name"] == "step number"
    assert "x" in ds.indexes and float(ds["temp"].sel(x=10.0).isel(step=1, y=0)) == 281
    raw = xr.open_dataset(cf_run, engine="cairn", mask_and_scale=False, decode_times=False, drop_variables=["temp"])
    assert raw["pres"].dtype == np.int16 and raw["pres"].values[0, 1, 1] == -32768 and raw["pres"].attrs["_FillValue"] == -32768
    assert raw["time"].values[2] == 1.0 and "temp" not in raw


@pytest.mark.parametrize("suffix", [".nc", ".h5", ".zarr"])
def test_each_export_opens_in_xarray_equal_to_the_cairn_engine(cf_run, tmp_path, suffix):
    out = tmp_path / f"out{suffix}"
    p = _cli("export", str(cf_run), "-o", str(out))
    assert p.returncode == 0, p.stderr
    back = xr.open_zarr(out) if suffix == ".zarr" else xr.open_dataset(out)
    want = xr.open_dataset(cf_run, engine="cairn")
    # .nc and .h5 have time as their record dimension (CDO's time axis); the backend keeps step.
    _same(want if suffix == ".zarr" else want.swap_dims(step="time"), back)
    assert back.attrs["Conventions"] == "CF-1.8" and "cairn export" in back.attrs["history"]


def test_the_cf_checker_finds_no_error_in_any_netcdf_export(cf_run, tmp_path):
    checker = _tool("compliance-checker", pip=True)
    for suffix in (".nc", ".h5"):  # time included: the export names it (standard_name) when the writer did not
        assert _cli("export", str(cf_run), "-o", str(tmp_path / f"out{suffix}")).returncode == 0
        # CF names a file by .nc alone: the HDF5 export is checked under that name (netCDF reads it as its own)
        checked = shutil.copy(tmp_path / f"out{suffix}", tmp_path / f"checked{suffix.replace('.', '-')}.nc")
        report = subprocess.run([checker, "--test=cf:1.8", str(checked)], capture_output=True, text=True, timeout=300)
        assert "Corrective Actions" in report.stdout or "All tests passed" in report.stdout, report.stdout + report.stderr
        assert "Errors" not in report.stdout.split("Warnings")[0], report.stdout
    time_attrs = xr.open_dataset(tmp_path / "out.nc", decode_times=False)["time"].attrs
    assert time_attrs["standard_name"] == "time" and time_attrs["axis"] == "T", time_attrs


def test_ncdump_and_h5dump_accept_the_exports(cf_run, tmp_path):
    ncdump, h5dump = _tool("ncdump"), _tool("h5dump")
    for suffix in (".nc", ".h5"):
        assert _cli("export", str(cf_run), "-o", str(tmp_path / f"out{suffix}")).returncode == 0
    head = subprocess.run([ncdump, "-h", str(tmp_path / "out.nc")], capture_output=True, text=True, check=True).stdout
    assert "float temp(time, y, x)" in head and "temp:_FillValue = -999.f" in head and "pres:_FillValue = -32768s" in head
    assert "double x(x)" in head, "the constant coordinate has no record axis"
    assert "time = UNLIMITED" in head and "int step(time)" in head and ':Conventions = "CF-1.8"' in head
    # netCDF reads the HDF5 export as it reads its own files: same variables, typed fill values.
    h5head = subprocess.run([ncdump, "-h", str(tmp_path / "out.h5")], capture_output=True, text=True, check=True).stdout
    assert "temp:_FillValue = -999.f" in h5head and "time = UNLIMITED" in h5head and ':title = "CF test"' in h5head
    dump = subprocess.run([h5dump, "-H", "-d", "temp", str(tmp_path / "out.h5")], capture_output=True, text=True, check=True).stdout
    fill = dump[dump.index('ATTRIBUTE "_FillValue"'):]
    assert "H5T_IEEE_F32LE" in fill.split("}")[0], "the _FillValue has the variable's type"


def test_define_refuses_a_fill_value_its_type_cannot_hold(tmp_path):
    w = cairn.open("bad", "w", engine="file", path=tmp_path)
    with pytest.raises(cairn.InvalidArgumentError, match="_FillValue = 300 does not fit its type int8"):
        w.define("a", "i1", (4,), attrs={"_FillValue": 300})
    with pytest.raises(cairn.InvalidArgumentError, match="missing_value = -999.5 does not fit"):
        w.define("b", "i4", (4,), attrs={"missing_value": -999.5})
    w.define("c", "f4", (4,), attrs={"_FillValue": -999.0, "valid_range": [0, 100]})


def test_an_export_that_fails_leaves_nothing_and_says_why_in_one_line(tmp_path):
    w = cairn.open("mix", "w", engine="file", path=tmp_path)
    w.define("z", "c16", (2,))
    w.define("walkers", "f8", local=True)
    with w.step(0):
        w.put("z", np.array([1 + 2j, 3j]))
        w.put("walkers", np.ones(3))
    w.close()
    for args, message in ((["-o", str(tmp_path / "z.nc")], "netCDF-4 has no complex numbers"),
                          (["-o", str(tmp_path / "w.nc"), "--vars", "walkers"], "nothing to export")):
        p = _cli("export", str(tmp_path / "mix"), *args)
        assert p.returncode == 1 and message in p.stderr and "Traceback" not in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1, p.stderr
    left = sorted(n for n in os.listdir(tmp_path) if n != "mix")
    assert left == [], f"no partial or temporary file: {left}"


def test_a_variable_named_like_its_dimension_exports_to_every_format(tmp_path):
    w = cairn.open("co", "w", engine="file", path=tmp_path)
    w.define("x", "f8", (4,), dims=("x",), attrs={"units": "m"})
    w.define("u", "f4", (4,), dims=("x",))
    for s in range(2):
        with w.step(s):
            w.put("x", np.linspace(0, 1, 4))
            w.put("u", np.arange(4, dtype="f4") + s)
    w.close()
    for back in _exports(tmp_path / "co", tmp_path):
        _same(xr.open_dataset(tmp_path / "co", engine="cairn"), back)


def test_ls_lists_steps_exactly_sizes_with_units_and_attributes_as_json(tmp_path):
    w = cairn.open("gaps", "w", engine="file", path=tmp_path)
    w.attrs["title"] = "gaps"
    w.define("u", "f8", (1 << 12,), attrs={"units": "m"})
    for s in (0, 2, 4, 5, 6):
        with w.step(s):
            w.put("u", np.zeros(1 << 12))
    w.close()
    p = _cli("ls", str(tmp_path / "gaps"))
    assert p.returncode == 0, p.stderr
    assert "5 committed: 0, 2, 4..6" in p.stdout and "32.0 KiB" in p.stdout
    assert 'attrs   {"title": "gaps"}' in p.stdout and '{"units": "m"}' in p.stdout
    missing = _cli("ls", str(tmp_path / "nope"))
    assert missing.returncode == 1 and "no dataset" in missing.stderr


def test_a_committed_step_is_refused_at_begin_step_naming_rm_and_mode_a_and_rm_removes_the_dataset(tmp_path):
    w = cairn.open("done", "w", engine="file", path=tmp_path)
    w.define("u", "f8", (4,))
    with w.step(0):
        w.put("u", np.ones(4))
    w.close()
    before = sorted(os.listdir(tmp_path / "done" / "data"))
    again = cairn.open("done", "w", engine="file", path=tmp_path)
    again.define("u", "f8", (4,))
    with pytest.raises(cairn.AlreadyExistsError, match=r'mode "a".*`cairn rm done`'):
        again.begin_step(0)
    again.close()
    assert sorted(os.listdir(tmp_path / "done" / "data")) == before, "no orphan data file"
    p = _cli("rm", str(tmp_path / "done"))
    assert p.returncode == 0 and "1 committed steps" in p.stdout and not (tmp_path / "done").exists()


def test_rm_of_a_staging_dataset_keeps_its_drained_copy_unless_all(tmp_path):
    from cairn import cluster

    c = cluster.start(tmp_path / "c.json", servers=2, memory="64MiB", drain=tmp_path / "disk")
    try:
        for name in ("a", "b"):
            w = cairn.open(name, "w", engine="staging", cluster=c.file)
            w.define("u", "f8", (4,))
            with w.step(0):
                w.put("u", np.ones(4))
            assert w.wait_drained(timeout=30)
        p = _cli("rm", "a", "--cluster", str(c.file))
        assert p.returncode == 0 and "1 committed steps released" in p.stdout and "is kept" in p.stdout, p.stdout + p.stderr
        assert (tmp_path / "disk" / "a").is_dir()
        p = _cli("rm", "b", "--cluster", str(c.file), "--all")
        assert p.returncode == 0 and "removed its drained copy" in p.stdout and not (tmp_path / "disk" / "b").exists()
        # cairn.toml names the engine and the cluster: ls finds a dataset by name, and the
        # cluster commands take --cluster as every other command does.
        (tmp_path / "cairn.toml").write_text(f'engine = "staging"\n[staging]\ncluster = "{c.file}"\n')
        ls = subprocess.run([sys.executable, "-m", "cairn", "ls", "a"], capture_output=True, text=True, cwd=tmp_path, timeout=60)
        assert ls.returncode == 0 and "dataset a" in ls.stdout, ls.stderr
        st = _cli("cluster", "status", "--cluster", str(c.file), "--json")
        assert st.returncode == 0 and '"drain"' in st.stdout
    finally:
        c.stop()


def test_cluster_start_says_where_the_server_logs_are(tmp_path):
    file = tmp_path / "logs.json"
    p = _cli("cluster", "start", "--servers", "1", "--memory", "64MiB", "--cluster", str(file))
    try:
        assert p.returncode == 0, p.stderr
        assert f"server logs in {file}.d/server-<id>.log" in p.stdout and (tmp_path / "logs.json.d" / "server-0.log").exists()
    finally:
        assert _cli("cluster", "stop", "--cluster", str(file)).returncode == 0


def _with_coordinate(tmp_path: Path, **opts) -> None:
    """Two ranks: a constant coordinate x (each rank puts half of it, in step 0) and a field u(x)."""
    ws = [cairn.open("co", "w", rank=r, nranks=2, session="c", **opts) for r in range(2)]
    for w in ws:
        w.define("x", "f8", (8,), dims=("x",), attrs={"units": "m", "axis": "X"}, constant=True)
        w.define("u", "f4", (8,), dims=("x",), attrs={"units": "K"})
    for s in range(4):
        for r, w in enumerate(ws):
            with w.step(s):
                if s == 0:
                    w.put("x", np.linspace(0, 0.7, 8)[4 * r:4 * r + 4], offset=(4 * r,))
                w.put("u", np.arange(4, dtype="f4")[None].repeat(1, 0)[0] + 10 * s + 4 * r, offset=(4 * r,))
    with pytest.raises(cairn.ConflictError, match="'x' is constant: it was written in step 0"):
        with ws[0].step(4):
            ws[0].put("x", np.zeros(4), offset=(0,))
    for w in ws:
        w.close()


def test_a_constant_is_written_once_read_without_a_step_and_an_index_coordinate(tmp_path):
    _with_coordinate(tmp_path, engine="file", path=tmp_path)
    r = cairn.open("co", "r", engine="file", path=tmp_path)
    info = r.variables()
    assert info["x"].constant and not info["u"].constant
    np.testing.assert_array_equal(r.get("x"), np.linspace(0, 0.7, 8))
    np.testing.assert_array_equal(r["x"][2:4], np.linspace(0, 0.7, 8)[2:4])
    with pytest.raises(cairn.InvalidArgumentError, match="give the step"):
        r.get("u")
    ds = xr.open_dataset(tmp_path / "co", engine="cairn")
    assert ds["x"].dims == ("x",) and "x" in ds.indexes and ds["u"].dims == ("step", "x")
    assert float(ds["u"].sel(x=0.5, step=2, method="nearest")) == 20 + 4 + 1
    # A restarted writer is refused a second write of it too (it looks the step up on disk).
    again = cairn.open("co", "a", engine="file", path=tmp_path, rank=0, nranks=1, session="again")
    with pytest.raises(cairn.ConflictError, match="written in step 0"):
        with again.step(again.next_step):
            again.put("x", np.zeros(8))
    again.close()
    for back in _exports(tmp_path / "co", tmp_path):
        _same(ds, back)
        assert float(back["u"].sel(x=0.5, step=2, method="nearest")) == 25
    head = subprocess.run([_tool("ncdump"), "-h", str(tmp_path / "co.nc")], capture_output=True, text=True, check=True).stdout
    assert "double x(x)" in head and "float u(step, x)" in head


def test_keep_last_keeps_the_step_that_holds_a_constant(tmp_path):
    from cairn import cluster

    c = cluster.start(tmp_path / "k.json", servers=2, memory="64MiB")
    try:
        _with_coordinate(tmp_path, engine="staging", cluster=c.file, keep_last=1)
        r = cairn.open("co", "r", engine="staging", cluster=c.file)
        assert r.steps() == [0, 3], "step 0 holds the constant: kept while the dataset is"
        np.testing.assert_array_equal(r.get("x"), np.linspace(0, 0.7, 8))
    finally:
        c.stop()


def test_a_constant_named_like_one_of_its_dimensions_but_not_a_coordinate_exports_everywhere(tmp_path):
    w = cairn.open("mesh", "w", engine="file", path=tmp_path)
    w.define("x", "f8", (2, 3), dims=("x", "y"), constant=True)  # 2-D: not x's coordinate variable
    w.define("u", "f4", (2, 3), dims=("x", "y"))
    with w.step(0):
        w.put("x", np.arange(6.0).reshape(2, 3))
        w.put("u", np.ones((2, 3), "f4"))
    w.close()
    for back in _exports(tmp_path / "mesh", tmp_path):
        _same(xr.open_dataset(tmp_path / "mesh", engine="cairn"), back)
