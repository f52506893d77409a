"""`cairn pack` against the paper's baseline (Agnostic: concatenate, then gzip) in the same run.

Checkpoint sets are generated to resemble mcrEngine's Table 3 (or taken from ``--src DIR``):

- ``ale3d``: ~90% float64, the rest int32 connectivity; the same ~90 variables per process; a
  strided decomposition (each process holds every P-th cell), so processes hold similar values.
- ``cactus``: ~34% float64, ~66% int32/int64 (grid indices, flags); a segmented decomposition.
- ``enzo``: ~67% float32, 24% float64, 9% int; AMR-like: each process owns a random number of grid
  patches (``Grid00000042/Density`` …), so variable counts differ between processes; matched with
  the regex ``/Grid(\d+)/.*`` so that every patch's Density is similar.
- ``real``: real files written by other libraries (``pack_corpus``: h5py files with every HDF5
  datatype class and layout, netCDF4 in four formats, scipy.io.netcdf, and the sample files shipped
  with the installed packages), ``--nproc / 8`` copies of each kind: small, mixed files.

Every set is also archived with ``tar | gzip -6`` and ``tar | zstd -3`` per group (the files of
each group in one tar), the plain-archive baselines the default scheme must not lose to.

Fields are smooth with relative noise from 1e-9 to 1e-4, some initialised to defaults, as in
simulation checkpoints. For every scheme and group size (1, 2, 8, 32) the benchmark prints the
compression ratio, the relative improvement over Agnostic+gzip at the same group size (the paper
reports 27.7%–115%), pack and unpack MB/s, and for aware-block the time to write the packed set vs
the original files to disk (each followed by fsync). Results: ``bench/results/pack.json``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np

from .. import pack
from ..pack import aggregate
from ..pack.compare import CANDIDATES
from ..pack.restore import decode_all
from .results import save, table

GROUP_SIZES = (1, 2, 8, 32)


def _field(rng: np.random.Generator, n: int, phase: float, noise: float, dtype: str) -> np.ndarray:
    x = np.linspace(0, 6.0, n) + phase
    v = 1.0 + 0.5 * np.sin(x) + 0.2 * np.cos(3.1 * x)
    return (v * (1 + rng.normal(0, noise, n))).astype(dtype)


def _write_ale3d(path: str, rank: int, nproc: int, cells: int) -> None:
    import h5py

    rng = np.random.default_rng(rank)
    with h5py.File(path, "w") as f:
        f.attrs["cycle"] = 4200
        for d in range(2):
            g = f.create_group(f"domain_{d}")
            for k in range(40):  # 80 float fields: strided cells, so neighbours across ranks agree
                noise = (1e-9, 1e-7, 1e-5, 1e-4)[k % 4]
                g[f"var_{k:03d}"] = _field(rng, cells, rank / nproc * 6.0 / cells + k, noise, "<f8")
            g["connectivity"] = (np.arange(cells * 4, dtype="<i4").reshape(cells, 4) % (cells + 7)) + rank
            g["material"] = np.repeat(np.arange(4, dtype="<i4"), cells // 4 + 1)[:cells]
            g["nodes"] = np.int64(cells * 4)


def _write_cactus(path: str, rank: int, nproc: int, cells: int) -> None:
    import h5py

    rng = np.random.default_rng(rank)
    with h5py.File(path, "w") as f:
        for k in range(60):
            g = f.require_group(f"thorn_{k // 10}")
            if k % 3 == 0:
                g[f"gf_{k}"] = _field(rng, cells, rank * 6.0 + k, 1e-6, "<f8")  # segmented: own region
            elif k % 3 == 1:
                g[f"idx_{k}"] = np.arange(rank * cells, (rank + 1) * cells, dtype="<i8")
            else:
                g[f"flag_{k}"] = (rng.random(cells) < 0.02).astype("<i4") + k % 5
            g.attrs["iteration"] = 1024


def _write_enzo(path: str, rank: int, nproc: int, cells: int) -> None:
    import h5py

    rng = np.random.default_rng(rank)
    with h5py.File(path, "w") as f:
        for p in range(int(rng.integers(4, 16))):
            g = f.create_group(f"Grid{rank * 100 + p:08d}")
            n = int(cells * rng.uniform(0.3, 1.0))
            for name in ("Density", "Temperature", "x-velocity", "y-velocity", "z-velocity", "Dark_Matter_Density"):
                g[name] = _field(rng, n, rng.uniform(0, 6), 1e-5, "<f4")
            g["particle_position_x"] = _field(rng, n // 2, p, 1e-8, "<f8")
            g["particle_mass"] = np.full(n // 2, 1e-3, dtype="<f8")  # initialised to defaults
            g["particle_index"] = np.arange(n // 2, dtype="<i4") + rank * 100000


SETS = {"ale3d": _write_ale3d, "cactus": _write_cactus, "enzo": _write_enzo, "real": None}
#: Name regexes per set (the paper's configurable matching): Enzo's patch numbers differ per process.
MATCH = {"enzo": r"/Grid(\d+)/.*"}


def generate(kind: str, out: str, nproc: int, mib: float) -> None:
    os.makedirs(out, exist_ok=True)
    if kind == "real":
        from .pack_corpus import write_corpus

        write_corpus(out, copies=max(1, nproc // 8))
        return
    # cells per variable chosen so each file is about `mib` MiB
    per_cell = {"ale3d": 2 * (40 * 8 + 20), "cactus": 60 * 6.7, "enzo": 10 * (6 * 4 + 10) * 0.65}[kind]
    cells = max(64, int(mib * 2**20 / per_cell))
    for r in range(nproc):
        SETS[kind](os.path.join(out, f"{kind}-{r:05d}.h5"), r, nproc, cells)


def _write_files(paths: list[str], dest: str, threads: int = 2) -> float:
    """Time to write the given files into `dest` (one fsync each), with `threads` writers."""
    os.makedirs(dest, exist_ok=True)

    def one(p: str) -> None:
        with open(p, "rb") as src, open(os.path.join(dest, os.path.basename(p)), "wb") as out:
            shutil.copyfileobj(src, out, 8 << 20)
            out.flush()
            os.fsync(out.fileno())

    t = time.perf_counter()
    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(one, paths))
    return time.perf_counter() - t


#: Plain archives of each group: (name, command reading a tar on stdin).
BASELINES = (("tar|gzip -6", ["gzip", "-6", "-c"]), ("tar|zstd -3", ["zstd", "-3", "-q", "-c"]))


def _archive(src: str, names: list[str], group: int, command: list[str]) -> tuple[int, float]:
    """Bytes and seconds of `tar | command` over each group of `names` (relative to `src`)."""
    total, t = 0, time.perf_counter()
    for a in range(0, len(names), group):
        tar = subprocess.Popen(["tar", "-cf", "-", "-C", src, *names[a : a + group]], stdout=subprocess.PIPE)
        out = subprocess.run(command, stdin=tar.stdout, capture_output=True, check=True).stdout
        tar.wait()
        total += len(out)
    return total, time.perf_counter() - t


def measure(src: str, name: str, work: str, group_sizes: tuple[int, ...], block: int, match: str | None = None) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = []
    names = [n for n, _ in aggregate.list_members(src)]
    files = [os.path.join(src, n) for n in names]
    raw = sum(os.path.getsize(f) for f in files)
    workers = os.cpu_count() or 2
    for g in group_sizes:
        if g > len(files):
            continue
        for base_name, command in BASELINES:
            size, secs = _archive(src, names, g, command)
            rows.append({"set": name, "group": g, "scheme": base_name, "codec": "-", "parity": 0, "raw_mb": raw / 1e6,
                         "ratio": raw / size, "pack_mbps": raw / secs / 1e6})
        base = None
        for scheme, codec, parity in [*((s, c, 1) for s, c in CANDIDATES), ("auto", "aware", 0)]:
            out = os.path.join(work, f"{name}-{scheme}-{codec}-{g}-{parity}")
            r = pack.pack(src, out, group_size=g, scheme=scheme, block=block, codec=codec, match=match, fsync=False, parity=parity)
            t = time.perf_counter()
            with ThreadPoolExecutor(workers) as pool:
                for c in pack.containers_in(out):
                    decode_all(c, pool)
            t_unpack = time.perf_counter() - t
            base = base or r.ratio
            row = {
                "set": name, "group": g, "scheme": scheme, "codec": codec, "parity": parity, "raw_mb": raw / 1e6, "ratio": r.ratio,
                "vs_agnostic_gzip_pct": (r.ratio / base - 1) * 100, "pack_mbps": raw / r.seconds / 1e6,
                "pack_mbps_per_core": raw / r.seconds / 1e6 / workers, "unpack_mbps": raw / t_unpack / 1e6,
            }
            if scheme == "auto" and parity:
                containers = pack.containers_in(out)
                t_orig = _write_files(files, os.path.join(work, "w-orig"))
                t_pack = _write_files(containers, os.path.join(work, "w-pack"))
                shutil.rmtree(os.path.join(work, "w-orig"))
                shutil.rmtree(os.path.join(work, "w-pack"))
                row.update({"write_orig_s": t_orig, "write_packed_s": t_pack, "write_reduction_pct": (1 - t_pack / t_orig) * 100})
            rows.append(row)
            shutil.rmtree(out)
    return rows


def main(argv: list[str]) -> None:
    p = argparse.ArgumentParser(prog="python -m cairn.bench pack", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--src", help="benchmark this checkpoint set instead of generated ones")
    p.add_argument("--sets", default=",".join(SETS), help="generated sets to run (default: all)")
    p.add_argument("--nproc", type=int, default=32, help="processes (files) per generated set (default 32)")
    p.add_argument("--mib", type=float, default=3.0, help="approximate MiB per generated file (default 3)")
    p.add_argument("--groups", default=",".join(map(str, GROUP_SIZES)), help="group sizes (default 1,2,8,32)")
    p.add_argument("--block", type=int, default=8192, help="interleaving block in bytes (default 8192)")
    p.add_argument("--match", help="with --src: regex for similar variable names (see cairn pack --match)")
    p.add_argument("--generate", metavar="DIR", help="only write the first of --sets into DIR (a sample for cairn pack) and exit")
    p.add_argument("--dir", help="work folder on the disk to measure (default: a temporary folder)")
    args = p.parse_args(argv)
    groups = tuple(int(g) for g in args.groups.split(","))
    if args.generate:
        generate(args.sets.split(",")[0], args.generate, args.nproc, args.mib)
        print(f"wrote {args.nproc} {args.sets.split(',')[0]}-like checkpoint files into {args.generate}")
        return
    work = tempfile.mkdtemp(prefix="cairn-bench-pack-", dir=args.dir)
    rows: list[dict[str, Any]] = []
    try:
        if args.src:
            rows += measure(args.src, os.path.basename(os.path.abspath(args.src)), work, groups, args.block, args.match)
        else:
            for kind in args.sets.split(","):
                src = os.path.join(work, f"set-{kind}")
                generate(kind, src, args.nproc, args.mib)
                print(f"generated {kind}: {args.nproc} files, {sum(os.path.getsize(os.path.join(src, f)) for f in os.listdir(src)) / 1e6:.0f} MB", flush=True)
                got = measure(src, kind, work, groups, args.block, MATCH.get(kind))
                print(table(got, ["set", "group", "scheme", "codec", "parity", "ratio", "vs_agnostic_gzip_pct", "pack_mbps", "unpack_mbps",
                                  "write_reduction_pct"]), flush=True)
                rows += got
                shutil.rmtree(src)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for (kind, g) in sorted({(r["set"], r["group"]) for r in rows}):
        cell = {(r["scheme"], r.get("parity", 1)): r["ratio"] for r in rows if (r["set"], r["group"]) == (kind, g)}
        plain = max(cell[(b, 0)] for b, _ in BASELINES)
        print(f"{kind} group {g}: default (auto, parity 1) {cell[('auto', 1)]:.2f}, auto --parity 0 {cell[('auto', 0)]:.2f}, "
              f"best plain archive {plain:.2f}: default {'>=' if cell[('auto', 1)] >= plain else 'LOSES TO'} plain")
    best = [r for r in rows if r["scheme"].startswith("aware")]
    if best:
        lo = min(r["vs_agnostic_gzip_pct"] for r in best)
        hi = max(r["vs_agnostic_gzip_pct"] for r in best)
        print(f"\ndata-aware improvement over Agnostic+gzip: {lo:.1f}% .. {hi:.1f}% (paper: 27.7% .. 115%)")
    path = save("pack", rows, {"nproc": args.nproc, "mib_per_file": args.mib, "groups": groups, "block": args.block,
                               "src": args.src, "baseline": "agnostic scheme + gzip level 6 (mcrEngine's Agnostic)"})
    print(f"saved {path}")
