"""The ``cairn`` command: inspect and extract datasets.

    cairn ls PATH [--blocks] [--verify]
    cairn pack SET_DIR -o OUT [--group-size 32 --scheme auto --parity 1] | --compare
    cairn unpack OUT -o RESTORED [--member NAME]
    cairn get PATH VAR --step N [--box 0:10,:,5] [-o out.npy]
    cairn export PATH -o OUT.zarr|OUT.nc|OUT.h5 [--steps 0:10] [--vars a,b] [--cluster FILE]
    [mpirun -n N] cairn skel APP.yaml|qmcpack|s3d [--engine file|staging|adios2] [--trace-flush N]
    cairn model RUNS.json... [--procs 16384,65536] [--mttf 6h] [--png model.png]
    cairn cohmm --out DIR [--nx 128 --ny 128 --steps 20 --mode database|runtime --store staging|redis
                [--store-url URL] --engine dask|process --workers 2 --no-kriging --flux analytic|md --plot]
    cairn serve --cluster cluster.json [--id N --servers S --memory 4GiB]
    cairn cluster start --servers 4 [--spares 1] [--topology FILE] [--memory 4GiB] [--file cluster.json]
    cairn cluster status [--objects] [--file cluster.json]
    cairn cluster stop [--file cluster.json]
    cairn chaos --cluster cluster.json --mtbf 18s --duration 150s --kill server|node [--workload] [--json OUT]
    cairn --version
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from . import __version__, chaos, cluster_cli, cohmm_cli, export_cli, model_cli, pack_cli, skel_cli
from ._api import Reader
from ._api import open as cairn_open
from .exceptions import CairnError, InvalidArgumentError

#: Reads larger than this are done in slabs with a progress bar.
_SLAB_BYTES = 64 << 20


def _open_path(path: str) -> Reader:
    path = os.path.abspath(path.rstrip("/"))
    reader = cairn_open(os.path.basename(path), "r", engine="file", path=os.path.dirname(path))
    assert isinstance(reader, Reader)
    return reader


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.6g}"


def cmd_ls(args: argparse.Namespace) -> None:
    if pack_cli.is_packed(args.path):
        pack_cli.ls(args.path, verify=args.verify)
        return
    f = _open_path(args.path)
    steps = f.steps()
    span = f"{len(steps)} committed: {steps[0]}..{steps[-1]}" if steps else "none committed"
    print(f"dataset {args.path}\nsteps   {span}")
    variables = f.variables()
    print(f"\n{'variable':<20} {'dtype':<8} {'shape':<24} {'blocks':>6} {'stored':>12} {'ratio':>7}  codec (last step)")
    raw = stored = 0
    for name, v in variables.items():
        shape = "local" if v.local else "x".join(map(str, v.shape))
        blocks = f.blocks(name, steps[-1]) if steps else []
        n, k = sum(b.nbytes for b in blocks), sum(b.stored for b in blocks)
        raw, stored = raw + n, stored + k
        codecs = sorted({b.codec.split(":")[0] if b.codec else "raw" for b in blocks})
        print(f"{name:<20} {v.dtype.str[1:]:<8} {shape:<24} {len(blocks):>6} {k / 1e6:>9.2f} MB {n / max(k, 1):>7.2f}  {'/'.join(codecs)}")
    if raw:
        print(f"{'total':<55} {stored / 1e6:>9.2f} MB {raw / max(stored, 1):>7.2f}")
    shown = steps if args.blocks else steps[-1:]
    for s in shown:
        print(f"\nstep {s}")
        print(f"  {'variable':<18} {'writer':>6} {'offset':<18} {'count':<18} {'min':>12} {'max':>12} {'mean':>12}")
        for name in variables:
            try:
                blocks = f.blocks(name, s)
            except KeyError:
                continue
            for b in blocks:
                print(f"  {name:<18} {b.writer:>6} {str(b.offset):<18} {str(b.count):<18} "
                      f"{_fmt(b.min):>12} {_fmt(b.max):>12} {_fmt(b.mean):>12}")


def parse_box(text: str, shape: tuple[int, ...]) -> tuple[list[int], list[int]]:
    """``"0:10,:,5"`` -> (offset, count) against ``shape``; Python slice syntax without steps."""
    parts = text.split(",")
    if len(parts) != len(shape):
        raise InvalidArgumentError(f"--box {text!r} has {len(parts)} dimensions; the variable has {len(shape)} {shape}")
    offset, count = [], []
    for p, n in zip(parts, shape):
        lo, _, hi = p.partition(":")
        a = int(lo) if lo.strip() else 0
        b = (int(hi) if hi.strip() else n) if ":" in p else a + 1
        if not 0 <= a < b <= n:
            raise InvalidArgumentError(f"--box part {p!r} is empty or outside 0..{n}")
        offset.append(a)
        count.append(b - a)
    return offset, count


def cmd_get(args: argparse.Namespace) -> None:
    from tqdm import tqdm

    f = _open_path(args.path)
    info = f.variables().get(args.var)
    if info is None:
        raise InvalidArgumentError(f"unknown variable {args.var!r}; `cairn ls {args.path}` lists them")
    if info.local:
        out = f.get_local(args.var, args.step, args.writer)
    else:
        offset, count = parse_box(args.box, info.shape) if args.box else ([0] * len(info.shape), list(info.shape))
        out = np.empty(count, dtype=info.dtype)
        row = max(1, out.nbytes // max(1, count[0]) if count and count[0] else 1)
        rows = max(1, _SLAB_BYTES // row)
        slabs = range(0, count[0], rows) if count else [0]
        show = out.nbytes > _SLAB_BYTES
        for r0 in tqdm(slabs, desc=f"reading {args.var}", unit="slab", disable=not show):
            n = min(rows, count[0] - r0) if count else 0
            if count:
                f.get(args.var, args.step, [offset[0] + r0, *offset[1:]], [n, *count[1:]], out=out[r0:r0 + n])
            else:
                f.get(args.var, args.step, [], [], out=out)
    if args.output:
        np.save(args.output, out)
        print(f"wrote {args.output}: {out.shape} {out.dtype}")
    else:
        with np.printoptions(threshold=200, edgeitems=3):
            print(out)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="cairn", description="Cairn: staging and checkpoint/restart for n-D arrays")
    p.add_argument("--version", action="version", version=f"cairn {__version__}")
    sub = p.add_subparsers(dest="cmd", required=True)
    ls = sub.add_parser("ls", help="list variables, steps, blocks and statistics of a dataset, or packed containers")
    ls.add_argument("path", help="dataset directory (the [file] path joined with the dataset name), or a pack folder")
    ls.add_argument("--blocks", action="store_true", help="show the blocks of every step, not only the last")
    ls.add_argument("--verify", action="store_true", help="packed containers: read and check every frame, report damage "
                                                          "and whether parity can repair it")
    ls.set_defaults(func=cmd_ls)
    get = sub.add_parser("get", help="read a box of a variable and print it or save it as .npy")
    get.add_argument("path")
    get.add_argument("var")
    get.add_argument("--step", type=int, required=True)
    get.add_argument("--box", help="box in slice syntax, e.g. 0:10,:,5 (default: the whole array)")
    get.add_argument("--writer", type=int, default=0, help="writer rank, for a local variable")
    get.add_argument("-o", "--output", help="write a .npy file instead of printing")
    get.set_defaults(func=cmd_get)
    export_cli.add(sub)
    pack_cli.add(sub)
    skel_cli.add(sub)
    model_cli.add(sub)
    cohmm_cli.add(sub)
    cluster_cli.add(sub)
    chaos.add(sub)
    args = p.parse_args(argv)
    try:
        args.func(args)
    except CairnError as e:
        print(f"cairn: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
