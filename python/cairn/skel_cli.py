"""`cairn skel`: replay an application's I/O from its descriptor (run it under mpirun for ranks)."""

from __future__ import annotations

import argparse
from pathlib import Path

from . import skel
from .exceptions import InvalidArgumentError
from .skel import report
from .skel.descriptor import need_yaml
from .skel.replay import mpi_comm

ENGINES = ("config", "file", "staging", "adios2")


def cmd_skel(args: argparse.Namespace) -> None:
    if args.list or not args.app:
        yaml = need_yaml()
        for name, path in skel.shipped().items():
            print(f"{name:<10} {yaml.safe_load(path.read_text()).get('description', '')}  ({path})")
        return
    sets = {}
    for kv in args.set or []:
        k, eq, v = kv.partition("=")
        if not eq or not k:
            raise InvalidArgumentError(f"--set {kv!r}: write KEY=VALUE (a top-level key such as steps, or a param)")
        sets[k] = v
    if args.steps is not None:
        sets["steps"] = str(args.steps)
    app = skel.load(args.app, sets)
    overrides = {} if args.engine in ("config", "adios2") else {"engine": args.engine}
    if args.engine == "file" and not args.config:
        overrides["path"] = str(Path(args.out) / "data")
    opts = skel.Options(engine="adios2" if args.engine == "adios2" else "cairn", config=args.config, overrides=overrides,
                        trace_flush=args.trace_flush, out=args.out, seed=args.seed, read=not args.no_read, progress=True)
    comm = mpi_comm()
    r = skel.run(app, opts, comm)
    if r is None:
        return
    print(report.summary(r))
    print()
    print(report.step_table(r))
    for p in report.save(r, Path(args.out), plot=not args.no_plot):
        print(f"wrote {p}")


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("skel", help="replay an application's I/O from a YAML descriptor (mpirun -n N cairn skel APP.yaml)",
                       description="Replays the I/O an application descriptor describes, without its computation, and "
                                   "reports per-step write/read times, the I/O overhead and the size models' traces.")
    p.add_argument("app", nargs="?", help="descriptor YAML, or a shipped app: qmcpack, s3d")
    p.add_argument("--list", action="store_true", help="list the shipped descriptors")
    p.add_argument("--engine", choices=ENGINES, default="config",
                   help="config: the engine cairn.toml names (default); file or staging: override it; adios2: the BP5 baseline")
    p.add_argument("--config", help="cairn.toml to use (else $CAIRN_CONFIG, ./cairn.toml, defaults)")
    p.add_argument("--trace-flush", type=int, default=1, help="write trace records every N steps as one write (default 1)")
    p.add_argument("--steps", type=int, help="steps to replay (overrides the descriptor)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE", help="override a descriptor key or param, e.g. electrons=144")
    p.add_argument("--seed", type=int, default=0, help="seed of the size models and data (runs are reproducible)")
    p.add_argument("--out", default="skel-out", help="folder for the report (JSON, PNG) and file-engine data")
    p.add_argument("--no-read", action="store_true", help="skip reading the steps back")
    p.add_argument("--no-plot", action="store_true", help="skip the PNG")
    p.set_defaults(func=cmd_skel)
