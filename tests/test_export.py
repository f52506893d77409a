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
