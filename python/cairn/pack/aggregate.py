"""Packing: N member files → one container per group of ``group_size`` (mcrEngine's N→M).

The pipeline overlaps its stages: the main thread gathers a frame's bytes from the members
(memory-mapped, so only the frames in flight are in memory), a pool compresses frames (the codec
releases the GIL), and the main thread writes finished frames in order.

With the default ``--codec aware`` every frame of numbers is coded both data-aware (pco) and plain
(zstd) and the smaller kept, so the data-aware path never costs ratio.
"""

from __future__ import annotations

import contextlib
import os
import re
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .. import _native
from ..exceptions import CairnError, InvalidArgumentError, NotFoundError
from . import layout
from .container import ContainerWriter
from .member import Member
from .scan import scan

#: Largest raw bytes per frame: the unit of compression, parallelism, partial reads and repair.
FRAME = 4 << 20
#: Byte codec of the aware policy (and what its pco frames are compared with) by the raw size of
#: the group: stronger for small groups, where its cost is small (under a second per group) and
#: plain archivers would otherwise win on ratio (zstd:19 would win more, at 60 times the time).
PLAIN_BY_SIZE = ((16 << 20, "zstd:9"), (1 << 62, "zstd:3"))


def plain_codec(raw: int) -> str:
    """The byte codec of the aware policy for a group of `raw` bytes."""
    return next(codec for limit, codec in PLAIN_BY_SIZE if raw <= limit)


@dataclass
class GroupReport:
    container: str
    members: int
    raw: int
    packed: int
    seconds: float


@dataclass
class PackReport:
    scheme: str
    codec: str
    groups: list[GroupReport] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # entries not packed (symlinks …), with why
    notes: list[str] = field(default_factory=list)  # what the scanner left residual, per file

    @property
    def raw(self) -> int:
        return sum(g.raw for g in self.groups)

    @property
    def packed(self) -> int:
        return sum(g.packed for g in self.groups)

    @property
    def seconds(self) -> float:
        return sum(g.seconds for g in self.groups)

    @property
    def ratio(self) -> float:
        return self.raw / self.packed if self.packed else 1.0


def _natural(name: str) -> list[object]:
    """Sort key putting rank-10 after rank-9."""
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", name)]


def list_members(src: str, skipped: list[str] | None = None) -> list[tuple[str, str]]:
    """(relative name, path) of every regular file under `src`, in rank (natural) order. Symbolic
    links and special files are not packed; each is described in `skipped`."""
    if not os.path.isdir(src):
        raise NotFoundError(f"checkpoint set {src!r} is not a directory; give the folder holding the per-process files")
    found = []
    for root, dirs, files in os.walk(src):
        for f in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            p = os.path.join(root, f)
            name = os.path.relpath(p, src).replace(os.sep, "/")
            if os.path.islink(p):
                if skipped is not None:
                    skipped.append(f"{name}: symbolic link to {os.readlink(p)!r}, not packed (recreate it after unpacking)")
            elif os.path.isfile(p):
                found.append((name, p))
            elif skipped is not None:
                skipped.append(f"{name}: not a regular file, not packed")
    if not found:
        raise NotFoundError(f"checkpoint set {src!r} holds no files")
    return sorted(found, key=lambda t: _natural(t[0]))


def scan_group(files: list[tuple[str, str]]) -> list[Member]:
    """Scans the members of one group; a file that cannot be read is named."""
    out = []
    for name, p in files:
        try:
            out.append(scan(p, name))
        except OSError as e:
            raise InvalidArgumentError(f"{p}: cannot be read ({e.strerror or e}); fix its permissions or remove it from the set") from None
    return out


