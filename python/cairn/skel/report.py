"""What `cairn skel` prints and saves: a summary, a per-step table, JSON, and a PNG of the
per-step times and the size models' traces (e.g. walkers per rank)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from ..exceptions import ConfigError


def need_matplotlib(otherwise: str) -> Any:
    """The ``matplotlib`` module (Agg backend), or a clear error naming the install or ``otherwise``."""
    try:
        import matplotlib
    except ImportError:
        raise ConfigError(f"drawing the PNG needs matplotlib: pip install matplotlib (or cairn[skel]), {otherwise}") from None
    matplotlib.use("Agg")
    return matplotlib


def summary(r: dict[str, Any]) -> str:
    lines = [
        f"{r['app']} on {r['engine']}: {r['ranks']} ranks, {r['steps']} steps, traces flushed every {r['trace_flush']}, "
        f"checkpoint every {r['checkpoint_every'] or '-'}",
        f"  wrote {r['bytes'] / 1e6:,.1f} MB in {r['wall_s']:.2f} s (compute {r['compute_s']:.2f} s)",
        f"  I/O overhead {r['overhead_pct']:.2f}% of wall time  (traces {r['trace_overhead_pct']:.2f}%, "
        f"checkpoints {r['checkpoint_overhead_pct']:.2f}%)",
        f"  read back every step in {r['read_s']:.3f} s",
    ]
    return "\n".join(lines)


def step_table(r: dict[str, Any], limit: int = 12) -> str:
    rows = r["per_step"]
    if len(rows) > limit:
        rows = rows[: limit // 2] + [None] + rows[-limit // 2:]
    head = f"{'step':>6} {'write ms':>9} {'ckpt ms':>8} {'trace ms':>9} {'read ms':>8} {'MB':>9}"
    out = [head]
    for x in rows:
        if x is None:
            out.append(f"{'...':>6}")
            continue
        out.append(f"{x['step']:>6} {1e3 * x['write_s']:>9.2f} {1e3 * x['checkpoint_s']:>8.2f} {1e3 * x['trace_s']:>9.2f} "
                   f"{1e3 * x['read_s']:>8.2f} {x['bytes'] / 1e6:>9.3f}")
    return "\n".join(out)


def save(r: dict[str, Any], out: Path, plot: bool = True) -> list[Path]:
    """Writes ``<out>/<app>-<engine>.json`` and, with ``plot``, the PNG beside it."""
    out.mkdir(parents=True, exist_ok=True)
    stem = out / f"{r['app']}-{r['engine']}-flush{r['trace_flush']}"
    paths = [stem.with_suffix(".json")]
    paths[0].write_text(json.dumps(r, indent=1) + "\n")
    if plot:
        paths.append(draw(r, stem.with_suffix(".png")))
    return paths


def draw(r: dict[str, Any], path: Path) -> Path:
    need_matplotlib("or pass --no-plot")
    import matplotlib.pyplot as plt

    n_plots = 1 + bool(r["sizes"])
    fig, axes = plt.subplots(n_plots, 1, figsize=(8, 3.2 * n_plots), squeeze=False)
    ax = axes[0][0]
    steps = [x["step"] for x in r["per_step"]]
    ax.plot(steps, [1e3 * x["write_s"] for x in r["per_step"]], label="write")
    ax.plot(steps, [1e3 * x["read_s"] for x in r["per_step"]], label="read")
    ax.set_xlabel("step")
    ax.set_ylabel("ms (slowest rank)")
    ax.set_title(f"{r['app']} on {r['engine']}, {r['ranks']} ranks: I/O {r['overhead_pct']:.1f}% of wall time")
    ax.legend()
    if r["sizes"]:
        ax = axes[1][0]
        for name, per_rank in r["sizes"].items():
            for rank, counts in enumerate(per_rank):
                ax.plot(range(len(counts)), counts, label=f"{name}, rank {rank}", lw=1)
        ax.set_xlabel("step")
        ax.set_ylabel("records per rank")
        ax.set_title("size model trace")
        if sum(len(v) for v in r["sizes"].values()) <= 8:
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
