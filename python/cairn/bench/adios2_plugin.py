"""The ADIOS2 plugin engine against ADIOS2's own engines and Cairn's own API, in the same run.

One C++ writer (``adios2/bench/stream_bench.cpp``, built here against the ``adios2`` wheel and
libcairn) streams ``--steps`` steps of a 1-D float64 array of ``--mib`` MiB, 1 rank (the wheel
has no MPI), while one reader process reads every step whole. The same program writes through
ADIOS2 with BP5 (a file), SST (the wheel's sockets data plane, ``QueueLimit=2``,
``QueueFullPolicy=Block``) and the Cairn plugin (staging: a 2-server cluster started for the run;
``file``), chosen by its XML file alone, and through Cairn's C API (``cairn_put``) on the same
staging cluster and file folder. Measured: the writer's seconds from its first ``BeginStep`` to
its last ``EndStep`` returning, median of ``--runs``; every run's reader must read every step
whole. Ratios: the plugin ÷ Cairn's API on the same engine (the target is within 5%), and each
row's throughput ÷ SST's. The plugin and the C API take turns to go first from run to run, and
an untimed file-engine run precedes the timed ones after the staging runs; every run starts once
the page cache of the runs before it is written back (``sync``).
Saves ``bench/results/adios2.json``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from .results import save, table

ROOT = Path(__file__).resolve().parents[3]

ENGINES = ("bp5", "sst", "plugin-staging", "capi-staging", "plugin-file", "capi-file")


def _build(tmp: Path) -> Path:
    import adios2

    wheel = Path(adios2.__file__).resolve().parent
    lib = ROOT / "target" / "release"
    exe = tmp / "stream_bench"
    cmd = ["c++", "-std=c++17", "-O2", str(ROOT / "adios2" / "bench" / "stream_bench.cpp"), f"-I{wheel / 'include'}",
           f"-I{ROOT / 'crates' / 'cairn-capi' / 'include'}", f"-L{wheel}", f"-L{lib}", "-ladios2_cxx", "-ladios2_core", "-lcairn",
           f"-Wl,-rpath,{wheel}", f"-Wl,-rpath,{lib}", f"-Wl,-rpath-link,{wheel.parent / 'adios2.libs'}", "-o", str(exe)]
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"building the benchmark program failed:\n{p.stderr}")
    return exe


def _xml(path: Path, engine: str, params: dict[str, str]) -> Path:
    extra = "".join(f'<parameter key="{k}" value="{v}"/>' for k, v in params.items())
    path.write_text(f'<?xml version="1.0"?>\n<adios-config><io name="bench"><engine type="{engine}">{extra}</engine></io></adios-config>\n')
    return path


def _pair(writer: list[str], reader: list[str], cwd: Path, env: dict[str, str]) -> tuple[float, int]:
    """Runs the reader and the writer together; the writer's seconds and the steps read whole."""
    r = subprocess.Popen(reader, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=cwd, env=env)
    w = subprocess.run(writer, capture_output=True, text=True, cwd=cwd, env=env, timeout=600)
    out, err = r.communicate(timeout=600)
    if w.returncode != 0 or r.returncode != 0:
        sys.exit(f"{' '.join(writer)}: {w.stderr}\n{' '.join(reader)}: {err}")
    return float(w.stdout.split()[-1]), int(out.split()[-1])


