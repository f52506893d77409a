"""The first job a user runs, with the default prefault against none (issue 55): ``make demo``'s
job (``python -m cairn.demo``: a fresh 3-server cluster started beside 4 writer ranks, then 3
readers) run ``--runs`` times each way, interleaved, so that both meet the machine alike. Its write
phase's MB/s (I/O alone, the field's computing apart) are compared as medians; the target is a
ratio of at least 0.95 (prefault must not slow the application it serves)."""

from __future__ import annotations

import argparse
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from .results import save, table

WRITE = re.compile(r"^write: .* = (\d+) MB/s", re.M)


def run_demo(prefault: str | None) -> float:
    """One demo run in a folder of its own (its ``cairn.toml`` sets ``prefault`` when given);
    its write phase's MB/s."""
    with tempfile.TemporaryDirectory(prefix="cairn-bench-demo-") as d:
        if prefault is not None:
            (Path(d) / "cairn.toml").write_text(f'[staging]\nprefault = "{prefault}"\n')
        out = subprocess.run([sys.executable, "-m", "cairn.demo"], cwd=d, capture_output=True, text=True, check=True,
                             timeout=600).stdout
    m = WRITE.search(out)
    if m is None:
        raise RuntimeError(f"the demo printed no write rate:\n{out}")
    return float(m.group(1))


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m cairn.bench demo-prefault", description=__doc__)
    p.add_argument("--runs", type=int, default=5, help="runs of each (interleaved; default 5)")
    args = p.parse_args(argv)
    rows = []
    for run in range(args.runs):
        for name, prefault in (("default", None), ("none", "0")):
            mb = run_demo(prefault)
            rows.append({"run": run, "prefault": name, "write_mb_s": mb})
            print(f"run {run}: prefault {name}: write {mb:.0f} MB/s", flush=True)
    med = {n: statistics.median(r["write_mb_s"] for r in rows if r["prefault"] == n) for n in ("default", "none")}
    summary = {"run": "median", "prefault": "default / none", "write_mb_s": round(med["default"] / med["none"], 3)}
    print(table(rows + [summary], ["run", "prefault", "write_mb_s"]))
    print(f"demo write phase, median of {args.runs}: default prefault {med['default']:.0f} MB/s, none {med['none']:.0f} MB/s: "
          f"ratio {med['default'] / med['none']:.2f} (target >= 0.95)")
    path = save("demo_prefault", rows, {"runs": args.runs, "median_default_mb_s": med["default"], "median_none_mb_s": med["none"],
                                        "ratio": round(med["default"] / med["none"], 3)})
    print(f"results: {path}")