def pack(
    src: str,
    out: str,
    group_size: int = 32,
    scheme: str = layout.AUTO,
    block: int = 8192,
    codec: str = "aware",
    match: str | None = None,
    workers: int | None = None,
    progress: bool = False,
    fsync: bool = True,
    frame: int = FRAME,
    parity: int = 1,
    parity_group: int = 16,
) -> PackReport:
    """Packs every file under `src` into ``out/group-NNNNN.cpk`` containers of `group_size`
    members each (in natural rank order). `scheme` ``auto`` packs each group both ``aware`` and
    ``agnostic`` and keeps the smaller container. `codec` is ``aware`` (by element type, never
    worse than plain zstd) or one byte codec for everything (``zstd[:L]``, ``gzip[:L]``, ``raw``);
    `match` is a regex whose capture groups are ignored when matching variable names. `frame` is the raw size
    of a compressed frame (the unit of partial reads). `parity` Reed–Solomon records per group of
    `parity_group` slices of the frames repair that many damaged slices per group, and with
    parity 1 one run of damage up to about 1/parity_group of a container of 1 MiB or more, one
    slice of a smaller one (0: no parity; see ``parity``). On
    failure nothing is left in `out`."""
    check_options(scheme, block, group_size, codec, frame, parity, parity_group)
    pattern = re.compile(match) if match else None
    report = PackReport(scheme, codec)
    files = list_members(src, report.skipped)
    created = not os.path.isdir(out)
    os.makedirs(out, exist_ok=True)
    stale = [f for f in os.listdir(out) if f.endswith(".cpk")]
    if stale:
        raise InvalidArgumentError(f"{out!r} already holds containers ({stale[0]}, …); pack into an empty folder")
    total = sum(os.path.getsize(p) for _, p in files)
    bar = progress_bar(total, "pack", progress)
    try:
        with ThreadPoolExecutor(workers or os.cpu_count() or 2) as pool:
            for g in range(0, len(files), group_size):
                t0 = time.perf_counter()
                # Scanning stays on this thread: prefetching the next group's scan in another thread
                # was measured 10-25% slower (its Python work contends for the GIL with the gather).
                members = scan_group(files[g : g + group_size])
                report.notes += [f"{m.name}: {n}" for m in members for n in m.notes]
                path = os.path.join(out, f"group-{g // group_size:05d}.cpk")
                try:
                    size = pack_best(members, path, layout.tries(scheme), block, codec, pattern, pool, bar, fsync, frame,
                                     parity, parity_group)
                except CairnError:
                    raise
                except Exception as e:
                    raise InvalidArgumentError(f"packing {', '.join(m.path for m in members[:3])}{' …' if len(members) > 3 else ''}: "
                                               f"{type(e).__name__}: {e}") from e
                report.groups.append(GroupReport(path, len(members), sum(m.size for m in members), size, time.perf_counter() - t0))
    except BaseException:
        for gr in report.groups:
            os.unlink(gr.container)
        if created:
            with contextlib.suppress(OSError):  # not empty: something else writes there too
                os.rmdir(out)
        raise
    finally:
        if bar is not None:
            bar.close()  # type: ignore[attr-defined]
    return report


def _frame_order(streams: list[layout.Stream], frame: int) -> list[tuple[int, int, int, int, int, layout.Runs]]:
    """(first member, stream, index, stream start, stream end, runs) of every frame, in the order
    they are written: by the first member they hold bytes of, so that every member's frames come
    before those of the members after it hold (a container cut short keeps the members before
    the cut whole, whatever the scheme), then by stream and index."""
    out = []
    for si, s in enumerate(streams):
        r = layout.runs(s)
        for i, a in enumerate(range(0, s.length, frame)):
            b = min(a + frame, s.length)
            ks = r.between(a, b)
            out.append((int(r.member[ks.start : ks.stop].min()), si, i, a, b, r))
    out.sort(key=lambda x: x[:3])
    return out


def check_options(scheme: str, block: int, group_size: int, codec: str, frame: int, parity: int, parity_group: int) -> None:
    """Refuses bad options before anything is written."""
    layout.check_scheme(scheme, block)
    if frame < 4096 or frame % 4096 or frame > 1 << 30:
        raise InvalidArgumentError(f"frame size {frame}: give a multiple of 4096 bytes, at most 1 GiB")
    if group_size < 1:
        raise InvalidArgumentError(f"--group-size {group_size}: give at least 1")
    if not 0 <= parity <= 64:
        raise InvalidArgumentError(f"--parity {parity}: give 0 (no parity) to 64 parity records per group of slices")
    if not 1 <= parity_group <= 255 - parity:
        raise InvalidArgumentError(f"--parity-group {parity_group}: give 1 to {255 - parity} slices (with --parity {parity})")
    _native.compress(np.zeros(0, np.uint8), None, codec)  # validates the codec name up front


