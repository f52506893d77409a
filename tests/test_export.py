"""`cairn export` to Zarr v3, netCDF-4 and HDF5: reopened by xarray, each equals the source."""

from __future__ import annotations

import textwrap

import numpy as np
import pytest

from cairn.cli import main

from .conftest import PY, check, mpirun
from .test_interop import open_xr, write_blocks

xr = pytest.importorskip("xarray")


def reopen(out):
    return xr.open_zarr(out) if str(out).endswith(".zarr") else xr.open_dataset(out)


def source_args(cfg):
    """The dataset argument and options naming dataset ``ds`` of ``cfg``."""
    text = cfg.read_text()
    if 'engine = "staging"' in text:
        return ["ds", "--cluster", text.split('cluster = "')[1].split('"')[0]]
    return [str(cfg.parent / "ds")]


def assert_same(got, want):
    """Equal values, dims, coordinates and attributes (lists read back from netCDF/HDF5 as arrays);
    the export adds the CF ``Conventions`` and a ``history`` line."""
    xr.testing.assert_equal(got, want)
    extra = {k: got.attrs[k] for k in ("Conventions", "history") if k in got.attrs and k not in want.attrs}
    assert extra.get("Conventions") == "CF-1.8" and "cairn export" in extra.get("history", "")
    assert {k: v for k, v in got.attrs.items() if k not in extra} == want.attrs
    for n in want.data_vars:
        assert got[n].dims == want[n].dims
        assert {k: np.asarray(v).tolist() for k, v in got[n].attrs.items()} == want[n].attrs


@pytest.mark.parametrize("suffix", [".zarr", ".nc", ".h5"])
def test_export_reopened_by_xarray_equals_the_source(cfg, tmp_path, suffix, capsys):
    write_blocks(cfg)
    out = tmp_path / f"out{suffix}"
    assert main(["export", *source_args(cfg), "-o", str(out)]) == 0
    assert "2 variables (p, q), 3 steps 0..2" in capsys.readouterr().out
    with open_xr(cfg) as want, reopen(out) as got:
        assert_same(got.load(), want.load())


