"""``cairn export DATASET -o OUT.zarr|OUT.nc|OUT.h5``: see :mod:`cairn.export`."""

from __future__ import annotations

import argparse

from .exceptions import InvalidArgumentError
from .export import export
from .locate import open_reader


def parse_steps(text: str | None, committed: list[int]) -> list[int]:
    """The committed steps ``--steps`` selects: ``A:B[:S]`` (step numbers, B excluded; either end
    may be left out) or one number; all without the option."""
    if text is None:
        return committed
    parts = text.split(":")
    try:
        nums = [int(p) if p.strip() else None for p in parts]
    except ValueError:
        nums = []
    if not 1 <= len(nums) <= 3 or any(n is not None and n < 0 for n in nums) or (len(nums) == 1 and nums[0] is None):
        raise InvalidArgumentError(f"--steps {text!r}: give step numbers A:B (B excluded), A:B:S or one step N, e.g. 0:10")
    lo = nums[0] or 0
    hi = lo + 1 if len(nums) == 1 else nums[1]
    stride = (nums[2] if len(nums) == 3 else None) or 1
    chosen = [s for s in committed if s >= lo and (hi is None or s < hi) and (s - lo) % stride == 0]
    if not chosen:
        span = f"{committed[0]}..{committed[-1]}" if committed else "none"
        raise InvalidArgumentError(f"--steps {text!r} selects no committed step (committed: {span})")
    return chosen


def cmd_export(args: argparse.Namespace) -> None:
    reader = open_reader(args.dataset, args.cluster)
    steps = parse_steps(args.steps, reader.steps())
    names = [n.strip() for n in args.vars.split(",") if n.strip()] if args.vars else None
    p = export(reader, args.output, steps, names, force=args.force, source=args.dataset, record_dim=args.record_dim,
               compress=args.compress)
    along = f", record dimension {p.record} (step an auxiliary coordinate)" if p.record != "step" else ""
    print(f"wrote {args.output}: {len(p.dims)} variables ({', '.join(p.dims)}), {len(p.steps)} steps "
          f"{p.steps[0]}..{p.steps[-1]}{along}")
    if p.added:
        print(f"with the coordinates the chosen variables use: {', '.join(p.added)}")
    if p.skipped:
        print(f"left out local variables (ragged, per writer): {', '.join(p.skipped)}; read them with `cairn get --writer`")


def add(sub: argparse._SubParsersAction) -> None:
    e = sub.add_parser("export", help="write a dataset to Zarr v3 (.zarr), netCDF-4 (.nc) or HDF5 (.h5) with dims, "
                                      "attributes and a step dimension")
    e.add_argument("dataset", help="dataset folder (the [file] path joined with the name), or with --cluster a staging dataset's name")
    e.add_argument("-o", "--output", required=True, help="output; its suffix picks the format: .zarr (zarr-python), "
                                                         ".nc (netCDF4-python) or .h5 (h5py)")
    e.add_argument("--steps", default=None, help="steps to export: A:B (B excluded), A:B:S or N; default: every committed step")
    e.add_argument("--vars", default=None, help="comma-separated variables to export, with the coordinates they use "
                                                "(as ncks -v); default: every global variable")
    e.add_argument("--record-dim", choices=("time", "step"), default=None,
                   help="the record (unlimited) dimension: time (a per-step scalar with axis T and units '... since "
                        "...' as the record coordinate time(time), step(time) beside it: what CDO and NCO read) or step "
                        "(step(step), time(step) beside it: the xarray backend's layout); default: time for .nc and .h5 "
                        "when there is such a variable, else step")
    e.add_argument("--compress", default=None, metavar="CODEC",
                   help="zlib[:LEVEL] (1-9, default 4) for .nc and .h5; zstd[:LEVEL] (1-22, default 3) or "
                        "blosc:zstd[:LEVEL] (1-9, default 5) for .zarr; none. Default: none for .nc and .h5, "
                        "zarr-python's zstd for .zarr")
    e.add_argument("--cluster", default=None, help="cluster file of the staging cluster holding the dataset; default: a file engine folder")
    e.add_argument("--force", action="store_true", help="replace OUT if it exists")
    e.set_defaults(func=cmd_export)