def pack_best(
    members: list[Member],
    path: str,
    schemes: tuple[str, ...],
    block: int,
    codec: str,
    match: re.Pattern[str] | None,
    pool: ThreadPoolExecutor,
    bar: object | None,
    fsync: bool,
    frame: int,
    parity: int,
    parity_group: int,
) -> int:
    """Packs one group under each of `schemes` and keeps the smallest container at `path`;
    returns its size (the progress bar counts the first try only)."""
    tried: list[tuple[int, str]] = []
    try:
        for k, sch in enumerate(schemes):
            p = path if len(schemes) == 1 else f"{path}.{sch}"
            tried.append((pack_group(members, p, sch, block, codec, match, pool, None if k else bar, fsync, frame, parity, parity_group), p))
        size, best = min(tried)
        os.replace(best, path)
        return size
    finally:
        for _, p in tried:
            if p != path and os.path.exists(p):
                os.unlink(p)


def pack_group(
    members: list[Member],
    path: str,
    scheme: str,
    block: int,
    codec: str,
    match: re.Pattern[str] | None,
    pool: ThreadPoolExecutor,
    bar: object | None = None,
    fsync: bool = True,
    frame: int = FRAME,
    parity: int = 1,
    parity_group: int = 16,
) -> int:
    """Writes one container; returns its size."""
    streams = layout.build(members, scheme, block, match)
    layout.check_coverage(members, streams)
    maps = [np.memmap(m.path, np.uint8, mode="r") if m.size else np.zeros(0, np.uint8) for m in members]
    crcs = [pool.submit(_native.crc32c, mm) for mm in maps]
    head = {
        "format": 2,
        "scheme": scheme,
        "block": block,
        "codec": codec,
        "match": match.pattern if match else None,
        "frame": frame,
        "parity": parity,
        "parity_group": parity_group,
        "members": [],
        "streams": [s.to_json() for s in streams],
    }
    var_at = {}
    for si, s in enumerate(streams):
        for pi, p in enumerate(s.parts):
            var_at[(p.member, tuple(p.extents))] = (si, pi)
    for i, m in enumerate(members):
        head["members"].append(
            {
                "name": m.name,
                "format": m.format,
                "size": m.size,
                "crc": crcs[i].result(),
                # path, dtype, shape, stream, part (aware schemes), ordered: enough to read one variable alone
                # Only the aware schemes keep variables apart, so only they can read one alone.
                "variables": [[v.path, v.dtype, list(v.shape), *var_at[(i, tuple(v.regions))], v.ordered]
                              for v in m.variables if (i, tuple(v.regions)) in var_at] if scheme.startswith("aware") else [],
            }
        )
    plain = plain_codec(sum(m.size for m in members))
    writer = ContainerWriter(path, head)
    inflight: deque[tuple[int, int, int, Future]] = deque()
    depth = 2 * pool._max_workers  # noqa: SLF001 - bound memory to a few frames per worker

    def drain(keep: int) -> None:
        while len(inflight) > keep:
            s, i, raw, fut = inflight.popleft()
            spec, coded, crc = fut.result()
            writer.add(s, i, spec, coded, raw, crc)
            if bar is not None:
                bar.update(raw)  # type: ignore[attr-defined]

    try:
        for _first, si, i, a, b, r in _frame_order(streams, frame):
            buf = np.empty(b - a, np.uint8)
            for k in r.between(a, b):
                st, n = int(r.start[k]), int(r.length[k])
                lo, hi = max(st, a), min(st + n, b)
                off = int(r.offset[k]) + lo - st
                buf[lo - a : hi - a] = maps[r.member[k]][off : off + hi - lo]
            inflight.append((si, i, b - a, pool.submit(_compress, buf, streams[si].elem, codec, plain)))
            drain(depth)
        drain(0)
        return writer.close(fsync)
    except BaseException:
        writer.abort()
        raise


def _compress(buf: np.ndarray, elem: str | None, codec: str, plain: str) -> tuple[str, bytes, int]:
    """One frame coded as `codec` says; under ``aware``, numbers are coded both with pco and
    with the byte codec `plain`, and the smaller kept; everything else with `plain`."""
    if codec != "aware":
        spec, coded = _native.compress(buf, elem, codec)
    else:
        spec, coded = _native.compress(buf, None, plain)
        if elem is not None and np.dtype(elem).kind in "iufc" and np.dtype(elem).itemsize > 1:
            typed = _native.compress(buf, elem, "aware")
            if len(typed[1]) < len(coded):
                spec, coded = typed
    return spec, coded, _native.crc32c(buf)


def progress_bar(total: int, what: str, show: bool) -> object | None:
    """A byte progress bar, or None when not shown (callers skip updates on None)."""
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=what)
