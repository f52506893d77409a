"""`cairn pack` and `cairn unpack`: N→M aggregation and compression of checkpoint sets."""

from __future__ import annotations

import argparse
import glob
import json
import os

from . import pack as P
from ._check import int_arg
from .exceptions import InvalidArgumentError
from .pack import parity


def _mb(n: int) -> str:
    return f"{n / 1e6:,.1f} MB"


def cmd_pack(args: argparse.Namespace) -> None:
    if args.compare:
        notes: list[str] = []
        rows = P.compare(args.src, group_size=args.group_size, block=args.block_size, sample=args.sample, match=args.match, notes=notes,
                         parity=args.parity, parity_group=args.parity_group)
        print(f"{rows[0].members} members of {args.src} ({_mb(rows[0].raw)}), group size {args.group_size}, block {args.block_size} B\n")
        print(P.table(rows))
        best = max(rows, key=lambda r: r.ratio)
        print(f"\nbest ratio: --scheme {best.scheme} --codec {best.codec}")
        _notes(notes, "left residual (packed exactly, not modelled)")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(P.compare_json(rows), f, indent=2)
        return
    if not args.output:
        raise InvalidArgumentError("give -o OUT (the folder for the containers), or --compare to only compare schemes")
    r = P.pack(args.src, args.output, group_size=args.group_size, scheme=args.scheme, block=args.block_size,
               codec=args.codec, match=args.match, progress=True, parity=args.parity, parity_group=args.parity_group)
    members = sum(g.members for g in r.groups)
    print(f"packed {members} files ({_mb(r.raw)}) into {len(r.groups)} containers ({_mb(r.packed)}) in {args.output}: "
          f"ratio {r.ratio:.3f}, {r.raw / r.seconds / 1e6:.0f} MB/s, scheme {r.scheme}, codec {r.codec}, parity {args.parity}")
    _notes(r.skipped, "skipped")
    _notes(r.notes, "left residual (packed exactly, not modelled)")


def _notes(lines: list[str], what: str, shown: int = 10) -> None:
    if lines:
        print(f"{len(lines)} {what}:")
        for line in lines[:shown]:
            print(f"  {line}")
        if len(lines) > shown:
            print(f"  … and {len(lines) - shown} more")


def cmd_unpack(args: argparse.Namespace) -> None:
    r = P.unpack(args.src, args.output, members=args.member or None, progress=True)
    print(f"restored {len(r.restored)} files ({_mb(r.raw)}) into {args.output}, each checked against its checksum, "
          f"{r.raw / max(r.seconds, 1e-9) / 1e6:.0f} MB/s")
    _notes(r.repaired, "damaged frames repaired from parity")


def is_packed(path: str) -> bool:
    return path.endswith(".cpk") or bool(glob.glob(os.path.join(path, "*.cpk")))


def _parity(c: P.Reader) -> str:
    """The parity as written: its records' slicing (containers under 1 MiB have one group of
    `parity_group` to 4 × `parity_group` slices), else the head's."""
    if not c.head["parity"]:
        return "no parity"
    found = parity._geometry(c) if isinstance(c, P.Container) else None
    if found:
        geo = found[0]
        return f"parity {geo.parity} per {len(geo.members(0))} slices of {geo.slice} B"
    return f"parity {c.head['parity']} per {c.head['parity_group']} slices"


