"""Where benchmark results go and how they print: ``bench/results/<name>.json`` with the
machine's description, and a plain-text table."""

from __future__ import annotations

import json
import os
import platform
import time
from pathlib import Path
from typing import Any


def results_dir() -> Path:
    """``bench/results`` of the source tree (or ``$CAIRN_BENCH_RESULTS``)."""
    env = os.environ.get("CAIRN_BENCH_RESULTS")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[3] / "bench" / "results"


def save(name: str, rows: list[dict[str, Any]], params: dict[str, Any]) -> Path:
    """Writes the rows with machine facts and parameters to ``<results>/<name>.json``."""
    out = results_dir()
    out.mkdir(parents=True, exist_ok=True)
    doc = {
        "benchmark": name,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"cpus": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version()},
        "params": params,
        "rows": rows,
    }
    path = out / f"{name}.json"
    path.write_text(json.dumps(doc, indent=2) + "\n")
    return path


def table(rows: list[dict[str, Any]], cols: list[str]) -> str:
    """A plain-text table of ``rows`` restricted to ``cols``."""
    def fmt(v: Any) -> str:
        return f"{v:.2f}" if isinstance(v, float) else str(v)

    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    lines = ["  ".join(c.rjust(w) for c, w in zip(cols, widths))]
    lines += ["  ".join(x.rjust(w) for x, w in zip(row, widths)) for row in cells]
    return "\n".join(lines)
