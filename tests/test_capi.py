"""The C API beyond put and get (issue 44), tested in C: tests/c/inquiry.c defines with dims,
attributes and a constant, sets dataset attributes, and inquires (steps, wait_step, var_info,
constant_step, get_local, release); Python then reads what C wrote."""

from __future__ import annotations

import subprocess

import cairn

from .conftest import ROOT, check


def test_the_c_inquiry_functions_and_what_python_reads_of_them(tmp_path):
    lib = ROOT / "target" / "release"
    exe = tmp_path / "inquiry"
    check(subprocess.run(["cc", str(ROOT / "tests/c/inquiry.c"), "-I", str(ROOT / "crates/cairn-capi/include"), "-L", str(lib),
                          "-lcairn", f"-Wl,-rpath,{lib}", "-o", str(exe)], capture_output=True, text=True))
    data = tmp_path / "data"
    data.mkdir()
    cfg = tmp_path / "cairn.toml"
    cfg.write_text(f'engine = "file"\n[file]\npath = "{data}"\n')
    assert "C inquiry: ok" in check(subprocess.run([str(exe), str(cfg)], capture_output=True, text=True, timeout=60))
    r = cairn.open("inq", "r", engine="file", path=data)
    v = r.variables()
    assert r.attrs == {"title": "from C"} and v["u"].dims == ("y", "x") and v["u"].attrs == {"units": "K"}
    assert v["x"].constant and list(r.get("x")) == [0.0, 0.5, 1.0] and r.steps() == [0, 2]
