"""The ADIOS2 plugin engine libcairn_adios2.so (issue 64), with real processes and the ADIOS2 API on
one side: Python's ``adios2.Stream`` over ``adios2.Adios("cairn.xml")``, and unmodified C++
programs (tests/adios2/) run first with BP5, then with the Cairn XML; cairn.open on the other side."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import cairn
from cairn import adios2_cli, cluster

from .conftest import ROOT, check, mpirun
from .test_staging import wait_for

adios2 = pytest.importorskip("adios2")
WHEEL = Path(adios2.__file__).resolve().parent


@pytest.fixture(scope="module")
def plugin_dir() -> Path:
    """The folder of libcairn_adios2.so (`make setup` builds it; built here where it is not)."""
    try:
        return adios2_cli.plugin_dir()
    except cairn.NotFoundError:
        if shutil.which("cmake") is None:
            pytest.skip("cmake not installed (make setup installs it)")
        return adios2_cli.build(quiet=True)


@pytest.fixture
def plugin(plugin_dir, monkeypatch) -> Path:
    """ADIOS2_PLUGIN_PATH set for this process and the programs it starts."""
    monkeypatch.setenv("ADIOS2_PLUGIN_PATH", str(plugin_dir))
    return plugin_dir


def engine_xml(path: Path, io: str = "heat", **params: str) -> Path:
    """An ADIOS2 XML file whose IO ``io`` uses the Cairn plugin with ``params``."""
    extra = "".join(f'      <parameter key="{k}" value="{v}"/>\n' for k, v in params.items())
    path.write_text(f"""<?xml version="1.0"?>
<adios-config>
  <io name="{io}">
    <engine type="Plugin">
      <parameter key="PluginName" value="cairn"/>
      <parameter key="PluginLibrary" value="cairn_adios2"/>
{extra}    </engine>
  </io>
