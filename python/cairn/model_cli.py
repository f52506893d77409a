"""`cairn model`: fit checkpoint time from skel or real runs and predict checkpointing's share of
time on larger machines (the paper's Table II and Fig. 6)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Sequence

from . import model as M
from .exceptions import InvalidArgumentError
from .skel.report import need_matplotlib


def _t(s: float) -> str:
    if s >= 3600:
        return f"{s / 3600:.3g} h"
    if s >= 60:
        return f"{s / 60:.3g} min"
    return f"{s:.3g} s"


def table(rows: Sequence[dict[str, Any]]) -> str:
    """Table II (predicted checkpoint time per platform) with Fig. 6's shares per tactic."""
    head = (f"{'platform':<22} {'procs':>7} {'MTTF':>8} {'ckpt time':>10} {'preventive':>18} {'proactive':>16} "
            f"{'Young/Daly':>20} {'waste at Y/D':>13}")
    out = [head, "-" * len(head)]
    for r in rows:
        out.append(
            f"{r['platform']:<22} {r['procs']:>7} {_t(r['mttf_s']):>8} {_t(r['checkpoint_s']):>10} "
            f"{_t(r['preventive_every_s']) + ': ' + format(r['preventive_pct'], '.2f') + '%':>18} "
            f"{_t(r['proactive_every_s']) + ': ' + format(r['proactive_pct'], '.1f') + '%':>16} "
            f"{_t(r['young_daly_s']) + ': ' + format(r['young_daly_pct'], '.2f') + '%':>20} "
            f"{r['young_daly_waste_pct']:>12.2f}%")
    return "\n".join(out)


def draw(samples: Sequence[M.Sample], f: M.Fit, rows: Sequence[dict[str, Any]], path: Path) -> Path:
    """Left: samples, the fitted law and its extrapolation. Right: Fig. 6, execution vs
    checkpointing per platform and tactic."""
    need_matplotlib("or leave out --png")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, (a, b) = plt.subplots(1, 2, figsize=(12, 4.5))
    a.scatter([s.procs for s in samples], [s.seconds for s in samples], s=10, alpha=0.5, label="samples")
    top = max([s.procs for s in samples] + [r["procs"] for r in rows])
    xs = np.geomspace(max(1, min(s.procs for s in samples)), top * 1.2, 200)
    a.plot(xs, [f.predict(x) for x in xs], "r-", label=f.law())
    a.scatter([r["procs"] for r in rows], [r["checkpoint_s"] for r in rows], marker="*", s=120, c="k", zorder=3,
              label="predicted")
    a.set_xscale("log")
    a.set_yscale("log")
    a.set_xlabel("processes")
    a.set_ylabel("checkpoint time (s)")
    a.set_title(f"fit: R² = {f.r2:.3f} over {f.n} samples")
    a.legend(fontsize=7)
    labels, ckpt = [], []
    for r in rows:
        for tactic in ("preventive", "proactive", "young_daly"):
            labels.append(f"{r['platform']}\n{tactic.replace('_', '/')}")
            ckpt.append(r[f"{tactic}_pct"])
    x = np.arange(len(labels))
    b.bar(x, [100 - c for c in ckpt], label="execution", color="tab:green")
    b.bar(x, ckpt, bottom=[100 - c for c in ckpt], label="checkpoint I/O", color="tab:red")
    for i, c in enumerate(ckpt):
        b.text(i, min(100 - c, 92) + 2, f"{c:.1f}%", ha="center", fontsize=7)
    b.set_xticks(x, labels, fontsize=6, rotation=60, ha="right")
    b.set_ylabel("% of wall time")
    b.set_title("predicted share of time (Fig. 6)")
    b.set_ylim(0, 118)
    b.legend(fontsize=7, loc="upper center", ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def cmd_model(args: argparse.Namespace) -> None:
    samples = M.load_samples(args.runs)
    f = M.fit(samples, with_size=args.with_size)
    platforms = [M.platform(p) for p in args.platform] if args.platform else list(M.PAPER_PLATFORMS)
    if args.mttf:
        platforms = [M.Platform(p.name, p.procs, M.duration(args.mttf), p.preventive_s, p.proactive_s) for p in platforms]
    if args.procs:
        try:
            counts = [int(x) for x in args.procs.split(",")]
        except ValueError:
            raise InvalidArgumentError(f"--procs {args.procs!r}: a comma-separated list of process counts") from None
        base = platforms[0]
        platforms = [M.Platform(f"{n} procs", n, base.mttf_s, base.preventive_s, base.proactive_s) for n in counts]
    rows = M.predict(f, platforms)
    lo, hi = f.procs_range
    print(f"{f.n} samples at {lo}..{hi} processes: {f.law()}   (R² {f.r2:.4f}, residual sd {f.residual_s:.3g} s)")
    print()
    print(table(rows))
    far = [r for r in rows if r["procs"] > 10 * hi]
    if far:
        print(f"\nnote: {len(far)} prediction(s) extrapolate more than 10x beyond the largest sample ({hi} processes)")
    if args.json:
        Path(args.json).write_text(json.dumps({"fit": f.__dict__, "predictions": rows}, indent=1) + "\n")
        print(f"wrote {args.json}")
    if args.png:
        print(f"wrote {draw(samples, f, rows, Path(args.png))}")


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("model", help="fit checkpoint time vs processes from skel/real runs; predict checkpointing's share of time",
                       description="Fits time = a + b*procs (+ c*bytes) by least squares over the checkpoint steps of "
                                   "`cairn skel` reports or CSV files (procs,seconds[,bytes]), extrapolates to the "
                                   "platforms, and prints the share of time spent checkpointing under preventive and "
                                   "proactive tactics and at the Young/Daly optimal interval. Default platforms: the "
                                   "paper's Titan (16K) and extreme-scale (64K) configurations.")
    p.add_argument("runs", nargs="+", help="cairn skel reports (.json) or CSV files")
    p.add_argument("--with-size", action="store_true", help="also regress on checkpoint bytes (weak scaling: bytes grow with procs)")
    p.add_argument("--platform", action="append", metavar="NAME:PROCS:MTTF:PREVENTIVE:PROACTIVE",
                   help="a platform to predict for, e.g. mine:4096:12h:30min:10s (repeatable)")
    p.add_argument("--procs", help="predict for these process counts (comma-separated), with the first platform's MTTF and tactics")
    p.add_argument("--mttf", help="override every platform's MTTF, e.g. 6h")
    p.add_argument("--png", help="draw the fit and the predicted shares (Fig. 6) to this PNG")
    p.add_argument("--json", help="write the fit and predictions as JSON")
    p.set_defaults(func=cmd_model)