def test_export_selects_steps_and_variables(file_cfg, tmp_path, capsys):
    write_blocks(file_cfg, steps=5)
    out = tmp_path / "sel.nc"
    assert main(["export", str(file_cfg.parent / "ds"), "-o", str(out), "--steps", "1:5:2", "--vars", "p"]) == 0
    with open_xr(file_cfg) as src, reopen(out) as got:
        assert_same(got.load(), src[["p"]].sel(step=[1, 3]).load())
    assert "left out local variables" not in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["-o", "{tmp}/x.csv"], "name the output .zarr"),
    (["-o", "{tmp}/none/x.nc"], "does not exist"),
    (["-o", "{tmp}/x.nc", "--steps", "7:9"], "selects no committed step (committed: 0..2)"),
    (["-o", "{tmp}/x.nc", "--steps", "a:b"], "give step numbers"),
    (["-o", "{tmp}/x.nc", "--vars", "p,zz"], "--vars names zz"),
])
def test_export_misuse_is_a_message_not_a_traceback(file_cfg, tmp_path, capsys, argv, message):
    write_blocks(file_cfg)
    assert main(["export", str(file_cfg.parent / "ds"), *[a.format(tmp=tmp_path) for a in argv]]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_export_refuses_to_overwrite_without_force(file_cfg, tmp_path, capsys):
    write_blocks(file_cfg)
    out = tmp_path / "o.zarr"
    args = ["export", str(file_cfg.parent / "ds"), "-o", str(out)]
    assert main(args) == 0
    assert main(args) == 1 and "exists; remove it or pass --force" in capsys.readouterr().err
    assert main([*args, "--force"]) == 0


MPI_WRITER = textwrap.dedent("""
    import sys, numpy as np, cairn
    from mpi4py import MPI
    comm = MPI.COMM_WORLD
    with cairn.open("sim", "w", path=sys.argv[1], comm=comm) as f:
        f.attrs["title"] = "4 ranks"
        f.define("rho", dtype="f4", shape=(8, 6), dims=("y", "x"), attrs={"units": "kg/m3"})
        y0 = comm.rank * 2
        for s in range(3):
            with f.step(s):
                f.put("rho", (np.arange(12, dtype="f4").reshape(2, 6) + 100 * y0 + 1000 * s), offset=(y0, 0))
""")


@pytest.mark.mpi
def test_four_rank_mpi_writer_with_dims_and_attributes_exported_and_reopened(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(MPI_WRITER)
    check(mpirun(4, PY, str(script), str(tmp_path)))
    from cairn.xarray_backend import CairnBackendEntrypoint

    with xr.open_dataset(tmp_path / "sim", engine=CairnBackendEntrypoint, chunks={}) as src:
        assert src["rho"].chunks == ((1, 1, 1), (2, 2, 2, 2), (6,))
        assert src.attrs == {"title": "4 ranks"} and src["rho"].attrs == {"units": "kg/m3"}
        for suffix in (".zarr", ".nc", ".h5"):
            out = tmp_path / f"sim{suffix}"
            assert main(["export", str(tmp_path / "sim"), "-o", str(out)]) == 0
            with reopen(out) as got:
                assert_same(got.load(), src.load())


def test_export_without_the_format_package_says_what_to_install(file_cfg, tmp_path, capsys, monkeypatch):
    import sys

    write_blocks(file_cfg)
    monkeypatch.setitem(sys.modules, "zarr", None)  # import zarr now raises ImportError
    assert main(["export", str(file_cfg.parent / "ds"), "-o", str(tmp_path / "o.zarr")]) == 1
    assert "needs the Python package zarr: pip install zarr" in capsys.readouterr().err


# Exports CDO and NCO read (issue 56): a time variable is the record coordinate, --vars keeps the
# coordinates, --compress. Checked by the tools themselves, run as processes.

def tool(name, pip=False):
    """The path of tool ``name``; one scripts/setup.sh installs with pip into the venv (``pip``) is
    never skipped, nor any under CI: a missing one fails there."""
    import os
    import shutil
    import sys

    path = shutil.which(name) or shutil.which(name, path=os.path.dirname(sys.executable))
    if path is None:
        if pip or os.environ.get("CI"):
            pytest.fail(f"{name} is not installed: make setup (scripts/setup.sh) installs it")
        pytest.skip(f"{name} is not installed (scripts/setup.sh installs it)")
    return path


def run(*cmd):
    import subprocess

    p = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, f"{cmd}: exit {p.returncode}\n{p.stdout}\n{p.stderr}"
    return p.stdout


@pytest.fixture
def timed(tmp_path):
    """Dataset ``run``: a per-step time (days since 2000-01-01: 0, 1, 2), a constant coordinate
    x, a 2-D constant lat that temperature names in ``coordinates``, a compressible temperature
    (64 x 64, f4) and a pressure."""
    import cairn

    w = cairn.open("run", "w", engine="file", path=tmp_path)
    w.attrs["title"] = "timed"
    w.define("time", "f8", (), attrs={"units": "days since 2000-01-01", "axis": "T", "standard_name": "time",
                                      "calendar": "standard"})
    w.define("x", "f8", (64,), dims=("x",), constant=True, attrs={"units": "m", "axis": "X",
                                                                  "standard_name": "projection_x_coordinate"})
    w.define("lat", "f8", (64, 64), dims=("y", "x"), constant=True, attrs={"units": "degrees_north",
                                                                           "standard_name": "latitude"})
    w.define("temperature", "f4", (64, 64), dims=("y", "x"), attrs={"units": "K", "standard_name": "air_temperature",
                                                                    "coordinates": "lat"})
    w.define("pressure", "f4", (64,), dims=("x",), attrs={"units": "Pa", "standard_name": "air_pressure"})
    for s in range(3):
        with w.step(s):
            w.put("time", np.array(float(s)))
            w.put("temperature", np.full((64, 64), 280 + s, "f4") + np.arange(64, dtype="f4") // 8)
            w.put("pressure", np.full(64, 1e5 + s, "f4"))
            if s == 0:
                w.put("x", np.arange(64.0))
                w.put("lat", np.repeat(np.linspace(-60, 60, 64)[:, None], 64, 1))
    w.close()
    return tmp_path / "run"


def backend(source):
    from cairn.xarray_backend import CairnBackendEntrypoint

    return xr.open_dataset(source, engine=CairnBackendEntrypoint)


@pytest.mark.parametrize("suffix", [".nc", ".h5"])
def test_a_time_variable_is_the_record_coordinate_that_cdo_and_nco_read(timed, tmp_path, suffix, capsys):
    cdo, ncks = tool("cdo"), tool("ncks")
    out = tmp_path / f"out{suffix}"
    assert main(["export", str(timed), "-o", str(out)]) == 0
    assert "record dimension time (step an auxiliary coordinate)" in capsys.readouterr().out
    assert run(cdo, "-s", "showtimestamp", out).split() == ["2000-01-01T00:00:00", "2000-01-02T00:00:00", "2000-01-03T00:00:00"]
    run(cdo, "sinfo", out)
    assert {"temperature", "pressure"} <= set(run(cdo, "-s", "showname", out).split())
    head = run(ncks, "-m", out)
    assert "time = UNLIMITED" in head and "step = UNLIMITED" not in head
    assert "double time(time)" in head and "step(time)" in head and "float temperature(time,y,x)" in head
    # The xarray backend keeps step; the export is the same data along time, step beside it.
    with reopen(out) as got, backend(timed) as want:
        want = want.swap_dims(step="time")
        xr.testing.assert_equal(got.load().drop_attrs(), want.load().drop_attrs())
        assert got["step"].dims == ("time",) and "step" in got.coords and got["step"].dtype.kind == "i"


def test_record_dim_step_keeps_the_xarray_layout_and_zarr_keeps_it_by_default(timed, tmp_path, capsys):
    ncks = tool("ncks")
    out = tmp_path / "step.nc"
    assert main(["export", str(timed), "-o", str(out), "--record-dim", "step"]) == 0
    assert "record dimension" not in capsys.readouterr().out
    head = run(ncks, "-m", out)
    assert "step = UNLIMITED" in head and "double time(step)" in head and "float temperature(step,y,x)" in head
    assert main(["export", str(timed), "-o", str(tmp_path / "z.zarr")]) == 0
    for got in (reopen(out), reopen(tmp_path / "z.zarr")):
        with got, backend(timed) as want:
            xr.testing.assert_equal(got.load().drop_attrs(), want.load().drop_attrs())
    # Asked for along time, a .zarr has it too.
    assert main(["export", str(timed), "-o", str(tmp_path / "t.zarr"), "--record-dim", "time"]) == 0
    with reopen(tmp_path / "t.zarr") as got:
        assert got["temperature"].dims == ("time", "y", "x") and got["step"].dims == ("time",)


def test_vars_keeps_the_coordinates_the_chosen_variables_use_as_ncks_v_does(timed, tmp_path, capsys):
    ncks, ncdump = tool("ncks"), tool("ncdump")
    assert main(["export", str(timed), "-o", str(tmp_path / "one.nc"), "--vars", "temperature"]) == 0
    assert "with the coordinates the chosen variables use: lat, time, x" in capsys.readouterr().out
    head = run(ncdump, "-h", tmp_path / "one.nc")
    for decl in ("double time(time)", "int step(time)", "double x(x)", "double lat(y, x)", "float temperature(time, y, x)"):
        assert decl in head
    assert "pressure" not in head and 'temperature:coordinates = "lat step"' in head
    assert main(["export", str(timed), "-o", str(tmp_path / "all.nc")]) == 0
    run(ncks, "-O", "-v", "temperature", tmp_path / "all.nc", tmp_path / "ncks.nc")
    with xr.open_dataset(tmp_path / "one.nc") as ours, xr.open_dataset(tmp_path / "ncks.nc") as theirs:
        assert sorted(ours.variables) == sorted(theirs.variables) == ["lat", "step", "temperature", "time", "x"]
    # A constant alone needs no time.
    assert main(["export", str(timed), "-o", str(tmp_path / "x.nc"), "--vars", "x"]) == 0
    head = run(ncdump, "-h", tmp_path / "x.nc")
    assert "double x(x)" in head and "time(" not in head and "lat" not in head


def test_compress_zlib_shrinks_nc_and_h5_chunked_one_step_per_chunk(timed, tmp_path):
    import h5py

    ncdump = tool("ncdump")
    sizes = {}
    for suffix in (".nc", ".h5"):
        for how in ("none", "zlib:4"):
            out = tmp_path / f"{how.replace(':', '')}{suffix}"
            assert main(["export", str(timed), "-o", str(out), "--compress", how]) == 0
            sizes[how, suffix] = out.stat().st_size
            head = run(ncdump, "-hs", out)
            assert "temperature:_ChunkSizes = 1, 64, 64" in head
            assert ("temperature:_DeflateLevel = 4" in head) == (how != "none")
        assert sizes["zlib:4", suffix] < sizes["none", suffix] / 2, sizes
        with reopen(tmp_path / f"zlib4{suffix}") as got, backend(timed) as want:
            np.testing.assert_array_equal(got["temperature"].values, want["temperature"].values)
    with h5py.File(tmp_path / "zlib4.h5") as f:
        t = f["temperature"]
        assert (t.compression, t.compression_opts, t.shuffle, t.chunks) == ("gzip", 4, True, (1, 64, 64))


@pytest.mark.parametrize("how, codec", [("zstd:5", "zstd"), ("blosc:zstd:3", "blosc")])
def test_compress_zarr_with_zstd_or_blosc(timed, tmp_path, how, codec):
    import zarr

    out = tmp_path / "c.zarr"
    assert main(["export", str(timed), "-o", str(out), "--compress", how]) == 0
    assert main(["export", str(timed), "-o", str(tmp_path / "raw.zarr"), "--compress", "none"]) == 0
    a = zarr.open_array(out / "temperature", mode="r")
    assert [type(c).__name__.lower() for c in a.compressors] == [f"{codec}codec"] and a.chunks == (1, 64, 64)
    assert zarr.open_array(tmp_path / "raw.zarr" / "temperature", mode="r").compressors == ()
    size = sum(f.stat().st_size for f in (out / "temperature").rglob("c/*/*/*"))
    raw = sum(f.stat().st_size for f in (tmp_path / "raw.zarr" / "temperature").rglob("c/*/*/*"))
    assert size < raw / 4, (size, raw)
    with reopen(out) as got, backend(timed) as want:
        xr.testing.assert_equal(got.load().drop_attrs(), want.load().drop_attrs())


@pytest.mark.parametrize("suffix", [".nc", ".h5"])
@pytest.mark.parametrize("record", ["time", "step"])
def test_the_cf_checker_finds_no_error_in_either_layout(timed, tmp_path, record, suffix):
    import shutil

    checker = tool("compliance-checker", pip=True)
    out = tmp_path / f"cf{suffix}"
    assert main(["export", str(timed), "-o", str(out), "--compress", "zlib", "--record-dim", record]) == 0
    checked = shutil.copy(out, tmp_path / f"checked-{suffix[1:]}.nc")  # CF names files .nc; netCDF reads the .h5 as its own
    report = run(checker, "--test=cf:1.8", checked)
    assert "Errors" not in report.split("Warnings")[0], report


@pytest.mark.parametrize("argv, message", [
    (["-o", "{tmp}/o.nc", "--compress", "zstd"], "--compress zstd: zstd does not apply to a .nc output; a .nc takes zlib"),
    (["-o", "{tmp}/o.zarr", "--compress", "zlib:4"], "zlib does not apply to a .zarr output; a .zarr takes zstd[:LEVEL] or"),
    (["-o", "{tmp}/o.h5", "--compress", "lz4"], "unknown codec 'lz4'; give zlib[:LEVEL] for .nc and .h5"),
    (["-o", "{tmp}/o.nc", "--compress", "zlib:10"], "level 10 is out of range; zlib takes 1 to 9"),
    (["-o", "{tmp}/o.zarr", "--compress", "blosc:zstd:0"], "level 0 is out of range; blosc:zstd takes 1 to 9"),
    (["-o", "{tmp}/o.zarr", "--compress", "zstd:fast"], "the level 'fast' is not a whole number; e.g. zstd:3"),
    (["-o", "{tmp}/o.nc", "--vars", "x", "--record-dim", "time"], "--record-dim time: no exported variable is a time"),
])
def test_export_options_misused_say_what_to_give(timed, tmp_path, capsys, argv, message):
    assert main(["export", str(timed), *[a.format(tmp=tmp_path) for a in argv]]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run"], "nothing written"


@pytest.mark.parametrize("times, message", [
    ([0.0, 2.0, 1.0], "'time' is 2.0 in step 1 and 1.0 in step 2: a record coordinate must increase"),
    ([0.0, None, 2.0], "'time' is missing in step 1, so it cannot be the record coordinate"),
])
def test_a_time_that_cannot_be_the_record_coordinate_names_the_steps_and_record_dim_step(tmp_path, capsys, times, message):
    import cairn

    w = cairn.open("bad", "w", engine="file", path=tmp_path)
    w.define("time", "f8", (), attrs={"units": "hours since 2000-01-01", "axis": "T"})
    w.define("u", "f4", (2,))
    for s, t in enumerate(times):
        with w.step(s):
            w.put("u", np.zeros(2, "f4"))
            if t is not None:
                w.put("time", np.array(t))
    w.close()
    assert main(["export", str(tmp_path / "bad"), "-o", str(tmp_path / "o.nc")]) == 1
    err = capsys.readouterr().err
    assert message in err and "--record-dim step" in err
    assert main(["export", str(tmp_path / "bad"), "-o", str(tmp_path / "o.nc"), "--record-dim", "step"]) == 0


def test_one_step_per_chunk_split_only_below_the_format_limits():
    from cairn.export import record_chunks

    assert record_chunks((5, 64, 64), 4) == (1, 64, 64)
    assert record_chunks((5, 0, 3), 8) == (1, 1, 3), "a zero-length dimension still has a chunk length"
    assert record_chunks((5000,), 8) == (1024,) and record_chunks((3,), 8) == (3,)
    big = record_chunks((2, 40_000, 20_000), 8)  # 6.4 GB a step
    assert big[0] == 1 and big[2] == 20_000 and np.prod(big) * 8 < 2**31 and big[1] > 40_000 // 8