</adios-config>
""")
    return path


def _compile(src: str, out: Path, mpi: bool = False) -> Path:
    cxx = shutil.which("mpicxx" if mpi else "c++")
    if cxx is None:
        pytest.skip(f"{'mpicxx' if mpi else 'c++'} not installed (make setup installs Open MPI and a C++ compiler)")
    check(subprocess.run([cxx, "-std=c++17", "-O1", str(ROOT / "tests" / "adios2" / src), f"-I{WHEEL / 'include'}", f"-L{WHEEL}",
                          "-ladios2_cxx", "-ladios2_core", f"-Wl,-rpath,{WHEEL}", f"-Wl,-rpath-link,{WHEEL.parent / 'adios2.libs'}",
                          "-o", str(out)], capture_output=True, text=True))
    return out


@pytest.fixture(scope="module")
def programs(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("programs")
    return {"heat": _compile("heat.cpp", d / "heat", mpi=True), "refusals": _compile("refusals.cpp", d / "refusals")}


@pytest.fixture
def staging(tmp_path):
    c = cluster.start(tmp_path / "cluster.json", servers=2, memory="128MiB")
    yield c
    c.stop()


def test_the_cli_prints_the_folder_holding_the_library(plugin_dir):
    out = check(subprocess.run([sys.executable, "-m", "cairn", "adios2-plugin"], capture_output=True, text=True))
    assert Path(out.strip()) == plugin_dir and (plugin_dir / "libcairn_adios2.so").is_file()


def test_python_streams_write_steps_arrays_values_and_attributes_that_cairn_open_reads_exactly(plugin, staging, tmp_path):
    xml = engine_xml(tmp_path / "cairn.xml", io="sim", Cluster=str(staging.file), Engine="staging")
    ad = adios2.Adios(str(xml))
    with adios2.Stream(ad.declare_io("sim"), "sim.bp", "w") as s:
        for _ in s.steps(3):
            step = s.current_step()
            u = np.arange(24.0).reshape(4, 6) + 100 * step
            s.write("u", u[:2], [4, 6], [0, 0], [2, 6])  # two blocks of one global array
            s.write("u", u[2:], [4, 6], [2, 0], [2, 6])
            s.write("n", step)  # a global single value
            s.write("loc", np.full(3 + step, step, dtype=np.int32), [], [], [3 + step])  # a local array
            s.write_attribute("title", "run 1")
            s.write_attribute("coeffs", np.array([1.5, 2.5]))
            s.write_attribute("units", "K", "u")
    r = cairn.open("sim", "r", engine="staging", cluster=staging.file)
    assert r.steps() == [0, 1, 2]
    v = r.variables()
    assert v["u"].shape == (4, 6) and v["u"].dtype == np.float64 and v["u"].attrs == {"units": "K"}
    assert v["n"].shape == () and v["n"].dtype == np.int64 and v["loc"].local and v["loc"].dtype == np.int32
    assert r.attrs == {"title": "run 1", "coeffs": [1.5, 2.5]}
    for step in range(3):
        assert np.array_equal(r.get("u", step), np.arange(24.0).reshape(4, 6) + 100 * step)
        assert r.get("n", step) == step and list(r.get_local("loc", step, 0)) == [step] * (3 + step)
        blocks = r.blocks("u", step)
        assert [(b.offset, b.count, b.min, b.max) for b in blocks] == [((0, 0), (2, 6), 100.0 * step, 100 * step + 11.0),
                                                                       ((2, 0), (2, 6), 100 * step + 12.0, 100 * step + 23.0)]
    # And back through ADIOS2: blocks of the global array, the local array's block, the value.
    with adios2.Stream(adios2.Adios(str(xml)).declare_io("sim"), "sim.bp", "r") as s:
        for _ in s.steps(timeout=10):
            step = int(s.read("n"))
            info = s.engine.blocks_info("u", s.current_step())
            assert [(b["Start"], b["Count"], float(b["Min"])) for b in info] == [("0,0", "2,6", 100.0 * step),
                                                                                 ("2,0", "2,6", 100 * step + 12.0)]
            # Python sizes a block read by Count(), which ADIOS2 asks only its own engines for a
            # block's extents (docs/guide.md): the block is the buffer's first 12 values.
            block = s.read("u", block_id=1).reshape(-1)[:12]
            assert np.array_equal(block, np.arange(12.0, 24.0) + 100 * step)
            loc = s.inquire_variable("loc")
            assert loc.shape() == [] and list(s.read("loc", block_id=0)) == [step] * (3 + step)
            assert s.read_attribute("coeffs").tolist() == [1.5, 2.5]


def test_what_cairn_open_writes_adios2_reads_in_streams_and_random_access(plugin, tmp_path):
    data = tmp_path / "data"
    with cairn.open("field", "w", engine="file", path=data) as w:
        w.define("T", "f4", (3, 4), dims=("y", "x"), attrs={"units": "K"})
        w.define("it", "i8", ())
        w.attrs["title"] = "from cairn"
        for step in range(3):
            with w.step(step):
                w.put("T", (np.arange(12, dtype="f4") + 10 * step).reshape(3, 4))
                w.put("it", np.int64(step))
    xml = engine_xml(tmp_path / "cairn.xml", io="field", engine="file", PATH=str(data))  # keys in any case
    ad = adios2.Adios(str(xml))
    seen = []
    with adios2.Stream(ad.declare_io("field"), "field", "r") as s:
        for _ in s.steps():
            t = s.inquire_variable("T")
            assert t.shape() == [3, 4] and t.type() == "float"
            it = int(s.read("it"))
            assert np.array_equal(s.read("T", [1, 1], [2, 2]), (np.arange(12, dtype="f4") + 10 * it).reshape(3, 4)[1:3, 1:3])
            info = s.engine.blocks_info("T", s.current_step())
            assert [(b["Start"], b["Count"], float(b["Min"]), float(b["Max"])) for b in info] == \
                [("0,0", "3,4", 10.0 * it, 10.0 * it + 11)]
            assert s.read_attribute("title") == "from cairn" and s.read_attribute("units", "T") == "K"
            seen.append(it)
    assert seen == [0, 1, 2]
    with adios2.Stream(ad.at_io("field"), "field", "rra") as f:
        assert f.num_steps() == 3
        both = f.read("T", [0, 0], [1, 4], step_selection=[1, 2])
        assert np.array_equal(both, np.array([[10, 11, 12, 13], [20, 21, 22, 23]], dtype="f4"))


def test_a_reader_waits_for_the_first_step_then_sees_not_ready_and_end_of_stream(plugin, staging, tmp_path):
    xml = engine_xml(tmp_path / "cairn.xml", io="live", Cluster=str(staging.file), Engine="staging")
    ad = adios2.Adios(str(xml))
    ST = adios2.bindings.StepStatus
    r = adios2.Stream(ad.declare_io("live"), "live", "r")  # opened before any step exists
    assert r.begin_step(timeout=0.2) == ST.NotReady
    w = adios2.Stream(adios2.Adios(str(xml)).declare_io("live"), "live", "w")  # another process, as it were
    w.begin_step()
    w.write("x", np.arange(5.0))
    assert r.begin_step(timeout=0.2) == ST.NotReady, "a step not ended is not there"
    w.end_step()
    assert r.begin_step(timeout=10) == ST.OK and list(r.read("x")) == [0, 1, 2, 3, 4]
    r.end_step()
    assert r.begin_step(timeout=0.2) == ST.NotReady
    w.close()
    assert r.begin_step(timeout=10) == ST.EndOfStream
    r.close()


def test_refusals_are_invalid_argument_naming_the_variable_and_unknown_keys_list_the_accepted(plugin, programs, tmp_path):
    cfg = tmp_path / "cairn.toml"
    cfg.write_text(f'engine = "file"\n[file]\npath = "{tmp_path / "data"}"\n')
    out = check(subprocess.run([str(programs["refusals"]), str(cfg)], capture_output=True, text=True, timeout=60))
    lines = dict(line.split(": ", 1) for line in out.splitlines())
    for case, var, why in [("string", "label", "type string"), ("long double", "ld", "type long double"),
                           ("operator", "squeezed", "operator"), ("joined", "table", "joined array"),
                           ("memory selection", "ghosted", "SetMemorySelection"), ("get memory selection", "fine", "SetMemorySelection")]:
        assert lines[case].startswith("invalid_argument: ") and f"'{var}'" in lines[case] and why in lines[case], lines[case]
    assert lines["plain"] == "accepted"
    xml = engine_xml(tmp_path / "cairn.xml", io="bad", Config=str(cfg), QueueLimit="4", Bogus="1")
    with pytest.raises(Exception, match="unknown parameter Bogus; it accepts PluginName, PluginLibrary, Config, Engine, Cluster, Path"):
        adios2.Stream(adios2.Adios(str(xml)).declare_io("bad"), "bad", "w")


@pytest.mark.mpi
def test_an_unmodified_heat_transfer_code_runs_on_bp5_then_on_cairn_with_4_ranks(plugin, programs, staging, tmp_path):
    heat = str(programs["heat"])
    bp5 = tmp_path / "bp5.xml"
    bp5.write_text('<?xml version="1.0"?>\n<adios-config><io name="heat"><engine type="BP5"/></io></adios-config>\n')
    env = {"ADIOS2_PLUGIN_PATH": str(plugin)}
    check(subprocess.run([heat, "write", str(bp5), "16", "20", "3"], capture_output=True, text=True, cwd=tmp_path, timeout=60))
    on_bp5 = check(subprocess.run([heat, "read", str(bp5), "2", "3", "9", "11"], capture_output=True, text=True, cwd=tmp_path, timeout=60))
    toml = tmp_path / "cairn.toml"
    toml.write_text(f'engine = "staging"\n[staging]\ncluster = "{staging.file}"\n')
    xml = engine_xml(tmp_path / "cairn.xml", Config=str(toml))
    reader = subprocess.Popen([heat, "read", str(xml), "2", "3", "9", "11"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, cwd=tmp_path)  # waits in BeginStep for the writer
    out = check(mpirun(4, heat, "write", str(xml), "16", "20", "3", env=env))
    assert "wrote 3 steps from 4 ranks" in out
    on_cairn = reader.communicate(timeout=60)
    assert reader.returncode == 0, on_cairn[1]
    assert on_cairn[0] == on_bp5.replace("blocks 1", "blocks 4"), (on_bp5, on_cairn)
    assert "exact 1 blocks 4 stats 1 attrs temperature field/K" in on_cairn[0]
    r = cairn.open("heat", "r", engine="staging", cluster=staging.file)
    assert r.steps() == [0, 1, 2] and sorted(b.writer for b in r.blocks("T", 0)) == [0, 1, 2, 3]
    assert r.attrs["description"] == "temperature field" and r.variables()["T"].attrs == {"units": "K"}


WRITER = """
import sys, numpy as np, adios2
xml, steps, mode = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with adios2.Stream(adios2.Adios(xml).declare_io("flow"), "flow", mode) as s:
    for _ in s.steps(steps):
        k = s.current_step()
        s.write("p", np.arange(64 * 64, dtype="f8").reshape(64, 64) + k, [64, 64], [0, 0], [64, 64])
        s.write("k", k)
        print(k, flush=True)
