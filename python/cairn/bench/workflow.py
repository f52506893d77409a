"""D²T's claim workflow (Lofstead et al., §III-IV) on real staging servers and on the file engine.

W writer ranks commit ``--steps`` steps of a 2-D field and close; then C claimer processes
(C = 1, 2, 4, 8) share them with ``src.claims()`` and commit each step's column means into a stats
dataset with ``dst.step(s, consume=src)``, doing ``--work`` seconds of analysis per step.
Reported: steps consumed per second, claim latency (a claim call's time, median and p90), the
consuming commit's time against a plain ``dst.step(s)`` then ``src.release(s)`` measured in the
same run, and the same workflow with one claimer SIGKILLed every ``--kill-every`` seconds (and
started again), where every step must still land in the stats dataset exactly once. Each engine
of ``--engines`` runs all of it. Saves ``bench/results/workflow.json``.
"""

from __future__ import annotations

import argparse
import json
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

import numpy as np

import cairn
from cairn import cluster

from .results import save, table

#: D²T's own figure: protocol overhead under 1.2 s at 4096 clients and 32 servers, with message
#: polling adding up to 100 ms per round trip (§VI).
PAPER = "D²T: < 1.2 s protocol overhead at 4096 clients x 32 servers; (0, 100] ms polling delay per round trip"

CLAIMER = textwrap.dedent("""
    import json, sys, time, cairn
    opts, src_name, dst_name, work, lease = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], float(sys.argv[4]), float(sys.argv[5])
    with cairn.open(src_name, "r", **opts) as src, cairn.open(dst_name, "w", rank=0, nranks=1, **opts) as dst:
        dst.define("mean", dtype="f8", local=True)
        it = src.claims(lease=lease)
        while True:
            t0 = time.perf_counter()
            step = next(it, None)
            claim = time.perf_counter() - t0
            if step is None:
                break
            a = src.get("u", step)
            time.sleep(work)
            t1 = time.perf_counter()
            with dst.step(step, consume=src):
                dst.put("mean", a.mean(axis=0))
            print(json.dumps({"step": step, "claim_s": claim, "commit_s": time.perf_counter() - t1}), flush=True)
""")


def _produce(opts: dict[str, Any], name: str, steps: int, writers: int, n: int) -> None:
    """``writers`` ranks (one session, in this process) commit ``steps`` steps and close."""
    ws = [cairn.open(name, "w", rank=r, nranks=writers, session=f"bench-{name}", **opts) for r in range(writers)]
    rows = n // writers
    for w in ws:
        w.define("u", "f8", (n, n))
    for s in range(steps):
        for r, w in enumerate(ws):
            w._inner.begin_step(s)
            w.put("u", np.full((rows, n), float(s)), offset=(r * rows, 0))
        for w in ws:
            w._inner.end_step()
    for w in ws:
        w.close()


def _check(opts: dict[str, Any], src: str, dst: str, steps: int) -> tuple[int, int]:
    """Steps in ``dst`` with the right result, and steps left in ``src``."""
    with cairn.open(dst, "r", **opts) as r, cairn.open(src, "r", **opts) as s:
        good = sum(1 for st in r.steps() if np.allclose(r.get_local("mean", st, writer=0), float(st)))
        return good, len(s.steps())


