"""The C API beyond put and get (issue 44), tested in C: tests/c/inquiry.c defines with dims,
attributes and a constant, sets dataset attributes, and inquires (steps, wait_step, var_info,
constant_step, get_local, release); tests/c/claims.c claims and consumes; Python then reads what
C wrote."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import cairn

from .conftest import ROOT, check


def _run_c(tmp_path: Path, program: str) -> tuple[str, Path]:
    """Builds tests/c/PROGRAM.c against target/release and runs it on a file-engine dataset
    directory; its output and that directory."""
    lib = ROOT / "target" / "release"
    exe = tmp_path / program
    check(subprocess.run(["cc", str(ROOT / f"tests/c/{program}.c"), "-Wall", "-Werror", "-I", str(ROOT / "crates/cairn-capi/include"),
                          "-L", str(lib), "-lcairn", f"-Wl,-rpath,{lib}", "-o", str(exe)], capture_output=True, text=True))
    data = tmp_path / "data"
    data.mkdir()
    cfg = tmp_path / "cairn.toml"
    cfg.write_text(f'engine = "file"\n[file]\npath = "{data}"\n')
    return check(subprocess.run([str(exe), str(cfg)], capture_output=True, text=True, timeout=60)), data


def test_the_c_inquiry_functions_and_what_python_reads_of_them(tmp_path):
    out, data = _run_c(tmp_path, "inquiry")
    assert "C inquiry: ok" in out
    r = cairn.open("inq", "r", engine="file", path=data)
    v = r.variables()
    assert r.attrs == {"title": "from C"} and v["u"].dims == ("y", "x") and v["u"].attrs == {"units": "K"}
    assert v["x"].constant and list(r.get("x")) == [0.0, 0.5, 1.0] and r.steps() == [0, 2]


def test_c_claimers_share_the_steps_and_consume_them_into_a_result(tmp_path):
    out, data = _run_c(tmp_path, "claims")
    assert "C claims: ok" in out
    dst = cairn.open("dst", "r", engine="file", path=data)
    assert dst.steps() == list(range(6))
    for s in range(6):
        assert list(dst.get("b", s)) == [2 * (s + q) for q in (0, 0.25, 0.5, 0.75)]
    assert cairn.open("src", "r", engine="file", path=data).steps() == [], "every source step consumed"


def test_a_c_restart_reads_its_state_through_the_append_handle_with_toml_text_settings(tmp_path):
    lib = ROOT / "target" / "release"
    exe = tmp_path / "restart"
    check(subprocess.run(["cc", str(ROOT / "tests/c/restart.c"), "-Wall", "-Werror", "-I", str(ROOT / "crates/cairn-capi/include"),
                          "-L", str(lib), "-lcairn", f"-Wl,-rpath,{lib}", "-o", str(exe)], capture_output=True, text=True))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CAIRN_", "SLURM_"))}
    out = check(subprocess.run([str(exe), str(tmp_path)], capture_output=True, text=True, timeout=60, env=env))
    assert "C restart: resumed at 3, halt 0" in out
    r = cairn.open("ckpt", "r", engine="file", path=tmp_path)
    assert r.steps() == [0, 1, 2, 3] and list(r.get("state", 3)) == [21.0 + i for i in range(8)]
    # The job's halt file, then the allocation's end within the margin, ask the program to stop.
    halt = tmp_path / "halt"
    halt.touch()
    out = check(subprocess.run([str(exe), str(tmp_path / "2")], capture_output=True, text=True, timeout=60,
                               env={**env, "CAIRN_HALT_FILE": str(halt)}))
    assert "halt 1" in out
    out = check(subprocess.run([str(exe), str(tmp_path / "3")], capture_output=True, text=True, timeout=60,
                               env={**env, "CAIRN_HALT_SECONDS": "600", "SLURM_JOB_END_TIME": str(int(time.time()) + 60)}))
    assert "halt 1" in out
    out = check(subprocess.run([str(exe), str(tmp_path / "4")], capture_output=True, text=True, timeout=60,
                               env={**env, "CAIRN_HALT_SECONDS": "soon", "SLURM_JOB_END_TIME": str(int(time.time()) + 60)}))
    assert "halt -1" in out