"""

READER = """
import sys, numpy as np, adios2
with adios2.Stream(adios2.Adios(sys.argv[1]).declare_io("flow"), "flow", "r") as s:
    for _ in s.steps(timeout=60):
        k = int(s.read("k"))
        ok = np.array_equal(s.read("p"), np.arange(64 * 64, dtype="f8").reshape(64, 64) + k)
        print(k, int(ok), flush=True)
"""


def test_a_server_killed_while_adios2_streams_loses_no_committed_step_and_append_goes_on_after_the_drain(plugin, tmp_path):
    drain = tmp_path / "drain"
    c = cluster.start(tmp_path / "cluster.json", servers=4, spares=1, memory="256MiB", meta=3, redundancy=1,
                      scheme="replicate", failure_timeout="1s", drain=drain)
    try:
        xml = engine_xml(tmp_path / "cairn.xml", io="flow", Cluster=str(c.file), Engine="staging")
        reader = subprocess.Popen([sys.executable, "-c", READER, str(xml)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, str(xml), "40", "w"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True)
        assert reader.stdout is not None
        read = [reader.stdout.readline() for _ in range(5)]  # the stream is under way on both sides
        victim = next(r["id"] for r in cluster.status(c.file) if r["meta"] == "none" and r["state"] == "up")
        c.procs[victim].send_signal(signal.SIGKILL)
        w_out, w_err = writer.communicate(timeout=120)
        assert writer.returncode == 0, w_err
        r_out, r_err = reader.communicate(timeout=120)
        assert reader.returncode == 0, r_err
        rows = [line.split() for line in read + r_out.splitlines() if line.strip()]
        assert [int(k) for k, _ in rows] == list(range(40)), "every committed step, in order, once"
        assert all(ok == "1" for _, ok in rows), "and each one whole"
        assert w_out.split() == [str(k) for k in range(40)]
        wait_for(lambda: victim in (cluster.view(c.file, timeout=1.0) or {}).get("down", []), "the victim declared down", 15)
        # A new writer appends where the last committed step left off.
        out = check(subprocess.run([sys.executable, "-c", WRITER, str(xml), "3", "a"], capture_output=True, text=True, timeout=120))
        assert out.split() == ["40", "41", "42"]
        r = cairn.open("flow", "r", engine="staging", cluster=c.file)
        assert r.steps() == list(range(43)) and np.array_equal(r.get("p", 42), np.arange(64 * 64, dtype="f8").reshape(64, 64) + 42)
        assert r.wait_drained(42, timeout=60)
    finally:
        c.stop()
    # The next allocation: a new cluster over the same drain, the same XML but its cluster file.
    c2 = cluster.start(tmp_path / "next.json", servers=2, memory="128MiB", redundancy=1, drain=drain)
    try:
        xml = engine_xml(tmp_path / "next.xml", io="flow", Cluster=str(c2.file), Engine="staging")
        out = check(subprocess.run([sys.executable, "-c", WRITER, str(xml), "2", "a"], capture_output=True, text=True, timeout=120))
        assert out.split() == ["43", "44"]
        rows = check(subprocess.run([sys.executable, "-c", READER, str(xml)], capture_output=True, text=True, timeout=120)).split()
        assert rows == [x for k in range(45) for x in (str(k), "1")], "drained and new steps, all whole"
    finally:
        c2.stop()


def test_append_on_the_file_engine_goes_on_after_the_steps_on_disk(plugin, tmp_path):
    xml = engine_xml(tmp_path / "cairn.xml", io="flow", Engine="file", Path=str(tmp_path / "data"))
    for mode, expect in [("w", ["0", "1"]), ("a", ["2", "3", "4"])]:
        out = check(subprocess.run([sys.executable, "-c", WRITER, str(xml), str(len(expect)), mode], capture_output=True, text=True,
                                   timeout=120, env={**os.environ}))
        assert out.split() == expect
    r = cairn.open("flow", "r", engine="file", path=tmp_path / "data")
    assert r.steps() == [0, 1, 2, 3, 4] and [int(r.get("k", s)) for s in r.steps()] == [0, 1, 2, 3, 4]


def test_the_c_functions_the_plugin_needs_through_the_c_api(tmp_path):
    """cairn_open_overrides (settings winning over the config), cairn_step_vars, cairn_step_attrs, cairn_stream_state."""
    lib = ROOT / "target" / "release"
    exe = tmp_path / "stream_inquiry"
    check(subprocess.run(["cc", str(ROOT / "tests/c/stream_inquiry.c"), "-Wall", "-Werror", "-I", str(ROOT / "crates/cairn-capi/include"),
                          "-L", str(lib), "-lcairn", f"-Wl,-rpath,{lib}", "-o", str(exe)], capture_output=True, text=True))
    cfg = tmp_path / "cairn.toml"
    cfg.write_text('engine = "staging"\n[staging]\ncluster = "/nonexistent/cluster.json"\n')
    out = check(subprocess.run([str(exe), str(cfg), str(tmp_path / "data")], capture_output=True, text=True, timeout=60))
    assert "C stream inquiry: ok" in out
    assert cairn.open("inq", "r", engine="file", path=tmp_path / "data").variables().keys() == {"n", "u"}


def test_make_install_installs_the_plugin_that_the_installed_cli_names(tmp_path):
    prefix = tmp_path / "prefix"
    check(subprocess.run([str(ROOT / "scripts" / "install.sh"), str(prefix)], capture_output=True, text=True, timeout=900))
    lib = prefix / "lib" / "libcairn_adios2.so"
    assert lib.is_file() and "[$ORIGIN]" in check(subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True))
    out = check(subprocess.run([str(prefix / "bin" / "cairn"), "adios2-plugin"], capture_output=True, text=True,
                               env={**os.environ, "CAIRN_PYTHON": sys.executable}))
    assert Path(out.strip()) == prefix / "lib"
    xml = engine_xml(tmp_path / "cairn.xml", io="flow", Engine="file", Path=str(tmp_path / "data"))
    out = check(subprocess.run([sys.executable, "-c", WRITER, str(xml), "2", "w"], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "ADIOS2_PLUGIN_PATH": str(prefix / "lib")}))
    assert out.split() == ["0", "1"] and cairn.open("flow", "r", engine="file", path=tmp_path / "data").steps() == [0, 1]