def claimers(opts: dict[str, Any], script: Path, tag: str, a: argparse.Namespace, c: int, kill_every: float | None) -> dict[str, Any]:
    src, dst = f"sim-{tag}", f"stats-{tag}"
    _produce(opts, src, a.steps, a.writers, a.n)
    argv = [sys.executable, str(script), json.dumps(opts), src, dst, str(a.work), str(a.lease)]
    records: list[dict[str, Any]] = []
    kills = 0
    t0 = time.perf_counter()
    procs: list[subprocess.Popen] = [subprocess.Popen(argv, stdout=subprocess.PIPE, text=True) for _ in range(c)]
    try:
        next_kill = None if kill_every is None else t0 + kill_every
        while any(p.poll() is None for p in procs):
            if next_kill is not None and time.perf_counter() >= next_kill:
                victim = next((p for p in procs if p.poll() is None), None)
                if victim is not None:
                    victim.send_signal(signal.SIGKILL)
                    victim.wait()
                    kills += 1
                    procs.append(subprocess.Popen(argv, stdout=subprocess.PIPE, text=True))
                next_kill += kill_every
            time.sleep(0.05)
        took = time.perf_counter() - t0
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            out, _ = p.communicate()
            records += [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    good, left = _check(opts, src, dst, a.steps)
    claim = np.array([r["claim_s"] for r in records]) * 1e3
    commit = np.array([r["commit_s"] for r in records]) * 1e3
    return {"engine": opts["engine"], "claimers": c, "killed_every_s": kill_every, "kills": kills, "steps": a.steps, "run_s": took,
            "steps_per_s": a.steps / took, "claim_ms_median": float(np.median(claim)), "claim_ms_p90": float(np.percentile(claim, 90)),
            "commit_ms_median": float(np.median(commit)), "in_stats_once": good, "left_in_source": left,
            "ideal_steps_per_s": c / a.work if a.work > 0 else None}


def consume_cost(opts: dict[str, Any], a: argparse.Namespace) -> dict[str, Any]:
    """One process: the consuming commit against a plain commit followed by a release."""
    _produce(opts, "cost-src", a.steps, 1, a.n)
    _produce(opts, "base-src", a.steps, 1, a.n)
    times: dict[str, list[float]] = {"consume": [], "step_release": []}
    with cairn.open("cost-src", "r", **opts) as src, cairn.open("cost-dst", "w", rank=0, nranks=1, **opts) as dst, \
            cairn.open("base-src", "r", **opts) as bsrc, cairn.open("base-dst", "w", rank=0, nranks=1, **opts) as bdst:
        for d in (dst, bdst):
            d.define("mean", dtype="f8", local=True)
        row = np.zeros(a.n)
        for s in range(a.steps):
            # Alternated, so both see the same state of the machine.
            t = time.perf_counter()
            with dst.step(s, consume=src):
                dst.put("mean", row)
            times["consume"].append(time.perf_counter() - t)
            t = time.perf_counter()
            with bdst.step(s):
                bdst.put("mean", row)
            bsrc.release(s)
            times["step_release"].append(time.perf_counter() - t)
    med = {k: float(np.median(v)) * 1e3 for k, v in times.items()}
    return {"engine": opts["engine"], "consume_ms": med["consume"], "step_then_release_ms": med["step_release"], "ratio": med["consume"] / med["step_release"]}


def run_engine(opts: dict[str, Any], script: Path, a: argparse.Namespace, rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The consume cost, the claimer counts and the failure run on one engine; returns the cost."""
    engine = opts["engine"]
    cost = consume_cost(opts, a)
    print(f"{engine}: consume-and-produce commit {cost['consume_ms']:.2f} ms vs step + release "
          f"{cost['step_then_release_ms']:.2f} ms ({cost['ratio']:.2f}x)", flush=True)
    for n in (int(x) for x in a.claimers.split(",")):
        row = claimers(opts, script, f"c{n}", a, n, None)
        rows.append(row)
        print(f"  {n} claimers: {row['steps_per_s']:.1f} steps/s, claim {row['claim_ms_median']:.1f} ms, "
              f"in stats once {row['in_stats_once']}/{a.steps}", flush=True)
    work = a.work
    a.work = a.kill_work
    row = claimers(opts, script, "kill", a, a.kill_claimers, a.kill_every)
    a.work = work
    rows.append(row)
    print(f"  {a.kill_claimers} claimers, one SIGKILLed every {a.kill_every:g} s: {row['kills']} kills, "
          f"{row['steps_per_s']:.2f} steps/s, in stats once {row['in_stats_once']}/{a.steps}", flush=True)
    return cost


def main(argv: list[str]) -> None:
    ap = argparse.ArgumentParser(prog="python -m cairn.bench workflow", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100, help="steps the writers produce (default 100)")
    ap.add_argument("--writers", type=int, default=2, help="writer ranks (default 2)")
    ap.add_argument("--n", type=int, default=128, help="field edge: n x n doubles per step (default 128)")
    ap.add_argument("--claimers", default="1,2,4,8", help="claimer counts (default 1,2,4,8)")
    ap.add_argument("--work", type=float, default=0.05, help="seconds of analysis per step (default 0.05)")
    ap.add_argument("--lease", type=float, default=2.0, help="claim lease in seconds (default 2)")
    ap.add_argument("--kill-every", type=float, default=10.0, help="SIGKILL one claimer this often in the failure run (default 10 s)")
    ap.add_argument("--kill-claimers", type=int, default=4, help="claimers in the failure run (default 4)")
    ap.add_argument("--kill-work", type=float, default=1.0, help="analysis seconds per step in the failure run (default 1.0)")
    ap.add_argument("--engines", default="staging,file", help="engines to run it on (default staging,file)")
    a = ap.parse_args(argv)
    rows: list[dict[str, Any]] = []
    costs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "claimer.py"
        script.write_text(CLAIMER)
        for engine in a.engines.split(","):
            c = None
            if engine == "staging":
                c = cluster.start(Path(tmp) / "cluster.json", servers=3, memory="1GiB", meta=3, redundancy=1, scheme="replicate")
                opts: dict[str, Any] = dict(engine="staging", cluster=str(c.file), timeout=30.0)
            else:
                opts = dict(engine="file", path=str(Path(tmp) / "files"))
            try:
                costs.append(run_engine(opts, script, a, rows))
            finally:
                if c is not None:
                    c.stop()
    print()
    print(table(rows, ["engine", "claimers", "killed_every_s", "kills", "steps_per_s", "ideal_steps_per_s", "claim_ms_median", "claim_ms_p90",
                       "commit_ms_median", "in_stats_once", "left_in_source"]))
    print(PAPER)
    path = save("workflow", rows + [{"consume_cost": cost} for cost in costs], {k: v for k, v in vars(a).items()} | {"paper": PAPER})
    print(f"\nsaved {path}")
