"""`cairn pack` on real files written by other libraries (h5py with every datatype class and
layout, netCDF4 in four formats, scipy.io.netcdf, the sample files shipped with those packages):
byte-exact under every scheme and codec; what the scanner cannot model stays residual with a
note; failures name the file and leave nothing behind; one variable is read without unpacking."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import h5py
import netCDF4
import numpy as np
import pytest

import cairn
from cairn import pack
from cairn.bench.pack_corpus import write_corpus
from cairn.pack import aggregate
from cairn.pack.container import Container


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> str:
    src = str(tmp_path_factory.mktemp("corpus") / "set")
    write_corpus(src, copies=2)
    return src


def _bytes(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_the_corpus_covers_what_real_files_hold(corpus) -> None:
    names = os.listdir(corpus)
    assert any(n.startswith("scipy-") for n in names), "scipy.io.netcdf files (scipy is a test dependency)"
    assert any(n.startswith("sample-") for n in names), "files shipped inside installed packages"
    with h5py.File(os.path.join(corpus, "h5-0.h5")) as f:
        kinds = {f[k].dtype.kind for k in f if isinstance(f[k], h5py.Dataset) and k not in ("time", "quad")}
        assert {"f", "i", "u", "c", "b", "V", "O", "S"} <= kinds
        assert f["f128"].dtype.itemsize == 16 and f["f16"].dtype.itemsize == 2
    assert h5py.File(os.path.join(corpus, "h5ub-0.h5")).userblock_size == 512


@pytest.mark.parametrize(("scheme", "codec"), [(s, "aware") for s in pack.CHOICES] + [("agnostic", "zstd"), ("aware", "gzip:1")])
def test_real_files_restore_byte_exact(corpus, tmp_path, scheme: str, codec: str) -> None:
    out, restored = str(tmp_path / "packed"), str(tmp_path / "restored")
    report = pack.pack(corpus, out, group_size=7, scheme=scheme, codec=codec, fsync=False)
    assert any("/time: TypeError: No NumPy equivalent for TypeTimeID" in n for n in report.notes)
    assert any("/quad: ValueError: Insufficient precision" in n for n in report.notes)
    names = sorted(os.listdir(corpus))
    assert sorted(pack.unpack(out, restored).restored) == names
    for n in names:
        assert _bytes(os.path.join(corpus, n)) == _bytes(os.path.join(restored, n)), n


def test_the_scanner_models_real_types_and_notes_what_it_cannot(corpus) -> None:
    from cairn.pack.scan import scan

    m = scan(os.path.join(corpus, "h5ub-0.h5"), "h5ub-0.h5")
    assert m.format == "hdf5"  # found behind its 512-byte userblock
    found = {v.path: v for v in m.variables}
    assert {"/f16", "/f64be", "/f128", "/compound", "/enum", "/opaque", "/array_type", "/chunked", "/refs"} <= set(found)
    assert found["/f64be"].dtype == ">f8" and found["/f128"].dtype.endswith("f16")
    assert not {"/gzip_shuffle", "/time", "/quad"} & set(found)  # filtered; no numpy type
    assert m.notes == ["/quad: ValueError: Insufficient precision in available types to represent (127, 112, 15, 0, 112); left residual",
                       "/time: TypeError: No NumPy equivalent for TypeTimeID exists; left residual"]
    raw = _bytes(os.path.join(corpus, "h5ub-0.h5"))
    (off, n), = found["/f64be"].regions
    with h5py.File(os.path.join(corpus, "h5ub-0.h5")) as f:
        assert raw[off : off + n] == f["f64be"][()].tobytes()


def test_compare_runs_on_real_files_and_notes_the_residual(corpus, tmp_path) -> None:
    r = subprocess.run([sys.executable, "-m", "cairn.cli", "pack", corpus, "--compare", "--group-size", "8"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr
    assert "left residual (packed exactly, not modelled)" in r.stdout and "TypeTimeID" in r.stdout
    assert "auto" in r.stdout


def test_a_failure_names_the_file_and_leaves_no_folder(corpus, tmp_path, monkeypatch) -> None:
    real = aggregate.scan

    def scan(path: str, name: str) -> object:
        if name == "h5-1.h5":
            raise PermissionError(13, "Permission denied", path)
        return real(path, name)

    monkeypatch.setattr(aggregate, "scan", scan)
    out = tmp_path / "packed"
    with pytest.raises(cairn.InvalidArgumentError, match=r"h5-1\.h5: cannot be read \(Permission denied\)"):
        pack.pack(corpus, str(out), group_size=4, fsync=False)
    assert not out.exists()
    monkeypatch.setattr(aggregate, "scan", real)

    def build(*_a: object, **_k: object) -> None:
        raise ValueError("boom")

    monkeypatch.setattr(aggregate.layout, "build", build)
    out.mkdir()
    with pytest.raises(cairn.InvalidArgumentError, match=r"packing .*ext-0\.bin.*: ValueError: boom"):
        pack.pack(corpus, str(out), group_size=4, fsync=False)
    assert out.exists() and os.listdir(out) == []  # a folder the user made is kept, empty


def test_symlinks_are_reported_not_silently_skipped(tmp_path, capsys) -> None:
    from cairn import pack_cli

    src = tmp_path / "set"
    src.mkdir()
    (src / "a.bin").write_bytes(b"x" * 100)
    (src / "link.bin").symlink_to(src / "a.bin")
    report = pack.pack(str(src), str(tmp_path / "packed"), fsync=False)
    assert report.skipped == [f"link.bin: symbolic link to {str(src / 'a.bin')!r}, not packed (recreate it after unpacking)"]
    r = subprocess.run([sys.executable, "-m", "cairn.cli", "pack", str(src), "-o", str(tmp_path / "p2")], capture_output=True, text=True)
    assert "1 skipped:" in r.stdout and "link.bin: symbolic link" in r.stdout
    pack_cli.ls(str(tmp_path / "packed"))
    assert "a.bin" in capsys.readouterr().out


def test_unpack_refuses_existing_files_before_drawing_a_bar(corpus, tmp_path) -> None:
    out = str(tmp_path / "packed")
    pack.pack(corpus, out, group_size=40, fsync=False)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "h5-0.h5").write_bytes(b"mine")
    r = subprocess.run([sys.executable, "-m", "cairn.cli", "unpack", out, "-o", str(tmp_path / "r")], capture_output=True, text=True)
    assert r.returncode == 1 and "exists; unpack into an empty folder" in r.stderr
    assert "%" not in r.stderr  # no progress bar drawn
    assert os.listdir(tmp_path / "r") == ["h5-0.h5"]


def test_unpack_names_a_path_it_cannot_create(tmp_path) -> None:
    src = tmp_path / "set"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "x.bin").write_bytes(b"x" * 10)
    pack.pack(str(src), str(tmp_path / "packed"), fsync=False)
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "sub").write_bytes(b"a file where a folder is needed")
    with pytest.raises(cairn.InvalidArgumentError, match=r"sub/x\.bin' cannot be created"):
        pack.unpack(str(tmp_path / "packed"), str(tmp_path / "r"))
    assert sorted(os.listdir(tmp_path / "r")) == ["sub"]


# -- one variable ----------------------------------------------------------------------------

H5_VARS = ["/f16", "/f64be", "/f128", "/u64be", "/c128", "/bool", "/enum", "/opaque", "/fixed_str", "/scalar", "/compact",
           "/compound", "/nested", "/array_type", "/vlen_str", "/vlen_seq", "/chunked", "/gzip_shuffle", "/partial_chunks"]


@pytest.mark.parametrize("scheme", ["aware", "aware-block", "agnostic"])
def test_read_variable_gives_every_variable_without_unpacking(corpus, tmp_path, scheme: str, monkeypatch) -> None:
    out = str(tmp_path / "packed")
    pack.pack(corpus, out, group_size=40, scheme=scheme, fsync=False)
    path = os.path.join(out, "group-00000.cpk")
    with Container(path) as c, h5py.File(os.path.join(corpus, "h5ub-1.h5")) as f:
        for v in H5_VARS:
            got, want = pack.read_variable(c, "h5ub-1.h5", v), f[v][()]
            if want.dtype.kind == "O":
                assert [np.asarray(x).tolist() for x in got] == [np.asarray(x).tolist() for x in want], v
            else:
                assert got.dtype == want.dtype and np.array_equal(got, want), v
        with netCDF4.Dataset(os.path.join(corpus, "netcdf3_classic-1.nc")) as d:
            d.set_auto_mask(False)
            for name in ("temp", "count", "time"):
                np.testing.assert_array_equal(pack.read_variable(c, "netcdf3_classic-1.nc", name), d[name][...])
        with netCDF4.Dataset(os.path.join(corpus, "netcdf4-1.nc")) as d:  # HDF5 underneath: read with h5py
            d.set_auto_mask(False)
            for name in ("temp", "count", "zipped", "sub/w"):
                np.testing.assert_array_equal(pack.read_variable(c, "netcdf4-1.nc", "/" + name), d[name][...])
        if scheme.startswith("aware"):
            # Plain variables decode only their own stream's frames: no member is restored.
            with monkeypatch.context() as m, netCDF4.Dataset(os.path.join(corpus, "netcdf3_classic-1.nc")) as d:
                m.setattr(pack.variable, "read_member", lambda *_: pytest.fail("restored the member"))
                np.testing.assert_array_equal(pack.read_variable(c, "h5ub-1.h5", "/f64be"), f["f64be"][()])
                np.testing.assert_array_equal(pack.read_variable(path, "netcdf3_classic-1.nc", "/temp"), d["temp"][...])
        with pytest.raises(cairn.NotFoundError, match="no dataset '/nope'"):
            pack.read_variable(c, "h5-0.h5", "/nope")
        with pytest.raises(cairn.NotFoundError, match="no member 'x.h5'"):
            pack.read_variable(c, "x.h5", "/f16")


def test_cli_ls_lists_members(corpus, tmp_path) -> None:
    out = str(tmp_path / "packed")
    pack.pack(corpus, out, group_size=10, fsync=False)
    r = subprocess.run([sys.executable, "-m", "cairn.cli", "ls", out], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    for n in os.listdir(corpus):
        assert n in r.stdout
    shutil.rmtree(out)