def ls(path: str, verify: bool = False) -> None:
    """Lists containers and their members: sizes, ratio, scheme, parity, and any damage found on
    opening; with `verify`, every frame is read and checked, and damage reported as repairable
    (by parity) or not."""
    print(f"{'container':<22} {'members':>7} {'raw':>14} {'packed':>14} {'ratio':>7}  scheme/codec, parity")
    raw = packed = 0
    lost = damaged = False
    for p in P.containers_in(path):
        try:
            c = P.open_container(p)
        except P.CorruptError as e:
            print(f"{os.path.basename(p):<22} unreadable: {e}")
            lost = True
            continue
        with c:
            r, k = c.raw_size(), c.size
            raw, packed = raw + r, packed + k
            print(f"{os.path.basename(p):<22} {len(c.members):>7} {_mb(r):>14} {_mb(k):>14} {r / k:>7.3f}  "
                  f"{c.head['scheme']}/{c.head['codec']}, {_parity(c)}")
            lines = [f"{m['name']:<40} {_mb(int(m['size'])):>14}  {m['format']}" for m in c.members]
            lines += [f"damaged: {d}" for d in c.damage]
            damaged = damaged or bool(c.damage)
            if verify:
                v = P.verify(c)
                state = "all sound" if not v.damaged and not v.lost else ("repairable" if v.repairable else "NOT repairable")
                lines.append(f"verify: {v.frames} frames, {len(v.damaged) + len(v.lost)} damaged, "
                             f"{v.parity_damaged} parity records damaged: {state}")
                lines += [f"damaged, repairable: {d}" for d in v.damaged] + [f"damaged, not repairable: {d}" for d in v.lost]
                lost = lost or not v.repairable
                damaged = damaged or bool(v.damaged or v.lost)
            print("\n".join(f"  {line}" for line in lines))
    print(f"{'total':<22} {'':>7} {_mb(raw):>14} {_mb(packed):>14} {raw / max(packed, 1):>7.3f}")
    if verify and lost:
        raise P.CorruptError(f"{path}: damage that parity cannot repair (listed above); `cairn unpack` restores every other member")
    if verify and damaged:
        raise P.CorruptError(f"{path}: damage found (listed above), all of it repairable: `cairn unpack` restores every member "
                             "from parity")


def add(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("pack", help="aggregate and compress a checkpoint set of per-process HDF5/netCDF files (N→M)")
    p.add_argument("src", help="folder of per-process checkpoint files (any depth; natural rank order)")
    p.add_argument("-o", "--output", help="folder for the containers (group-NNNNN.cpk)")
    p.add_argument("--group-size", type=int, default=32, help="processes per container (default 32)")
    p.add_argument("--scheme", choices=P.CHOICES, default="auto",
                   help="merging scheme (default auto: aware or agnostic, whichever is smaller per container)")
    p.add_argument("--block-size", type=int, default=8192, help="interleaving block in bytes for *-block schemes (default 8192)")
    p.add_argument("--codec", default="aware", help="aware (pco/zstd by element type; default), zstd[:L], gzip[:L] or raw")
    p.add_argument("--match", help="regex on variable paths; text in its capture groups is ignored when matching, "
                                   "e.g. '/patch_(\\d+)/.*' makes every patch's variables similar")
    p.add_argument("--parity", type=int, default=1,
                   help="Reed-Solomon parity records per group of slices of the frames: repairs that many damaged slices "
                        "per group, and with 1 any run of damage (a lost frame) up to about 1/PARITY_GROUP of a container "
                        "of 1 MiB or more, one slice of a smaller one (default 1; 0 disables)")
    p.add_argument("--parity-group", type=int, default=16,
                   help="slices per parity group (default 16: parity costs 1/16; containers under 1 MiB: one group of "
                        "PARITY_GROUP to 4 x PARITY_GROUP slices)")
    p.add_argument("--compare", action="store_true", help="try every scheme on a sample and print a table; writes nothing")
    p.add_argument("--sample", type=int_arg(1), help="members to sample with --compare (default: one group)")
    p.add_argument("--json", help="with --compare: also save the table as JSON")
    p.set_defaults(func=cmd_pack)
    u = sub.add_parser("unpack", help="restore every original file of packed containers, byte for byte")
    u.add_argument("src", help="folder of containers (or one .cpk file)")
    u.add_argument("-o", "--output", required=True, help="folder to restore into (files must not exist)")
    u.add_argument("--member", action="append", help="restore only this file (repeatable)")
    u.set_defaults(func=cmd_unpack)
