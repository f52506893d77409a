"""The ``file`` engine as ranks grow: N→N (a data file and a fragment per rank and step) against
N→M aggregation (``[file] aggregation = send | offsets``: one data file per group, metadata
gathered over MPI), in the same run.

``mpirun --oversubscribe -n R`` writers of a fixed total step size (default 64 MiB, a float64
field split in slabs), R = 4, 16, 64, 128, groups of ``--ranks-per-node`` ranks (8: one machine
stands in for R/8 nodes). For each R and path: file-system operations per step (counted with
``strace -f`` between markers the ranks emit at step boundaries, steps after the first, so opens
of the run are not counted), bytes of index per step, commit latency (all ranks enter
``end_step`` → all returned with the step committed), write MB/s (barrier to barrier) and read
MB/s (every rank reads its slab of every step back). Then a projection to 10,000 ranks from a
least-squares fit of the measured growth (model printed with it).

Ratios are N→M ÷ N→N in the same run. A measurement, not a test.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections import Counter
from typing import Any

import numpy as np

from .results import save, table

COLS = 1024                 # float64 per row: 8 KiB rows
PATHS = ["none", "send", "offsets"]
#: System calls that touch file-system metadata (counted per step), and lookups/listings.
META = ["openat", "creat", "rename", "renameat", "renameat2", "link", "linkat", "unlink", "unlinkat", "mkdir", "mkdirat",
        "fsync", "fdatasync"]
LOOKUP = ["newfstatat", "statx", "stat", "lstat", "access", "faccessat", "faccessat2", "getdents64"]
MARKER = "/nonexistent-cairn-step-marker-"


def worker(d: str, path: str, steps: int, mib: int, aggregators: int, marker: bool) -> None:
    """One rank: writes `steps` steps of its slab, then reads them back; rank 0 prints the timings."""
    from mpi4py import MPI

    import cairn

    comm = MPI.COMM_WORLD
    r, n = comm.rank, comm.size
    rows = mib * 2**20 // (COLS * 8)
    x0, x1 = r * rows // n, (r + 1) * rows // n
    a = np.full((x1 - x0, COLS), float(r))
    commit, end_t, step_t = [], [], []
    with cairn.open("scale", "w", engine="file", path=d, comm=comm, aggregation=path, aggregators=aggregators) as f:
        f.define("field", "f8", (rows, COLS))
        for s in range(steps):
            if marker:
                try:
                    os.stat(f"{MARKER}{s}")
                except OSError:
                    pass
            comm.Barrier()
            t0 = time.perf_counter()
            f.begin_step(s)
            f.put("field", a, offset=(x0, 0))
            comm.Barrier()
            t1 = time.perf_counter()
            f.end_step()
            comm.Barrier()
            t2 = time.perf_counter()
            end_t.append(t2 - t1)
            step_t.append(t2 - t0)
        if marker:
            try:
                os.stat(f"{MARKER}{steps}")
            except OSError:
                pass
        # Commit latency alone: steps whose blocks are 8 bytes per rank, so that moving data
        # (which N→M does inside end_step, N→N at the put) does not hide the protocol's cost.
        f.define("tick", "i8", local=True)
        for s in range(steps, steps + 6):
            f.begin_step(s)
            f.put("tick", np.array([s]))
            comm.Barrier()
            t1 = time.perf_counter()
            f.end_step()
            comm.Barrier()
            commit.append(time.perf_counter() - t1)
    comm.Barrier()
    t0 = time.perf_counter()
    out = np.empty_like(a)
    with cairn.open("scale", "r", engine="file", path=d) as f:
        for s in range(steps):
            f.get("field", s, (x0, 0), a.shape, out=out)
        assert out[0, 0] == r
    comm.Barrier()
    t_read = time.perf_counter() - t0
    if r == 0:
        index = [os.path.getsize(os.path.join(d, "scale", "steps", f"{s:012}.json")) for s in range(steps)]
        total = rows * COLS * 8
        # Step 0 opens the files and warms up: left out.
        print(json.dumps({"commit_ms": 1e3 * float(np.median(commit[1:])), "end_step_ms": 1e3 * float(np.median(end_t[1:])), "write_MBps": total / 1e6 / float(np.median(step_t[1:])),
                          "read_MBps": total * steps / 1e6 / t_read, "index_bytes": int(np.median(index)),
                          "data_files": len(os.listdir(os.path.join(d, "scale", "data")))}), flush=True)


def mpirun(n: int, args: list[str], wrap: list[str] | None = None) -> str:
    exe = shutil.which("mpirun")
    if exe is None:
        sys.exit("mpirun not found (make setup installs Open MPI)")
    extra = ["--oversubscribe"] + (["--allow-run-as-root"] if os.geteuid() == 0 else [])
    cmd = [exe, *extra, "-n", str(n), *(wrap or []), sys.executable, "-m", "cairn.bench.file_scale", "--worker", *args]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if p.returncode != 0:
        sys.exit(f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}")
    return p.stdout


def count_ops(prefix: str, steps: int) -> tuple[float, float, Counter[str]]:
    """Metadata and lookup calls per step over all ranks, between the markers of step 1 and of the
    end (steps 1..steps-1), from `strace -ff -o prefix` logs."""
    meta, look = Counter(), Counter()
    call = re.compile(r"^(?:\d+ +)?(\w+)\(")
    for log in glob.glob(prefix + ".*"):
        inside = False
        with open(log, errors="replace") as fh:
            for line in fh:
                if MARKER in line:
                    inside = f"{MARKER}1\"" in line or (inside and f"{MARKER}{steps}\"" not in line)
                    continue
                m = call.match(line)
                if not inside or not m:
                    continue
                name = m.group(1)
                if name in META:
                    meta[name] += 1
                elif name in LOOKUP:
                    look[name] += 1
    per = steps - 1
    return sum(meta.values()) / per, sum(look.values()) / per, meta


def fit(xs: list[float], ys: list[float], *terms) -> list[float]:
    """Least squares y = c0 + c1·terms[0](x) + … with every c ≥ 0 (costs add up; a negative
    term would be noise extrapolated 100-fold); the coefficients."""
    from scipy.optimize import nnls

    m = np.array([[1.0, *(t(x) for t in terms)] for x in xs])
    return [float(c) for c in nnls(m, np.array(ys, dtype=float))[0]]


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m cairn.bench file-scale", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="4,16,64,128", help="writer counts (default %(default)s)")
    p.add_argument("--mib", type=int, default=64, help="total MiB per step over all ranks (default %(default)s)")
    p.add_argument("--steps", type=int, default=6, help="steps per run (default %(default)s)")
    p.add_argument("--ranks-per-node", type=int, default=8, help="ranks per aggregator group (default %(default)s)")
    p.add_argument("--project", type=int, default=10_000, help="rank count to project to (default %(default)s)")
    p.add_argument("--dir", help="scratch directory (default: a temporary one)")
    args = p.parse_args(argv)
    if shutil.which("strace") is None:
        sys.exit("strace not found: apt-get install strace (it counts the file-system operations)")
    ranks = [int(x) for x in args.ranks.split(",")]
    rows: list[dict[str, Any]] = []
    trace = ["-e", "trace=" + ",".join(META + LOOKUP)]
    for n in ranks:
        for path in PATHS:
            aggs = max(1, n // args.ranks_per_node)
            d = tempfile.mkdtemp(prefix="cairn-scale-", dir=args.dir)
            try:
                res = json.loads(mpirun(n, [d, path, str(args.steps), str(args.mib), str(aggs)]).strip().splitlines()[-1])
                shutil.rmtree(d)
                os.makedirs(d)
                prefix = os.path.join(d, "strace")
                mpirun(n, [d, path, str(args.steps), str(args.mib), str(aggs), "--marker"],
                       wrap=["strace", "-f", "-ff", "-qq", *trace, "-o", prefix])
                meta, look, kinds = count_ops(prefix, args.steps)
            finally:
                shutil.rmtree(d, ignore_errors=True)
            row = {"ranks": n, "path": "N→N" if path == "none" else f"N→M {path}", "groups": 0 if path == "none" else aggs,
                   "meta_ops": meta, "lookups": look, **res,
                   "ops": " ".join(f"{k}:{v / (args.steps - 1):.0f}" for k, v in sorted(kinds.items()))}
            rows.append(row)
            print(table([row], ["ranks", "path", "groups", "meta_ops", "lookups", "index_bytes", "commit_ms", "end_step_ms", "write_MBps",
                         "read_MBps", "ops"]),
                  flush=True)
    for r in rows:
        base = next(x for x in rows if x["ranks"] == r["ranks"] and x["path"] == "N→N")
        r["write_ratio"] = r["write_MBps"] / base["write_MBps"]
        r["ops_ratio"] = r["meta_ops"] / base["meta_ops"]
    cols = ["ranks", "path", "groups", "meta_ops", "lookups", "index_bytes", "commit_ms", "end_step_ms", "write_MBps", "read_MBps",
            "write_ratio"]
    print("\nmeta_ops: creates, opens, renames, links, unlinks, mkdirs, fsyncs per step over all ranks; lookups: stats and listings")
    print("commit_ms: end_step of an 8-byte-per-rank step (protocol and index); end_step_ms: of a data step (N→M moves")
    print("the data there, N→N at the put); write_ratio = write MB/s ÷ N→N's at the same rank count (same run)")
    print(table(rows, cols))
    projection = []
    for path in ["N→N", "N→M send", "N→M offsets"]:
        rs = [r for r in rows if r["path"] == path]
        xs = [float(r["ranks"]) for r in rs]
        x = float(args.project)
        if path == "N→N":
            ops = fit(xs, [r["meta_ops"] for r in rs], lambda r: r, lambda r: r * r)
            ops_at, ops_model = ops[0] + ops[1] * x + ops[2] * x * x, f"{ops[0]:.0f} + {ops[1]:.1f}·R + {ops[2]:.2f}·R²"
        else:
            per = args.ranks_per_node
            ops = fit(xs, [r["meta_ops"] for r in rs], lambda r: r / per)
            ops_at, ops_model = ops[0] + ops[1] * x / per, f"{ops[0]:.1f} + {ops[1]:.2f}·R/{per}"
        idx = fit(xs, [r["index_bytes"] for r in rs], lambda r: r)
        # Commit: messages up and down a tree (log R) and rank 0's merge and index write (R).
        c = fit(xs, [r["commit_ms"] for r in rs], math.log2, lambda r: r)
        projection.append({"path": path, "ranks": args.project, "meta_ops": ops_at, "index_MB": (idx[0] + idx[1] * x) / 1e6,
                           "commit_ms": c[0] + c[1] * math.log2(x) + c[2] * x,
                           "model": f"ops = {ops_model}; index = {idx[0]:.0f} + {idx[1]:.0f}·R B; "
                                    f"commit = {c[0]:.2f} + {c[1]:.2f}·log2 R + {c[2] * 1e3:.2f}e-3·R ms"})
    print(f"\nprojection to {args.project} ranks ({args.ranks_per_node} per node), non-negative least squares over the measured rank counts:")
    print(table(projection, ["path", "ranks", "meta_ops", "index_MB", "commit_ms", "model"]))
    out = save("file-scale", rows, {"mib_per_step": args.mib, "steps": args.steps, "ranks_per_node": args.ranks_per_node,
                                    "baseline": "the file engine's N→N path (aggregation = none), same run", "projection": projection})
    print(f"saved {out}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        a = sys.argv[2:]
        worker(a[0], a[1], int(a[2]), int(a[3]), int(a[4]), "--marker" in a)
    else:
        main(sys.argv[1:])
