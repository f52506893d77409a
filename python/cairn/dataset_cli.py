"""``cairn ls`` and ``cairn get``: inspect datasets (file engine folders, or staging datasets with
``--cluster``) and read boxes of them."""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from . import pack_cli
from ._check import U64, int_arg, output_folder
from ._api import Reader
from .exceptions import InvalidArgumentError, NotFoundError
from .locate import configured, open_reader

#: Reads larger than this are done in slabs with a progress bar.
_SLAB_BYTES = 64 << 20


def _fmt(v: float | None) -> str:
    return "-" if v is None else f"{v:.6g}"


def _size(n: float) -> str:
    """Bytes with the binary unit that fits: ``512 B``, ``3.2 KiB``, ``48.0 MiB``."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TiB"


def steps_text(steps: list[int], most: int = 12) -> str:
    """The steps exactly: runs of consecutive steps as ``a..b``, the rest listed (``0, 2, 4``);
    past ``most`` parts, the first and last few."""
    parts: list[str] = []
    i = 0
    while i < len(steps):
        j = i
        while j + 1 < len(steps) and steps[j + 1] == steps[j] + 1:
            j += 1
        parts.append(str(steps[i]) if i == j else f"{steps[i]}..{steps[j]}")
        i = j + 1
    if len(parts) > most:
        parts = parts[: most // 2] + ["..."] + parts[-most // 2:]
    return ", ".join(parts)


def _span(steps: list[int]) -> str:
    return f"{len(steps)} committed: {steps_text(steps)}" if steps else "none committed"


def _pending(f: Reader) -> str:
    return "; ".join(f"step {s} pending ({ended} of {of} ranks ended it)" for s, ended, of in f.pending())


def datasets_in(folder: str) -> list[str]:
    """Names of the datasets directly inside ``folder`` (a ``[file] path``)."""
    if not os.path.isdir(folder):
        return []
    return sorted(n for n in os.listdir(folder) if os.path.isdir(os.path.join(folder, n, "steps")))


def ls_folder(folder: str, names: list[str], cluster: str | None = None) -> None:
    """One line per dataset of ``names``: in ``folder``, or in the staging cluster of cluster
    file ``cluster``."""
    print(f"{len(names)} datasets in {folder}\n\n{'dataset':<24} {'variables':>9}  steps")
    for n in names:
        f = open_reader(n, cluster) if cluster else open_reader(os.path.join(folder, n))
        pending = _pending(f)
        print(f"{n:<24} {len(f.variables()):>9}  {_span(f.steps())}{'; ' + pending if pending else ''}")


def ls_cluster(file: str) -> None:
    """The datasets of the staging cluster of cluster file ``file``, one line each."""
    from . import cluster
    from .cluster_status import dataset_names

    names = dataset_names(file, cluster.status(file, timeout=5.0))
    if not names:
        print(f"0 datasets in {file}")
        return
    ls_folder(file, names, file)


def cmd_ls(args: argparse.Namespace) -> None:
    if args.path is None:
        if args.cluster is None:
            raise InvalidArgumentError("give a dataset or folder to list, or --cluster FILE to list a staging cluster's datasets")
        ls_cluster(args.cluster)
        return
    if args.cluster is None and pack_cli.is_packed(args.path):
        pack_cli.ls(args.path, verify=args.verify)
        return
    named = args.cluster is None and not os.path.isdir(os.path.join(args.path, "steps"))
    if named and os.path.isdir(args.path):
        names = datasets_in(args.path)
        if not names:
            raise NotFoundError(f"no dataset or pack containers at {args.path}; give a dataset folder (the [file] path "
                                "joined with the name), a folder of datasets, or a staging dataset's name with --cluster")
        ls_folder(args.path, names)
        return
    if named and configured() is None:
        raise NotFoundError(f"no dataset {args.path}: no such folder, and no cairn.toml (or $CAIRN_CONFIG) names an engine "
                            "to find it by name; give a dataset folder, or a staging dataset's name with --cluster")
    f = open_reader(args.path, args.cluster)
    steps = f.steps()
    if not steps and not f.variables() and not f.pending():
        raise NotFoundError(f"no dataset {args.path}: nothing was ever committed under that name"
                            f"{' in ' + args.cluster if args.cluster else ''}")
    print(f"dataset {args.path}\nsteps   {_span(steps)}")
    pending = _pending(f)
    if pending:
        print(f"pending {pending}")
    if f.attrs:
        print(f"attrs   {json.dumps(f.attrs, default=_json_default)}")
    variables = f.variables()
    print(f"\n{'variable':<20} {'dtype':<8} {'shape':<24} {'blocks':>6} {'stored':>11} {'ratio':>7}  codec (last step)")
    raw = stored = 0
    for name, v in variables.items():
        shape = "local" if v.local else "x".join(map(str, v.shape or ()))
        if v.dims:
            shape += f" ({', '.join(v.dims)})"
        try:
            blocks = f.blocks(name, steps[-1]) if steps else []
        except NotFoundError:  # not defined in the last step
            blocks = []
        n, k = sum(b.nbytes for b in blocks), sum(b.stored for b in blocks)
        raw, stored = raw + n, stored + k
        codecs = sorted({b.codec.split(":")[0] if b.codec else "raw" for b in blocks})
        print(f"{name:<20} {v.dtype.str[1:]:<8} {shape:<24} {len(blocks):>6} {_size(k):>11} {n / max(k, 1):>7.2f}  {'/'.join(codecs)}")
        if v.attrs:
            print(f"{'':<20} attrs {json.dumps(v.attrs, default=_json_default)}")
    if raw:
        print(f"{'total':<55} {_size(stored):>11} {raw / max(stored, 1):>7.2f}")
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


def _json_default(v: object) -> object:
    """numpy values in attributes, as JSON numbers and lists."""
    return v.tolist() if isinstance(v, (np.ndarray, np.generic)) else str(v)


def parse_box(text: str, shape: tuple[int, ...]) -> tuple[int | slice, ...]:
    """``"0:10,:,-1"`` or ``"::2,:,5"`` -> numpy basic indexing against ``shape``: integers and
    slices, negative ones counting from the end; bounds past the shape are refused, not clipped."""
    parts = text.split(",")
    if len(parts) != len(shape):
        raise InvalidArgumentError(f"--box {text!r} has {len(parts)} dimensions; the variable has {len(shape)} {shape}")
    key: list[int | slice] = []
    for p, n in zip(parts, shape):
        try:
            nums = [int(x) if x.strip() else None for x in p.split(":")]
        except ValueError:
            nums = []
        if not 1 <= len(nums) <= 3 or (len(nums) == 1 and nums[0] is None) or (len(nums) == 3 and nums[2] == 0):
            raise InvalidArgumentError(f"--box part {p!r} is not an index: use integers and slices, e.g. 0:10, -1, ::2 or :")
        if len(nums) == 1:
            if not -n <= nums[0] < n:  # type: ignore[operator]
                raise InvalidArgumentError(f"--box part {p!r} is outside 0..{n}")
            key.append(nums[0] % n)  # type: ignore[operator]
            continue
        if any(b is not None and not -n <= b <= n for b in nums[:2]):
            raise InvalidArgumentError(f"--box part {p!r} is empty or outside 0..{n}")
        s = slice(*nums)
        if len(range(*s.indices(n))) == 0:
            raise InvalidArgumentError(f"--box part {p!r} is empty or outside 0..{n}")
        key.append(s)
    return tuple(key)


def _get_local(f: Reader, var: str, step: int, writer: int | None) -> np.ndarray:
    if writer is None:
        writers = sorted({b.writer for b in f.blocks(var, step)})
        raise InvalidArgumentError(f"'{var}' is a local variable (one block per writer): give --writer R; writers with a "
                                   f"block at step {step}: {', '.join(map(str, writers)) or 'none'}")
    return f.get_local(var, step, writer)


def _read_slabs(f: Reader, var: str, step: int, key: tuple[int | slice, ...], shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """The selection ``key`` of ``var`` at ``step``, read in slabs along its first sliced axis with a
    progress bar when it is large (each slab reads only its own bounding box)."""
    from tqdm import tqdm

    from .variable import normalize, selected_shape

    full = normalize(key, shape)
    out = np.empty(selected_shape(full), dtype=dtype)
    axis = next((i for i, k in enumerate(full) if isinstance(k, slice)), None)
    v = f[var]
    if axis is None or out.nbytes <= _SLAB_BYTES:
        out[...] = v[(step, *full)]
        return out
    picked = full[axis]
    assert isinstance(picked, range)
    rows = max(1, _SLAB_BYTES * len(picked) // out.nbytes)
    out_axis = sum(isinstance(k, slice) for k in full[:axis])
    for r0 in tqdm(range(0, len(picked), rows), desc=f"reading {var}", unit="slab"):
        sub = picked[r0:r0 + rows]
        dest = (slice(None),) * out_axis + (slice(r0, r0 + len(sub)),)
        out[dest] = v[(step, *full[:axis], sub, *full[axis + 1:])]
    return out


def cmd_get(args: argparse.Namespace) -> None:
    output_folder(args.output, "-o")
    f = open_reader(args.path, args.cluster)
    info = f.variables().get(args.var)
    if info is None:
        raise InvalidArgumentError(f"unknown variable {args.var!r}; `cairn ls {args.path}` lists them")
    step = f[args.var].step_of(args.step)
    if info.local:
        out = _get_local(f, args.var, step, args.writer)
    else:
        shape = info.shape or ()
        key = parse_box(args.box, shape) if args.box else (slice(None),) * len(shape)
        out = _read_slabs(f, args.var, step, key, shape, info.dtype)
    if args.output:
        np.save(args.output, out)
        print(f"wrote {args.output}: {out.shape} {out.dtype} (step {step})")
    else:
        with np.printoptions(threshold=200, edgeitems=3):
            print(out)


def cmd_rm(args: argparse.Namespace) -> None:
    """Removes a dataset: its folder (file engine), or every committed step of it in the cluster
    (staging), whose drained copy on disk is named and kept unless ``--all``."""
    import shutil

    from . import cluster as cluster_mod

    path = args.path.rstrip("/")
    if args.from_step is not None:
        _rm_from(path, args)
        return
    if args.cluster is None and os.path.isdir(os.path.join(path, "steps")):
        n = len(open_reader(path).steps())
        shutil.rmtree(path)
        print(f"removed dataset {path} ({n} committed steps)")
        return
    if args.cluster is None and configured() is None:
        raise NotFoundError(f"no dataset {path}: no such folder; give a dataset folder, or a staging dataset's name with --cluster")
    f = open_reader(path, args.cluster)
    # One control-plane command: steps, queue, readers, claims, released steps and the drained
    # mark go together, so the name behaves as one never used.
    gone = f._inner.remove()
    print(f"removed dataset {os.path.basename(path)} from the cluster ({gone} committed steps released)")
    drain = cluster_mod.document(args.cluster).get("drain") if args.cluster else None
    copy = os.path.join(drain["path"], os.path.basename(path)) if drain else None
    if copy and os.path.isdir(copy):
        if args.all:
            shutil.rmtree(copy)
            print(f"removed its drained copy {copy}")
        else:
            print(f"its drained copy {copy} is kept (`cairn rm --all` removes it too)")


def _rm_from(path: str, args: argparse.Namespace) -> None:
    """Discards the committed steps from ``--from-step`` on, on every level (``cairn.open(name,
    "a", from_step=N)`` from the shell)."""
    if args.all:
        raise InvalidArgumentError("--all goes with removing a dataset whole; --from-step discards the drained copies of "
                                   "those steps anyway")
    if args.cluster is None and not os.path.isdir(os.path.join(path, "steps")) and configured() is None:
        raise NotFoundError(f"no dataset {path}: no such folder; give a dataset folder, or a staging dataset's name with --cluster")
    f = open_reader(path, args.cluster)
    before = f.steps()
    gone = f._inner.discard_from(args.from_step)
    kept = [s for s in before if s < args.from_step]
    where = "in the cluster and its drain" if args.cluster else ""
    print(f"discarded the steps of {os.path.basename(path)} from {args.from_step} on {where}".rstrip()
          + f" ({gone} committed steps); it continues at step {args.from_step}"
          + (f", the newest kept is {kept[-1]}" if kept else ", no step is kept"))


def add(sub: argparse._SubParsersAction) -> None:
    ls = sub.add_parser("ls", help="list variables, steps, blocks and statistics of a dataset, the datasets of a folder "
                                   "or of a staging cluster, or packed containers")
    ls.add_argument("path", nargs="?", help="dataset folder (the [file] path joined with the name), a folder of datasets, a "
                                            "pack folder, or with --cluster a staging dataset's name (none: every dataset "
                                            "of the --cluster, one line each)")
    ls.add_argument("--cluster", metavar="FILE", help="cluster file of the staging cluster holding the dataset(s)")
    ls.add_argument("--blocks", action="store_true", help="show the blocks of every step, not only the last")
    ls.add_argument("--verify", action="store_true", help="packed containers: read and check every frame, report damage "
                                                          "and whether parity can repair it")
    ls.set_defaults(func=cmd_ls)
    get = sub.add_parser("get", help="read a box of a variable and print it or save it as .npy")
    get.add_argument("path", help="dataset folder (the [file] path joined with the name), or with --cluster a staging dataset's name")
    get.add_argument("var", help="variable name (`cairn ls` lists them)")
    get.add_argument("--step", type=int, required=True, help="step number; negative counts back from the last committed step (-1: the last)")
    get.add_argument("--box", help="numpy-style index per dimension, e.g. 0:10,:,5 or -1,::2,: (default: the whole array)")
    get.add_argument("--writer", type=int, help="writer rank whose block of a local variable to read (required for local variables)")
    get.add_argument("-o", "--output", help="write a .npy file instead of printing (its folder must exist)")
    get.add_argument("--cluster", metavar="FILE", help="cluster file of the staging cluster holding the dataset")
    get.set_defaults(func=cmd_get)
    rm = sub.add_parser("rm", help="remove a dataset: its folder (file engine), or its steps in a staging cluster "
                                   "(a drained copy on disk is kept unless --all)")
    rm.add_argument("path", help="dataset folder, or with --cluster a staging dataset's name")
    rm.add_argument("--cluster", metavar="FILE", help="cluster file of the staging cluster holding the dataset")
    rm.add_argument("--all", action="store_true", help="also remove the copy the cluster drained to disk")
    rm.add_argument("--from-step", type=int_arg(0, U64, "step"), metavar="N", help="discard only the committed steps from N on (memory "
                    "and drained copies), to restart from an older step: `cairn.open(NAME, 'a', from_step=N)`")
    rm.set_defaults(func=cmd_rm)