def main(argv: list[str]) -> None:
    import os

    from cairn import adios2_cli, cluster

    p = argparse.ArgumentParser(prog="python -m cairn.bench adios2", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--mib", type=int, default=16, help="MiB per step")
    p.add_argument("--runs", type=int, default=5, help="runs per engine (the median is kept)")
    args = p.parse_args(argv)
    try:
        plugin = adios2_cli.plugin_dir()
    except Exception:
        plugin = adios2_cli.build(quiet=True)
    tmp = Path(tempfile.mkdtemp(prefix="cairn-bench-adios2-"))
    env = {**os.environ, "ADIOS2_PLUGIN_PATH": str(plugin)}
    exe = str(_build(tmp))
    c = cluster.start(tmp / "cluster.json", servers=2, memory=f"{max(512, 4 * args.steps * args.mib)}MiB")
    times: dict[str, list[float]] = {e: [] for e in ENGINES}
    try:
        for run in range(args.runs):
            # The plugin and the C API take turns to go first: a run after another gets the
            # memory the first freed, which this VM's host still backs (see cairn.bench.stream).
            order = ENGINES if run % 2 == 0 else ("bp5", "sst", "capi-staging", "plugin-staging", "capi-file", "plugin-file")
            for e in order:
                name = f"bench{run}{e.replace('-', '')}"
                work = tmp / name
                work.mkdir()
                staging_cfg = f'engine = "staging"\n[staging]\ncluster = "{c.file}"\n'
                file_cfg = f'engine = "file"\n[file]\npath = "{work / "data"}"\n'
                steps, mib = str(args.steps), str(args.mib)
                if e.startswith("capi"):
                    cfg = staging_cfg if e.endswith("staging") else file_cfg
                    writer = [exe, "write", "capi", cfg, name, steps, mib]
                    reader = [exe, "read", "capi", cfg, name, steps]
                else:
                    params = {"bp5": ("BP5", {"OpenTimeoutSecs": "60"}),
                              "sst": ("SST", {"DataTransport": "WAN", "RendezvousReaderCount": "1", "QueueLimit": "2",
                                              "QueueFullPolicy": "Block"}),
                              "plugin-staging": ("Plugin", {"PluginName": "cairn", "PluginLibrary": "cairn_adios2", "Name": name,
                                                            "Engine": "staging", "Cluster": str(c.file)}),
                              "plugin-file": ("Plugin", {"PluginName": "cairn", "PluginLibrary": "cairn_adios2", "Name": name,
                                                         "Engine": "file", "Path": str(work / "data")})}[e]
                    xml = str(_xml(work / "bench.xml", *params))
                    writer, reader = [exe, "write", "adios2", xml, steps, mib], [exe, "read", "adios2", xml]
                    if e == "plugin-file":
                        (work / "data").mkdir()
                if e in ("plugin-file", "capi-file") and e == order[4]:
                    # The first file-engine write after the staging runs pays for the memory the
                    # servers freed (this VM's host takes it back): an untimed one pays it here.
                    _pair(writer, reader, work, env)
                    shutil.rmtree(work / "data", ignore_errors=True)
                    (work / "data").mkdir()
                os.sync()  # the previous runs' dirty pages written back before this one, not during it
                took, whole = _pair(writer, reader, work, env)
                if whole != args.steps:
                    sys.exit(f"{e}: the reader read {whole} of {args.steps} steps whole")
                times[e].append(took)
                print(f"run {run} {e:>15}: {took:.3f} s, {args.steps * args.mib / took:.0f} MiB/s", flush=True)
                if "staging" in e:
                    from cairn import open as cairn_open

                    cairn_open(name, "r", engine="staging", cluster=c.file)._inner.remove()
                shutil.rmtree(work, ignore_errors=True)
    finally:
        c.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    med = {e: statistics.median(t) for e, t in times.items()}
    rows: list[dict[str, Any]] = []
    for e in ENGINES:
        mbs = args.steps * args.mib * (1 << 20) / 1e6 / med[e]
        row: dict[str, Any] = {"engine": e, "write_s": med[e], "MB_s": mbs, "vs_sst": med["sst"] / med[e], "runs_s": times[e]}
        if e.startswith("plugin"):
            row["vs_capi"] = med[e] / med[e.replace("plugin", "capi")]
        rows.append(row)
    print()
    print(table(rows, ["engine", "write_s", "MB_s", "vs_sst", "vs_capi"]))
    params = {"steps": args.steps, "mib_per_step": args.mib, "runs": args.runs, "ranks": 1, "readers": 1,
              "measure": "writer: first BeginStep to last EndStep returning, median; a reader reads every step whole meanwhile",
              "sst": "DataTransport=WAN, QueueLimit=2, QueueFullPolicy=Block", "staging": "2 servers, local"}
    print(save("adios2", rows, params))
