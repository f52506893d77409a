"""Packing: N member files → one container per group of ``group_size`` (mcrEngine's N→M).

The pipeline overlaps its stages: the main thread gathers a frame's bytes from the members
(memory-mapped, so only the frames in flight are in memory), a pool compresses frames (the codec
releases the GIL), and the main thread writes finished frames in order.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np

from .. import _native
from ..exceptions import InvalidArgumentError, NotFoundError
from . import layout
from .container import ContainerWriter
from .scan import Member, scan

#: Raw bytes per frame: the unit of compression, parallelism and partial reads.
FRAME = 4 << 20


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


def list_members(src: str) -> list[tuple[str, str]]:
    """(relative name, path) of every regular file under `src`, in rank (natural) order."""
    if not os.path.isdir(src):
        raise NotFoundError(f"checkpoint set {src!r} is not a directory; give the folder holding the per-process files")
    found = []
    for root, _dirs, files in os.walk(src):
        for f in files:
            p = os.path.join(root, f)
            if os.path.isfile(p) and not os.path.islink(p):
                found.append((os.path.relpath(p, src).replace(os.sep, "/"), p))
    if not found:
        raise NotFoundError(f"checkpoint set {src!r} holds no files")
    return sorted(found, key=lambda t: _natural(t[0]))


def pack(
    src: str,
    out: str,
    group_size: int = 32,
    scheme: str = "aware-block",
    block: int = 8192,
    codec: str = "aware",
    match: str | None = None,
    workers: int | None = None,
    progress: bool = False,
    fsync: bool = True,
    frame: int = FRAME,
) -> PackReport:
    """Packs every file under `src` into ``out/group-NNNNN.cpk`` containers of `group_size`
    members each (in natural rank order). `codec` is ``aware`` (by element type) or one byte codec
    for everything (``zstd[:L]``, ``gzip[:L]``, ``raw``); `match` is a regex whose capture groups
    are ignored when matching variable names. `frame` is the raw size of a compressed frame (the
    unit of partial reads and of damage)."""
    layout.check_scheme(scheme, block)
    if frame < 4096 or frame % 4096:
        raise InvalidArgumentError(f"frame size {frame}: give a multiple of 4096 bytes")
    if group_size < 1:
        raise InvalidArgumentError(f"--group-size {group_size}: give at least 1")
    _native.compress(np.zeros(0, np.uint8), None, codec)  # validates the codec name up front
    pattern = re.compile(match) if match else None
    files = list_members(src)
    os.makedirs(out, exist_ok=True)
    stale = [f for f in os.listdir(out) if f.endswith(".cpk")]
    if stale:
        raise InvalidArgumentError(f"{out!r} already holds containers ({stale[0]}, …); pack into an empty folder")
    report = PackReport(scheme, codec)
    total = sum(os.path.getsize(p) for _, p in files)
    bar = progress_bar(total, "pack", progress)
    with ThreadPoolExecutor(workers or os.cpu_count() or 2) as pool:
        for g in range(0, len(files), group_size):
            t0 = time.perf_counter()
            # Scanning stays on this thread: prefetching the next group's scan in another thread
            # was measured 10-25% slower (its Python work contends for the GIL with the gather).
            members = [scan(p, name) for name, p in files[g : g + group_size]]
            path = os.path.join(out, f"group-{g // group_size:05d}.cpk")
            size = pack_group(members, path, scheme, block, codec, pattern, pool, bar, fsync, frame)
            report.groups.append(GroupReport(path, len(members), sum(m.size for m in members), size, time.perf_counter() - t0))
    if bar is not None:
        bar.close()  # type: ignore[attr-defined]
    return report


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
) -> int:
    """Writes one container; returns its size."""
    streams = layout.build(members, scheme, block, match)
    layout.check_coverage(members, streams)
    maps = [np.memmap(m.path, np.uint8, mode="r") if m.size else np.zeros(0, np.uint8) for m in members]
    crcs = [pool.submit(_native.crc32c, mm) for mm in maps]
    head = {
        "format": 1,
        "scheme": scheme,
        "block": block,
        "codec": codec,
        "match": match.pattern if match else None,
        "frame": frame,
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
                # path, dtype, shape, stream, part (aware schemes): enough to read one variable alone
                "variables": [[v.path, v.dtype, list(v.shape), *var_at.get((i, tuple(v.regions)), (None, None))] for v in m.variables],
            }
        )
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
        for si, s in enumerate(streams):
            r = layout.runs(s)
            for i, a in enumerate(range(0, s.length, frame)):
                b = min(a + frame, s.length)
                buf = np.empty(b - a, np.uint8)
                for k in r.between(a, b):
                    st, n = int(r.start[k]), int(r.length[k])
                    lo, hi = max(st, a), min(st + n, b)
                    off = int(r.offset[k]) + lo - st
                    buf[lo - a : hi - a] = maps[r.member[k]][off : off + hi - lo]
                inflight.append((si, i, b - a, pool.submit(_compress, buf, s.elem, codec)))
                drain(depth)
        drain(0)
        return writer.close(fsync)
    except BaseException:
        writer.abort()
        raise


def _compress(buf: np.ndarray, elem: str | None, codec: str) -> tuple[str, bytes, int]:
    spec, coded = _native.compress(buf, elem, codec)
    return spec, coded, _native.crc32c(buf)


def progress_bar(total: int, what: str, show: bool) -> object | None:
    """A byte progress bar, or None when not shown (callers skip updates on None)."""
    if not show:
        return None
    from tqdm import tqdm

    return tqdm(total=total, unit="B", unit_scale=True, desc=what)
